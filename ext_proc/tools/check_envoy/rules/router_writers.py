"""Nothing writes a header the router retries or hedges by (``ROUTER_HEADERS``) between
the header step's removal of them and the router, on a connection manager with a
``mint`` or ``honor`` route: the router would resend that route's body, decided once,
without running any filter again (a proven decode leg read twice, a turn's KV read back
twice).

The construction: the header step removes every router header, so whatever a filter
before it wrote (a Lua script, a second ``header_mutation``, a route's configuration of
one) never reaches the router, and only what runs after it is judged here. The router's
own options cannot help: none turns these headers off (``strict_check_headers`` checks
their values, ``suppress_envoy_headers`` concerns the headers it writes), and a route's
``request_headers_to_remove`` comes too late for the hedge and per-try timeout headers
(``router_headers``). A filter after the step is judged by what it can write:

- ``header_mutation``: its own mutations and every route's ``HeaderMutationPerRoute``
  for it, a write of a router header (a constant or a client's value) is refused;
- ``ext_proc`` and ``ext_authz``: their servers' header mutations are checked by Envoy's
  mutation rules, which refuse ``x-envoy-*`` unless ``allow_envoy`` (or an
  ``allow_expression``) lets them through; ``ext_authz`` checks nothing without
  ``decoder_header_mutation_rules``;
- ``local_ratelimit``: its ``request_headers_to_add_when_not_enforced``;
- a filter known to write no request header (``after_decision.KEEPS_THE_REQUEST``, the
  decompressor) passes; any other (Lua, Wasm, ``composite``, a filter from ECDS) could
  write anything, which cannot be known here, and is refused.

After this processor's first filter, ``after_decision`` already refuses every filter but
those that keep the request and the declared ones, and bounds a declared ext_proc
filter's mutation rules (``allow_envoy`` among them); a declared filter of another kind
is judged here. Upstream filters (the router's and clusters') run after the router chose
its retries: what they write retries nothing. A route's ``request_headers_to_add`` is
``replay``'s rule (``retry-header-added``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from ext_proc.tools import carrier_headers
from ext_proc.tools.check_envoy.findings import Finding, error
from ext_proc.tools.check_envoy.reader import FILTER_CONFIG, Chain, is_ext_proc, walk
from ext_proc.tools.check_envoy.rules.after_decision import KEEPS_THE_REQUEST
from ext_proc.tools.router_headers import ROUTER_HEADERS

_T: Final = "type.googleapis.com/envoy.extensions.filters.http."
MUTATION_PER_ROUTE: Final = _T + "header_mutation.v3.HeaderMutationPerRoute"
EXT_AUTHZ: Final = _T + "ext_authz.v3.ExtAuthz"
LOCAL_RATELIMIT: Final = _T + "local_ratelimit.v3.LocalRateLimit"
# Filters that write no request header of Envoy's: those that keep the request, and the
# decompressor (it rewrites the body and its framing headers only).
WRITES_NONE: Final = KEEPS_THE_REQUEST - {LOCAL_RATELIMIT} | {_T + "decompressor.v3.Decompressor"}


def _per_route(chain: Chain, name: str) -> list[dict[str, Any]]:
    """Every route-level configuration of filter ``name`` (a ``FilterConfig`` wrapper's
    inner one), at any level of the route configuration."""
    found = []
    for node in walk(chain.manager.get("route_config", {})):
        configs = node.get("typed_per_filter_config")
        given = configs.get(name) if isinstance(configs, dict) else None
        if isinstance(given, dict) and given.get("@type") == FILTER_CONFIG:
            given = given.get("config")
        if isinstance(given, dict):
            found.append(given)
    return found


def _last(mutations: Any) -> dict[str, str]:
    """What a list of header mutations last does to each router header it touches, read
    in order as Envoy applies them: ``remove`` or ``write``."""
    last: dict[str, str] = {}
    for mutation in mutations if isinstance(mutations, list) else []:
        if not isinstance(mutation, dict):
            continue
        if isinstance(mutation.get("remove"), str):
            last[mutation["remove"].lower()] = "remove"
        append = mutation.get("append")
        header = append.get("header") if isinstance(append, dict) else None
        if isinstance(header, dict):
            last[str(header.get("key", "")).lower()] = "write"
    return {name: done for name, done in last.items() if name in ROUTER_HEADERS}


def _request_mutations(config: Any) -> Any:
    return (
        config.get("mutations", {}).get("request_mutations") if isinstance(config, dict) else None
    )


def clears(chain: Chain, position: int) -> bool:
    """Whether the filter at ``position`` removes every router header on every route:
    a ``header_mutation`` filter on by default, configured by no route, whose own
    mutations remove each last."""
    entry = chain.filters[position]
    config = entry.get("typed_config", {})
    if config.get("@type") != carrier_headers.FILTER_TYPE or entry.get("disabled", False):
        return False
    if _per_route(chain, str(entry.get("name"))):
        return False
    last = _last(_request_mutations(config))
    return all(last.get(name) == "remove" for name in ROUTER_HEADERS)


def _allows_envoy(rules: Any) -> str | None:
    rules = rules if isinstance(rules, dict) else {}
    if rules.get("allow_envoy"):
        return "allow_envoy lets its server write x-envoy-* headers"
    if rules.get("allow_expression"):
        return "allow_expression may let its server write x-envoy-* headers"
    return None


def writes(chain: Chain, entry: dict[str, Any]) -> str | None:
    """How the filter can write a router header, or None when it cannot."""
    config = entry.get("typed_config", {})
    kind = config.get("@type")
    if kind in WRITES_NONE:
        return None
    if kind == carrier_headers.FILTER_TYPE:
        levels = [config, *_per_route(chain, str(entry.get("name")))]
        names = [
            n for c in levels for n, done in _last(_request_mutations(c)).items() if done == "write"
        ]
        return f"it sets {', '.join(sorted(set(names)))}" if names else None
    if kind == LOCAL_RATELIMIT:
        added = config.get("request_headers_to_add_when_not_enforced", [])
        keys = {
            str(a.get("header", {}).get("key", "")).lower() for a in added if isinstance(a, dict)
        }
        names = [name for name in ROUTER_HEADERS if name in keys]
        return f"it adds {', '.join(names)}" if names else None
    if is_ext_proc(entry):
        return _allows_envoy(config.get("mutation_rules"))
    if kind == EXT_AUTHZ:
        if "decoder_header_mutation_rules" not in config:
            return "without decoder_header_mutation_rules its server may write any header"
        return _allows_envoy(config["decoder_header_mutation_rules"])
    return f"it ({kind or 'no typed_config'}) may write any request header"


def router_writers(chain: Chain, declared: frozenset[str]) -> Iterator[Finding]:
    filters = chain.filters
    first = next(i for i, f in enumerate(filters) if f.get("name") in chain.names)
    # The last removal of them all before this processor's filter: what runs before it
    # writes nothing the router reads.
    cleared = [i for i in range(first) if clears(chain, i)]
    start = cleared[-1] + 1 if cleared else 0
    where = (
        f"it runs after {filters[cleared[-1]].get('name')}, the last filter that removes them"
        if cleared
        else "no header step before it removes them"
    )
    for position in range(start, len(filters)):
        entry = filters[position]
        name = entry.get("name")
        if name in chain.names:
            continue
        if position > first and (name not in declared or is_ext_proc(entry)):
            continue  # after_decision's rule
        how = writes(chain, entry)
        if how is not None:
            yield error(
                "router-header-writer",
                f"{chain.place} filter {name}",
                f"{how}, a header the router retries or hedges by "
                f"({', '.join(ROUTER_HEADERS)}), and {where}: the router would resend a "
                "mint or honor route's body decided once. Remove the filter or move it "
                "before a header step that removes them",
            )
