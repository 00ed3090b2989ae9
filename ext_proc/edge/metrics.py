"""Prometheus metrics, owned by the service edge (the core never counts anything).

With several workers each process writes to ``PROMETHEUS_MULTIPROC_DIR`` and the
supervisor serves the aggregate; with one process the registry is served directly.
Either way ``serve_metrics`` is the one place the HTTP endpoint is started.

What is counted on every request (a decision, its body size, the processor's time) is
counted with prometheus_client's metrics in multiprocess mode, whose values are the
files the supervisor aggregates; in one process, as plain numbers a collector reads at
each scrape (``_Tally``), exposed exactly as those metrics expose them: a label lookup
and a lock per value cost several times the increment.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable
from typing import Any, Final
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
    values,
)
from prometheus_client import metrics as client_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.utils import floatToGoString

from ext_proc.core.address import HostPort
from ext_proc.core.config import ConfigError
from ext_proc.core.decisions import REASONS_BY_ACTION
from ext_proc.core.reasons import Reason
from ext_proc.version import version

# How a stream can end in error (``ext_proc_stream_errors_total``'s kind label).
# shutdown: still open when the server stopped after its grace.
STREAM_ERROR_KINDS: Final = ("protocol_violation", "internal", "cancelled", "shutdown")
# Body sizes from 1 KiB to 64 MiB, processing times from 50 µs to 5 s.
BODY_BUCKETS: Final = tuple(float(1024 * 4**i) for i in range(9))
TIME_BUCKETS: Final = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip


DECISIONS: Final = (
    "ext_proc_decisions",
    "Policy decisions by route, action (allow, strip, honor, deny, mint), reason and mode "
    "(enforce, audit).",
)
DECISION_LABELS: Final = ("route", "action", "reason", "mode")
BODY_BYTES: Final = ("ext_proc_request_body_bytes", "Size of inspected request bodies.")
PROCESSING_SECONDS: Final = (
    "ext_proc_processing_seconds",
    "Processor time spent on one request (parsing, policy, rewriting, encoding).",
)

# decided(route, action, reason, mode, body_size): count one decision; a request's body
# size is observed too (0: none). observe_processing(route, seconds).
Decided = Callable[[str, str, Reason, str, int], None]
Observed = Callable[[str, float], None]


class Metrics:
    """The service's metrics. ``tally``: count each request's outcome as plain numbers
    (``_Tally``); by default, unless prometheus_client is in multiprocess mode."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, tally: bool | None = None
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        if tally is None:
            # prometheus_client's choice, made at its import: values in files, or here.
            tally = values.ValueClass is values.MutexValue
        self.tallied = tally
        outcomes = _Tally(self.registry) if tally else _Children(self.registry)
        self.decided: Decided = outcomes.decided
        self.observe_processing: Observed = outcomes.observe_processing
        self.default_policy = _default_policy(self.registry)
        self.inflight_streams, self.inflight_bytes, self.inflight_limit = _gauges(self.registry)
        self.stream_errors = _stream_errors(self.registry)
        self.parsed_by_upb = _parsed_by_upb(self.registry)
        self.record_errors, self.record_up = _record(self.registry)
        self.build_info = _build_info(self.registry)

    def sample(self, streams: int, held: int, limit: int) -> None:
        """Set the in-flight gauges (sampled, not updated on every request)."""
        self.inflight_streams.set(streams)
        self.inflight_bytes.set(held)
        self.inflight_limit.set(limit)


def _exported(route: str, mode: str) -> Iterable[tuple[str, str, str, str]]:
    """The decision series exported at 0 for ``route`` in ``mode`` on the route's first
    outcome in that mode: every action and reason it is reported with, so that a panel
    or a ratio reads 0 for a reason not seen yet rather than no series. A route is known
    only once Envoy names it, so nothing is exported before a route's first outcome."""
    for action, reasons in REASONS_BY_ACTION.items():
        for reason in reasons:
            yield route, action, reason, mode


class _Children:
    """Each request's outcome counted with prometheus_client's metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(*DECISIONS, DECISION_LABELS, registry=registry)
        self.body_bytes, self.processing_seconds = _histograms(registry)
        # Labelled children by label values: labels() validates and locks on every call.
        # Bounded: routes come from the Envoy config, actions, reasons and modes from
        # this package.
        self._decided: dict[tuple[str, ...], tuple[Any, Any]] = {}
        self._processing: dict[str, Any] = {}
        # The (route, mode) pairs whose every decision series is exported.
        self._exported: set[tuple[str, str]] = set()

    def decided(self, route: str, action: str, reason: Reason, mode: str, body_size: int) -> None:
        """Count one decision; a request's body size is observed too (0: none)."""
        key = (route, action, reason, mode)
        children = self._decided.get(key)
        if children is None:
            if (route, mode) not in self._exported:
                self._export(route, mode)
            children = self._decided[key] = (
                self.decisions.labels(route, action, reason, mode),
                self.body_bytes.labels(route),
            )
        children[0].inc()
        if body_size:
            children[1].observe(body_size)

    def _export(self, route: str, mode: str) -> None:
        self._exported.add((route, mode))
        for labels in _exported(route, mode):
            self.decisions.labels(*labels)

    def observe_processing(self, route: str, seconds: float) -> None:
        child = self._processing.get(route)
        if child is None:
            child = self._processing[route] = self.processing_seconds.labels(route)
        child.observe(seconds)


class _Count:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0
        self.created = time.time()


class _Observed:
    """One histogram series: the observations in each bucket (the last: above every
    bound), their sum, and when the series began."""

    __slots__ = ("counts", "created", "sum")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)
        self.sum = 0.0
        self.created = time.time()


class _Tally:
    """Each request's outcome counted as plain numbers in this process, exposed at each
    scrape as ``_Children``'s metrics expose it (the same series, created in the same
    order, the same samples). A histogram observation goes to the first bucket whose
    bound is at least the value, as prometheus_client's. A scrape reads from another
    thread while the loop counts: each number is read whole, and no more than
    prometheus_client's metrics (a lock per value) is a histogram read at one instant."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # Every decision series, in the order created; and by label values, with the
        # route's body sizes, those counted so far.
        self._series: dict[tuple[str, str, str, str], _Count] = {}
        self._decided: dict[tuple[str, str, str, str], tuple[_Count, _Observed]] = {}
        self._exported: set[tuple[str, str]] = set()
        self._bodies: dict[str, _Observed] = {}
        self._processing: dict[str, _Observed] = {}
        registry.register(self)

    def decided(self, route: str, action: str, reason: Reason, mode: str, body_size: int) -> None:
        key = (route, action, reason, mode)
        cells = self._decided.get(key)
        if cells is None:
            cells = self._decided[key] = self._new(key)
        cells[0].value += 1
        if body_size:
            body = cells[1]
            body.counts[bisect.bisect_left(BODY_BUCKETS, body_size)] += 1
            body.sum += body_size

    def _new(self, key: tuple[str, str, str, str]) -> tuple[_Count, _Observed]:
        route, _, _, mode = key
        if (route, mode) not in self._exported:
            self._exported.add((route, mode))
            for labels in _exported(route, mode):
                if labels not in self._series:
                    self._series[labels] = _Count()
        count = self._series.get(key)
        if count is None:
            count = self._series[key] = _Count()
        body = self._bodies.get(route)
        if body is None:
            body = self._bodies[route] = _Observed(len(BODY_BUCKETS))
        return count, body

    def observe_processing(self, route: str, seconds: float) -> None:
        observed = self._processing.get(route)
        if observed is None:
            observed = self._processing[route] = _Observed(len(TIME_BUCKETS))
        observed.counts[bisect.bisect_left(TIME_BUCKETS, seconds)] += 1
        observed.sum += seconds

    def describe(self) -> list[Metric]:
        return [
            Metric(DECISIONS[0], DECISIONS[1], "counter"),
            Metric(*BODY_BYTES, "histogram"),
            Metric(*PROCESSING_SECONDS, "histogram"),
        ]

    def collect(self) -> list[Metric]:
        # As prometheus_client's own (PROMETHEUS_DISABLE_CREATED_SERIES).
        created = client_metrics._use_created
        decisions, bodies, processing = self.describe()
        name = DECISIONS[0]
        for labels, count in list(self._series.items()):
            named = dict(zip(DECISION_LABELS, map(str, labels), strict=True))
            decisions.add_sample(name + "_total", named, float(count.value))
            if created:
                decisions.add_sample(name + "_created", named, count.created)
        _histogram(bodies, self._bodies, _BODY_LE, created)
        _histogram(processing, self._processing, _TIME_LE, created)
        return [decisions, bodies, processing]


# Each bucket's bound as prometheus_client labels it, the last above every bound.
_BODY_LE: Final = (*map(floatToGoString, BODY_BUCKETS), "+Inf")
_TIME_LE: Final = (*map(floatToGoString, TIME_BUCKETS), "+Inf")


def _histogram(
    family: Metric, series: dict[str, _Observed], bounds: tuple[str, ...], created: bool
) -> None:
    """``series`` (by route) as prometheus_client's Histogram samples them."""
    name = family.name
    for route, observed in list(series.items()):
        total = 0.0
        for le, count in zip(bounds, list(observed.counts), strict=True):
            total += count
            family.add_sample(name + "_bucket", {"route": route, "le": le}, total)
        family.add_sample(name + "_count", {"route": route}, total)
        family.add_sample(name + "_sum", {"route": route}, observed.sum)
        if created:
            family.add_sample(name + "_created", {"route": route}, observed.created)


def _default_policy(registry: CollectorRegistry) -> Counter:
    """The requests given the default policy. Fail closed on a shared gateway: a route
    the filter runs on without a policy gets the strictest one, counted so a route left
    out of the values shows."""
    return Counter(
        "ext_proc_default_policy_requests",
        "Requests on a route without policy metadata (given the default policy, "
        "aggregated + strip), by route.",
        ["route"],
        registry=registry,
    )


def _histograms(registry: CollectorRegistry) -> tuple[Histogram, Histogram]:
    """Body sizes and processor time, per route."""
    body_bytes = Histogram(*BODY_BYTES, ["route"], buckets=BODY_BUCKETS, registry=registry)
    processing_seconds = Histogram(
        *PROCESSING_SECONDS, ["route"], buckets=TIME_BUCKETS, registry=registry
    )
    return body_bytes, processing_seconds


def _gauges(registry: CollectorRegistry) -> tuple[Gauge, Gauge, Gauge]:
    """What is held now: streams, body bytes, and the budget they are held against
    (summed over live workers)."""

    def gauge(name: str, doc: str) -> Gauge:
        return Gauge(name, doc, registry=registry, multiprocess_mode="livesum")

    return (
        gauge("ext_proc_inflight_streams", "ext_proc streams open now."),
        gauge(
            "ext_proc_inflight_body_bytes",
            "Request-body bytes held now (the in-flight budget in use).",
        ),
        gauge(
            "ext_proc_inflight_budget_limit_bytes",
            "The in-flight budget: request-body bytes that may be held at once (503 beyond).",
        ),
    )


def _stream_errors(registry: CollectorRegistry) -> Counter:
    """Streams ended with an error, by kind."""
    stream_errors = Counter(
        "ext_proc_stream_errors",
        "Streams ended with an error: protocol_violation, internal, cancelled, shutdown.",
        ["kind"],
        registry=registry,
    )
    # Every kind exported from the start, at 0: a ratio of errors (and an alert on
    # it) then has a value before the first error, not no series at all.
    for kind in STREAM_ERROR_KINDS:
        stream_errors.labels(kind)
    return stream_errors


def _parsed_by_upb(registry: CollectorRegistry) -> Counter:
    """Messages the compiled wire reader left to upb (``codec.Decoder``): each costs a
    second parse, so a rise says Envoy sends something the reader does not read."""
    return Counter(
        "ext_proc_messages_parsed_by_upb",
        "Envoy's messages the compiled wire reader could not read exactly, parsed by upb "
        "instead (slower; malformed messages included).",
        registry=registry,
    )


def _record(registry: CollectorRegistry) -> tuple[Counter, Gauge]:
    """The record of spent proofs: consultations that failed, and whether it is up."""
    record_errors = Counter(
        "ext_proc_proof_record_errors",
        "Proofs not honored because the record of spent proofs could not be consulted "
        "(store: redis).",
        ["store"],
        registry=registry,
    )
    record_errors.labels("redis")
    # 1 while the last consultation of the record found it able to keep the record,
    # 0 before the first and while it cannot be reached or cannot keep it; with
    # several workers, the lowest: a worker that honors nothing shows.
    record_up = Gauge(
        "ext_proc_proof_record_up",
        "1 when the record of spent proofs (store: redis) answered the last "
        "consultation and can keep the record; 0 otherwise (no proof is honored).",
        ["store"],
        registry=registry,
        multiprocess_mode="livemin",
    )
    return record_errors, record_up


def _build_info(registry: CollectorRegistry) -> Gauge:
    """The running version."""
    # 1, labelled with the running version: a rollout shows as two series, and
    # `count by (version)` says how many replicas run each.
    build_info = Gauge(
        "ext_proc_build_info",
        "The processor's version (label version); always 1.",
        ["version"],
        registry=registry,
        multiprocess_mode="livemax",
    )
    build_info.labels(version()).set(1)
    return build_info


class Endpoint:
    """A running ``/metrics`` HTTP endpoint (served from a daemon thread)."""

    def __init__(self, server: WSGIServer) -> None:
        self._server = server
        self.port: int = server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve_metrics(address: HostPort, registry: CollectorRegistry) -> Endpoint:
    """Serve ``registry`` at ``http://address/metrics``.

    An address that cannot be bound is an operator error: ``ConfigError`` naming the
    address and the setting that chose it.
    """
    try:
        server, _ = start_http_server(address.port, address.host, registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {address} for metrics: {exc.strerror or exc} "
            "(setting: metrics_listen / --metrics-listen / EXT_PROC_METRICS_LISTEN)"
        ) from None
    return Endpoint(server)


def aggregate(directory: str) -> CollectorRegistry:
    """A registry reading every worker's samples from ``directory`` on each scrape."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    return registry
