"""The request headers the processor reads, by name: one list each, for the stream, the
edge that asks Envoy for them as attributes, and the route policy that refuses to take
a tenant from one a client writes."""

from __future__ import annotations

from typing import Final

# The request headers the stream reads (the edge asks Envoy for them as attributes
# when it skips the headers message: ``ext_proc.edge.attributes``).
CHECKED_HEADERS: Final = ("content-type", "content-encoding", "content-length", "x-request-id")
# The headers only a decision's span reads: the W3C trace context and the request id the
# request came with, which the header step moves aside. Each holds what a client sent
# (Envoy's tracer renews the trace context only where it traces).
TRACE_HEADERS: Final = ("traceparent", "tracestate", "x-client-request-id")
