"""A route that reads its tenant from a header (``tenant: header:<name>``) is as good as
the filter that sets that header: a client can send it too. So the header is followed
through the filters before this processor's first one, in order, on each route (each of
its weighted clusters), starting with the client's copy:

- a ``header_mutation`` that runs on the route clears it when the last of its mutations
  of the header, its own then each route-level ``HeaderMutationPerRoute`` in Envoy's
  order (``writes.route_configs``), removes it or overwrites it
  (``OVERWRITE_IF_EXISTS_OR_ADD``) with a value that is no request's and is written
  (an empty value is not), and no route-level configuration of it writes the header
  from the request. With ``most_specific_header_mutations_wins`` it clears nothing;
- any other write a configuration states (``writes``) leaves it unguarded: a value
  from the request puts a client's back (the guard's own too), an append or an
  add-if-absent keeps a client's copy beside it or, where the identity filter set
  none, names a tenant no credential did;
- what a server or a script chooses at run time (``ext_authz``, ``jwt_authn``, Lua) is
  the identity filter's business: the operator's set-up removes the client's copy, then
  lets that filter set it.

A client's copy that can reach the processor is ``tenant-header-unguarded``.

Whatever its source, a route that names a tenant must send the processor every
request's headers (``tenant-headers-skipped``): where a filter skips them (one message
per request), a request without a body never reaches the processor and is forwarded
naming no tenant, and vLLM reads and cancels a stored response by its id alone
(docs/trust.md#tenants)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final

from ext_proc.core.route_policy import RoutePolicy, TenantKind
from ext_proc.tools import carrier_headers
from ext_proc.tools.check_envoy.effective import ext_proc_mode, running, runs
from ext_proc.tools.check_envoy.findings import Finding, error, warning
from ext_proc.tools.check_envoy.reader import Chain, Route
from ext_proc.tools.check_envoy.writes import (
    OVERWRITE,
    Mutation,
    client_derived,
    last_mutations,
    request_mutations,
    route_configs,
    writes,
)

# Why a client's copy is there before any filter ran.
UNTOUCHED: Final = "no header_mutation filter before this processor's removes or overwrites it"


def _clears(mutation: Mutation) -> bool:
    """Whether a header_mutation's last mutation of a header leaves no client's value."""
    if mutation.value is None:
        return True
    written = mutation.value != "" or mutation.keeps_empty
    return mutation.action == OVERWRITE and written and not client_derived(mutation.value)


def _guard(entry: dict[str, Any], levels: Sequence[Any], name: str, why: str | None) -> str | None:
    """What the header_mutation ``entry`` leaves in ``name`` on a route of ``levels``:
    None for no client's value, else why one can be there (``why``: before it)."""
    called = entry.get("name")
    config = entry.get("typed_config", {})
    own = last_mutations(request_mutations(config)).get(name)
    routed = [
        done
        for level in route_configs(levels, str(called))
        if (done := last_mutations(request_mutations(level)).get(name)) is not None
    ]
    if not runs(entry, levels):
        if why is None or (own is None and not routed):
            return why
        off = (
            "it is disabled" if entry.get("disabled") else "a route-level FilterConfig disables it"
        )
        return f"{called} does not run on this route ({off})"
    copied = [m.value for m in routed if m.value is not None and client_derived(m.value)]
    if copied:
        level = "a route-level HeaderMutationPerRoute"
        return f"{level} of {called} writes it from the request ({copied[0]!r})"
    effective = ([own] if own is not None else []) + routed
    if not effective:
        return why
    if config.get("most_specific_header_mutations_wins", False):
        return (
            f"{called} sets most_specific_header_mutations_wins (a route's mutations stand in "
            "for its own), so it is taken as no guard"
        )
    if _clears(effective[-1]):
        return None
    if own is not None and own.value is not None and client_derived(own.value):
        return f"{called} writes it from the request ({own.value!r})"
    last = effective[-1]
    skipped = ", an empty value Envoy does not write" if last.value == "" else ""
    return (
        f"{called} writes it by {last.action} {last.value!r}{skipped}, neither removing nor "
        "overwriting it: a client's copy or a tenant no credential named stays"
    )


def _follow(chain: Chain, levels: Sequence[Any], name: str, first: int) -> str | None:
    """Why a client's value of ``name`` can reach the filter at ``first`` on a route of
    ``levels``, or None when none can."""
    why: str | None = UNTOUCHED
    for entry in chain.filters[:first]:
        if entry.get("typed_config", {}).get("@type") == carrier_headers.FILTER_TYPE:
            why = _guard(entry, levels, name, why)
            continue
        write = writes(chain, entry).of(name)
        if write is not None and write.stated and runs(entry, levels):
            source = ", from the request" if write.copies else ""
            why = (
                f"{entry.get('name')} writes it ({write.how}){source}: only a removal or an "
                "overwrite leaves no client's copy"
            )
    return why


def tenant_rules(route: Route, chain: Chain, policy: RoutePolicy) -> Iterator[Finding]:
    if policy.tenant is None:
        return
    if policy.audit:
        # Audit mode forwards every body as it came: no salt is written.
        yield warning(
            "tenant-route-audited",
            route.place,
            "the route names a tenant source and is in audit mode (its policy's audit: "
            "true): bodies are forwarded with the client's cache_salt, so its tenants share "
            "whatever partitions their clients name until audit is turned off",
        )
    # A weighted cluster's own configurations are the most specific of its requests'.
    paths = [(f" (weighted cluster {c})", levels) for c, levels in route.clusters()]
    yield from _headers_sent(route, chain, [("", route.levels), *paths])
    if policy.tenant.kind is TenantKind.HEADER:
        yield from _guarded(route, chain, policy.tenant.value, paths or [("", route.levels)])


def _headers_sent(
    route: Route, chain: Chain, paths: Sequence[tuple[str, Sequence[Any]]]
) -> Iterator[Finding]:
    for where, levels in paths:
        for name in running(chain, levels):
            mode = ext_proc_mode(name, chain.configs[name].get("processing_mode", {}), levels)
            if mode is not None and mode.get("request_header_mode") == "SKIP":
                yield error(
                    "tenant-headers-skipped",
                    route.place,
                    f"the route names a tenant source and {name} skips the request headers "
                    f"here{where} (request_header_mode SKIP): a request without a body never "
                    "reaches the processor and is forwarded naming no tenant (vLLM reads and "
                    "cancels a stored response by its id alone). Send them on this route: an "
                    "ExtProcPerRoute whose overrides' processing_mode sets request_header_mode "
                    "SEND (envoy-config writes one)",
                )
                return


def _guarded(
    route: Route, chain: Chain, name: str, paths: Sequence[tuple[str, Sequence[Any]]]
) -> Iterator[Finding]:
    first = next(i for i, f in enumerate(chain.filters) if f.get("name") in chain.names)
    for where, levels in paths:
        why = _follow(chain, levels, name, first)
        if why is not None:
            yield error(
                "tenant-header-unguarded",
                route.place,
                f"the route reads its tenant from {name}, and a client's copy can reach this "
                f"processor{where}: {why}. Remove it first in the chain on every route, then "
                "let the identity filter set it",
            )
            return
