"""The decision spans, exported over OTLP/gRPC by the real exporter to a real receiver
(tests/collector.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from ext_proc.core.config import ConfigError, Tracing
from ext_proc.core.decisions import NO_PARAMS, Deny
from ext_proc.core.errors import Refusal
from ext_proc.core.events import (
    BodyMode,
    Outcome,
    RequestBody,
    RequestHeaders,
    ResponseBody,
    RouteMetadata,
)
from ext_proc.core.reasons import Reason
from ext_proc.edge import tracing
from tests.collector import Collector, Span

PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"
CALL_SPAN = "00f067aa0ba902b7"
SERVER = 2
UNSET, ERROR = 0, 2


def _request(*headers: tuple[str, bytes], topology: str | None = None) -> RequestHeaders:
    values = {} if topology is None else {"topology": topology}
    return RequestHeaders(
        headers=(("content-type", b"application/json"), *headers),
        end_of_stream=False,
        body_mode=BodyMode.BUFFERED,
        route=RouteMetadata(values, float(len(values)), "pd"),
        path="/pd/v1/chat/completions",
    )


def _parent(span: str = PARENT_SPAN, flags: str = "01") -> bytes:
    return f"00-{PARENT_TRACE}-{span}-{flags}".encode()


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector() as running:
        yield running


@pytest.fixture
def spans(collector: Collector) -> Iterator[tracing.Spans]:
    settings = Tracing(enabled=True, endpoint=str(collector.address), service_name="proc")
    started = tracing.start(settings)
    assert started is not None
    yield started
    started.shutdown()


def _exported(spans: tracing.Spans, collector: Collector) -> list[Span]:
    spans.shutdown()  # exports what is queued, then stops
    return collector.spans()


def test_off_starts_nothing():
    assert tracing.start(Tracing()) is None


def test_a_decision_span_joins_the_requests_trace(spans, collector):
    request = _request(
        ("x-request-id", b"gw-1"),
        ("traceparent", _parent()),
        ("tracestate", b"vendor=1"),
        ("x-client-request-id", b"client-1"),
        topology="disaggregated",
    )
    outcome = Outcome(NO_PARAMS, audit=False, route="pd", body_size=2, request_id="gw-1")
    started = tracing.now_ns()
    spans.decided(outcome, {}, request, started)
    (span,) = _exported(spans, collector)
    assert (span.service, span.name, span.kind) == ("proc", tracing.SPAN_NAME, SERVER)
    assert (span.trace_id, span.parent_span_id) == (PARENT_TRACE, PARENT_SPAN)
    assert span.status_code == UNSET
    assert span.attributes == {
        "ext_proc.decision": "allow",
        "ext_proc.reason": "no_transfer_params",
        "ext_proc.route": "pd",
        "ext_proc.mode": "enforce",
        "ext_proc.phase": "request",
        "ext_proc.id_count": 0,
        "ext_proc.topology": "disaggregated",
        "url.path": "/pd/v1/chat/completions",
        "http.request.header.x-request-id": ["gw-1"],
        "http.request.header.x-client-request-id": ["client-1"],
    }


def test_the_calls_trace_context_comes_before_the_requests(spans, collector):
    """Envoy's span of the ext_proc call, sent in the call's metadata, is the parent; a
    traceparent in the request's headers (a client's) is not."""
    request = _request(("traceparent", _parent()))
    call = tracing.call_context([("traceparent", _parent(CALL_SPAN).decode()), ("x", "y")])
    assert call == {"traceparent": _parent(CALL_SPAN).decode()}
    outcome = Outcome(NO_PARAMS, audit=False, route="pd", body_size=2, request_id="")
    spans.decided(outcome, call, request, tracing.now_ns())
    (span,) = _exported(spans, collector)
    assert (span.trace_id, span.parent_span_id) == (PARENT_TRACE, CALL_SPAN)
    assert span.attributes["ext_proc.topology"] == "aggregated"  # the route states none


def test_a_denial_is_no_error_and_a_failed_stream_is(spans, collector):
    deny = Deny(Refusal(400, "invalid_request_error", Reason.DENIED_BY_POLICY, "refused"))
    outcome = Outcome(deny, audit=False, route="deny", body_size=2, request_id="r")
    spans.decided(outcome, {}, None, tracing.now_ns())
    spans.failed("protocol_violation", {}, None, tracing.now_ns())
    denied, failed = _exported(spans, collector)
    assert (denied.attributes["ext_proc.decision"], denied.status_code) == ("deny", UNSET)
    assert denied.parent_span_id == ""  # no trace context: a root span
    assert failed.status_code == ERROR
    assert failed.attributes == {"error.type": "protocol_violation"}


def test_an_unsampled_parent_records_nothing(spans, collector):
    outcome = Outcome(NO_PARAMS, audit=False, route="pd", body_size=2, request_id="")
    spans.decided(outcome, {}, _request(("traceparent", _parent(flags="00"))), 0)
    spans.decided(outcome, {}, _request(), 0)
    (span,) = _exported(spans, collector)
    assert span.parent_span_id == ""


def test_a_clients_long_values_are_cut(spans, collector):
    """A client chooses its request id and path, up to Envoy's header limit: the span
    keeps ``ATTRIBUTE_LENGTH`` characters of each."""
    long = b"x" * 10_000
    request = RequestHeaders(
        headers=(("x-client-request-id", long),),
        end_of_stream=False,
        body_mode=BodyMode.BUFFERED,
        route=RouteMetadata({}, 0.0, "r"),
        path="/" + "p" * 10_000,
    )
    outcome = Outcome(NO_PARAMS, audit=False, route="r", body_size=2, request_id="")
    spans.decided(outcome, {}, request, tracing.now_ns())
    (span,) = _exported(spans, collector)
    (client_id,) = span.attributes["http.request.header.x-client-request-id"]
    assert client_id == "x" * tracing.ATTRIBUTE_LENGTH
    assert span.attributes["url.path"] == "/" + "p" * (tracing.ATTRIBUTE_LENGTH - 1)


def test_the_request_comes_with_its_first_message():
    request = _request()
    assert tracing.request_of(request) is request
    assert tracing.request_of(RequestBody(b"{}", True, request)) is request
    assert tracing.request_of(RequestBody(b"{}", True)) is None
    assert tracing.request_of(ResponseBody(b"", True)) is None


def test_serving_with_tracing_off_imports_no_tracer():
    """Off, nothing of the tracing SDK or the exporter is imported. (redis-py imports
    OpenTelemetry's API and metrics SDK by itself once they are installed: its own
    observability, not this processor's.)"""
    probe = (
        "import sys; from ext_proc.core.config import Config; "
        "from ext_proc.edge.service import ExternalProcessor; "
        "from ext_proc.edge import server, tracing; "
        "assert tracing.start(Config.load(environ={}).tracing) is None; "
        "ExternalProcessor(Config.load(environ={})); "
        "print(sorted(m for m in sys.modules if m.startswith(("
        "'opentelemetry.sdk.trace', 'opentelemetry.exporter', "
        "'opentelemetry.trace.propagation.tracecontext'))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_tracing_on_without_opentelemetry_names_the_extra():
    probe = (
        "import sys; sys.modules['opentelemetry'] = None; "
        "from ext_proc.core.config import Tracing, ConfigError; "
        "from ext_proc.edge import tracing\n"
        "try:\n    tracing.start(Tracing(enabled=True))\n"
        "except ConfigError as exc:\n    print('ConfigError:', exc)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.startswith(f"{ConfigError.__name__}: tracing.enabled needs")
    assert tracing.EXTRA in done.stdout
