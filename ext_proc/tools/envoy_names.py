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
