"""Which route Envoy selects for each probe path of a virtual host, and what it sends
upstream: the claims ``check-envoy`` makes about vLLM's token-in and echo endpoints
(``token_endpoints``), which the live probe (tests/e2e/test_live_probe.py) sends through
the real Envoy.

Probe paths are made from every route whose matcher has a literal start (``prefix``,
``path``, ``path_separated_prefix``) and from its rewrite
(``token_endpoints.probe_suffixes``). Envoy's first-match selection is then simulated
with ``route_match`` (RE2 for regexes and URI templates). A route with a condition
beside its path (headers, query parameters...) may or may not be selected: a forwarding
one is listed as a possible forward, and the routes after it are simulated too. A route
whose matcher cannot be read is reported (``Route.problem``) and taken as one that may
match anything.

A route matched by a pattern (``safe_regex``, a URI template) makes no probes: nothing
says which token paths it matches. One that forwards is safe only after the 404s that
answer every token path whatever its prefix (``token_endpoints.EVERYWHERE``, the
generator's own two regexes): ``unguarded`` names those that come before them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ext_proc.core.vllm_request import endpoint
from ext_proc.tools.route_match import (
    PATTERNS,
    PathMatcher,
    Unreadable,
    read_matcher,
    upstream_path,
)
from ext_proc.tools.token_endpoints import EVERYWHERE, probe_suffixes

# Route conditions beside the path: a route with one matches only some requests.
CONDITIONS: Final = (
    "headers",
    "query_parameters",
    "grpc",
    "runtime_fraction",
    "tls_context",
    "dynamic_metadata",
    "filter_state",
    "cel_matcher",
)
# What a route's match may hold beside its path matcher (and what read_matcher reads).
_KNOWN_MATCH: Final = frozenset(
    {
        "prefix",
        "path",
        "path_separated_prefix",
        "safe_regex",
        "path_match_policy",
        "case_sensitive",
        *CONDITIONS,
    }
)
# What a route does: forward, or answer by itself.
_ACTIONS: Final = ("route", "direct_response", "redirect")
# Rewrites whose token paths cannot be told from the route.
UNFOLLOWED_REWRITES: Final = ("regex_rewrite", "path_rewrite_policy")
# A redirect's status by its response_code (Envoy's default: 301).
_REDIRECTS: Final = {
    "MOVED_PERMANENTLY": 301,
    "FOUND": 302,
    "SEE_OTHER": 303,
    "TEMPORARY_REDIRECT": 307,
    "PERMANENT_REDIRECT": 308,
}
# Envoy's own answer when no route matches.
NO_ROUTE: Final = 404


@dataclass(frozen=True, slots=True)
class Route:
    """One route of a virtual host, as the simulation reads it."""

    label: str
    entry: dict[str, Any]
    # None when the matcher cannot be read (``problem`` says why).
    matcher: PathMatcher | None
    conditional: bool
    problem: str | None = None

    @property
    def forwards(self) -> bool:
        return "route" in self.entry

    def may_match(self, path: str) -> bool:
        return self.matcher is None or self.matcher.matches(path)

    def status(self) -> int:
        """The status of a route that answers by itself (direct response or redirect)."""
        if "direct_response" in self.entry:
            return int(self.entry["direct_response"].get("status", 0))
        code = self.entry.get("redirect", {}).get("response_code", "MOVED_PERMANENTLY")
        return _REDIRECTS.get(str(code), 301)

    def upstream(self, path: str) -> str | None:
        """The path this forwarding route sends upstream for ``path``; None when its
        rewrite cannot be followed (``rewrite_problem``)."""
        try:
            return upstream_path(self.entry.get("match", {}), self.entry["route"], path)
        except Unreadable:
            return None

    def rewrite_problem(self) -> str | None:
        """Why the paths this forwarding route sends to a token endpoint cannot be told,
        if so. A ``regex_rewrite`` is evaluated (RE2) for the paths probed, but nothing
        says which other paths it rewrites onto a token endpoint (``^/gen$`` to
        ``/inference/v1/generate``): not supported either."""
        if not self.forwards:
            return None
        for key in UNFOLLOWED_REWRITES:
            if key in self.entry["route"]:
                return f"{key} is not supported"
        if self.matcher is None:
            return None
        sample = "/" if self.matcher.head() is None else self.matcher.value
        try:
            upstream_path(self.entry.get("match", {}), self.entry["route"], sample)
        except Unreadable as exc:
            return str(exc)
        return None


def read_routes(entries: list[dict[str, Any]]) -> list[Route]:
    out = []
    for position, entry in enumerate(entries):
        label = str(entry.get("name") or f"#{position}")
        match = entry.get("match", {})
        if not isinstance(match, dict):
            out.append(Route(label, entry, None, True, "a match that is not a mapping"))
            continue
        conditional = any(key in match for key in CONDITIONS)
        unknown = sorted(set(match) - _KNOWN_MATCH)
        actions = [key for key in _ACTIONS if key in entry]
        if unknown or len(actions) != 1:
            what = f"match {unknown}" if unknown else f"the action of {sorted(entry)}"
            out.append(Route(label, entry, None, True, f"{what} is not simulated"))
            continue
        try:
            out.append(Route(label, entry, read_matcher(match), conditional))
        except Unreadable as exc:
            out.append(Route(label, entry, None, True, str(exc)))
    return out


@dataclass(frozen=True, slots=True)
class Forward:
    """A forwarding route that may take a probe: where it sends it (None: unknown)."""

    route: str
    upstream: str | None
    certain: bool


@dataclass(frozen=True, slots=True)
class Claim:
    """What Envoy does with one probe path, as simulated. ``forwards``: the forwarding
    routes that may take it, in order; the last is certain (its matcher matches, no
    condition beside it) unless ``status`` says the request is answered: by ``route``
    (a direct response or redirect), or by Envoy itself when no route matches (route
    None, 404)."""

    path: str
    origin: str
    forwards: tuple[Forward, ...]
    route: str | None
    status: int | None

    @property
    def upstream(self) -> str | None:
        """Where the request certainly goes (None when answered or unknown)."""
        if self.status is not None or not self.forwards:
            return None
        return self.forwards[-1].upstream


def probes(
    routes: list[Route], suffixes: Callable[[str], tuple[str, ...]] = probe_suffixes
) -> dict[str, str]:
    """Downstream paths that reach a token endpoint upstream through one of ``routes``
    (its literal start, then what makes its rewrite a token endpoint: ``suffixes`` of
    the rewrite, vLLM's token-in and echo endpoints unless told), each with the label of
    the route it was made from."""
    out: dict[str, str] = {}
    for route in routes:
        if route.matcher is None or route.matcher.head() is None:
            continue
        head = route.matcher.value
        if route.matcher.kind == "path":
            out.setdefault(head, route.label)
            continue
        action = route.entry.get("route", {})
        rewrite = action.get("prefix_rewrite") if isinstance(action, dict) else None
        # The upstream decodes what the rewrite writes ("/%69nference/" is /inference/).
        for suffix in suffixes(endpoint(str(rewrite or head))):
            out.setdefault(head + suffix, route.label)
    return out


def _conditions(route: Route) -> dict[str, Any]:
    match = route.entry.get("match", {})
    return {key: match[key] for key in CONDITIONS if key in match}


def claim(routes: list[Route], path: str, origin: str) -> Claim:
    """Envoy's first-match selection for ``path``. A conditional route that answers by
    itself answers every request of a later route with the same conditions (the 404s
    ``envoy-config`` writes before a route that matches a header carry its headers)."""
    forwards: list[Forward] = []
    answered: list[dict[str, Any]] = []
    for route in routes:
        if not route.may_match(path):
            continue
        certain = not route.conditional
        if route.forwards:
            if route.matcher is not None and _conditions(route) in answered:
                continue
            forwards.append(Forward(route.label, route.upstream(path), certain))
            if certain:
                return Claim(path, origin, tuple(forwards), route.label, None)
        elif certain:
            return Claim(path, origin, tuple(forwards), route.label, route.status())
        elif route.matcher is not None:
            answered.append(_conditions(route))
    return Claim(path, origin, tuple(forwards), None, NO_ROUTE)


def claims(entries: list[dict[str, Any]]) -> list[Claim]:
    """Every probe of a virtual host's routes, and what Envoy does with it."""
    routes = read_routes(entries)
    return [claim(routes, path, origin) for path, origin in probes(routes).items()]


def _answers_everywhere(route: Route) -> bool:
    match = route.entry.get("match", {})
    regex = match.get("safe_regex", {}).get("regex") if isinstance(match, dict) else None
    return not route.forwards and not route.conditional and regex in {m.value for m in EVERYWHERE}


def unguarded(routes: list[Route]) -> list[Route]:
    """Forwarding routes matched by a pattern (or an unreadable matcher) that come before
    the 404s of every token path (``EVERYWHERE``): which token paths they forward cannot
    be told."""
    out: list[Route] = []
    seen: set[str] = set()
    wanted = {m.value for m in EVERYWHERE}
    for route in routes:
        if seen >= wanted:
            break
        if _answers_everywhere(route):
            seen.add(route.entry["match"]["safe_regex"]["regex"])
        elif route.forwards and (route.matcher is None or route.matcher.kind in PATTERNS):
            out.append(route)
    return out
