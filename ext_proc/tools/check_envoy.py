"""``check-envoy FILE [--listener NAME]``: check an Envoy configuration offline, before it
protects anything.

This processor's ext_proc filters are those that request its route metadata attributes;
another service's ext_proc filter (an endpoint picker's) may run after them and after
the buffer filter that holds the request for them, not before. Every HTTP connection
manager (of the named listeners, when some are named) must run one. For each: the filter
fails closed, uses an inspectable body mode and requests every route-metadata attribute;
every route's policy metadata is valid (the same validation the processor applies at
request time); no per-route override (route, virtual host, route configuration or
weighted cluster) makes the filter fail open; a ``mint`` route sends the processor its
response headers and buffered response body (docs/trust.md), or nothing is signed; every
forwarding route runs an ext_proc filter (one disabled there, or disabled by default and
not enabled there, forwards bodies nobody inspected, ids included); a ``mint`` or
``honor`` route with a ``prefix_rewrite`` tells the processor about it in its metadata
(``match_prefix`` and ``prefix_rewrite`` equal to the route's match prefix and rewrite,
or the processor binds proofs to the wrong endpoint), and rewrites no other way; no
route forwards a path that reaches one of vLLM's token-in or echo endpoints upstream
(``token_endpoints``): Envoy's first-match route selection is simulated, per virtual
host, for probe paths made from every route's prefix and rewrite (``route_probes``,
regexes run by RE2 as Envoy runs them), after the connection manager has normalised the
path as the upstream will decode it (``normalize_path``, and escaped slashes unescaped
or refused); what the simulation cannot evaluate exactly is an error, never a pass; a
route where a filter skips the request headers (one message) runs a buffer filter after
it, which holds the request until the decision. The filter keeps the processor's
refusals (no ``disable_immediate_response``), every ext_proc per-route configuration
names a filter of the chain, and no upgrade runs a filter chain of its own.
Warnings: forwarding routes without policy metadata, ``strip`` or ``deny`` routes with a
rewrite their metadata does not state, and ``honor`` routes that trust any caller or
have no ``vocab_size``. Routes that forward nothing (a direct response or a redirect)
need neither metadata nor the filter."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ext_proc.core.errors import RoutePolicyError
from ext_proc.core.route_policy import DEFAULT_NAMESPACE, FIELDS, Action, RoutePolicy, parse
from ext_proc.edge.attributes import HEADERS, as_cel, attribute_keys
from ext_proc.tools import carrier_headers, route_probes
from ext_proc.tools.token_endpoints import EVERYWHERE, is_token_path

EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
FILTER_CONFIG = "type.googleapis.com/envoy.config.route.v3.FilterConfig"
BUFFER = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer"
BUFFER_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute"
BUFFER_NAME = "envoy.filters.http.buffer"
HCM = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
    "HttpConnectionManager"
)
INSPECTABLE = ("BUFFERED", "FULL_DUPLEX_STREAMED")
# What a mint route needs the processor to see of the response: its headers, then the
# whole body at once.
MINT_RESPONSE = {"response_header_mode": "SEND", "response_body_mode": "BUFFERED"}


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    routes: int = 0


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every mapping in the document, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def _check_mode(where: str, mode: dict[str, Any], requested: set[str], report: Report) -> None:
    body = mode.get("request_body_mode", "NONE")
    if body not in INSPECTABLE:
        report.errors.append(f"{where}: request_body_mode {body} is not inspected; use BUFFERED")
    if mode.get("request_header_mode", "SEND") == "SKIP":
        # One message per request: allowed with BUFFERED bodies when the headers the
        # processor checks come as attributes.
        missing = [key for key in HEADERS.values() if key not in requested]
        if body != "BUFFERED" or missing:
            report.errors.append(
                f"{where}: request_header_mode SKIP needs request_body_mode BUFFERED and "
                f"request_attributes {missing or list(HEADERS.values())}"
            )
    if body == "FULL_DUPLEX_STREAMED" and mode.get("request_trailer_mode") != "SEND":
        report.errors.append(f"{where}: FULL_DUPLEX_STREAMED needs request_trailer_mode SEND")


def _check_filter(where: str, entry: dict[str, Any], namespace: str, report: Report) -> None:
    config = entry["typed_config"]
    if config.get("failure_mode_allow", False):
        report.errors.append(f"{where}: failure_mode_allow must be false (fail closed)")
    if config.get("observability_mode", False):
        report.errors.append(f"{where}: observability_mode cannot enforce anything")
    if config.get("allow_content_length_header", False):
        report.errors.append(f"{where}: allow_content_length_header lets stale lengths through")
    if config.get("disable_immediate_response", False):
        report.errors.append(
            f"{where}: disable_immediate_response drops the processor's refusals (its 400, "
            "413 and 415 in vLLM's error shape): Envoy closes the stream instead, and every "
            "refused request ends in a 500"
        )
    requested = set(config.get("request_attributes", []))
    _check_mode(where, config.get("processing_mode", {}), requested, report)
    missing = [key for key in attribute_keys(namespace).all() if key not in requested]
    if missing:
        report.errors.append(f"{where}: request_attributes lacks {missing}")


def _per_route(configs: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """The ext_proc per-route configurations in a ``typed_per_filter_config``, also
    inside a ``FilterConfig`` wrapper (whose own ``disabled`` counts as the filter's)."""
    if not isinstance(configs, dict):
        return
    for name, given in configs.items():
        config = given
        if isinstance(given, dict) and given.get("@type") == FILTER_CONFIG:
            if given.get("disabled"):
                yield name, {"@type": PER_ROUTE, "disabled": True}
                continue
            config = given.get("config", {})
            if not isinstance(config, dict) or config.get("@type") != PER_ROUTE:
                # An empty wrapper enables a filter that is disabled by default.
                yield name, {"@type": PER_ROUTE}
                continue
        if isinstance(config, dict) and config.get("@type") == PER_ROUTE:
            yield name, config


def _check_override(
    where: str, name: str, config: dict[str, Any], requested: set[str], report: Report
) -> None:
    """One ExtProcPerRoute, at any level: it must not make the filter fail open."""
    overrides = config.get("overrides", {})
    if overrides.get("failure_mode_allow"):
        report.errors.append(f"{where}: {name} overrides.failure_mode_allow fails open")
    if "processing_mode" in overrides:
        _check_mode(f"{where} {name} overrides", overrides["processing_mode"], requested, report)


def _overrides_in(node: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every ext_proc per-route configuration under ``node`` (weighted clusters too)."""
    for mapping in _walk(node):
        yield from _per_route(mapping.get("typed_per_filter_config"))


def _enabled(name: str, by_default: bool, levels: list[dict[str, Any]]) -> bool:
    """Whether filter ``name`` runs on a route, as Envoy decides: the most specific
    per-route configuration (any one enables a filter disabled by default), else the
    filter's own ``disabled``."""
    for level in levels:
        config = dict(_per_route(level)).get(name)
        if config is not None:
            return not config.get("disabled")
    return by_default


def _mode_on_route(
    mode: dict[str, Any], levels: list[dict[str, Any]], name: str
) -> dict[str, Any] | None:
    """The processing mode of filter ``name``, whose own mode is ``mode``, on a route
    whose typed_per_filter_config, most specific first, are ``levels``; None where it is
    disabled. As Envoy merges them: the most specific ``disabled`` or
    ``overrides.processing_mode`` decides."""
    for level in levels:
        config = dict(_per_route(level)).get(name)
        if config is None:
            continue
        if config.get("disabled"):
            return None
        overrides = config.get("overrides", {})
        if "processing_mode" in overrides:
            return dict(overrides["processing_mode"])
    return mode


def _responds(mode: dict[str, Any], levels: list[dict[str, Any]], name: str) -> bool:
    """Whether filter ``name`` sends the response to the processor on the route."""
    effective = _mode_on_route(mode, levels, name)
    return effective is not None and all(
        effective.get(key) == value for key, value in MINT_RESPONSE.items()
    )


def _hold_on_route(hold: _Hold, levels: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The buffer filter's settings (a ``Buffer``) on a route, as Envoy picks them: the
    most specific ``BufferPerRoute`` or ``FilterConfig``; None where it does not run."""
    for level in levels:
        given = level.get(hold.name) if isinstance(level, dict) else None
        if not isinstance(given, dict):
            continue
        if given.get("@type") == FILTER_CONFIG:
            if given.get("disabled"):
                return None
            given = given.get("config") or {}
            if not isinstance(given, dict) or given.get("@type") != BUFFER_PER_ROUTE:
                return hold.config  # an empty wrapper enables the filter as configured
        if given.get("@type") == BUFFER_PER_ROUTE:
            if given.get("disabled"):
                return None
            if isinstance(given.get("buffer"), dict):
                return dict(given["buffer"])
    return None if hold.off_by_default else hold.config


def _check_hold(
    where: str,
    route: dict[str, Any],
    levels: list[dict[str, Any]],
    *,
    running: list[str],
    manager: _Manager,
    report: Report,
) -> None:
    """Whatever skips the request headers (one message per request) passes them on at
    once, and the router would open the upstream request before the decision: a buffer
    filter after it must hold the request until the body has been let through."""
    for name in running:
        mode = _mode_on_route(manager.filters[name].get("processing_mode", {}), levels, name)
        if mode is None or mode.get("request_header_mode", "SEND") != "SKIP":
            continue
        after = manager.positions[name]
        holds = [
            (hold, settings)
            for hold in manager.holds
            if hold.position > after and (settings := _hold_on_route(hold, levels)) is not None
        ]
        if not holds:
            report.errors.append(
                f"{where}: {name} skips the request headers (one message) and no buffer "
                "filter after it holds the request here: the upstream request opens, "
                "headers sent, before the decision, for refused requests and slow uploads "
                f"alike. Put {BUFFER_NAME} after it (docs/body-modes.md)"
            )
            continue
        limit = route.get("request_body_buffer_limit")
        for hold, settings in holds:
            held = settings.get("max_request_bytes")
            if held is None:
                continue
            # The hold sets the stream's buffer limit to its own: above the route's, Envoy
            # buffers bodies the route was sized to refuse (memory); below, it refuses
            # bodies the route admits (413).
            if limit is None:
                report.errors.append(
                    f"{where}: {hold.name} sets the stream's buffer limit to {held} and the "
                    "route states none (request_body_buffer_limit): give the route its "
                    "limit and the hold the same"
                )
            elif int(held) > int(limit):
                report.errors.append(
                    f"{where}: {hold.name} max_request_bytes {held} raises this route's "
                    f"request_body_buffer_limit {limit}: Envoy would buffer bodies up to "
                    f"{held}; give the route a BufferPerRoute with its own limit"
                )
            elif int(held) < int(limit):
                report.warnings.append(
                    f"{where}: {hold.name} max_request_bytes {held} lowers this route's "
                    f"request_body_buffer_limit {limit} (413 beyond it); give the route a "
                    "BufferPerRoute with its own limit"
                )


def _check_policy(where: str, policy: RoutePolicy, responds: bool, report: Report) -> None:
    if policy.action is Action.MINT and not responds:
        report.errors.append(
            f"{where}: action mint but the response is not processed (needs "
            "response_header_mode SEND and response_body_mode BUFFERED, e.g. an "
            "ExtProcPerRoute override); nothing would be signed"
        )
    if policy.action is Action.HONOR and policy.trust_any_caller:
        report.warnings.append(
            f"{where}: trust_any_caller honors ids from any caller; only for routes "
            "nothing untrusted can reach"
        )
    if policy.action is Action.HONOR and policy.vocab_size is None:
        report.warnings.append(
            f"{where}: honor without vocab_size: ids are bounded by 2**31, not by the vocabulary"
        )


@dataclass
class _Manager:
    """What every route of one connection manager is checked against."""

    namespace: str
    requested: set[str]
    # ext_proc filters by name: their typed_config.
    filters: dict[str, dict[str, Any]]
    # Filters that run unless a route says otherwise (HttpFilter.disabled false).
    on_by_default: set[str]
    # Each ext_proc filter's place in the filter chain, and the buffer filters'.
    positions: dict[str, int]
    holds: list[_Hold]


@dataclass(frozen=True)
class _Hold:
    """A buffer filter of the chain: it holds a request until its whole body is there."""

    name: str
    position: int
    config: dict[str, Any]
    off_by_default: bool


def _check_route(
    where: str,
    route: dict[str, Any],
    outer: list[dict[str, Any]],
    manager: _Manager,
    report: Report,
) -> None:
    """``outer``: the virtual host's and the route configuration's typed_per_filter_config."""
    report.routes += 1
    for name, config in _overrides_in(route):
        _check_override(where, name, config, manager.requested, report)
    # A direct response or a redirect reaches no upstream: nothing to police.
    if "route" not in route:
        return
    own = route.get("typed_per_filter_config", {})
    levels = [own, *outer]
    running = [
        name for name in manager.filters if _enabled(name, name in manager.on_by_default, levels)
    ]
    if not running:
        # Fail closed: whatever this route forwards reaches the upstream uninspected,
        # client-chosen kv_transfer_params included.
        report.errors.append(
            f"{where}: no ext_proc filter runs on this forwarding route (disabled here or "
            "not enabled); request bodies would reach the upstream uninspected. Enable the "
            "filter, or answer the route with a direct_response"
        )
    _check_hold(where, route, levels, running=running, manager=manager, report=report)
    # A weighted cluster's own configuration is the most specific of all: one that
    # turns the filter off forwards its share of the route's requests uninspected.
    for cluster in route["route"].get("weighted_clusters", {}).get("clusters", []):
        inner = cluster.get("typed_per_filter_config", {}) if isinstance(cluster, dict) else {}
        inside = [inner, *levels]
        here = [
            name
            for name in manager.filters
            if _enabled(name, name in manager.on_by_default, inside)
        ]
        if running and not here:
            report.errors.append(
                f"{where}: no ext_proc filter runs for weighted cluster "
                f"{cluster.get('name')!r}; its requests would reach the upstream uninspected"
            )
        label = f"{where} weighted cluster {cluster.get('name')!r}"
        _check_hold(label, route, inside, running=here, manager=manager, report=report)
    namespace = manager.namespace
    policy = route.get("metadata", {}).get("filter_metadata", {}).get(namespace)
    if policy is None:
        report.warnings.append(f"{where}: no '{namespace}' metadata (aggregated + strip)")
        return
    if not isinstance(policy, dict):
        report.errors.append(f"{where}: '{namespace}' metadata must be a mapping")
        return
    try:
        values = {k: as_cel(v) for k, v in policy.items() if k in FIELDS}
        parsed = parse(values, len(policy), namespace)
    except RoutePolicyError as exc:
        report.errors.append(f"{where}: {exc.message}")
        return
    responds = any(
        _responds(manager.filters[name].get("processing_mode", {}), levels, name)
        for name in running
    )
    _check_policy(where, parsed, responds, report)
    _check_rewrite(where, route, parsed, report)


def _check_rewrite(where: str, route: dict[str, Any], policy: RoutePolicy, report: Report) -> None:
    """The processor learns the upstream path from ``match_prefix`` and ``prefix_rewrite``
    (``RoutePolicy.upstream_path``): on ``mint`` and ``honor`` routes, where proofs are
    bound to that path, a rewrite it is not told about, or cannot follow, is an error."""
    action = route["route"]
    binding = policy.action in (Action.MINT, Action.HONOR)
    problems = report.errors if binding else report.warnings
    given = (policy.match_prefix, policy.prefix_rewrite)
    if any(key in action for key in route_probes.UNFOLLOWED_REWRITES):
        return  # an error on every forwarding route (_check_token_endpoints)
    rewrite = action.get("prefix_rewrite") or None
    match = route.get("match", {})
    prefix = match.get("prefix", match.get("path_separated_prefix"))
    if rewrite is None:
        if given != (None, None):
            report.errors.append(
                f"{where}: metadata match_prefix {given[0]!r} and prefix_rewrite "
                f"{given[1]!r} describe a rewrite this route does not make; the processor "
                "would compute the wrong upstream path. Remove them"
            )
        return
    if prefix is None:
        problems.append(
            f"{where}: prefix_rewrite with a {', '.join(match) or 'missing'} matcher is not "
            f"supported on a {policy.action.value} route (the processor follows prefix "
            "rewrites of prefix matches only)"
        )
        return
    expected = (prefix, rewrite)
    if given == expected:
        return
    fields = f"match_prefix {prefix!r} and prefix_rewrite {rewrite!r}"
    if given == (None, None):
        problems.append(
            f"{where}: the route rewrites {prefix!r} to {rewrite!r} but its metadata lacks "
            f"{fields}; the processor would take the downstream path for the upstream "
            + ("one and bind proofs to the wrong endpoint" if binding else "one")
        )
        return
    report.errors.append(
        f"{where}: metadata match_prefix {given[0]!r} and prefix_rewrite {given[1]!r} "
        f"differ from the route's {fields}; the processor would compute the wrong "
        "upstream path (or refuse every request)"
    )


def _check_token_endpoints(where: str, entries: list[dict[str, Any]], report: Report) -> None:
    """No route Envoy would select forwards a probe path to a token-in or echo endpoint
    (``route_probes``). A route whose selection depends on a condition beside the path
    is checked when it forwards, and the routes after it are checked too: requests it
    does not match reach them. What cannot be simulated exactly is an error: a matcher
    or a rewrite that cannot be read, and a forwarding route matched by a pattern before
    the 404s that answer every token path."""
    routes = route_probes.read_routes(entries)
    for route in routes:
        if route.problem is not None:
            report.errors.append(
                f"{where}/{route.label}: {route.problem}: this check cannot tell which paths "
                "the route matches (token-in or echo endpoints among them)"
            )
        rewrite = route.rewrite_problem()
        if rewrite is not None:
            report.errors.append(
                f"{where}/{route.label}: {rewrite}: neither the processor (which binds "
                "proofs to the upstream path) nor this check can tell which paths reach a "
                "token-in or echo endpoint upstream through it. Use a prefix match with "
                "prefix_rewrite, stated in match_prefix and prefix_rewrite"
            )
    for route in route_probes.unguarded(routes):
        if route.problem is None and route.matcher is not None:
            report.errors.append(
                f"{where}/{route.label}: forwards what its {route.matcher.kind} "
                f"{route.matcher.source!r} matches before the 404s of every token path "
                f"({', '.join(m.value for m in EVERYWHERE)}): this check cannot tell which "
                "token-in or echo endpoints it forwards. Put it after them (envoy-config "
                "writes them first)"
            )
    forwarded: dict[str, list[str]] = {}
    for found in (route_probes.claim(routes, p, o) for p, o in route_probes.probes(routes).items()):
        for forward in found.forwards:
            if forward.upstream is None or is_token_path(forward.upstream):
                shown = "unknown" if forward.upstream is None else repr(forward.upstream)
                note = "" if forward.certain else ", if its matcher matches"
                forwarded.setdefault(forward.route, []).append(
                    f"{found.path!r} (upstream {shown}, made from route {found.origin}{note})"
                )
    for label, paths in forwarded.items():
        more = f" and {len(paths) - 1} more" if len(paths) > 1 else ""
        report.errors.append(
            f"{where}/{label}: forwards {paths[0]}{more} to a vLLM token-in or echo "
            "endpoint (ids in without a template, or request content echoed); answer "
            "those paths with a direct_response before this route"
        )


# What the connection manager must do to the path before routes match, so that route
# matches see the path the upstream decodes (uvicorn percent-decodes it).
_UNESCAPING = ("UNESCAPE_AND_REDIRECT", "UNESCAPE_AND_FORWARD", "REJECT_REQUEST")


def _check_path_handling(where: str, manager: dict[str, Any], report: Report) -> None:
    if manager.get("normalize_path") is not True:
        report.errors.append(
            f"{where}: normalize_path is not true: route matches see dot segments and "
            "escaped letters the upstream resolves ('/v1/chat/completions/%64erender' "
            "reaches derender). Set normalize_path: true"
        )
    action = manager.get("path_with_escaped_slashes_action", "KEEP_UNCHANGED")
    if action not in _UNESCAPING:
        report.errors.append(
            f"{where}: path_with_escaped_slashes_action {action} keeps '%2F' in the path "
            "routes match while the upstream decodes it ('/pd/v1/chat/completions%2Fderender' "
            f"reaches derender). Use one of {', '.join(_UNESCAPING)}"
        )


def _ours(entry: dict[str, Any], namespace: str) -> bool:
    """Whether an ext_proc filter is this processor's: it requests one of the route
    metadata attributes of its namespace. Another service's (an endpoint picker's) is
    checked only for where it runs (``_check_others``)."""
    requested = entry.get("typed_config", {}).get("request_attributes", [])
    keys = attribute_keys(namespace)
    return any(key in requested for key in (*keys.fields.values(), keys.size))


def _check_others(
    where: str, filters: list[dict[str, Any]], ours: list[str], report: Report
) -> None:
    """Another service's ext_proc filter must see only requests this processor has
    decided: after this processor's first filter and after any buffer filter that holds
    the request for it. One that fails open is reported as a warning."""
    first = next(i for i, f in enumerate(filters) if f.get("name") in ours)
    holds = [
        i
        for i, f in enumerate(filters)
        if i > first and f.get("typed_config", {}).get("@type") == BUFFER
    ]
    for position, entry in enumerate(filters):
        config = entry.get("typed_config", {})
        if config.get("@type") != EXT_PROC or entry.get("name") in ours:
            continue
        name = entry.get("name")
        if position < first:
            report.errors.append(
                f"{where}: ext_proc filter {name} runs before this processor's: it reads "
                "(and may change) requests before their kv_transfer_params are policed"
            )
        elif holds and position < holds[0]:
            report.errors.append(
                f"{where}: ext_proc filter {name} runs before the buffer filter that holds "
                "the request until this processor's decision: it sees undecided requests"
            )
        if config.get("failure_mode_allow", False):
            report.warnings.append(
                f"{where}: ext_proc filter {name} fails open (failure_mode_allow): while "
                "its service is down, requests skip it"
            )


_OVERWRITE = "OVERWRITE_IF_EXISTS_OR_ADD"
# The headers whose value no client may choose once the header step has run.
_GUARDED = (*carrier_headers.ROUTING_HEADERS, carrier_headers.REQUEST_ID)


def _sets(mutation: dict[str, Any]) -> tuple[str, str, str] | None:
    """The header an ``append`` mutation writes: (name, value, append action)."""
    option = mutation.get("append")
    if not isinstance(option, dict) or not isinstance(option.get("header"), dict):
        return None
    header = option["header"]
    action = str(option.get("append_action", "APPEND_IF_EXISTS_OR_ADD"))
    return str(header.get("key", "")).lower(), str(header.get("value", "")), action


def _client_derived(value: str) -> bool:
    """Whether a header value Envoy formats may carry what a client sent: any command
    but the step's own fresh id (``%REQ(...)%``, a path, a query parameter, SNI...)."""
    return "%" in value.replace(carrier_headers.NEW_ID, "")


def _header_step_faults(entry: dict[str, Any]) -> list[str]:
    """What a header step (``ext_proc.tools.carrier_headers``) fails to do, its mutations read
    in order as Envoy applies them: every routing header removed last, and the request
    id last overwritten with a fresh one."""
    config = entry.get("typed_config", {})
    if entry.get("disabled", False):
        return ["it is disabled"]
    if config.get("most_specific_header_mutations_wins", False):
        return ["most_specific_header_mutations_wins lets a route's mutations replace it"]
    # What each guarded header holds after the step: None = removed, else the last write.
    last: dict[str, tuple[str, str] | None] = {}
    for mutation in config.get("mutations", {}).get("request_mutations", []):
        if not isinstance(mutation, dict):
            continue
        if isinstance(mutation.get("remove"), str):
            last[mutation["remove"].lower()] = None
        written = _sets(mutation)
        if written is not None:
            last[written[0]] = (written[1], written[2])
    faults = [
        f"it keeps a client's {name}" if name not in last else f"it writes {name} after removing it"
        for name in carrier_headers.ROUTING_HEADERS
        if last.get(name, "kept") is not None
    ]
    if last.get(carrier_headers.REQUEST_ID) != (carrier_headers.NEW_ID, _OVERWRITE):
        faults.append(
            f"it keeps a client's {carrier_headers.REQUEST_ID} (its last mutation must set "
            f"{carrier_headers.NEW_ID} with append_action {_OVERWRITE}, after moving the "
            f"incoming one to {carrier_headers.CLIENT_REQUEST_ID})"
        )
    return faults


def _rewrites(where: str, manager: dict[str, Any], step: str, report: Report) -> None:
    """Anything else that writes a guarded header from what a client sent undoes the
    step: another header_mutation filter, or a route's ``request_headers_to_add``
    (applied by the router, after every filter). A constant (an endpoint picker's own
    choice, say) is its writer's business."""
    for entry in manager.get("http_filters", []):
        config = entry.get("typed_config", {}) if isinstance(entry, dict) else {}
        if config.get("@type") != carrier_headers.FILTER_TYPE or entry.get("name") == step:
            continue
        for mutation in config.get("mutations", {}).get("request_mutations", []):
            written = _sets(mutation) if isinstance(mutation, dict) else None
            if written and written[0] in _GUARDED and _client_derived(written[1]):
                report.errors.append(
                    f"{where}: filter {entry.get('name')} writes {written[0]} from the "
                    f"request ({written[1]}): a client's value again, after the header step"
                )
    for node in _walk(manager.get("route_config", {})):
        for option in node.get("request_headers_to_add", []):
            header = option.get("header", {}) if isinstance(option, dict) else {}
            name, value = str(header.get("key", "")).lower(), str(header.get("value", ""))
            if name in _GUARDED and _client_derived(value):
                report.errors.append(
                    f"{where}: request_headers_to_add writes {name} from the request "
                    f"({value}): the router adds it after every filter, the header step "
                    "included"
                )


def _check_header_step(
    where: str,
    manager: dict[str, Any],
    filters: list[dict[str, Any]],
    ours: list[str],
    report: Report,
) -> None:
    """The header step must run before this processor's first filter, on every route:
    then neither the processor nor any filter after it (an endpoint picker) nor an
    upstream sees a client's copy of a header that a component behind it trusts."""
    first = next(i for i, f in enumerate(filters) if f.get("name") in ours)
    steps = [
        (i, f)
        for i, f in enumerate(filters)
        if f.get("typed_config", {}).get("@type") == carrier_headers.FILTER_TYPE
    ]
    good = [i for i, f in steps if i < first and not _header_step_faults(f)]
    if not good:
        faults = [fault for i, f in steps if i < first for fault in _header_step_faults(f)]
        why = f": {'; '.join(faults)}" if faults else ""
        report.errors.append(
            f"{where}: no header step ({carrier_headers.FILTER}) before this processor's "
            f"filter{why}. Later filters and the upstream see a client's routing headers "
            f"({', '.join(carrier_headers.ROUTING_HEADERS)}) and request id: `envoy-config` "
            "writes the step"
        )
        return
    names = {str(filters[i].get("name")) for i in good}
    _rewrites(where, manager, str(filters[good[0]].get("name")), report)
    options = manager.get("common_http_protocol_options", {})
    if options.get("headers_with_underscores_action", "ALLOW") == "ALLOW":
        report.warnings.append(
            f"{where}: header names with underscores pass (headers_with_underscores_action "
            "ALLOW): a reader that takes '_' for '-' (CGI, WSGI, nginx with "
            "underscores_in_headers) sees x_request_id as the renewed x-request-id. Set "
            "DROP_HEADER or REJECT_REQUEST"
        )
    for node in _walk(manager.get("route_config", {})):
        for name in names & set(node.get("typed_per_filter_config", {})):
            report.errors.append(
                f"{where}: a route or virtual host configures the header step {name} "
                "itself: it must be the same on every route"
            )


def _check_filter_names(
    where: str, manager: dict[str, Any], filters: list[dict[str, Any]], report: Report
) -> None:
    """Envoy hands a per-route filter configuration to the filter of the chain with that
    name, and to nothing else: an ext_proc one under another name (the filter's type, a
    misspelt name) is ignored. A route that disables or overrides an ext_proc filter that
    way still runs it as configured, and its requests fail at run time where the check
    said they pass."""
    names = {str(f.get("name")) for f in filters}
    for node in _walk(manager.get("route_config", {})):
        configs = node.get("typed_per_filter_config")
        if not isinstance(configs, dict):
            continue
        for name in sorted(set(configs) - names):
            given = configs[name]
            inner = given.get("config") if isinstance(given, dict) else None
            if not any(isinstance(c, dict) and c.get("@type") == PER_ROUTE for c in (given, inner)):
                continue
            report.errors.append(
                f"{where}: typed_per_filter_config {name!r} names no filter of the chain "
                f"({', '.join(sorted(names))}): Envoy ignores it. Key it by the filter's name"
            )


def _check_upgrades(where: str, manager: dict[str, Any], report: Report) -> None:
    """An upgrade (websocket, CONNECT...) with a filter chain of its own runs that chain
    instead of this one: the request's headers reach the upstream without this
    processor's filter, and its body waits for a 101."""
    for upgrade in manager.get("upgrade_configs", []):
        if isinstance(upgrade, dict) and "filters" in upgrade:
            report.errors.append(
                f"{where}: upgrade_configs {upgrade.get('upgrade_type')!r} runs filters of its "
                "own: its requests skip this processor's filter (headers forwarded "
                "uninspected). Remove its filters (the upgrade then runs this chain) or the "
                "upgrade"
            )


def _managers(config: Any, listeners: frozenset[str] | None, report: Report) -> list[Any]:
    """The connection managers to check: every one, or those of the named listeners."""
    if listeners is None:
        return [n for n in _walk(config) if n.get("@type") == HCM]
    found = [
        listener
        for listener in _walk(config)
        if listener.get("name") in listeners
        and ("filter_chains" in listener or "default_filter_chain" in listener)
    ]
    missing = sorted(listeners - {str(listener["name"]) for listener in found})
    if missing:
        report.errors.append(f"no listener named {', '.join(missing)}")
    return [n for listener in found for n in _walk(listener) if n.get("@type") == HCM]


def check(
    config: Any, namespace: str = DEFAULT_NAMESPACE, listeners: frozenset[str] | None = None
) -> Report:
    """``listeners``: check only these listeners' connection managers (the ones in front
    of model servers), not an admin or readiness listener beside them."""
    report = Report()
    managers = _managers(config, listeners, report)
    if not managers:
        report.errors.append("no HTTP connection manager found")
    for index, manager in enumerate(managers):
        filters = [f for f in manager.get("http_filters", []) if isinstance(f, dict)]
        ext_procs = [
            f
            for f in filters
            if f.get("typed_config", {}).get("@type") == EXT_PROC and _ours(f, namespace)
        ]
        where = f"http_connection_manager[{index}]"
        if ext_procs:
            ours = [str(f.get("name")) for f in ext_procs]
            _check_others(where, filters, ours, report)
            _check_header_step(where, manager, filters, ours, report)
        if not ext_procs:
            others = any(f.get("typed_config", {}).get("@type") == EXT_PROC for f in filters)
            report.errors.append(
                f"{where}: no ext_proc filter of this processor (none requests its route "
                f"attributes{', though other ext_proc filters run' if others else ''}); no "
                "request is inspected"
            )
            continue
        requested = {
            attribute
            for ext_proc in ext_procs
            for attribute in ext_proc["typed_config"].get("request_attributes", [])
        }
        for ext_proc in ext_procs:
            _check_filter(f"{where} filter {ext_proc.get('name')}", ext_proc, namespace, report)
        _check_path_handling(where, manager, report)
        _check_filter_names(where, manager, filters, report)
        _check_upgrades(where, manager, report)
        checked = _Manager(
            namespace,
            requested,
            {str(f.get("name")): f["typed_config"] for f in ext_procs},
            {str(f.get("name")) for f in ext_procs if not f.get("disabled", False)},
            {str(f.get("name")): filters.index(f) for f in ext_procs},
            [
                _Hold(str(f.get("name")), position, f["typed_config"], bool(f.get("disabled")))
                for position, f in enumerate(filters)
                if f.get("typed_config", {}).get("@type") == BUFFER
            ],
        )
        for unseen in ("rds", "scoped_routes"):
            if unseen in manager:
                report.errors.append(
                    f"{where}: routes come from {unseen}: this check cannot see them (give "
                    "the connection manager its route_config inline to check it)"
                )
        route_config = manager.get("route_config", {})
        top = route_config.get("typed_per_filter_config", {})
        for name, per_route in _per_route(top):
            _check_override(f"{where} route_config", name, per_route, requested, report)
        for vhost in route_config.get("virtual_hosts", []):
            label = f"{where} virtual_host {vhost.get('name')}"
            if "matcher" in vhost:
                report.errors.append(
                    f"{label}: routes chosen by a matcher tree: this check cannot see which "
                    "routes forward what; use routes"
                )
            host = vhost.get("typed_per_filter_config", {})
            for name, per_route in _per_route(host):
                _check_override(label, name, per_route, requested, report)
            listed = [r for r in vhost.get("routes", []) if isinstance(r, dict)]
            for position, route in enumerate(listed):
                route_label = route.get("name") or f"#{position}"
                _check_route(
                    f"{where} route {vhost.get('name')}/{route_label}",
                    route,
                    [host, top],
                    checked,
                    report,
                )
            _check_token_endpoints(f"{where} route {vhost.get('name')}", listed, report)
    return report


def main(path: Path, namespace: str | None = None, listeners: frozenset[str] | None = None) -> int:
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        print(f"{path}: cannot read: {exc}", file=sys.stderr)
        return 1
    report = check(config, namespace or DEFAULT_NAMESPACE, listeners)
    for warning in report.warnings:
        print(f"warning: {warning}")
    for error in report.errors:
        print(f"error: {error}")
    verdict = "FAILED" if report.errors else "OK"
    print(
        f"{path}: {verdict} ({report.routes} routes, {len(report.errors)} errors, "
        f"{len(report.warnings)} warnings)"
    )
    return 1 if report.errors else 0
