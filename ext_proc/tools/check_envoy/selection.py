"""Envoy's route selection for the paths that reach vLLM's token-in and echo endpoints
(and every endpoint a route's policy refuses: ``refused_paths``), per virtual host:
which route takes each probe path and where it sends it (``route_probes``, regexes run
by RE2 as Envoy runs them), and which forwarding routes it cannot evaluate. The rules
(``rules.token_paths``) judge what this finds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ext_proc.core.errors import RoutePolicyError
from ext_proc.core.route_policy import DEFAULT_NAMESPACE, FIELDS, Accept, parse
from ext_proc.edge.attributes import as_cel
from ext_proc.tools import refused_paths, route_probes
from ext_proc.tools.token_endpoints import is_token_path


@dataclass(frozen=True, slots=True)
class TokenForward:
    """A probe path that ``route`` may forward to a token endpoint: ``upstream`` is
    where (None: its rewrite cannot be followed); ``origin`` the route the probe was
    made from; ``certain``: the route takes it whatever the request's other parts."""

    route: str
    path: str
    upstream: str | None
    origin: str
    certain: bool


@dataclass(frozen=True, slots=True)
class PatternRoute:
    """A readable forwarding route matched by a pattern (``kind``: ``safe_regex`` or
    ``template``; ``source``: the pattern as written)."""

    label: str
    kind: str
    source: str


@dataclass(frozen=True, slots=True)
class Selection:
    """What the simulation found in one virtual host."""

    # Every route as read (``Route.problem`` says why one cannot be).
    routes: list[route_probes.Route]
    # Readable forwarding routes matched by a pattern before the 404s of every token
    # path: which token paths they forward cannot be told.
    unguarded: list[PatternRoute]
    # In the order Envoy's first-match selection met them, probe by probe.
    forwards: list[TokenForward]
    # Probes a route forwards to an endpoint its own policy refuses (``refused_paths``),
    # which a request without a body would reach: the processor judges bodies only.
    refused: list[TokenForward] = field(default_factory=list)


def select(entries: list[dict[str, Any]], namespace: str = DEFAULT_NAMESPACE) -> Selection:
    routes = route_probes.read_routes(entries)
    claims = [route_probes.claim(routes, p, o) for p, o in route_probes.probes(routes).items()]
    return Selection(
        routes=routes,
        unguarded=[
            PatternRoute(route.label, route.matcher.kind, route.matcher.source)
            for route in route_probes.unguarded(routes)
            if route.problem is None and route.matcher is not None
        ],
        forwards=[
            TokenForward(forward.route, found.path, forward.upstream, found.origin, forward.certain)
            for found in claims
            for forward in found.forwards
            if forward.upstream is None or is_token_path(forward.upstream)
        ],
        refused=_refused(routes, namespace),
    )


def _refused_suffixes(rewrite: str) -> tuple[str, ...]:
    return refused_paths.probe_suffixes(rewrite, refused_paths.refused_names(()))


def _refused(routes: list[route_probes.Route], namespace: str) -> list[TokenForward]:
    """Every refused endpoint probed under every route; a forward counts where the
    route that takes it refuses what it reaches (the token-in and echo endpoints that
    ``forwards`` lists are left to it)."""
    accepted = {route.label: accepts(route.entry, namespace) for route in routes}
    probed = route_probes.probes(routes, _refused_suffixes)
    return [
        TokenForward(forward.route, found.path, forward.upstream, found.origin, forward.certain)
        for found in (route_probes.claim(routes, p, o) for p, o in probed.items())
        for forward in found.forwards
        if forward.upstream is not None
        and not is_token_path(forward.upstream)
        and refused_paths.refused_at(forward.upstream, accepted[forward.route]) is not None
    ]


def accepts(entry: dict[str, Any], namespace: str) -> frozenset[Accept]:
    """What a route's policy accepts as the processor reads it; nothing where its
    metadata is missing (the default policy) or invalid (a finding of its own)."""
    policy = entry.get("metadata", {}).get("filter_metadata", {}).get(namespace)
    if not isinstance(policy, dict):
        return frozenset()
    try:
        values = {k: as_cel(v) for k, v in policy.items() if k in FIELDS}
        return parse(values, len(policy), namespace).accept
    except RoutePolicyError:
        return frozenset()
