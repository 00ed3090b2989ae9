"""OpenTelemetry spans of the processor's decisions, in Envoy's traces
(docs/operations.md#traces).

One span per outcome (``ext_proc.decide``): the decision, its reason, the route, its
topology, the path, the mode and the request ids as attributes. Its parent is a W3C
trace context (``traceparent``, ``tracestate``), first found of:

- the ext_proc gRPC call's metadata: Envoy's tracer, when it runs, makes a span of the
  call to the processor (a child of its span of the request) and sends its context
  with the call. The request's own headers get Envoy's context only from the router,
  after every filter: the processor never sees it there;
- the request's headers: a client's (or an earlier proxy's) context, when Envoy traces
  nothing. It names a trace and a parent span, decides nothing, and its sampled flag
  chooses only whether this span is recorded.

The sampler follows the parent's sampled flag, so the processor records exactly the
traces Envoy records, and ``sample_ratio`` of the others.

A refusal is a correct outcome of the policy, not a failure of the processor: its span
status stays unset (as OpenTelemetry's HTTP conventions leave a server's 4xx); only a
stream the processor ends with an error status (a protocol error, an internal error)
gets status ERROR.

OpenTelemetry is imported by ``start`` alone, when the configuration turns tracing on:
with tracing off, the servicer holds no ``Spans`` and a request pays one ``is None``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from ext_proc.core.config import ConfigError, Tracing
from ext_proc.core.events import Event, Outcome, RequestBody, RequestHeaders, RequestTrailers
from ext_proc.core.route_policy import Topology
from ext_proc.version import DISTRIBUTION, version

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

SPAN_NAME: Final = "ext_proc.decide"
EXTRA: Final = f"{DISTRIBUTION}[tracing]"
# The headers of the trace context (W3C Trace Context), as the propagator reads them.
_CONTEXT: Final = ("traceparent", "tracestate")
# Request ids on the span, as OpenTelemetry names a request header's values.
_IDS: Final = ("x-request-id", "x-client-request-id")
# The longest attribute value a span keeps: a client's request id and path can be as
# long as Envoy's header limit (60 KiB), and every span of theirs is exported.
ATTRIBUTE_LENGTH: Final = 256


Carrier = dict[str, str]


def call_context(metadata: Iterable[tuple[str, str | bytes]] | None) -> Carrier:
    """The trace context the gRPC call's metadata carries (Envoy's span of the call)."""
    return {
        key: value for key, value in metadata or () if key in _CONTEXT and isinstance(value, str)
    }


def request_of(event: Event) -> RequestHeaders | None:
    """The request's headers and route, from the first event that carries them (the
    headers message, or the preamble of the first message when Envoy skipped it)."""
    if isinstance(event, RequestHeaders):
        return event
    if isinstance(event, RequestBody | RequestTrailers):
        return event.preamble
    return None


class Spans:
    """Makes and exports the spans of one process's decisions."""

    def __init__(
        self,
        provider: TracerProvider,
        tracer: Tracer,
        propagator: TraceContextTextMapPropagator,
    ) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode  # noqa: PLC0415

        self._provider = provider
        self._tracer = tracer
        self._propagator = propagator
        self._kind = SpanKind.SERVER
        self._status, self._error = Status, StatusCode.ERROR

    def decided(
        self,
        outcome: Outcome,
        call: Carrier,
        request: RequestHeaders | None,
        started_ns: int,
    ) -> None:
        """The span of ``outcome``, from ``started_ns`` (the request's first message) to
        now, under the trace context of the gRPC call (``call``) or else the request."""
        decision = outcome.decision
        attributes: dict[str, Any] = {
            "ext_proc.decision": decision.action,
            "ext_proc.reason": decision.reason,
            "ext_proc.route": outcome.route,
            "ext_proc.mode": outcome.mode,
            "ext_proc.phase": outcome.phase,
            "ext_proc.id_count": decision.id_count,
        }
        self._span(attributes, call, request, started_ns, error=None)

    def failed(
        self, reason: str, call: Carrier, request: RequestHeaders | None, started_ns: int
    ) -> None:
        """The span of a stream the processor ended with an error status (Envoy fails
        the request closed): status ERROR, ``error.type`` the reason."""
        self._span({}, call, request, started_ns, error=reason)

    def _span(
        self,
        attributes: dict[str, Any],
        call: Carrier,
        request: RequestHeaders | None,
        started_ns: int,
        error: str | None,
    ) -> None:
        carrier: dict[str, str] = {}
        if request is not None:
            attributes["url.path"] = request.path
            topology = request.route.values.get("topology", Topology.AGGREGATED.value)
            attributes["ext_proc.topology"] = str(topology)
            for name, value in request.headers:
                if name in _CONTEXT:
                    carrier[name] = value.decode("latin-1")
                elif name in _IDS:
                    attributes[f"http.request.header.{name}"] = (value.decode("latin-1"),)
        if "traceparent" in call:
            carrier = call
        parent = self._propagator.extract(carrier) if carrier else None
        span = self._tracer.start_span(
            SPAN_NAME,
            context=parent,
            kind=self._kind,
            attributes=attributes,
            start_time=started_ns or None,
        )
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(self._status(self._error, error))
        span.end()

    def shutdown(self) -> None:
        """Export what is left and stop (blocking: at most the exporter's timeout)."""
        self._provider.shutdown()


def now_ns() -> int:
    return time.time_ns()


def start(tracing: Tracing) -> Spans | None:
    """This process's ``Spans`` when ``tracing.enabled``, else None (nothing imported).
    Raises ``ConfigError`` when tracing is on and OpenTelemetry is not installed."""
    if not tracing.enabled:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import SpanLimits, TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
        from opentelemetry.sdk.trace.sampling import (  # noqa: PLC0415
            ParentBased,
            TraceIdRatioBased,
        )
        from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
            TraceContextTextMapPropagator,
        )
    except ImportError as exc:
        raise ConfigError(
            f"tracing.enabled needs OpenTelemetry: pip install '{EXTRA}' ({exc})"
        ) from None
    resource = Resource.create({"service.name": tracing.service_name, "service.version": version()})
    # Not the global provider: the process's spans go where this configuration says.
    provider = TracerProvider(
        resource=resource,
        sampler=ParentBased(TraceIdRatioBased(tracing.sample_ratio)),
        span_limits=SpanLimits(max_span_attribute_length=ATTRIBUTE_LENGTH),
    )
    exporter = OTLPSpanExporter(endpoint=f"http://{tracing.endpoint}", insecure=True)
    # Exported from the processor's own thread, in batches: a request only queues its span.
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Spans(provider, provider.get_tracer("ext_proc"), TraceContextTextMapPropagator())
