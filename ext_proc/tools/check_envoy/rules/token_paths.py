"""No route Envoy would select forwards a path that reaches one of vLLM's token-in or
echo endpoints upstream, nor one that reaches an endpoint the route's own policy refuses
(``refused_paths``: a request without a body is never judged by the processor). A
route whose selection depends on a condition beside the path is checked when it
forwards, and the routes after it are checked too: requests it does not match reach
them. What cannot be simulated exactly is an error: a matcher or a
rewrite that cannot be read, and a forwarding route matched by a pattern before the
404s that answer every token path."""

from __future__ import annotations

from collections.abc import Iterator

from ext_proc.core.route_policy import DEFAULT_NAMESPACE
from ext_proc.tools.check_envoy.findings import Finding, error
from ext_proc.tools.check_envoy.reader import VirtualHost
from ext_proc.tools.check_envoy.selection import Selection, TokenForward, select
from ext_proc.tools.token_endpoints import EVERYWHERE


def token_paths(vhost: VirtualHost, namespace: str = DEFAULT_NAMESPACE) -> Iterator[Finding]:
    found = select(vhost.listed, namespace)
    yield from _unreadable(vhost.routes_place, found)
    yield from _unguarded(vhost.routes_place, found)
    yield from _forwarded(vhost.routes_place, found.forwards)
    yield from _refused(vhost.routes_place, found.refused)


def _unreadable(where: str, found: Selection) -> Iterator[Finding]:
    for route in found.routes:
        place = f"{where}/{route.label}"
        if route.problem is not None:
            yield error(
                "route-unreadable",
                place,
                f"{route.problem}: this check cannot tell which paths the route matches "
                "(token-in or echo endpoints among them)",
            )
        rewrite = route.rewrite_problem()
        if rewrite is not None:
            yield error(
                "rewrite-unreadable",
                place,
                f"{rewrite}: neither the processor (which binds proofs to the upstream path) "
                "nor this check can tell which paths reach a token-in or echo endpoint "
                "upstream through it. Use a prefix match with prefix_rewrite, stated in "
                "match_prefix and prefix_rewrite",
            )


def _unguarded(where: str, found: Selection) -> Iterator[Finding]:
    for route in found.unguarded:
        yield error(
            "pattern-before-404s",
            f"{where}/{route.label}",
            f"forwards what its {route.kind} {route.source!r} matches before "
            f"the 404s of every token path ({', '.join(m.value for m in EVERYWHERE)}): this "
            "check cannot tell which token-in or echo endpoints it forwards. Put it after "
            "them (envoy-config writes them first)",
        )


def _forwarded(where: str, forwards: list[TokenForward]) -> Iterator[Finding]:
    yield from _per_route(
        "token-path-forwarded",
        where,
        forwards,
        "to a vLLM token-in or echo endpoint (ids in without a template, or request content "
        "echoed); answer those paths with a direct_response before this route",
    )


def _refused(where: str, forwards: list[TokenForward]) -> Iterator[Finding]:
    yield from _per_route(
        "refused-endpoint-forwarded",
        where,
        forwards,
        "to an endpoint its policy refuses (a token-in or internal endpoint it does not "
        "accept); the processor refuses it only from a request's body, and a request without "
        "one (GET, DELETE, an empty POST) never reaches it where Envoy skips the headers. "
        "Answer those paths with a direct_response before this route (envoy-config writes "
        "one per route)",
    )


def _per_route(
    code: str, where: str, forwards: list[TokenForward], reaches: str
) -> Iterator[Finding]:
    """One finding per route: its first path, and how many more."""
    paths: dict[str, list[str]] = {}
    for forward in forwards:
        shown = "unknown" if forward.upstream is None else repr(forward.upstream)
        note = "" if forward.certain else ", if its matcher matches"
        paths.setdefault(forward.route, []).append(
            f"{forward.path!r} (upstream {shown}, made from route {forward.origin}{note})"
        )
    for label, listed in paths.items():
        more = f" and {len(listed) - 1} more" if len(listed) > 1 else ""
        yield error(code, f"{where}/{label}", f"forwards {listed[0]}{more} {reaches}")
