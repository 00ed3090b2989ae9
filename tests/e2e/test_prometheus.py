"""A real Prometheus scraping the real stack, with the shipped rules: traffic with every
decision goes through Envoy, and Prometheus' HTTP API shows the series, the recording
rules and the alerts that traffic implies, with one worker and with two (metrics from
several processes), across a worker's restart, and when the processor goes away.

Prometheus (Debian's ``prometheus`` package, installed with apt-get when missing)
scrapes every second and evaluates every second. Its rules are the shipped file with
each alert's ``for`` set to 0 (the expressions unchanged): the test shows what fires,
not how long an operator waits for it (tests/monitoring/rules_test.yaml does that)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench import tools
from devstack import monitoring, processes
from tests.e2e.conftest import KEY_ID
from tests.e2e.stack import Stack, new_key
from tests.e2e.test_dashboard import expressions, series_names, substituted
from tests.e2e.test_gateway import chat
from tests.e2e.test_handoff import DECODE, PREFILL, proof_parts, sign

JOB = "ext-proc-token-policy"
AGGREGATED = "/v1/chat/completions"
IDS = {"prompt_token_ids": [1, 2, 3]}


class Prometheus:
    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log

    def query(self, expr: str) -> list[dict[str, Any]]:
        reply = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        assert reply.status_code == 200, reply.text
        result: list[dict[str, Any]] = reply.json()["data"]["result"]
        return result

    def value(self, expr: str) -> float:
        """The value of a query that gives one sample, or 0 when it gives none."""
        result = self.query(expr)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else 0.0

    def firing(self) -> set[tuple[str, ...]]:
        """(alertname, then the values of route and reason where the alert has them)."""
        reply = httpx.get(self.url + "/api/v1/alerts", timeout=10)
        found = set()
        for alert in reply.json()["data"]["alerts"]:
            if alert["state"] == "firing":
                labels = alert["labels"]
                extra = tuple(labels[k] for k in ("route", "reason") if k in labels)
                found.add((labels["alertname"], *extra))
        return found

    def until(self, check: Callable[[], bool], what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: not within {timeout:.0f} s\n{self.log.read_text()[-2000:]}"
                )
            time.sleep(0.5)


def _rules_without_waits(target: Path) -> None:
    rules = yaml.safe_load(monitoring.RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = "0s"
    target.write_text(yaml.safe_dump(rules))


@contextlib.contextmanager
def prometheus(workdir: Path, stack: Stack) -> Iterator[Prometheus]:
    binary = tools.ensure_tools({"prometheus": "prometheus"})["prometheus"]
    _rules_without_waits(workdir / "rules.yaml")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [
            {"job_name": JOB, "static_configs": [{"targets": [str(stack.metrics)]}]},
            {
                "job_name": "envoy",
                "metrics_path": "/stats/prometheus",
                "static_configs": [{"targets": [str(stack.admin)]}],
            },
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = processes.free_port()
    log = workdir / "prometheus.log"
    process = processes.start(
        [
            binary,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        log,
        cwd=workdir,
    )
    try:
        processes.wait_for_http(port, "/-/ready", process, timeout=60)
        yield Prometheus(f"http://127.0.0.1:{port}", process, log)
    finally:
        processes.stop(process)


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-workers"])
def monitored(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, Prometheus]]:
    workdir = tmp_path_factory.mktemp(f"prometheus-{request.param}")
    key = new_key()
    stack = Stack(workdir, proof_keys={KEY_ID: key}, workers=request.param)
    with stack, prometheus(workdir, stack) as running:
        running.until(lambda: running.value(f'sum(up{{job="{JOB}"}})') == 1, "scraped")
        yield stack, running


def post(stack: Stack, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(stack.url + path, json=body, timeout=20)


def drive(stack: Stack) -> dict[tuple[str, str], int]:
    """One request per outcome; returns (action, reason) -> how many were sent."""
    sent: dict[tuple[str, str], int] = {}

    def count(action: str, reason: str) -> None:
        sent[action, reason] = sent.get((action, reason), 0) + 1

    assert post(stack, AGGREGATED, chat()).status_code == 200
    count("allow", "no_transfer_params")
    assert post(stack, AGGREGATED, chat(kv_transfer_params=IDS)).status_code == 200
    count("strip", "stripped_by_policy")
    assert post(stack, "/deny/v1/chat/completions", chat(kv_transfer_params=IDS)).status_code == 400
    count("deny", "denied_by_policy")
    assert (
        post(stack, "/audit/v1/chat/completions", chat(kv_transfer_params=IDS)).status_code == 200
    )
    count("allow", "trusted_any_caller")
    prefill = post(stack, PREFILL, chat(max_tokens=1, return_token_ids=True))
    minted = prefill.json()["kv_transfer_params"]
    count("strip", "connector_written")
    count("mint", "minted")
    assert post(stack, DECODE, chat(kv_transfer_params=minted)).status_code == 200
    count("honor", "trusted_proof")
    key_id, _minted, expiry, _nonce, digest, _mac = proof_parts(minted)
    secret = stack.proof_keys[key_id]
    signed = {k: v for k, v in minted.items() if k != "token_policy_proof"}
    failures = {
        "proof_bad_signature": {**minted, "remote_port": 1},
        "proof_unknown_key": {
            **minted,
            "token_policy_proof": minted["token_policy_proof"].replace(
                f"tp4.{key_id}.", "tp4.other."
            ),
        },
        "proof_malformed": {**minted, "token_policy_proof": "not-a-proof"},
        "proof_missing": signed,
        "proof_expired": {
            **signed,
            "token_policy_proof": sign(secret, key_id, 1000, digest, signed, minted=980),
        },
    }
    for reason, params in failures.items():
        assert post(stack, DECODE, chat(kv_transfer_params=params)).status_code == 200
        count("strip", reason)
    other = chat(kv_transfer_params=minted)
    other["messages"][0]["content"] = "another prompt"
    assert post(stack, DECODE, other).status_code == 200
    count("strip", "prompt_mismatch")
    assert expiry > time.time()
    return sent


def decided(running: Prometheus) -> dict[tuple[str, str], float]:
    result = running.query(f'sum by (action, reason) (ext_proc_decisions_total{{job="{JOB}"}})')
    return {(r["metric"]["action"], r["metric"]["reason"]): float(r["value"][1]) for r in result}


def test_the_series_rules_and_alerts_are_what_the_traffic_implies(monitored):
    stack, running = monitored
    # Twice, scraped in between: a series is born with its first count, and a rate
    # needs an increase between two scrapes.
    for _ in range(2):
        before = decided(running)
        sent = drive(stack)

        def counted(
            before: dict[tuple[str, str], float] = before,
            sent: dict[tuple[str, str], int] = sent,
        ) -> bool:
            now = decided(running)
            return all(now.get(k, 0) - before.get(k, 0) >= n for k, n in sent.items())

        running.until(counted, f"every decision counted: {sent}")
        now = decided(running)
        assert {k: now[k] - before.get(k, 0) for k in sent} == {
            k: float(n) for k, n in sent.items()
        }
    # The recording rules carry the same decisions.
    rate = 'ext_proc:decisions:rate5m{{job="{}", reason="{}"}}'
    for _, reason in sent:
        running.until(lambda r=reason: running.value(f"sum({rate.format(JOB, r)})") > 0, reason)
    running.until(
        lambda: running.value(f'sum(ext_proc:requests:rate5m{{job="{JOB}"}})') > 0, "requests"
    )
    assert running.query(f'ext_proc:processing_seconds:p99_5m{{job="{JOB}"}}')
    ratio = running.value(f'ext_proc:inflight_budget:ratio{{job="{JOB}"}}')
    assert 0 <= ratio < 0.5
    (errors,) = running.query(f'ext_proc:stream_errors:ratio_rate5m{{job="{JOB}"}}')
    assert float(errors["value"][1]) == 0
    # The alerts the traffic implies, and only those.
    implied = {
        ("ExtProcProofForgery", "disaggregated", "proof_bad_signature"),
        ("ExtProcProofForgery", "disaggregated", "proof_unknown_key"),
        ("ExtProcProofsExpiring", "disaggregated"),
        ("ExtProcAuditMode", "audit"),
    }
    running.until(lambda: implied <= running.firing(), f"alerts {implied}")
    # Decision latency depends on the machine, not on the traffic: left out.
    assert {a for a in running.firing() if a[0] != "ExtProcSlowDecisions"} == implied
    # Envoy's own series are there for the same routes.
    assert running.query('envoy_cluster_upstream_rq_xx{job="envoy"}')


# Outcomes `drive` does not produce: dashboard queries on them alone may return nothing.
NOT_PRODUCED = (
    "inflight_budget_exhausted",
    "no_signing_key|",  # the panel of mint routes' unsigned responses
)


def test_every_dashboard_query_runs_on_the_series_the_stack_exports(monitored):
    """Each panel's query, its variables given values, runs on this Prometheus, and every
    series it names exists here (the processor's, the rules', Envoy's)."""
    stack, running = monitored
    drive(stack)
    for expr in expressions():
        query = substituted(expr)
        for name in series_names(query):
            present = f'count({{__name__="{name}"}})'
            running.until(lambda p=present: running.value(p) > 0, f"{name} (in {expr})")
        # Data, unless the query asks only for outcomes this traffic does not produce.
        if not any(outcome in expr for outcome in NOT_PRODUCED):
            running.until(lambda q=query: bool(running.query(q)), f"data for {expr}")


def _workers(stack: Stack) -> set[int]:
    """The supervisor's worker processes (multiprocessing's spawned children; its
    resource tracker is a child too)."""
    supervisor = stack.children["processor"].pid
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue  # not a process, or one that ended meanwhile
        if parent == supervisor and b"spawn_main" in command:
            found.add(int(entry.name))
    return found


def test_a_restarted_worker_loses_no_count_and_a_stopped_processor_fires_down(monitored):
    """With workers, one killed and restarted by the supervisor: the service's counts go
    on from where they were (no counter reset). Then, with or without workers, the
    processor stopped: its target is down and Envoy sees no replica ready."""
    stack, running = monitored
    total = f'sum(ext_proc_decisions_total{{job="{JOB}"}})'
    drive(stack)
    running.until(lambda: running.value(total) > 0, "counted")
    time.sleep(2)  # every count scraped
    before = running.value(total)
    if stack.workers > 1:
        workers = _workers(stack)
        assert len(workers) == stack.workers
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        running.until(
            lambda: len(_workers(stack) - {victim}) == stack.workers, "the worker restarted"
        )
        # Serving its port again, and back in Envoy's rotation: no stream is refused.
        stack.wait_for_workers()
    sent = sum(drive(stack).values())
    running.until(lambda: running.value(total) >= before + sent, "counted after the restart")
    assert running.value(total) == before + sent
    assert running.value(f'sum(resets(ext_proc_decisions_total{{job="{JOB}"}}[5m]))') == 0
    # The processor gone: its target is down and the alert fires.
    stack.stop_processor()
    # Its target is down, and Envoy's health checks find no replica ready (Envoy checks
    # an idle cluster only once a minute: the requests, failed closed, are traffic).
    down = {("ExtProcDown",), ("ExtProcNoneReady",)}

    def alerted() -> bool:
        assert post(stack, AGGREGATED, chat()).status_code >= 500  # fail closed
        return down <= running.firing()

    running.until(alerted, f"{down} after the processor stopped")
