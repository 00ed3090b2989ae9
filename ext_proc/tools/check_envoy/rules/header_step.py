"""The header step (``ext_proc.tools.carrier_headers``) runs before this processor's
first filter, on every route: then neither the processor nor any filter after it (an
endpoint picker) nor an upstream sees a client's copy of a header that a component
behind it trusts, and no route's header additions write one back from the request
(what a filter after the step may write is ``writers``'s rule)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from ext_proc.tools import carrier_headers
from ext_proc.tools.check_envoy.effective import running, runs
from ext_proc.tools.check_envoy.findings import Finding, error, warning
from ext_proc.tools.check_envoy.reader import FILTER_CONFIG, Chain, virtual_hosts, walk
from ext_proc.tools.check_envoy.writes import client_derived

OVERWRITE: Final = "OVERWRITE_IF_EXISTS_OR_ADD"
# The headers whose value no client may choose once the header step has run.
GUARDED: Final = (*carrier_headers.ROUTING_HEADERS, carrier_headers.REQUEST_ID)


def _sets(mutation: dict[str, Any]) -> tuple[str, str, str] | None:
    """The header an ``append`` mutation writes: (name, value, append action)."""
    option = mutation.get("append")
    if not isinstance(option, dict) or not isinstance(option.get("header"), dict):
        return None
    header = option["header"]
    action = str(option.get("append_action", "APPEND_IF_EXISTS_OR_ADD"))
    return str(header.get("key", "")).lower(), str(header.get("value", "")), action


def _is_step(entry: dict[str, Any]) -> bool:
    return bool(entry.get("typed_config", {}).get("@type") == carrier_headers.FILTER_TYPE)


def faults(entry: dict[str, Any]) -> list[str]:
    """What a header step fails to do, its mutations read in order as Envoy applies
    them: every routing header removed last, and the request id last overwritten with a
    fresh one."""
    config = entry.get("typed_config", {})
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
    found = [
        f"it keeps a client's {name}" if name not in last else f"it writes {name} after removing it"
        for name in carrier_headers.ROUTING_HEADERS
        if last.get(name, "kept") is not None
    ]
    if last.get(carrier_headers.REQUEST_ID) != (carrier_headers.NEW_ID, OVERWRITE):
        found.append(
            f"it keeps a client's {carrier_headers.REQUEST_ID} (its last mutation must set "
            f"{carrier_headers.NEW_ID} with append_action {OVERWRITE}, after moving the "
            f"incoming one to {carrier_headers.CLIENT_REQUEST_ID})"
        )
    return found


def header_step(chain: Chain) -> Iterator[Finding]:
    filters = chain.filters
    first = next(i for i, f in enumerate(filters) if f.get("name") in chain.names)
    before = [(i, f) for i, f in enumerate(filters) if _is_step(f) and i < first]
    good = [i for i, f in before if not faults(f)]
    if not good:
        found = [fault for _, f in before for fault in faults(f)]
        why = f": {'; '.join(found)}" if found else ""
        yield error(
            "header-step-missing",
            chain.place,
            f"no header step ({carrier_headers.FILTER}) before this processor's filter{why}. "
            "Later filters and the upstream see a client's routing headers "
            f"({', '.join(carrier_headers.ROUTING_HEADERS)}) and request id: `envoy-config` "
            "writes the step",
        )
        return
    yield from _disabled(chain, [filters[i] for i in good])
    yield from _added_by_routes(chain)
    yield from _underscores(chain, [filters[i] for i in good])
    yield from _per_route(chain, {str(filters[i].get("name")) for i in good})


def _disabled(chain: Chain, steps: list[dict[str, Any]]) -> Iterator[Finding]:
    """A step disabled by default (a shared gateway's wiring, enabled where this
    processor's filter is) must run on every route this processor polices."""
    if any(not step.get("disabled", False) for step in steps):
        return
    for vhost in virtual_hosts(chain):
        for route in vhost.routes:
            if not running(chain, route.levels):
                continue
            if not any(runs(step, route.levels) for step in steps):
                yield error(
                    "header-step-missing",
                    route.place,
                    "the header step is disabled by default and this route, which this "
                    "processor's filter polices, does not enable it: later filters and the "
                    "upstream see a client's routing headers and request id",
                )


def _added_by_routes(chain: Chain) -> Iterator[Finding]:
    """A route's ``request_headers_to_add`` writing a guarded header from what a client
    sent undoes the step: the router applies it after every filter. A constant (an
    endpoint picker's own choice, say) is its writer's business. What a filter after
    the step writes is ``writers``'s rule."""
    for node in walk(chain.manager.get("route_config", {})):
        for option in node.get("request_headers_to_add", []):
            header = option.get("header", {}) if isinstance(option, dict) else {}
            name, value = str(header.get("key", "")).lower(), str(header.get("value", ""))
            if name in GUARDED and client_derived(value):
                yield error(
                    "header-rewritten-by-route",
                    chain.place,
                    f"request_headers_to_add writes {name} from the request ({value}): the "
                    "router adds it after every filter, the header step included",
                )


def _removed(step: dict[str, Any]) -> set[str]:
    mutations = step.get("typed_config", {}).get("mutations", {}).get("request_mutations", [])
    return {str(m["remove"]).lower() for m in mutations if isinstance(m, dict) and "remove" in m}


def _underscores(chain: Chain, steps: list[dict[str, Any]]) -> Iterator[Finding]:
    options = chain.manager.get("common_http_protocol_options", {})
    # A step that removes every guarded header's underscore spelling keeps them from
    # such a reader on the routes it runs on, without dropping other routes' headers.
    spelt = {name.replace("-", "_") for name in GUARDED}
    if any(spelt <= _removed(step) for step in steps):
        return
    if options.get("headers_with_underscores_action", "ALLOW") == "ALLOW":
        yield warning(
            "underscore-headers",
            chain.place,
            "header names with underscores pass (headers_with_underscores_action ALLOW): a "
            "reader that takes '_' for '-' (CGI, WSGI, nginx with underscores_in_headers) "
            "sees x_request_id as the renewed x-request-id. Set DROP_HEADER or REJECT_REQUEST",
        )


def _only_enables(given: Any) -> bool:
    """A ``FilterConfig`` with an empty config: it enables the step as it is."""
    return (
        isinstance(given, dict)
        and given.get("@type") == FILTER_CONFIG
        and not given.get("disabled", False)
        and not given.get("is_optional", False)
        and given.get("config") in (None, {})
    )


def _per_route(chain: Chain, names: set[str]) -> Iterator[Finding]:
    for node in walk(chain.manager.get("route_config", {})):
        configs = node.get("typed_per_filter_config", {})
        for name in names & set(configs):
            if _only_enables(configs[name]):
                continue
            yield error(
                "header-step-per-route",
                chain.place,
                f"a route or virtual host configures the header step {name} itself: it must "
                "be the same on every route",
            )
