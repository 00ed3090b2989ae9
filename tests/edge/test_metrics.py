"""The service's Prometheus metrics: what each call counts, under which labels, the
multi-process aggregate the supervisor serves, and the HTTP endpoint."""

import importlib.metadata
import itertools
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import prometheus_client
import pytest
from prometheus_client import multiprocess
from prometheus_client.parser import text_string_to_metric_families

from ext_proc.core.address import HostPort
from ext_proc.core.decisions import REASONS_BY_ACTION
from ext_proc.core.reasons import Reason
from ext_proc.edge.metrics import BODY_BUCKETS, TIME_BUCKETS, Metrics, aggregate, serve_metrics
from ext_proc.version import version

REPO = Path(__file__).resolve().parents[2]
DENY = {"route": "r", "action": "deny", "reason": "ids_denied", "mode": "enforce"}


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_decision_is_counted_under_its_labels(metrics):
    metrics.decided("r", "deny", "ids_denied", "enforce", 2048)
    metrics.decided("r", "deny", "ids_denied", "enforce", 100)
    metrics.decided("r", "deny", "ids_denied", "audit", 100)
    metrics.decided("other", "strip", "stripped", "enforce", 100)
    assert value(metrics, "ext_proc_decisions_total", **DENY) == 2
    assert value(metrics, "ext_proc_decisions_total", **(DENY | {"mode": "audit"})) == 1
    other = {"route": "other", "action": "strip", "reason": "stripped", "mode": "enforce"}
    assert value(metrics, "ext_proc_decisions_total", **other) == 1
    assert value(metrics, "ext_proc_decisions_total", **(DENY | {"reason": "x"})) is None


def test_a_decision_observes_the_body_size_per_route(metrics):
    metrics.decided("r", "deny", "ids_denied", "enforce", 2048)
    metrics.decided("r", "allow", "no_ids", "enforce", 100)
    assert value(metrics, "ext_proc_request_body_bytes_count", route="r") == 2
    assert value(metrics, "ext_proc_request_body_bytes_sum", route="r") == 2148
    assert value(metrics, "ext_proc_request_body_bytes_bucket", route="r", le="1024.0") == 1
    assert value(metrics, "ext_proc_request_body_bytes_bucket", route="r", le="4096.0") == 2


def test_a_decision_without_a_body_observes_no_size(metrics):
    metrics.decided("r", "deny", "ids_denied", "enforce", 0)
    assert value(metrics, "ext_proc_decisions_total", **DENY) == 1
    assert value(metrics, "ext_proc_request_body_bytes_count", route="r") == 0


def test_processing_time_is_observed_per_route(metrics):
    metrics.observe_processing("r", 0.0003)
    metrics.observe_processing("r", 0.002)
    metrics.observe_processing("s", 0.00001)
    assert value(metrics, "ext_proc_processing_seconds_count", route="r") == 2
    assert value(metrics, "ext_proc_processing_seconds_sum", route="r") == pytest.approx(0.0023)
    assert value(metrics, "ext_proc_processing_seconds_bucket", route="r", le="0.00025") == 0
    assert value(metrics, "ext_proc_processing_seconds_bucket", route="r", le="0.0005") == 1
    assert value(metrics, "ext_proc_processing_seconds_count", route="s") == 1


def test_sample_sets_the_inflight_gauges(metrics):
    metrics.sample(5, 4096, 1 << 20)
    assert value(metrics, "ext_proc_inflight_streams") == 5
    assert value(metrics, "ext_proc_inflight_body_bytes") == 4096
    assert value(metrics, "ext_proc_inflight_budget_limit_bytes") == 1 << 20
    metrics.sample(2, 0, 1 << 20)  # set, not added
    assert value(metrics, "ext_proc_inflight_streams") == 2
    assert value(metrics, "ext_proc_inflight_body_bytes") == 0
    assert value(metrics, "ext_proc_inflight_budget_limit_bytes") == 1 << 20


def test_messages_left_to_upb_are_counted_from_zero(metrics):
    assert value(metrics, "ext_proc_messages_parsed_by_upb_total") == 0
    metrics.parsed_by_upb.inc()
    assert value(metrics, "ext_proc_messages_parsed_by_upb_total") == 1


def test_every_stream_error_kind_is_exported_at_zero_before_the_first(metrics):
    for kind in ("protocol_violation", "internal", "cancelled", "shutdown"):
        assert value(metrics, "ext_proc_stream_errors_total", kind=kind) == 0


def exported(metrics: Metrics) -> dict[tuple[str, ...], float]:
    """Every decision series: (route, action, reason, mode) to its count."""
    (family,) = [f for f in metrics.registry.collect() if f.name == "ext_proc_decisions"]
    return {
        tuple(s.labels[k] for k in ("route", "action", "reason", "mode")): s.value
        for s in family.samples
        if s.name == "ext_proc_decisions_total"
    }


def test_a_routes_first_outcome_exports_every_reason_at_zero(metrics):
    assert exported(metrics) == {}  # no route is known before Envoy names one
    metrics.decided("r", "deny", Reason.PROOF_EXPIRED, "enforce", 10)
    series = exported(metrics)
    pairs = {(a, r) for a, reasons in REASONS_BY_ACTION.items() for r in reasons}
    assert {(a, r) for (_, a, r, _) in series} == pairs
    assert {r for (_, _, r, _) in series} == {r.value for r in Reason}
    assert {(route, mode) for (route, _, _, mode) in series} == {("r", "enforce")}
    assert sum(series.values()) == 1
    assert series[("r", "deny", "proof_expired", "enforce")] == 1
    # Another mode, or another route, gets its own zeros.
    metrics.decided("r", "allow", Reason.NO_BODY, "audit", 0)
    metrics.decided("s", "allow", Reason.NO_BODY, "enforce", 0)
    assert len(exported(metrics)) == 3 * len(pairs)


def test_stream_errors_are_counted_by_kind(metrics):
    metrics.stream_errors.labels("cancelled").inc()
    metrics.stream_errors.labels("cancelled").inc()
    metrics.stream_errors.labels("internal").inc()
    assert value(metrics, "ext_proc_stream_errors_total", kind="cancelled") == 2
    assert value(metrics, "ext_proc_stream_errors_total", kind="internal") == 1


def test_build_info_is_1_labelled_with_the_installed_version(metrics):
    assert version() == importlib.metadata.version("ext-proc-token-policy")
    samples = [
        s for s in metrics.registry.collect() if s.name == "ext_proc_build_info" for s in s.samples
    ]
    assert [(s.labels, s.value) for s in samples] == [({"version": version()}, 1)]


def test_each_instance_has_its_own_registry_and_never_the_global_one():
    first, second = Metrics(), Metrics()  # no "Duplicated timeseries"
    first.decided("r", "deny", "ids_denied", "enforce", 1)
    assert value(second, "ext_proc_decisions_total", **DENY) is None
    assert prometheus_client.REGISTRY.get_sample_value("ext_proc_decisions_total", DENY) is None


def test_buckets_span_1_kib_to_64_mib_and_50_us_to_5_s():
    assert (BODY_BUCKETS[0], BODY_BUCKETS[-1]) == (1024, 64 * 1024**2)
    assert all(b == 4 * a for a, b in itertools.pairwise(BODY_BUCKETS))
    assert (TIME_BUCKETS[0], TIME_BUCKETS[-1]) == (0.00005, 5.0)
    assert list(TIME_BUCKETS) == sorted(set(TIME_BUCKETS))


WORKER = """
import os, sys
from ext_proc.edge.metrics import Metrics
metrics = Metrics()
metrics.decided("r", "deny", "ids_denied", "enforce", 2048)
metrics.observe_processing("r", 0.001)
metrics.stream_errors.labels("internal").inc()
metrics.sample(int(sys.argv[1]), int(sys.argv[2]), 4096)
print(os.getpid())
"""


def test_the_aggregate_sums_every_workers_samples_and_drops_a_dead_workers_gauges(tmp_path):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, streams, held],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for streams, held in (("3", "1000"), ("4", "20"))
    ]
    pids = []
    for worker in workers:
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        pids.append(int(out))
    registry = aggregate(str(tmp_path))
    get = registry.get_sample_value
    assert get("ext_proc_decisions_total", DENY) == 2
    assert get("ext_proc_request_body_bytes_sum", {"route": "r"}) == 4096
    assert get("ext_proc_processing_seconds_count", {"route": "r"}) == 2
    assert get("ext_proc_stream_errors_total", {"kind": "internal"}) == 2
    # Live sums: one value for the service, not one per pid.
    assert get("ext_proc_inflight_streams") == 7
    assert get("ext_proc_inflight_body_bytes") == 1020
    assert get("ext_proc_inflight_budget_limit_bytes") == 8192  # each worker's budget
    # One series of the version, 1 however many workers run it.
    assert get("ext_proc_build_info", {"version": version()}) == 1
    # What the supervisor does when a worker dies: its gauges go, its counts stay.
    multiprocess.mark_process_dead(pids[0], str(tmp_path))
    assert get("ext_proc_inflight_streams") == 4
    assert get("ext_proc_inflight_body_bytes") == 20
    assert get("ext_proc_inflight_budget_limit_bytes") == 4096
    assert get("ext_proc_decisions_total", DENY) == 2


def scrape(port: int) -> tuple[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.headers["Content-Type"], reply.read().decode()


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of a text exposition, by name and sorted labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_endpoint_serves_the_registry_as_text_exposition(metrics):
    metrics.decided("r", "deny", "ids_denied", "enforce", 2048)
    metrics.sample(1, 2048, 4096)
    endpoint = serve_metrics(HostPort("127.0.0.1", 0), metrics.registry)
    try:
        assert endpoint.port > 0
        content_type, text = scrape(endpoint.port)
        metrics.decided("r", "deny", "ids_denied", "enforce", 2048)
        _, later = scrape(endpoint.port)
    finally:
        endpoint.close()
    with pytest.raises(urllib.error.URLError):  # closed: nothing answers any more
        scrape(endpoint.port)
    assert content_type.startswith("text/plain")
    first = parse(text)
    assert first[("ext_proc_decisions_total", tuple(sorted(DENY.items())))] == 1
    assert first[("ext_proc_inflight_body_bytes", ())] == 2048
    assert first[("ext_proc_request_body_bytes_count", (("route", "r"),))] == 1
    # Every scrape reads the registry anew.
    assert parse(later)[("ext_proc_decisions_total", tuple(sorted(DENY.items())))] == 2
