"""The closed world: on every listener that carries a policed route (a route of a
connection manager that runs this processor's filter), every field of every message the
check walks is one ``field_classes`` knows, and none it refuses.

The fields of each walked message (``WALKED``) come from Envoy's own schema, generated
(``envoy_fields.json``, from envoy-data-plane: ``python -m devstack envoy-fields``); each
is classified once (``field_classes``): read by a rule, refused where a policed route is,
or harmless, with the reason. A field the rules do not read is a finding by itself, so
no rule has to imagine a shape to refuse it: ``field-refused`` for a field refused
there, ``field-unclassified`` for one the classification does not know (a new Envoy
release's) and ``field-unknown`` for a key that is no field of the message at all.

What is walked, from a bootstrap (or a listener, or a connection manager, given alone):
the bootstrap itself, its static listeners that carry a policed route and the clusters
their routes name (every static cluster where a route chooses its cluster per
request); in them every field whose type is a walked message, and a packed
configuration (``typed_config``, ``typed_per_filter_config``,
``typed_extension_protocol_options``) whose type is walked. This processor's ext_proc
configurations are walked, another service's (an endpoint picker's) are that service's
(where it runs and what it may change are ``filters`` and ``after_decision``'s rules).
The contents of a field whose type is not walked (a retry policy, a header matcher,
metadata) are its reader's: a field read is read whole by the rule that names it."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from ext_proc.tools.check_envoy import reader
from ext_proc.tools.check_envoy.field_classes import CLASSES, REFUSED, Class
from ext_proc.tools.check_envoy.findings import Finding, error
from ext_proc.tools.check_envoy.spelling import TYPE_PREFIX

TABLE: Final = Path(__file__).with_name("envoy_fields.json")

_HCM: Final = "envoy.extensions.filters.network.http_connection_manager.v3."
_ROUTE: Final = "envoy.config.route.v3."
_EXT_PROC: Final = "envoy.extensions.filters.http.ext_proc.v3."
BOOTSTRAP: Final = "envoy.config.bootstrap.v3.Bootstrap"
LISTENER: Final = "envoy.config.listener.v3.Listener"
MANAGER: Final = _HCM + "HttpConnectionManager"
CLUSTER: Final = "envoy.config.cluster.v3.Cluster"
EXTERNAL_PROCESSOR: Final = _EXT_PROC + "ExternalProcessor"
PER_ROUTE: Final = _EXT_PROC + "ExtProcPerRoute"
FILTER_CONFIG: Final = _ROUTE + "FilterConfig"

# Every message the check walks: each of its fields is in the generated table and
# classified in ``field_classes``.
WALKED: Final = (
    BOOTSTRAP,
    BOOTSTRAP + ".StaticResources",
    BOOTSTRAP + ".DynamicResources",
    LISTENER,
    "envoy.config.listener.v3.FilterChain",
    "envoy.config.listener.v3.FilterChainMatch",
    "envoy.config.listener.v3.Filter",
    "envoy.config.listener.v3.ListenerFilter",
    MANAGER,
    MANAGER + ".UpgradeConfig",
    _HCM + "HttpFilter",
    _ROUTE + "RouteConfiguration",
    _ROUTE + "VirtualHost",
    _ROUTE + "Route",
    _ROUTE + "RouteMatch",
    _ROUTE + "RouteAction",
    _ROUTE + "WeightedCluster",
    _ROUTE + "WeightedCluster.ClusterWeight",
    FILTER_CONFIG,
    "envoy.extensions.filters.http.router.v3.Router",
    "envoy.extensions.filters.http.buffer.v3.Buffer",
    "envoy.extensions.filters.http.buffer.v3.BufferPerRoute",
    EXTERNAL_PROCESSOR,
    PER_ROUTE,
    _EXT_PROC + "ExtProcOverrides",
    _EXT_PROC + "ProcessingMode",
    "envoy.config.core.v3.GrpcService",
    "envoy.config.core.v3.GrpcService.EnvoyGrpc",
    CLUSTER,
    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
)
_ANY: Final = "google.protobuf.Any"
_STATIC: Final = BOOTSTRAP + ".StaticResources"


@dataclass(frozen=True)
class Table:
    """The generated table: each walked message's fields and their types (a message's
    full name, ``repeated T``, ``map<string, T>``, or a scalar's kind)."""

    source: str
    messages: Mapping[str, Mapping[str, str]]


def parse_table(text: str) -> Table:
    given = json.loads(text)
    return Table(str(given["source"]), given["messages"])


@functools.cache
def table() -> Table:
    return parse_table(TABLE.read_text())


def unclassified(given: Table, classes: Mapping[tuple[str, str], Class]) -> list[str]:
    """Each field of the table the classification does not know, and each it classifies
    that the table lacks (a field Envoy removed), as ``Message.field``."""
    fields = {(m, f) for m, known in given.messages.items() for f in known}
    return [f"{m}.{f}" for m, f in sorted(fields ^ set(classes))]


def element(kind: str) -> str:
    """The type of one value of a field of type ``kind``."""
    kind = kind.removeprefix("repeated ")
    if kind.startswith("map<string, ") and kind.endswith(">"):
        return kind[len("map<string, ") : -1]
    return kind


def _values(kind: str, value: Any) -> list[tuple[str, str | None, Any]]:
    """Each value of a field: the suffix its place takes, its key in a map, itself."""
    if kind.startswith("repeated ") and isinstance(value, list):
        return [(f"[{i}]", None, item) for i, item in enumerate(value)]
    if kind.startswith("map<") and isinstance(value, dict):
        return [(f"[{key!r}]", str(key), item) for key, item in value.items()]
    return [("", None, value)]


@dataclass(frozen=True)
class _Walk:
    table: Table
    classes: Mapping[tuple[str, str], Class]
    namespace: str
    # This processor's ext_proc filters of the connection manager walked, by name.
    ours: frozenset[str] = frozenset()
    # The clusters walked (None: every one).
    reached: frozenset[str] | None = frozenset()
    # The filter name a per-filter configuration is keyed by.
    key: str | None = None


def _typed(walk: _Walk, value: Any) -> str | None:
    """The walked message a packed configuration holds, if it is walked here."""
    if not isinstance(value, dict):
        return None
    kind = str(value.get("@type", "")).removeprefix(TYPE_PREFIX)
    if kind not in walk.table.messages:
        return None
    if kind in {EXTERNAL_PROCESSOR, PER_ROUTE}:
        return kind if walk.key in walk.ours else None
    return kind


def _short(message: str) -> str:
    """A message's name without its package (``WeightedCluster.ClusterWeight``)."""
    return ".".join(p for p in message.split(".") if p[:1].isupper())


def _message(walk: _Walk, message: str, node: Any, place: str) -> Iterator[Finding]:
    if not isinstance(node, dict):
        return
    fields = walk.table.messages[message]
    short = _short(message)
    if message == MANAGER:
        walk = replace(walk, ours=frozenset(_ours(node, walk.namespace)))
    elif message == _HCM + "HttpFilter":
        walk = replace(walk, key=str(node.get("name")))
    for key, value in node.items():
        if key == "@type":
            continue
        here = f"{place}.{key}"
        kind = fields.get(key)
        if kind is None:
            yield error(
                "field-unknown",
                here,
                f"{key!r} is no field of {short} (Envoy {walk.table.source}): what Envoy makes "
                "of it cannot be checked",
            )
            continue
        found = walk.classes.get((message, key))
        if found is None:
            yield error(
                "field-unclassified",
                here,
                f"{short}.{key} is a field this check does not know (read, refused or "
                "harmless): on a listener that carries a policed route it is refused",
            )
            continue
        if found.kind == REFUSED:
            yield error(
                "field-refused",
                here,
                f"{short}.{key} on a listener that carries a policed route: {found.reason}",
            )
            continue
        if (message, key) == (BOOTSTRAP, "layered_runtime"):
            yield from runtime(value, here)
        yield from _field(walk, (message, key), element(kind), _values(kind, value), here)


# Runtime keys known to change nothing a request carries: RE2's program size limits
# (the route simulation refuses a regex over Envoy's limit either way), the overload
# manager's connection limits, and Envoy Gateway's EDS cache (endpoints only). A key
# ending in "." names every key under it.
RUNTIME_KEYS: Final = (
    "re2.max_program_size.",
    "overload.",
    "envoy.restart_features.use_eds_cache_for_ads",
)


def _known(key: str) -> bool:
    return any(key.startswith(k) if k.endswith(".") else key == k for k in RUNTIME_KEYS)


def runtime(layered: Any, place: str) -> Iterator[Finding]:
    """The runtime a policed listener runs under: static layers of known keys, and the
    admin layer (changes through the admin interface are the operator's). A runtime key
    can turn Envoy's behaviour (path handling, header handling) back to what the rules
    do not describe, so any other key, and a layer whose keys cannot be read here (a
    disk or RTDS layer), is refused."""
    layers = layered.get("layers", []) if isinstance(layered, dict) else None
    for index, layer in enumerate(layers if isinstance(layers, list) else [layered]):
        here = f"{place}.layers[{index}]"
        kinds = sorted(set(layer) - {"name"}) if isinstance(layer, dict) else ["?"]
        if kinds == ["admin_layer"]:
            continue
        if kinds != ["static_layer"] or not isinstance(layer["static_layer"], dict):
            yield error(
                "field-refused",
                here,
                f"a runtime layer ({', '.join(kinds)}) whose keys this check cannot read: a "
                "runtime key can turn Envoy's path or header handling back. Use a static "
                "layer",
            )
            continue
        for key in sorted(_keys(layer["static_layer"])):
            if not _known(key):
                yield error(
                    "field-refused",
                    f"{here}.static_layer",
                    f"runtime key {key!r} is not known to leave requests as the rules read "
                    f"them (known: {', '.join(RUNTIME_KEYS)})",
                )


def _keys(layer: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """A static layer's keys: nested mappings are dotted keys."""
    for key, value in layer.items():
        if isinstance(value, dict):
            yield from _keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def _field(
    walk: _Walk,
    field: tuple[str, str],
    kind: str,
    values: list[tuple[str, str | None, Any]],
    place: str,
) -> Iterator[Finding]:
    """The values of ``field`` (its message and its name) whose type ``kind`` is walked."""
    for suffix, key, value in values:
        here = place + suffix
        if field == (_STATIC, "listeners"):
            if not _policed(value, walk.namespace):
                continue
            here = f"listener {value.get('name')}"
        elif field == (_STATIC, "clusters"):
            name = value.get("name") if isinstance(value, dict) else None
            if walk.reached is not None and name not in walk.reached:
                continue
            here = f"cluster {name}"
        # A per-filter configuration is the filter's its key names.
        inner = (
            walk if key is None or field[1] != "typed_per_filter_config" else replace(walk, key=key)
        )
        if kind == _ANY:
            typed = _typed(inner, value)
            if typed is not None:
                yield from _message(inner, typed, value, here)
        elif kind in walk.table.messages:
            yield from _message(inner, kind, value, here)


def _policed(listener: Any, namespace: str) -> bool:
    """Whether a listener carries a policed route: one of its connection managers runs
    this processor's filter."""
    return any(_ours(manager, namespace) for manager in _managers(listener))


def _managers(node: Any) -> Iterator[dict[str, Any]]:
    return (n for n in reader.walk(node) if n.get("@type") == reader.HCM)


def _ours(manager: dict[str, Any], namespace: str) -> list[str]:
    return [
        str(f.get("name"))
        for f in manager.get("http_filters", [])
        if isinstance(f, dict) and reader.is_ext_proc(f) and reader.is_ours(f, namespace)
    ]


# A route's cluster chosen per request: any cluster may serve it.
_PER_REQUEST: Final = (
    "cluster_header",
    "cluster_specifier_plugin",
    "inline_cluster_specifier_plugin",
)


def _reached(listeners: list[Any]) -> frozenset[str] | None:
    """The clusters the routes of ``listeners`` send to (a route's, a weighted
    cluster's, a mirror's); None when a route chooses its cluster per request."""
    names: set[str] = set()
    for listener in listeners:
        for manager in _managers(listener):
            for node in reader.walk(manager.get("route_config", {})):
                if any(key in node for key in _PER_REQUEST):
                    return None
                if isinstance(node.get("cluster"), str):
                    names.add(node["cluster"])
                for weighted in node.get("weighted_clusters", {}).get("clusters", []):
                    if isinstance(weighted, dict) and isinstance(weighted.get("name"), str):
                        names.add(weighted["name"])
    return frozenset(names)


def coverage(
    config: Any,
    namespace: str,
    classes: Mapping[tuple[str, str], Class] | None = None,
    given: Table | None = None,
) -> Iterator[Finding]:
    """Every field the walk meets on the listeners that carry a policed route (and the
    clusters their routes reach) that is refused, unclassified or no field at all.
    ``classes`` and ``given`` replace the classification and the table (tests)."""
    walk = _Walk(given or table(), CLASSES if classes is None else classes, namespace)
    if isinstance(config, dict) and isinstance(config.get("static_resources"), dict):
        listed = config["static_resources"].get("listeners", [])
        policed = [entry for entry in listed if _policed(entry, namespace)]
        if policed:
            yield from _message(
                replace(walk, reached=_reached(policed)), BOOTSTRAP, config, "bootstrap"
            )
        return
    if isinstance(config, dict) and ("filter_chains" in config or "default_filter_chain" in config):
        if _policed(config, namespace):
            yield from _message(walk, LISTENER, config, f"listener {config.get('name')}")
        return
    for index, manager in enumerate(_managers(config)):
        if _ours(manager, namespace):
            yield from _message(walk, MANAGER, manager, f"http_connection_manager[{index}]")
