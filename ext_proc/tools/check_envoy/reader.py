"""The parts of an Envoy bootstrap the check reads: the HTTP connection managers (of the
listeners named), their filter chains, their virtual hosts and routes, and the ext_proc
filter's per-route configurations, each with the place a finding names.

Nothing here judges: the rules do (``rules``), from what this module reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from ext_proc.edge.attributes import attribute_keys
from ext_proc.tools.envoy_names import PER_ROUTE_TYPE

_TYPE_URL: Final = "type.googleapis.com/"
EXT_PROC: Final = _TYPE_URL + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
PER_ROUTE: Final = _TYPE_URL + PER_ROUTE_TYPE
FILTER_CONFIG: Final = _TYPE_URL + "envoy.config.route.v3.FilterConfig"
BUFFER: Final = _TYPE_URL + "envoy.extensions.filters.http.buffer.v3.Buffer"
BUFFER_PER_ROUTE: Final = _TYPE_URL + "envoy.extensions.filters.http.buffer.v3.BufferPerRoute"
HCM: Final = (
    _TYPE_URL + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)


class Unreadable(ValueError):
    """The file cannot be read as YAML; the message is one line naming it."""


def load(path: Path) -> Any:
    """The YAML document in ``path``, or ``Unreadable``."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise Unreadable(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise Unreadable(f"{path}: not YAML: not UTF-8 text") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise Unreadable(f"{path}: not YAML: {problem}{where}") from None


def walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every mapping in the document, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


def managers(config: Any, listeners: frozenset[str] | None) -> tuple[list[Any], list[str]]:
    """The connection managers to check (every one, or those of the named listeners),
    and the names of listeners named but not found."""
    if listeners is None:
        return [n for n in walk(config) if n.get("@type") == HCM], []
    found = [
        listener
        for listener in walk(config)
        if listener.get("name") in listeners
        and ("filter_chains" in listener or "default_filter_chain" in listener)
    ]
    missing = sorted(listeners - {str(listener["name"]) for listener in found})
    return [n for listener in found for n in walk(listener) if n.get("@type") == HCM], missing


def ext_proc_per_route(given: Any) -> dict[str, Any] | None:
    """An ext_proc per-route configuration as the filter receives it, also from inside
    a ``FilterConfig`` wrapper (whose own ``disabled`` counts as the filter's); None for
    anything else."""
    config = given
    if isinstance(given, dict) and given.get("@type") == FILTER_CONFIG:
        if given.get("disabled"):
            return {"@type": PER_ROUTE, "disabled": True}
        config = given.get("config", {})
        if not isinstance(config, dict) or config.get("@type") != PER_ROUTE:
            # An empty wrapper enables a filter that is disabled by default.
            return {"@type": PER_ROUTE}
    if isinstance(config, dict) and config.get("@type") == PER_ROUTE:
        return config
    return None


def per_route(configs: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """The ext_proc per-route configurations of a ``typed_per_filter_config``."""
    if not isinstance(configs, dict):
        return
    for name, given in configs.items():
        config = ext_proc_per_route(given)
        if config is not None:
            yield name, config


def overrides_in(node: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every ext_proc per-route configuration under ``node`` (weighted clusters too)."""
    for mapping in walk(node):
        yield from per_route(mapping.get("typed_per_filter_config"))


def is_ext_proc(entry: dict[str, Any]) -> bool:
    return bool(entry.get("typed_config", {}).get("@type") == EXT_PROC)


def is_ours(entry: dict[str, Any], namespace: str) -> bool:
    """Whether an ext_proc filter is this processor's: it requests one of the route
    metadata attributes of its namespace. Another service's (an endpoint picker's) is
    checked only for where it runs."""
    requested = entry.get("typed_config", {}).get("request_attributes", [])
    keys = attribute_keys(namespace)
    return any(key in requested for key in (*keys.fields.values(), keys.size))


@dataclass(frozen=True)
class Hold:
    """A buffer filter of the chain: it holds a request until its whole body is there."""

    name: str
    position: int
    config: dict[str, Any]
    off_by_default: bool


@dataclass(frozen=True)
class Chain:
    """One connection manager with this processor's ext_proc filters (``ours``), as
    every route of it is checked."""

    place: str
    manager: dict[str, Any]
    namespace: str
    filters: list[dict[str, Any]]
    ours: list[dict[str, Any]]
    # Every attribute one of ours requests.
    requested: set[str]
    # Ours by name: their typed_config.
    configs: dict[str, dict[str, Any]]
    # Ours that run unless a route says otherwise (HttpFilter.disabled false).
    on_by_default: set[str]
    # Each of ours' place in the filter chain.
    positions: dict[str, int]
    holds: list[Hold]

    @property
    def names(self) -> list[str]:
        return [str(f.get("name")) for f in self.ours]


def read_chain(index: int, manager: dict[str, Any], namespace: str) -> Chain:
    filters = [f for f in manager.get("http_filters", []) if isinstance(f, dict)]
    ours = [f for f in filters if is_ext_proc(f) and is_ours(f, namespace)]
    return Chain(
        place=f"http_connection_manager[{index}]",
        manager=manager,
        namespace=namespace,
        filters=filters,
        ours=ours,
        requested={a for f in ours for a in f["typed_config"].get("request_attributes", [])},
        configs={str(f.get("name")): f["typed_config"] for f in ours},
        on_by_default={str(f.get("name")) for f in ours if not f.get("disabled", False)},
        positions={str(f.get("name")): filters.index(f) for f in ours},
        holds=[
            Hold(str(f.get("name")), position, f["typed_config"], bool(f.get("disabled")))
            for position, f in enumerate(filters)
            if f.get("typed_config", {}).get("@type") == BUFFER
        ],
    )


@dataclass(frozen=True)
class Route:
    """One route of a virtual host. ``levels``: its own typed_per_filter_config, its
    virtual host's and its route configuration's, most specific first."""

    place: str
    entry: dict[str, Any]
    levels: list[Any]

    @property
    def forwards(self) -> bool:
        """A direct response or a redirect reaches no upstream."""
        return "route" in self.entry

    def clusters(self) -> Iterator[tuple[Any, list[Any]]]:
        """Each weighted cluster of a forwarding route: its name and its levels (its
        own configuration the most specific of all)."""
        for cluster in self.entry["route"].get("weighted_clusters", {}).get("clusters", []):
            inner = cluster.get("typed_per_filter_config", {}) if isinstance(cluster, dict) else {}
            yield cluster.get("name"), [inner, *self.levels]


@dataclass(frozen=True)
class VirtualHost:
    place: str
    # The prefix of its routes' places ("... route NAME"; a route adds "/ROUTE").
    routes_place: str
    entry: dict[str, Any]
    # Its routes that are mappings, in order.
    listed: list[dict[str, Any]]
    routes: list[Route]


def virtual_hosts(chain: Chain) -> Iterator[VirtualHost]:
    route_config = chain.manager.get("route_config", {})
    top = route_config.get("typed_per_filter_config", {})
    for vhost in route_config.get("virtual_hosts", []):
        host = vhost.get("typed_per_filter_config", {})
        routes_place = f"{chain.place} route {vhost.get('name')}"
        listed = [r for r in vhost.get("routes", []) if isinstance(r, dict)]
        yield VirtualHost(
            place=f"{chain.place} virtual_host {vhost.get('name')}",
            routes_place=routes_place,
            entry=vhost,
            listed=listed,
            routes=[
                Route(
                    f"{routes_place}/{entry.get('name') or f'#{position}'}",
                    entry,
                    [entry.get("typed_per_filter_config", {}), host, top],
                )
                for position, entry in enumerate(listed)
            ],
        )


def filter_levels(chain: Chain) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every ``typed_per_filter_config`` of the connection manager's routes, with its
    place: the route configuration's, each virtual host's, each route's and each of its
    weighted clusters'."""
    route_config = chain.manager.get("route_config", {})
    levels: list[tuple[str, Any]] = [
        (f"{chain.place} route_config", route_config.get("typed_per_filter_config"))
    ]
    for vhost in virtual_hosts(chain):
        levels.append((vhost.place, vhost.entry.get("typed_per_filter_config")))
        for route in vhost.routes:
            levels.append((route.place, route.entry.get("typed_per_filter_config")))
            action = route.entry.get("route")
            weighted = action.get("weighted_clusters", {}) if isinstance(action, dict) else {}
            for cluster in weighted.get("clusters", []) if isinstance(weighted, dict) else []:
                if isinstance(cluster, dict):
                    where = f"{route.place} weighted_cluster {cluster.get('name')!r}"
                    levels.append((where, cluster.get("typed_per_filter_config")))
    for place, configs in levels:
        if isinstance(configs, dict):
            yield place, configs


# A route's cluster chosen at request time (RouteAction's, and a ClusterWeight's
# cluster_header): any cluster may serve it.
CHOSEN_PER_REQUEST: Final = (
    "cluster_header",
    "cluster_specifier_plugin",
    "inline_cluster_specifier_plugin",
)

HTTP_OPTIONS: Final = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def http_options(config: Any) -> dict[str, dict[str, Any]]:
    """Each cluster's ``HttpProtocolOptions`` (what Envoy applies to every request routed
    to it: its own retry and mirror policies, its upstream filters), by cluster name."""
    found: dict[str, dict[str, Any]] = {}
    for node in walk(config):
        options = node.get("typed_extension_protocol_options")
        if "name" not in node or not isinstance(options, dict):
            continue
        for given in options.values():
            if isinstance(given, dict) and given.get("@type") == HTTP_OPTIONS:
                found[str(node["name"])] = given
    return found


@dataclass(frozen=True)
class Clusters:
    """The clusters the bootstrap lists (``static_resources``), and whether others come
    at run time (``dynamic_resources``' ``cds_config`` or ``cds_resources_locator``),
    which this check cannot see. ``extension``: the listed ones of an extension type
    (``cluster_type``: an aggregate cluster, a dynamic forward proxy), which choose
    further clusters or hosts at run time."""

    static: frozenset[str]
    from_cds: bool
    extension: frozenset[str] = frozenset()
    # The listed ones of type ORIGINAL_DST, with their ``original_dst_lb_config``: each
    # connects to a host the request or the connection names, not one it lists.
    original_dst: Mapping[str, dict[str, Any]] = field(default_factory=dict)


def clusters(config: Any) -> Clusters | None:
    """None for a document that is no bootstrap (a listener alone, a platform's patch):
    its clusters are defined elsewhere."""
    if not isinstance(config, dict) or not isinstance(config.get("static_resources"), dict):
        return None
    listed = [c for c in config["static_resources"].get("clusters", []) if isinstance(c, dict)]
    names = frozenset(str(c["name"]) for c in listed if "name" in c)
    dynamic = config.get("dynamic_resources", {})
    from_cds = isinstance(dynamic, dict) and bool(
        {"cds_config", "cds_resources_locator"} & set(dynamic)
    )
    extension = frozenset(str(c["name"]) for c in listed if "name" in c and "cluster_type" in c)
    original_dst = {
        str(c["name"]): c.get("original_dst_lb_config", {})
        for c in listed
        if "name" in c and discovery_type(c.get("type")) == ORIGINAL_DST
    }
    return Clusters(names, from_cds, extension, original_dst)


# Cluster.DiscoveryType by its number (cluster.proto).
_DISCOVERY_TYPES: Final = ("STATIC", "STRICT_DNS", "LOGICAL_DNS", "EDS", "ORIGINAL_DST")
ORIGINAL_DST: Final = "ORIGINAL_DST"


def discovery_type(value: Any) -> Any:
    """A cluster's ``type`` by its name, as Envoy reads it: the name in any case, or
    its number (also as a string)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if type(value) is int and 0 <= value < len(_DISCOVERY_TYPES):
        return _DISCOVERY_TYPES[value]
    return value.strip().upper() if isinstance(value, str) else value
