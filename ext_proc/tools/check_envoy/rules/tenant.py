"""A route that reads its tenant from a header (``tenant: header:<name>``) is as good as
the filter that sets that header: a client can send it too. Before this processor's
first filter, a ``header_mutation`` filter must remove or overwrite the client's copy
(the operator's identity filter, ``jwt_authn``'s ``claim_to_headers`` or an
``ext_authz`` server, then sets it between the two); and with one message per request
the filter must request the header as an attribute, or no request names a tenant
(docs/trust.md#tenants)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from ext_proc.core.route_policy import RoutePolicy, TenantKind
from ext_proc.edge.attributes import header
from ext_proc.tools import carrier_headers
from ext_proc.tools.check_envoy.findings import Finding, error
from ext_proc.tools.check_envoy.reader import Chain, Route

OVERWRITE: Final = "OVERWRITE_IF_EXISTS_OR_ADD"


def _guards(entry: dict[str, Any], name: str) -> bool:
    """Whether the filter ``entry`` is a header_mutation that, where it runs, leaves no
    client's value in ``name``: its last mutation of it removes it, or overwrites it."""
    config = entry.get("typed_config", {})
    if config.get("@type") != carrier_headers.FILTER_TYPE or entry.get("disabled", False):
        return False
    if config.get("most_specific_header_mutations_wins", False):
        return False  # a route's own mutations would stand in for these
    guarded = False
    for mutation in config.get("mutations", {}).get("request_mutations", []):
        if not isinstance(mutation, dict):
            continue
        if str(mutation.get("remove", "")).lower() == name:
            guarded = True
        option = mutation.get("append")
        written = option.get("header") if isinstance(option, dict) else None
        if isinstance(written, dict) and str(written.get("key", "")).lower() == name:
            guarded = isinstance(option, dict) and option.get("append_action") == OVERWRITE
    return guarded


def tenant_header(route: Route, chain: Chain, policy: RoutePolicy) -> Iterator[Finding]:
    if policy.tenant is None or policy.tenant.kind is not TenantKind.HEADER:
        return
    name = policy.tenant.value
    filters = chain.filters
    first = next(i for i, f in enumerate(filters) if f.get("name") in chain.names)
    if not any(_guards(entry, name) for entry in filters[:first]):
        yield error(
            "tenant-header-unguarded",
            route.place,
            f"the route reads its tenant from {name}, which no header_mutation filter before "
            "this processor's removes or overwrites: a client names any tenant by sending "
            "it. Remove it first in the chain, then let the identity filter set it",
        )
    one_message = any(
        config.get("processing_mode", {}).get("request_header_mode") == "SKIP"
        for config in chain.configs.values()
    )
    if one_message and header(name) not in chain.requested:
        yield error(
            "tenant-header-not-requested",
            route.place,
            f"the route reads its tenant from {name}, which no ext_proc filter of this "
            f"processor requests as an attribute ({header(name)}): every request is refused",
        )
