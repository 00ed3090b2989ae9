"""A filter's setting on one route, as Envoy picks it from the per-route
configurations: the most specific ``typed_per_filter_config`` that says something about
it wins (a weighted cluster's, then the route's, the virtual host's, the route
configuration's), else the filter's own.

``effective`` is that walk, written once; each reading below states what one level
says about one filter, or None when it leaves the decision to the levels around it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Literal, TypeVar

from ext_proc.tools.check_envoy.reader import (
    BUFFER_PER_ROUTE,
    FILTER_CONFIG,
    PER_ROUTE,
    Chain,
    Hold,
)

T = TypeVar("T")
# A level's word that the filter does not run there.
OFF: Final = "off"
Off = Literal["off"]


def effective(levels: Sequence[Any], name: str, says: Callable[[Any], T | None], default: T) -> T:
    """What the most specific level that decides says about filter ``name``
    (``levels``: typed_per_filter_config mappings, most specific first), else
    ``default``."""
    for level in levels:
        if not isinstance(level, dict) or name not in level:
            continue
        decided = says(level[name])
        if decided is not None:
            return decided
    return default


def _enables(given: Any) -> bool | None:
    # The filter chain's word (Envoy's route entry per filter name): a FilterConfig
    # wrapper by its own ``disabled``, any ext_proc configuration by being there (one
    # enables a filter disabled by default).
    if not isinstance(given, dict):
        return None
    if given.get("@type") == FILTER_CONFIG:
        return not given.get("disabled")
    return True if given.get("@type") == PER_ROUTE else None


def _configured(given: Any) -> bool | None:
    # The filter chain's word on any filter: a FilterConfig wrapper by its own
    # ``disabled``, any other configuration by being there (Envoy's docs of
    # HttpFilter.disabled: a route's configuration enables a filter disabled by default).
    if not isinstance(given, dict):
        return None
    return not given.get("disabled") if given.get("@type") == FILTER_CONFIG else True


def runs(entry: dict[str, Any], levels: Sequence[Any]) -> bool:
    """Whether the filter chain runs the HTTP filter ``entry`` on a route of ``levels``."""
    by_default = not entry.get("disabled", False)
    return effective(levels, str(entry.get("name")), _configured, by_default)


def _own(given: Any) -> dict[str, Any] | None:
    # ext_proc's own per-route configuration at a level: what its merge reads. A
    # wrapper with an empty config enables the filter but configures nothing.
    if isinstance(given, dict) and given.get("@type") == FILTER_CONFIG:
        given = None if given.get("disabled") else given.get("config")
    if isinstance(given, dict) and given.get("@type") == PER_ROUTE:
        return given
    return None


def _own_disabled(given: Any) -> bool | None:
    own = _own(given)
    return None if own is None else bool(own.get("disabled"))


def ext_proc_runs(name: str, by_default: bool, levels: Sequence[Any]) -> bool:
    """Whether ext_proc filter ``name`` processes the route: the filter chain runs it
    (the most specific level naming it enables it) and ext_proc's merged per-route
    configuration does not disable it (Envoy takes ``disabled`` from the most specific
    ext_proc configuration, so a wrapper that only enables the filter leaves a disabled
    one below it in force)."""
    runs = effective(levels, name, _enables, by_default)
    return runs and not effective(levels, name, _own_disabled, False)


def running(chain: Chain, levels: Sequence[Any]) -> list[str]:
    """This processor's filters that process a request under ``levels``."""
    return [
        name for name in chain.configs if ext_proc_runs(name, name in chain.on_by_default, levels)
    ]


def ext_proc_mode(name: str, mode: dict[str, Any], levels: Sequence[Any]) -> dict[str, Any] | None:
    """The processing mode of ext_proc filter ``name``, whose own is ``mode``, on the
    route; None where it is disabled.

    Envoy merges the per-route configurations from the least specific up, each merge
    taking the more specific level's ``disabled`` and, unless that is set, its processing
    mode or else the merged one below it; a disabled level's merged mode is none. So the
    most specific level that states something wins, a level without a processing mode
    leaves it to the levels around it, and a disabled level that is not the most
    specific ends the search: the filter's own mode applies, not one stated below it."""
    most_specific = True
    for level in levels:
        config = _own(level.get(name)) if isinstance(level, dict) else None
        if config is None:
            continue
        if config.get("disabled"):
            return None if most_specific else mode
        most_specific = False
        overrides = config.get("overrides", {})
        if "processing_mode" in overrides:
            return dict(overrides["processing_mode"])
    return mode


def _buffer_settings(hold: Hold) -> Callable[[Any], dict[str, Any] | Off | None]:
    def says(given: Any) -> dict[str, Any] | Off | None:
        if not isinstance(given, dict):
            return None
        if given.get("@type") == FILTER_CONFIG:
            if given.get("disabled"):
                return OFF
            given = given.get("config") or {}
            if not isinstance(given, dict) or given.get("@type") != BUFFER_PER_ROUTE:
                return hold.config  # an empty wrapper enables the filter as configured
        if given.get("@type") == BUFFER_PER_ROUTE:
            if given.get("disabled"):
                return OFF
            if isinstance(given.get("buffer"), dict):
                return dict(given["buffer"])
        return None

    return says


def hold_settings(hold: Hold, levels: Sequence[Any]) -> dict[str, Any] | None:
    """The buffer filter's settings (a ``Buffer``) on the route: the most specific
    ``BufferPerRoute`` or ``FilterConfig``; None where it does not run."""
    default: dict[str, Any] | Off = OFF if hold.off_by_default else hold.config
    found = effective(levels, hold.name, _buffer_settings(hold), default)
    return None if isinstance(found, str) else found
