"""Prometheus metrics, owned by the service edge (the core never counts anything).

With several workers each process writes to ``PROMETHEUS_MULTIPROC_DIR`` and the
supervisor serves the aggregate; with one process the registry is served directly.
Either way ``serve_metrics`` is the one place the HTTP endpoint is started.
"""

from __future__ import annotations

from typing import Any, Final
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector

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


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.decisions, self.default_policy = _decision_counters(self.registry)
        self.body_bytes, self.processing_seconds = _histograms(self.registry)
        self.inflight_streams, self.inflight_bytes, self.inflight_limit = _gauges(self.registry)
        self.stream_errors = _stream_errors(self.registry)
        self.record_errors, self.record_up = _record(self.registry)
        self.build_info = _build_info(self.registry)
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
        """Every action and reason it is reported with, at 0 for ``route`` in ``mode``
        (the route's first outcome in that mode): a panel or a ratio then reads 0 for a
        reason not seen yet, rather than no series. A route is known only once Envoy
        names it, so nothing is exported before a route's first outcome."""
        self._exported.add((route, mode))
        for action, reasons in REASONS_BY_ACTION.items():
            for reason in reasons:
                self.decisions.labels(route, action, reason, mode)

    def observe_processing(self, route: str, seconds: float) -> None:
        child = self._processing.get(route)
        if child is None:
            child = self._processing[route] = self.processing_seconds.labels(route)
        child.observe(seconds)

    def sample(self, streams: int, held: int, limit: int) -> None:
        """Set the in-flight gauges (sampled, not updated on every request)."""
        self.inflight_streams.set(streams)
        self.inflight_bytes.set(held)
        self.inflight_limit.set(limit)


def _decision_counters(registry: CollectorRegistry) -> tuple[Counter, Counter]:
    """What was decided: every decision, and the requests given the default policy."""
    decisions = Counter(
        "ext_proc_decisions",
        "Policy decisions by route, action (allow, strip, honor, deny, mint), reason and mode "
        "(enforce, audit).",
        ["route", "action", "reason", "mode"],
        registry=registry,
    )
    # Fail closed on a shared gateway: a route the filter runs on without a policy
    # gets the strictest one, counted so a route left out of the values shows.
    default_policy = Counter(
        "ext_proc_default_policy_requests",
        "Requests on a route without policy metadata (given the default policy, "
        "aggregated + strip), by route.",
        ["route"],
        registry=registry,
    )
    return decisions, default_policy


def _histograms(registry: CollectorRegistry) -> tuple[Histogram, Histogram]:
    """Body sizes and processor time, per route."""
    body_bytes = Histogram(
        "ext_proc_request_body_bytes",
        "Size of inspected request bodies.",
        ["route"],
        buckets=BODY_BUCKETS,
        registry=registry,
    )
    processing_seconds = Histogram(
        "ext_proc_processing_seconds",
        "Processor time spent on one request (parsing, policy, rewriting, encoding).",
        ["route"],
        buckets=TIME_BUCKETS,
        registry=registry,
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
