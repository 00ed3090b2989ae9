"""Request headers that the stacks around vLLM parse for an address, a peer or a prompt,
and the request id: what the gateway's header step does with each before any later
filter, or any upstream, sees a client's copy (docs/trust.md#header-carriers).

A client can set any header. The components behind the gateway trust these because they
expect only their own peers to set them; none authenticates them. Envoy runs the header
step right before this processor's ext_proc filter, on every route and in every body
arrangement (the processor is not sent the headers when one message carries the
request), so the processor and every filter after it (an endpoint picker that writes
its own copy) see the client's request without them. This module is their one source:
``envoy-config`` writes the step, ``check-envoy`` demands it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from ext_proc.core import classified
from ext_proc.tools.router_headers import ROUTER_HEADERS

# Envoy's filter that removes and sets request headers in the filter chain (not the
# route's headers_to_remove, which the router applies after every filter: it would also
# remove what a later filter such as the endpoint picker wrote).
FILTER: Final = "envoy.filters.http.header_mutation"
FILTER_TYPE: Final = (
    "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation"
)

# Every request header a component behind the gateway reads an address, a peer, tokens
# or transfer parameters from, generated from the classification of what their sources
# read (docs/trust.md#header-carriers says who reads each and what a client's copy
# does there), then every header a component partitions its prefix cache by (a
# client's copy names any tenant it likes: docs/trust.md#tenants).
ROUTING_HEADERS: Final = (*classified.HEADER_CARRIERS, *classified.PARTITION_HEADERS)

# vLLM builds its request id from this header (else the body's request_id); vLLM's
# MoRIIO connector reads a peer's address from that id, and a prefill server's
# connector returns it in the kv_transfer_params a mint route signs. The header step
# moves the id the request came with to CLIENT_REQUEST_ID, which nothing downstream
# parses, and gives the request a fresh one (NEW_ID): Envoy's access log, the
# processor's log lines and vLLM's request id then all carry the gateway's id.
REQUEST_ID: Final = "x-request-id"
CLIENT_REQUEST_ID: Final = "x-client-request-id"
# The request id the step sets, as an Envoy format string: a random UUID per request.
NEW_ID: Final = "%UNIQUE_ID%"
# The id the request came with (the client's, else the one Envoy made for it).
INCOMING_ID: Final = "%REQ(x-request-id)%"


def removed(extra: Iterable[str] = ()) -> tuple[str, ...]:
    """Every header the step removes: the routing headers, the router's retry and hedge
    headers (``router_headers``: whatever a filter before the step wrote into them, the
    router never reads), then an operator's own (each once); the two request id headers
    are set, never listed."""
    names = dict.fromkeys((*ROUTING_HEADERS, *ROUTER_HEADERS, *extra))
    names.pop(REQUEST_ID, None)
    names.pop(CLIENT_REQUEST_ID, None)
    return tuple(names)
