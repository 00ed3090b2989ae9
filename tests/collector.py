"""An OTLP/gRPC trace receiver that keeps every span exported to it: OpenTelemetry's own
TraceService on a real gRPC server (port 0), in threads of the test process. Envoy's
OpenTelemetry tracer and the processor's exporter both send to it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from ext_proc.core.address import HostPort


@dataclass(frozen=True)
class Span:
    """One exported span, with the ``service.name`` of the resource that sent it."""

    service: str
    name: str
    trace_id: str  # hex, as in a traceparent
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: int
    status_code: int
    attributes: dict[str, Any]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


class _Service(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self, collector: Collector) -> None:
        self._collector = collector

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self._collector.add(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class Collector:
    """Listens on 127.0.0.1 (``address``, once started) and keeps what it is sent."""

    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Service(self), self._server)
        self.address = HostPort("127.0.0.1", self._server.add_insecure_port("127.0.0.1:0"))

    def __enter__(self) -> Collector:
        self._server.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.stop(None)

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = str(resource.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                spans.extend(
                    Span(
                        service=service,
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        status_code=span.status.code,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                    )
                    for span in scope_spans.spans
                )
        with self._lock:
            self._spans.extend(spans)

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def wait_for(self, found: Callable[[list[Span]], bool], timeout: float = 20.0) -> list[Span]:
        """Every span, once ``found`` holds of them; fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if found(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"not found within {timeout} s among {spans}")
            time.sleep(0.05)
