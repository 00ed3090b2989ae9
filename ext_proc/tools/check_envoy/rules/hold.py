"""Whatever skips the request headers (one message per request) passes them on at once,
and the router would open the upstream request before the decision: a buffer filter
after it must hold the request until the body has been let through, at the route's own
buffer limit."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ext_proc.tools.check_envoy.effective import ext_proc_mode, hold_settings
from ext_proc.tools.check_envoy.findings import Finding, error, warning
from ext_proc.tools.check_envoy.reader import Chain, Hold
from ext_proc.tools.envoy_names import BUFFER_FILTER


def hold(
    place: str, route: dict[str, Any], levels: Sequence[Any], running: list[str], chain: Chain
) -> Iterator[Finding]:
    """``running``: this processor's filters that run here; ``levels``: the
    typed_per_filter_config that apply, most specific first."""
    for name in running:
        mode = ext_proc_mode(name, chain.configs[name].get("processing_mode", {}), levels)
        if mode is None or mode.get("request_header_mode", "SEND") != "SKIP":
            continue
        holds = [
            (found, settings)
            for found in chain.holds
            if found.position > chain.positions[name]
            and (settings := hold_settings(found, levels)) is not None
        ]
        if not holds:
            yield error(
                "hold-missing",
                place,
                f"{name} skips the request headers (one message) and no buffer filter after "
                "it holds the request here: the upstream request opens, headers sent, before "
                f"the decision, for refused requests and slow uploads alike. Put "
                f"{BUFFER_FILTER} after it (docs/body-modes.md)",
            )
            continue
        for found, settings in holds:
            yield from _limit(place, found, settings, route.get("request_body_buffer_limit"))


def _limit(place: str, found: Hold, settings: dict[str, Any], limit: Any) -> Iterator[Finding]:
    # The hold sets the stream's buffer limit to its own: above the route's, Envoy
    # buffers bodies the route was sized to refuse (memory); below, it refuses bodies
    # the route admits (413).
    held = settings.get("max_request_bytes")
    if held is None:
        return
    if limit is None:
        yield error(
            "hold-limit-unstated",
            place,
            f"{found.name} sets the stream's buffer limit to {held} and the route states none "
            "(request_body_buffer_limit): give the route its limit and the hold the same",
        )
    elif int(held) > int(limit):
        yield error(
            "hold-limit-raised",
            place,
            f"{found.name} max_request_bytes {held} raises this route's "
            f"request_body_buffer_limit {limit}: Envoy would buffer bodies up to {held}; give "
            "the route a BufferPerRoute with its own limit",
        )
    elif int(held) < int(limit):
        yield warning(
            "hold-limit-lowered",
            place,
            f"{found.name} max_request_bytes {held} lowers this route's "
            f"request_body_buffer_limit {limit} (413 beyond it); give the route a "
            "BufferPerRoute with its own limit",
        )
