"""One route: every forwarding route (and each of its weighted clusters) runs one of
this processor's ext_proc filters, held where it skips the headers; its policy metadata
is valid (the processor's own validation); a ``mint`` route sends the processor its
response; the metadata states the route's prefix rewrite, which the processor follows
(``match_prefix`` and ``prefix_rewrite``: proofs are bound to the upstream path).
Routes that forward nothing (a direct response or a redirect) need neither metadata nor
the filter."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ext_proc.core.errors import RoutePolicyError
from ext_proc.core.route_policy import Action, RoutePolicy, parse_whole
from ext_proc.edge.attributes import as_cel
from ext_proc.tools import route_probes
from ext_proc.tools.check_envoy.effective import ext_proc_mode, running
from ext_proc.tools.check_envoy.findings import Finding, error, warning
from ext_proc.tools.check_envoy.reader import Chain, Route, overrides_in, virtual_hosts
from ext_proc.tools.check_envoy.rules.filters import override
from ext_proc.tools.check_envoy.rules.hold import hold
from ext_proc.tools.check_envoy.rules.namespace import near_misses
from ext_proc.tools.check_envoy.rules.tenant import tenant_rules
from ext_proc.tools.envoy_names import MINT_RESPONSE


def route_rules(route: Route, chain: Chain) -> Iterator[Finding]:
    for name, config in overrides_in(route.entry):
        yield from override(route.place, name, config, chain.requested)
    if not route.forwards:
        return
    yield from _inspected(route, chain)
    if scoped_out(route, chain):
        return
    yield from near_misses(route, chain.namespace)
    found = policy_of(route, chain.namespace)
    if isinstance(found, Finding):
        yield found
        return
    yield from _mint_and_honor(route, chain, found)
    yield from rewrite(route.place, route.entry, found)
    yield from tenant_rules(route, chain, found)


def _upstream(cluster: str) -> str:
    """What a cluster's name says it reaches: istiod names a Service's clusters
    ``outbound|<port>|<subset>|<host>``, every port and subset of one Service reaching
    its pods, so the host; any other name as it is."""
    parts = cluster.split("|")
    if len(parts) == 4 and parts[0] == "outbound" and parts[3]:
        return parts[3]
    return cluster


def _named_clusters(entry: dict[str, Any]) -> frozenset[str] | None:
    """What the clusters a forwarding route names reach (``_upstream``); None where one
    is chosen per request."""
    action = entry.get("route", {})
    if "cluster" in action:
        return frozenset({_upstream(str(action["cluster"]))})
    weighted = action.get("weighted_clusters", {}).get("clusters")
    if isinstance(weighted, list) and weighted:
        return frozenset(_upstream(str(c.get("name"))) for c in weighted if isinstance(c, dict))
    return None


def _policed_clusters(chain: Chain) -> frozenset[str] | None:
    """The clusters the routes this processor polices in ``chain`` reach; None: any."""
    found: set[str] = set()
    for vhost in virtual_hosts(chain):
        for route in vhost.routes:
            if route.forwards and running(chain, route.levels):
                named = _named_clusters(route.entry)
                if named is None:
                    return None
                found |= named
    return frozenset(found)


def _second_door(route: Route, chain: Chain) -> str | None:
    """Why a route this processor's filter does not run on may reach what it polices;
    None for a route of a scoped wiring (every filter of this processor disabled by
    default, enabled on the routes it polices) that names only clusters no policed
    route names."""
    if chain.on_by_default:
        return "the filter runs by default and this route turns it off"
    named = _named_clusters(route.entry)
    policed = _policed_clusters(chain)
    if named is None or policed is None:
        return "a cluster is chosen per request, here or on a policed route"
    if not policed:
        return "no route of this connection manager runs it"
    shared = sorted(named & policed)
    if shared:
        return f"it reaches {', '.join(map(repr, shared))}, which a policed route reaches"
    return None


def scoped_out(route: Route, chain: Chain) -> bool:
    """A forwarding route a scoped wiring does not police (``_second_door``): no policy,
    token path or refused endpoint of this processor applies to it."""
    return not running(chain, route.levels) and _second_door(route, chain) is None


def _inspected(route: Route, chain: Chain) -> Iterator[Finding]:
    on_route = running(chain, route.levels)
    if not on_route:
        door = _second_door(route, chain)
        if door is None:
            yield warning(
                "route-unpoliced",
                route.place,
                "this processor's filter, disabled by default, does not run on this route: "
                "its requests are not inspected (a route the wiring does not police, on a "
                "shared gateway). Its clusters are compared with the policed routes' by "
                "name (an Istio Service's by its host, whatever the port or subset): no "
                "other name may reach a policed upstream",
            )
        else:
            # Fail closed: whatever this route forwards reaches the upstream uninspected,
            # client-chosen kv_transfer_params included.
            yield error(
                "ext-proc-not-running",
                route.place,
                "no ext_proc filter runs on this forwarding route (disabled here or not "
                f"enabled; {door}); request bodies would reach the upstream uninspected. "
                "Enable the filter, or answer the route with a direct_response",
            )
    yield from hold(route.place, route.entry, route.levels, on_route, chain)
    # A weighted cluster's own configuration is the most specific of all: one that
    # turns the filter off forwards its share of the route's requests uninspected.
    for cluster, levels in route.clusters():
        here = running(chain, levels)
        if on_route and not here:
            yield error(
                "ext-proc-off-for-cluster",
                route.place,
                f"no ext_proc filter runs for weighted cluster {cluster!r}; its requests "
                "would reach the upstream uninspected",
            )
        place = f"{route.place} weighted cluster {cluster!r}"
        yield from hold(place, route.entry, levels, here, chain)


def policy_of(route: Route, namespace: str) -> RoutePolicy | Finding:
    """The route's policy as the processor reads it, or what is wrong with it."""
    policy = route.entry.get("metadata", {}).get("filter_metadata", {}).get(namespace)
    if policy is None:
        return warning(
            "policy-missing", route.place, f"no '{namespace}' metadata (aggregated + strip)"
        )
    if not isinstance(policy, dict):
        return error("policy-not-mapping", route.place, f"'{namespace}' metadata must be a mapping")
    try:
        return parse_whole({k: as_cel(v) for k, v in policy.items()}, namespace)
    except RoutePolicyError as exc:
        return error("policy-invalid", route.place, exc.message)


def _responds(chain: Chain, levels: Sequence[Any]) -> bool:
    """Whether one of the filters running here sends the processor the response."""
    for name in running(chain, levels):
        mode = ext_proc_mode(name, chain.configs[name].get("processing_mode", {}), levels)
        if mode is not None and all(mode.get(k) == v for k, v in MINT_RESPONSE.items()):
            return True
    return False


def _mint_and_honor(route: Route, chain: Chain, policy: RoutePolicy) -> Iterator[Finding]:
    if policy.action is Action.MINT and not _responds(chain, route.levels):
        yield error(
            "mint-response-unseen",
            route.place,
            "action mint but the response is not processed (needs response_header_mode SEND "
            "and response_body_mode BUFFERED, e.g. an ExtProcPerRoute override); nothing "
            "would be signed",
        )
    if policy.action is Action.HONOR and policy.trust_any_caller:
        yield warning(
            "trust-any-caller",
            route.place,
            "trust_any_caller honors ids from any caller; only for routes nothing untrusted "
            "can reach",
        )
    if policy.action is Action.HONOR and policy.vocab_size is None:
        yield warning(
            "vocab-size-missing",
            route.place,
            "honor without vocab_size: ids are bounded by 2**31, not by the vocabulary",
        )


def rewrite(place: str, route: dict[str, Any], policy: RoutePolicy) -> Iterator[Finding]:
    """The processor learns the upstream path from ``match_prefix`` and ``prefix_rewrite``
    (``RoutePolicy.upstream_path``): on ``mint`` and ``honor`` routes, where proofs are
    bound to that path, and on tenant routes, which serve an endpoint by that path, a
    rewrite it is not told about, or cannot follow, is an error; on the others a warning."""
    action = route["route"]
    if any(key in action for key in route_probes.UNFOLLOWED_REWRITES):
        return  # an error on every forwarding route (rules.token_paths)
    binding = policy.action in (Action.MINT, Action.HONOR) or policy.tenant is not None
    found = error if binding else warning
    given = (policy.match_prefix, policy.prefix_rewrite)
    rewritten = action.get("prefix_rewrite") or None
    match = route.get("match", {})
    prefix = match.get("prefix", match.get("path_separated_prefix"))
    if rewritten is None:
        if given != (None, None):
            yield error(
                "rewrite-stated-not-made",
                place,
                f"metadata match_prefix {given[0]!r} and prefix_rewrite {given[1]!r} describe "
                "a rewrite this route does not make; the processor would compute the wrong "
                "upstream path. Remove them",
            )
        return
    if prefix is None:
        yield found(
            "rewrite-unfollowed",
            place,
            f"prefix_rewrite with a {', '.join(match) or 'missing'} matcher is not supported "
            f"on a {policy.action.value} route (the processor follows prefix rewrites of "
            "prefix matches only)",
        )
        return
    yield from _stated(place, (prefix, rewritten), given, binding)


def _stated(
    place: str, expected: tuple[str, str], given: tuple[str | None, str | None], binding: bool
) -> Iterator[Finding]:
    if given == expected:
        return
    prefix, rewritten = expected
    fields = f"match_prefix {prefix!r} and prefix_rewrite {rewritten!r}"
    if given == (None, None):
        yield (error if binding else warning)(
            "rewrite-unstated",
            place,
            f"the route rewrites {prefix!r} to {rewritten!r} but its metadata lacks {fields}; "
            "the processor would take the downstream path for the upstream "
            + ("one and bind proofs to the wrong endpoint" if binding else "one"),
        )
        return
    yield error(
        "rewrite-misstated",
        place,
        f"metadata match_prefix {given[0]!r} and prefix_rewrite {given[1]!r} differ from the "
        f"route's {fields}; the processor would compute the wrong upstream path (or refuse "
        "every request)",
    )
