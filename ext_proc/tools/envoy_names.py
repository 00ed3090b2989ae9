"""The Envoy names that both ``envoy-config`` writes and ``check-envoy`` reads.

Only names live here: what the generator builds and what the checker concludes stay
apart, so the check remains a second opinion on the generator's output. Plain strings,
no imports: the checker loads this without the generator's dependencies.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

# Envoy's buffer filter: it holds a request until its whole body is there.
BUFFER_FILTER: Final = "envoy.filters.http.buffer"
# The ext_proc filter's per-route configuration (a bare protobuf type name).
PER_ROUTE_TYPE: Final = "envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
# What a mint route needs the processor to see of the response: its headers, then the
# whole body at once (processing_mode fields and their values).
MINT_RESPONSE: Final[Mapping[str, str]] = MappingProxyType(
    {"response_header_mode": "SEND", "response_body_mode": "BUFFERED"}
)

# Envoy's response code details for a failure of the ext_proc filter itself (a gRPC
# error, a stream that could not be opened, a message timeout), never for a decision of
# the processor's, whose details start with ``token_policy_``.
PROCESSOR_FAILED: Final = "ext_proc_error_"
# The processor ending a stream it will not serve (FAILED_PRECONDITION: a message order
# or body mode it does not accept): the same request fails the same way again.
PROCESSOR_REFUSED_STREAM: Final = "ext_proc_error_gRPC_error_9{"
_FAILED: Final = f"response.code_details.startsWith('{PROCESSOR_FAILED}')"
_REFUSED: Final = f"response.code_details.startsWith('{PROCESSOR_REFUSED_STREAM}')"
# Any other such failure before the router chose an upstream host (the processor
# unreachable, gone mid-stream, failing, or silent past message_timeout): nothing of the
# request left the gateway, so a client may send it again (CEL on Envoy's attributes).
RETRY_SAFE: Final = f"{_FAILED} && !{_REFUSED} && !has(upstream.address)"
# The rest: a refused stream, or a failure after the router chose a host (the upstream
# may have the request).
RETRY_UNSAFE: Final = f"{_FAILED} && ({_REFUSED} || has(upstream.address))"
# The status and the retry-after (seconds) of a retry-safe processor failure.
RETRY_STATUS: Final = 503
RETRY_AFTER: Final = "1"
# The retry-after header's value where no local reply mapper can set it (a route's or
# virtual host's response_headers_to_add): empty, so not added, for any other answer.
RETRY_AFTER_FORMAT: Final = f"%CEL({RETRY_SAFE} ? '{RETRY_AFTER}' : '')%"
