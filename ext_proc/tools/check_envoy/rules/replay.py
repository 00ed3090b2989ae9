"""A body the processor decided reaches the upstreams once, on every ``mint`` and
``honor`` route it processes: the processor decides once per request, and Envoy's
retries, hedges and mirrors resend the decided body without running any filter again,
so a proof honored once would reach two decode pods, a prefill would run twice.

What resends a body, in Envoy 1.40 (route and router protos, checked with
``envoy --mode validate``), each at the levels Envoy reads it, the most specific that
states it winning:

- ``retry_policy`` / ``retry_policy_typed_config``: the route's replaces the virtual
  host's entirely; a cluster's (``HttpProtocolOptions.retry_policy``) replaces both. A
  retry that only follows a request no upstream received (``connect-failure``,
  ``refused-stream``, ``reset-before-request``) or makes no retry (``num_retries: 0``)
  resends nothing an upstream read. A typed retry extension is not readable here.
- ``hedge_policy`` (route, virtual host): a hedged request runs beside the first.
- ``request_mirror_policies`` (route, virtual host, route configuration: the most
  specific non-empty list; a cluster's replaces the route's): a shadow copy to another
  cluster.

- the router's retry request headers (``ROUTER_HEADERS``): the router reads them from the
  request after the route's header additions, so ``request_headers_to_add`` of any of
  them (route, weighted cluster, virtual host, route configuration) retries or hedges as
  a policy would; and from a client when the connection manager counts its request as
  internal (``trusted``).

Not a replay: ``internal_redirect_policy``. Envoy answers an upstream redirect with a
new internal stream that runs the filter chain again, ext_proc included, so the
redirected request is decided again (a spent proof is refused then); its upstream got
one copy per decision."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from ext_proc.core.route_policy import Action
from ext_proc.tools.check_envoy.effective import running
from ext_proc.tools.check_envoy.findings import Finding, error
from ext_proc.tools.check_envoy.reader import CHOSEN_PER_REQUEST, Chain, Route, VirtualHost
from ext_proc.tools.check_envoy.rules.route import policy_of
from ext_proc.tools.router_headers import ROUTER_HEADERS

# Retry conditions that hold only for a request no upstream has read: the connection
# was never made, the upstream refused the stream unprocessed (HTTP/2 REFUSED_STREAM),
# or the stream reset before the request went out.
UNSENT: Final = frozenset({"connect-failure", "refused-stream", "reset-before-request"})


def resends(policy: Any) -> bool:
    """Whether a ``RetryPolicy`` can send a body to an upstream a second time."""
    if not isinstance(policy, dict):
        return True
    if str(policy.get("num_retries", 1)) == "0":
        return False
    conditions = {c.strip() for c in str(policy.get("retry_on", "")).split(",") if c.strip()}
    return not conditions <= UNSENT


def decided(route: Route, chain: Chain) -> Action | None:
    """The action of a forwarding ``mint`` or ``honor`` route this processor's filter
    runs on; None for any other route."""
    if not route.forwards or not running(chain, route.levels):
        return None
    policy = policy_of(route, chain.namespace)
    if isinstance(policy, Finding) or policy.action not in (Action.MINT, Action.HONOR):
        return None
    return policy.action


def replays(
    route: Route,
    vhost: VirtualHost,
    chain: Chain,
    clusters: dict[str, dict[str, Any]],
) -> Iterator[Finding]:
    """``clusters``: each cluster's HttpProtocolOptions. Which clusters a decided route
    may reach at all is ``rules.closure``'s."""
    decision = decided(route, chain)
    if decision is None:
        return
    action = route.entry["route"]
    why = f"this {decision.value} route's body, decided once, would reach upstreams twice"
    # Where the route's settings come from, the most specific first, and the settings of
    # each cluster it may send to.
    levels = [
        (route.place, action),
        (f"{route.place} virtual_host", vhost.entry),
        (f"{route.place} route_config", chain.manager.get("route_config", {})),
    ]
    targets = _targets(route, clusters)
    yield from _retries(levels[:2], targets, why)
    for place, holder in levels[:2]:
        if "hedge_policy" in holder:
            yield error("body-hedged", place, f"hedge_policy: {why}. Remove it")
            break
    yield from _mirrors(levels, targets, why)
    # Header additions are the route's own (not its action's), at the levels above.
    yield from _retry_headers([(route.place, route.entry), *levels[1:]], action, route.place, why)


def trusted(chain: Chain) -> Iterator[Finding]:
    """The connection manager of a ``mint`` or ``honor`` route lets a client's retry
    headers through to the router.

    The connection manager removes ``ROUTER_HEADERS`` from every request it counts as
    external and keeps them on an internal one. A request is internal when the address
    it is judged by (the peer's with ``use_remote_address``, else the last
    ``x-forwarded-for`` entry, ``xff_num_trusted_hops`` entries in) is internal by
    ``internal_address_config``, and in Envoy 1.40 only by it: unset, no address is
    internal (the runtime guard that restored RFC1918 is gone since 1.36), so
    ``use_remote_address``, ``xff_num_trusted_hops`` and original IP detection choose
    which address is judged but cannot make one internal. Set, even empty, it trusts
    addresses: its ``cidr_ranges``, or when they are empty every RFC1918, RFC4193 and
    loopback address, and with ``unix_sockets`` every Unix socket peer. A client at such
    an address, or one that writes such an address into ``x-forwarded-for``, retries the
    decided body at will. So any ``internal_address_config`` is refused. The honor
    route's own ``request_headers_to_remove`` of the headers does keep them from the
    router (tests/e2e/test_decided_once.py), but is not taken as a remedy: every level
    removes and then adds, so a virtual host's or route configuration's addition, or a
    route that removes only some of them, would undo it, and the check does not follow
    which level Envoy applies last."""
    if "internal_address_config" not in chain.manager:
        return
    yield error(
        "retry-header-trusted",
        chain.place,
        "internal_address_config makes some clients internal: the router honors their "
        f"{', '.join(ROUTER_HEADERS)} headers and resends a mint or honor route's "
        "body decided once. Remove it",
    )


_Levels = list[tuple[str, dict[str, Any]]]


def _clusters(action: dict[str, Any]) -> list[str]:
    named = [action.get("cluster")]
    named += [c.get("name") for c in action.get("weighted_clusters", {}).get("clusters", [])]
    return [str(name) for name in named if name is not None]


def _per_request(action: dict[str, Any]) -> bool:
    """Whether the request chooses the route's cluster: on the action or on one of its
    weighted clusters."""
    weighted = action.get("weighted_clusters", {}).get("clusters", [])
    return any(
        key in holder
        for holder in [action, *(c for c in weighted if isinstance(c, dict))]
        for key in CHOSEN_PER_REQUEST
    )


def _targets(route: Route, clusters: dict[str, dict[str, Any]]) -> _Levels:
    action = route.entry["route"]
    if _per_request(action):
        # Chosen per request: any cluster, those without settings of their own too.
        return [
            *((f"{route.place} cluster {n!r}", o) for n, o in sorted(clusters.items())),
            (f"{route.place} cluster *", {}),
        ]
    return [(f"{route.place} cluster {n!r}", clusters.get(n, {})) for n in _clusters(action)]


def _retries(levels: _Levels, targets: _Levels, why: str) -> Iterator[Finding]:
    # A cluster's retry policy replaces the route's for requests sent to it; a route's
    # that no cluster replaces stands for the others.
    replaced = [(place, options) for place, options in targets if "retry_policy" in options]
    for place, options in replaced:
        if resends(options["retry_policy"]):
            yield error("body-retried", place, f"the cluster's retry_policy: {why}")
    if targets and len(replaced) == len(targets):
        return
    for place, holder in levels:
        if "retry_policy_typed_config" in holder:
            yield error(
                "body-retried", place, f"retry_policy_typed_config (unreadable here): {why}"
            )
            return
        if "retry_policy" in holder:
            if resends(holder["retry_policy"]):
                yield error(
                    "body-retried",
                    place,
                    f"retry_policy retries after an upstream read the request: {why}. Remove "
                    f"it, or retry only on {', '.join(sorted(UNSENT))}",
                )
            return


def _mirrors(levels: _Levels, targets: _Levels, why: str) -> Iterator[Finding]:
    # A cluster's mirror policies replace the route's; either copies the body.
    for place, options in targets:
        if options.get("request_mirror_policies"):
            yield error("body-mirrored", place, f"the cluster's request_mirror_policies: {why}")
    for place, holder in levels:
        if holder.get("request_mirror_policies"):
            yield error("body-mirrored", place, f"request_mirror_policies: {why}. Remove them")
            return


def _added(holder: dict[str, Any]) -> list[str]:
    names = [
        str(entry.get("header", {}).get("key", "")).lower()
        for entry in holder.get("request_headers_to_add", [])
        if isinstance(entry, dict)
    ]
    return [name for name in ROUTER_HEADERS if name in names]


def _retry_headers(
    levels: _Levels, action: dict[str, Any], place: str, why: str
) -> Iterator[Finding]:
    # Every level's additions reach the request the router reads, whichever wins where
    # two levels add the same header; a weighted cluster's apply to the requests sent
    # to it.
    weighted = [
        (f"{place} weighted_cluster {c.get('name')!r}", c)
        for c in action.get("weighted_clusters", {}).get("clusters", [])
        if isinstance(c, dict)
    ]
    for where, holder in [*levels, *weighted]:
        names = _added(holder)
        if names:
            yield error(
                "retry-header-added",
                where,
                f"request_headers_to_add sets {', '.join(names)}, which the router reads "
                f"as a retry or hedge policy: {why}. Remove them",
            )
