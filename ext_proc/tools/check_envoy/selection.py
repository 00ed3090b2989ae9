"""Envoy's route selection for the paths that reach vLLM's token-in and echo endpoints,
per virtual host: which route takes each probe path and where it sends it
(``route_probes``, regexes run by RE2 as Envoy runs them), and which forwarding routes
it cannot evaluate. The rules (``rules.token_paths``) judge what this finds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ext_proc.tools import route_probes
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


def select(entries: list[dict[str, Any]]) -> Selection:
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
    )
