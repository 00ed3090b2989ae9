"""What a connection manager must do for its routes to be checked at all: normalise the
path as the upstream decodes it, run this chain for upgrades too, and carry its routes
where the check can read them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from ext_proc.tools.check_envoy.effective import running
from ext_proc.tools.check_envoy.findings import Finding, error
from ext_proc.tools.check_envoy.reader import Chain, VirtualHost, virtual_hosts
from ext_proc.tools.route_match import Unreadable, read_matcher

# What the connection manager must do to the path before routes match, so that route
# matches see the path the upstream decodes (uvicorn percent-decodes it).
UNESCAPING: Final = ("UNESCAPE_AND_REDIRECT", "UNESCAPE_AND_FORWARD", "REJECT_REQUEST")
# Paths with an escaped slash or backslash, which the upstream decodes. Where the
# connection manager keeps them (a shared gateway whose other routes this processor
# does not police), each virtual host with a route this processor polices must answer
# them itself before any route forwards one.
ESCAPED: Final = tuple(
    f"/v1/chat/completions{escape}derender" for escape in ("%2F", "%2f", "%5C", "%5c")
)


def _answers(vhost: VirtualHost, path: str) -> bool:
    """Whether the first route of ``vhost`` that may take ``path`` answers it itself (a
    route matching only some requests, by header or query, does not answer all)."""
    for route in vhost.routes:
        match = route.entry.get("match", {})
        try:
            if not read_matcher(match).matches(path):
                continue
        except Unreadable:
            return False
        if route.forwards:
            return False
        if not {"headers", "query_parameters", "grpc", "runtime_fraction"} & set(match):
            return True
    return False


def _escaped_answered(chain: Chain) -> bool:
    policed = [
        vhost
        for vhost in virtual_hosts(chain)
        if any(route.forwards and running(chain, route.levels) for route in vhost.routes)
    ]
    return all(_answers(vhost, path) for vhost in policed for path in ESCAPED)


def path_handling(chain: Chain) -> Iterator[Finding]:
    manager = chain.manager
    if manager.get("normalize_path") is not True:
        yield error(
            "path-not-normalized",
            chain.place,
            "normalize_path is not true: route matches see dot segments and escaped letters "
            "the upstream resolves ('/v1/chat/completions/%64erender' reaches derender). Set "
            "normalize_path: true",
        )
    action = manager.get("path_with_escaped_slashes_action", "KEEP_UNCHANGED")
    if action not in UNESCAPING and not _escaped_answered(chain):
        yield error(
            "escaped-slashes-kept",
            chain.place,
            f"path_with_escaped_slashes_action {action} keeps '%2F' in the path routes match "
            "while the upstream decodes it ('/pd/v1/chat/completions%2Fderender' reaches "
            f"derender). Use one of {', '.join(UNESCAPING)}, or answer such paths (a "
            "direct_response route first) in every virtual host this processor polices",
        )


def upgrades(chain: Chain) -> Iterator[Finding]:
    """An upgrade (websocket, CONNECT...) with a filter chain of its own runs that chain
    instead of this one: the request's headers reach the upstream without this
    processor's filter, and its body waits for a 101."""
    for upgrade in chain.manager.get("upgrade_configs", []):
        if isinstance(upgrade, dict) and "filters" in upgrade:
            yield error(
                "upgrade-filter-chain",
                chain.place,
                f"upgrade_configs {upgrade.get('upgrade_type')!r} runs filters of its own: its "
                "requests skip this processor's filter (headers forwarded uninspected). Remove "
                "its filters (the upgrade then runs this chain) or the upgrade",
            )


def unseen_routes(chain: Chain) -> Iterator[Finding]:
    """Routes delivered at run time: the connection manager's ``rds`` or
    ``scoped_routes``, or virtual hosts its inline route configuration takes from
    ``vhds`` (on demand, beside the ones it lists)."""
    sources: list[str] = [s for s in ("rds", "scoped_routes") if s in chain.manager]
    route_config = chain.manager.get("route_config")
    if isinstance(route_config, dict) and "vhds" in route_config:
        sources.append("route_config.vhds")
    for unseen in sources:
        yield error(
            "routes-unseen",
            chain.place,
            f"routes come from {unseen}: this check cannot see them (give the connection "
            "manager its route_config inline, every virtual host listed, to check it)",
        )


def matcher_tree(vhost: VirtualHost) -> Iterator[Finding]:
    if "matcher" in vhost.entry:
        yield error(
            "matcher-tree",
            vhost.place,
            "routes chosen by a matcher tree: this check cannot see which routes forward "
            "what; use routes",
        )
