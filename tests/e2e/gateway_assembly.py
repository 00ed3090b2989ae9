"""Assemble minimal Envoy bootstraps from the Envoy configuration inside deploy/ manifests.

Neither Istio nor Envoy Gateway runs here, so the tests rebuild what each control plane
would hand Envoy from our manifests and give that to the real ``envoy --mode validate``:

- Istio: the routes istiod makes of the HTTPRoutes (named
  ``<namespace>.<HTTPRoute name>.<rule index>``, each with Istio's default retry
  policy), or of an Ingress (``istio_ingress``), the EnvoyFilter's CLUSTER value, its
  HTTP_FILTER values (INSERT_FIRST, INSERT_AFTER a named filter, in patch order, before
  the router), its HTTP_ROUTE MERGE values merged into the routes its match selects (by
  virtual host name, route name and action, or every route), its HTTP_ROUTE
  INSERT_FIRST values put before them in every virtual host, and its NETWORK_FILTER
  MERGE values into the connection manager, as istiod does
  (pilot/pkg/networking/core/envoyfilter).
- Envoy Gateway: the ext_proc filter, cluster, connection manager and routes that Envoy
  Gateway's translator (v1.9: internal/xds/translator/extproc.go, listener.go,
  route.go, route naming in internal/gatewayapi) generates from the
  EnvoyExtensionPolicy and HTTPRoutes, then the EnvoyPatchPolicy's JSON patches applied
  to them.

Both write a Gateway API ``PathPrefix`` match as ``path_separated_prefix`` without its
trailing "/" (``/`` stays a ``prefix``), an ``Exact`` header match as a header matcher,
and a ``ReplacePrefixMatch`` rewrite as ``prefix_rewrite`` without its trailing "/"
(Envoy Gateway: route.go
buildXdsRouteMatch, buildXdsURLRewriteAction; Istio: conversion.go
createRewriteFilter, route.go), and order the routes longest path first.

Each bootstrap has its control plane's static runtime layer (``ISTIO_RUNTIME``,
``EG_RUNTIME``): the refused endpoints' 404s need RE2's program size limit raised.

These are emulations of the two control planes, written from their sources; they check
that every piece of Envoy configuration we ship is valid for Envoy and that the patches
find their targets under the names the control planes use.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any, Final

HCM = (
    "type.googleapis.com/"
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
ROUTER = {
    "name": "envoy.filters.http.router",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
}
EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_QUANTITY = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}


def static_cluster(name: str, host: str, port: int) -> dict[str, Any]:
    """A STRICT_DNS cluster of one endpoint (``gateway_run`` points it at the stand-in)."""
    return {
        "name": name,
        "type": "STRICT_DNS",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {"socket_address": {"address": host, "port_value": port}}
                            }
                        }
                    ]
                }
            ],
        },
    }


def bootstrap(
    listener_name: str,
    http_filters: list[dict[str, Any]],
    route_config: dict[str, Any],
    clusters: list[dict[str, Any]],
    manager: dict[str, Any] | None = None,
    runtime: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``manager``: further fields of the connection manager; ``runtime``: the static
    runtime layer the control plane's bootstrap writes, before the admin layer."""
    layers = [] if runtime is None else [runtime]
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "layered_runtime": {"layers": [*layers, {"name": "admin", "admin_layer": {}}]},
        "static_resources": {
            "listeners": [
                {
                    "name": listener_name,
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                    "default_filter_chain": {
                        "filters": [
                            {
                                "name": "envoy.filters.network.http_connection_manager",
                                "typed_config": {
                                    "@type": HCM,
                                    "stat_prefix": "gateway",
                                    "route_config": route_config,
                                    "http_filters": http_filters,
                                    **(manager or {}),
                                },
                            }
                        ]
                    },
                }
            ],
            "clusters": clusters,
        },
    }


def gateway_api_route(
    name: str, rule: dict[str, Any], match: dict[str, Any], cluster: str
) -> dict[str, Any]:
    """One Envoy route for one match of an HTTPRoute rule, as Istio and Envoy Gateway
    write a PathPrefix match and a ReplacePrefixMatch rewrite (the module docstring)."""
    path = match["path"]
    assert path.get("type", "PathPrefix") == "PathPrefix", path
    value = path["value"]
    route_match = {"prefix": "/"} if value == "/" else {"path_separated_prefix": value.rstrip("/")}
    action: dict[str, Any] = {"cluster": cluster}
    for found in rule.get("filters", []):
        if found["type"] != "URLRewrite":
            continue
        modifier = found["urlRewrite"]["path"]
        assert modifier["type"] == "ReplacePrefixMatch", modifier
        replacement = modifier["replacePrefixMatch"].rstrip("/")
        # Both write "/" as a regex rewrite instead (envoy#26055); not emulated here.
        assert replacement, "a rewrite to '/' is not emulated"
        action["prefix_rewrite"] = replacement
    headers = match.get("headers", [])
    assert all(h.get("type", "Exact") == "Exact" for h in headers), headers
    if headers:
        route_match["headers"] = [
            {"name": h["name"].lower(), "string_match": {"exact": h["value"]}} for h in headers
        ]
    entry = {"name": name, "match": route_match}
    if rule.get("backendRefs"):
        entry["route"] = action
    else:
        # No backend: the rule forwards nothing (Gateway API: a 404).
        entry["direct_response"] = {"status": 404}
    return entry


def _longest_path_first(entry: dict[str, Any]) -> tuple[int, int]:
    """Gateway API precedence: the longest path, then the most header matches (a stable
    sort keeps the rules' order beyond that)."""
    match = entry["match"]
    path = match.get("path_separated_prefix", match.get("prefix", ""))
    return -len(path), -len(match.get("headers", []))


# The map fields our patches merge into: proto merge replaces each entry named in the
# patch whole (no merge within an entry).
_MAPS = frozenset({"filter_metadata", "typed_filter_metadata", "typed_per_filter_config"})


def deep_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Istio's MERGE (pkg/proto/merge, protobuf's Merge): messages merge field by field,
    repeated fields append, a map's entries are replaced whole, and a scalar the patch
    sets to its zero value (0, "", false; a wrapper such as ``num_retries: 0`` too) is
    not set in the patch's proto, so it leaves the base's value in place."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if key in _MAPS and isinstance(value, dict):
            out[key] = {**out.get(key, {}), **copy.deepcopy(value)}
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        elif isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = [*out[key], *copy.deepcopy(value)]
        elif value in (0, "", False) and key in out:
            continue
        else:
            out[key] = copy.deepcopy(value)
    return out


# --- Istio -----------------------------------------------------------------------------


# The static runtime layer of istiod's bootstrap (pkg/bootstrap/config.go,
# extractRuntimeFlags; `istioctl proxy-config bootstrap` shows it), of which the tests need
# RE2's program size limit: the refused endpoints' 404s (ext_proc.tools.refused_paths)
# are above Envoy's default of 100.
ISTIO_RUNTIME: Final = {
    "name": "global config",
    "static_layer": {"re2.max_program_size.error_level": "32768"},
}


# istiod's connection manager path handling by default (meshConfig pathNormalization
# BASE): normalised, slashes not merged, escaped slashes kept unchanged.
ISTIO_PATH_DEFAULTS = {"normalize_path": True, "path_with_escaped_slashes_action": "KEEP_UNCHANGED"}


# The retry policy istiod gives every route it makes of an HTTPRoute rule without a
# `retry` field (of a VirtualService route without `retries` too): meshConfig
# defaultHttpRetryPolicy, unset by default, and then Istio's default
# (pilot/pkg/networking/core/route/retry: DefaultPolicy; route.go applies it to every
# forwarding route; conversion.go sets a policy of its own only for a rule's `retry`).
# It is what `istioctl proxy-config route` shows on any Istio gateway. "unavailable" and
# "cancelled" retry on a response's gRPC status; "retriable-status-codes" with no codes
# retries none. retry_host_predicate is left out for a destination with a consistent
# hash load balancer (DefaultConsistentHashPolicy).
ISTIO_RETRY_POLICY: dict[str, Any] = {
    "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
    "num_retries": 2,
    "retry_host_predicate": [
        {
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {
                "@type": "type.googleapis.com/"
                "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
            },
        }
    ],
    "host_selection_retry_max_attempts": 5,
}
# Istio up to 1.23 retried a 503 by default too, as 1.24 to 1.26 do with
# EXCLUDE_UNSAFE_503_FROM_DEFAULT_RETRY=false or compatibilityVersion 1.23 (the flag is
# gone from 1.27).
ISTIO_1_23_RETRY_POLICY: dict[str, Any] = {**ISTIO_RETRY_POLICY, "retriable_status_codes": [503]}


def istio_cluster(namespace: str, backend: dict[str, Any]) -> str:
    """istiod's cluster of a backendRef (model.BuildSubsetKey): the Service's port."""
    service = f"{backend['name']}.{backend.get('namespace', namespace)}.svc.cluster.local"
    return f"outbound|{backend.get('port', 8000)}||{service}"


def istio_routes(
    httproutes: list[dict[str, Any]],
    retry_policy: dict[str, Any] | None = None,
    by_backend: bool = False,
) -> list[dict[str, Any]]:
    """The Envoy routes istiod makes of ``httproutes``, to the cluster ``upstream`` (or,
    ``by_backend``, istiod's cluster of each rule's one backend), each forwarding one
    with ``retry_policy`` (by default Istio's, ``ISTIO_RETRY_POLICY``)."""
    policy = ISTIO_RETRY_POLICY if retry_policy is None else retry_policy
    out = []
    for httproute in httproutes:
        meta = httproute["metadata"]
        for index, rule in enumerate(httproute["spec"]["rules"]):
            name = f"{meta['namespace']}.{meta['name']}.{index}"
            cluster = "upstream"
            if by_backend:
                (backend,) = rule["backendRefs"]
                cluster = istio_cluster(meta["namespace"], backend)
            out += [gateway_api_route(name, rule, m, cluster) for m in rule["matches"]]
    for entry in out:
        if "route" in entry:
            entry["route"]["retry_policy"] = copy.deepcopy(policy)
    return sorted(out, key=_longest_path_first)


# The port of the Gateway's listener the HTTPRoutes attach to (sectionName http).
ISTIO_PORT: Final = 80


def istio_virtual_hosts(
    httproutes: list[dict[str, Any]],
    retry_policy: dict[str, Any] | None = None,
    by_backend: bool = False,
) -> list[dict[str, Any]]:
    """The virtual hosts istiod makes of ``httproutes`` (pilot/pkg/networking/core/
    gateway.go): one per hostname, named ``<hostname>:<port>`` (util.DomainName), an
    HTTPRoute without hostnames on ``*``; each route on every host of its HTTPRoute."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for httproute in httproutes:
        for host in httproute["spec"].get("hostnames") or ["*"]:
            by_host.setdefault(host, []).append(httproute)
    return [
        {
            "name": f"{host}:{ISTIO_PORT}",
            "domains": [host],
            "routes": istio_routes(routes, retry_policy, by_backend),
        }
        for host, routes in sorted(by_host.items())
    ]


def istio_bootstrap(
    envoy_filter: dict[str, Any],
    httproutes: list[dict[str, Any]],
    retry_policy: dict[str, Any] | None = None,
    more_hosts: list[dict[str, Any]] | None = None,
    more_clusters: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``retry_policy``: the one istiod gives the routes (``istio_routes``);
    ``more_hosts``: virtual hosts of other sources (an Ingress), to ``more_clusters``."""
    hosts = [*istio_virtual_hosts(httproutes, retry_policy), *(more_hosts or [])]
    upstream = static_cluster("upstream", "upstream.invalid", 8000)
    return istio_assemble(envoy_filter, hosts, [upstream, *(more_clusters or [])])


def _route_matched(patch: dict[str, Any], vhost: dict[str, Any], entry: dict[str, Any]) -> bool:
    """Whether a route patch's match selects ``entry`` in ``vhost``, as istiod decides
    (envoyfilter/rc_patch.go: virtualHostMatch, routeMatch): the virtual host's name,
    the route's name and its action, each only where the match states it."""
    wanted = patch["match"].get("routeConfiguration", {}).get("vhost", {})
    if wanted.get("name") not in (None, vhost["name"]):
        return False
    route = wanted.get("route", {})
    if route.get("name") not in (None, entry.get("name", "")):
        return False
    action = next(k for k in ("route", "redirect", "direct_response") if k in entry)
    return route.get("action", "ANY") in ("ANY", action.upper())


def istio_assemble(
    envoy_filter: dict[str, Any],
    virtual_hosts: list[dict[str, Any]],
    clusters: list[dict[str, Any]],
) -> dict[str, Any]:
    """The bootstrap of a gateway whose routes istiod made (``virtual_hosts``, to
    ``clusters``), with ``envoy_filter``'s patches applied as istiod applies them
    (pilot/pkg/networking/core/envoyfilter): in each virtual host the merges into the
    routes already there, then the inserts."""
    patches = envoy_filter["spec"]["configPatches"]
    added = [p["patch"]["value"] for p in patches if p["applyTo"] == "CLUSTER"]
    http_filters = [ROUTER]
    for patch in patches:
        if patch["applyTo"] != "HTTP_FILTER":
            continue
        operation, value = patch["patch"]["operation"], patch["patch"]["value"]
        if operation == "INSERT_FIRST":
            http_filters.insert(0, value)
            continue
        assert operation in ("INSERT_AFTER", "INSERT_BEFORE"), operation
        beside = patch["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"]
        names = [f["name"] for f in http_filters]
        http_filters.insert(names.index(beside) + (operation == "INSERT_AFTER"), value)
    route_patches = [p for p in patches if p["applyTo"] == "HTTP_ROUTE"]
    for patch in route_patches:
        operation = patch["patch"]["operation"]
        assert operation in ("MERGE", "INSERT_FIRST"), operation
        if operation == "INSERT_FIRST":
            wanted = patch["match"].get("routeConfiguration", {}).get("vhost", {})
            assert set(wanted) <= {"name"}, "inserts into every or a named virtual host only"
    host_patches = [p for p in patches if p["applyTo"] == "VIRTUAL_HOST"]
    assert all(p["patch"]["operation"] == "MERGE" for p in host_patches)
    hosts = []
    for made in virtual_hosts:
        vhost = made
        for patch in host_patches:
            wanted = patch["match"].get("routeConfiguration", {}).get("vhost", {})
            if wanted.get("name") in (None, vhost["name"]):
                vhost = deep_merge(vhost, patch["patch"]["value"])
        routes = []
        for generated in vhost["routes"]:
            entry = generated
            for patch in route_patches:
                if patch["patch"]["operation"] == "MERGE" and _route_matched(patch, vhost, entry):
                    entry = deep_merge(entry, patch["patch"]["value"])
            routes.append(entry)
        for patch in route_patches:
            wanted = patch["match"].get("routeConfiguration", {}).get("vhost", {})
            if patch["patch"]["operation"] == "INSERT_FIRST" and wanted.get("name") in (
                None,
                vhost["name"],
            ):
                routes.insert(0, copy.deepcopy(patch["patch"]["value"]))
        hosts.append({**vhost, "routes": routes})
    route_config = {"name": "gateway", "virtual_hosts": hosts}
    manager: dict[str, Any] = dict(ISTIO_PATH_DEFAULTS)
    for patch in patches:
        if patch["applyTo"] == "NETWORK_FILTER":
            assert patch["patch"]["operation"] == "MERGE"
            typed = dict(patch["patch"]["value"]["typed_config"])
            assert typed.pop("@type") == HCM
            manager = deep_merge(manager, typed)
    return bootstrap(
        "gateway", http_filters, route_config, [*added, *clusters], manager, ISTIO_RUNTIME
    )


# --- Envoy Gateway -----------------------------------------------------------------------


def quantity(text: str | int) -> int:
    if isinstance(text, int):
        return text
    for suffix, factor in _QUANTITY.items():
        if text.endswith(suffix):
            return int(text.removesuffix(suffix)) * factor
    return int(text)


def eg_ext_proc_filter_name(policy: dict[str, Any], index: int) -> str:
    meta = policy["metadata"]
    return (
        "envoy.filters.http.ext_proc/envoyextensionpolicy/"
        f"{meta['namespace']}/{meta['name']}/extproc/{index}"
    )


def eg_ext_proc(policy: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The HTTP filters and clusters Envoy Gateway generates for an EnvoyExtensionPolicy."""
    filters, clusters = [], []
    meta = policy["metadata"]
    for index, spec in enumerate(policy["spec"]["extProc"]):
        (ref,) = spec["backendRefs"]
        namespace = ref.get("namespace", meta["namespace"])
        cluster_name = f"envoyextensionpolicy/{meta['namespace']}/{meta['name']}/{index}"
        request = spec.get("processingMode", {}).get("request")
        response = spec.get("processingMode", {}).get("response")
        body_modes = {
            "Buffered": "BUFFERED",
            "Streamed": "STREAMED",
            "BufferedPartial": "BUFFERED_PARTIAL",
            "FullDuplexStreamed": "FULL_DUPLEX_STREAMED",
        }
        mode = {
            "request_header_mode": "SEND" if request is not None else "SKIP",
            "response_header_mode": "SEND" if response is not None else "SKIP",
            "request_body_mode": body_modes.get((request or {}).get("body"), "NONE"),
            "response_body_mode": "NONE",
            "request_trailer_mode": "SKIP",
            "response_trailer_mode": "SKIP",
        }
        if mode["request_body_mode"] == "FULL_DUPLEX_STREAMED":
            mode["request_trailer_mode"] = "SEND"
        config: dict[str, Any] = {
            "@type": EXT_PROC,
            "grpc_service": {
                "envoy_grpc": {
                    "cluster_name": cluster_name,
                    "authority": f"{ref['name']}.{namespace}:{ref['port']}",
                },
                "timeout": "10s",
            },
            "processing_mode": mode,
            "failure_mode_allow": bool(spec.get("failOpen", False)),
            "allow_mode_override": False,
        }
        if "messageTimeout" in spec:
            config["message_timeout"] = spec["messageTimeout"]
        writable = spec.get("metadata", {}).get("writableNamespaces")
        if writable:
            config["metadata_options"] = {"receiving_namespaces": {"untyped": writable}}
        filters.append(
            {
                "name": eg_ext_proc_filter_name(policy, index),
                "disabled": True,
                "typed_config": config,
            }
        )
        cluster = static_cluster(
            cluster_name, f"{ref['name']}.{namespace}.svc.cluster.local", ref["port"]
        )
        settings = spec.get("backendSettings", {})
        h2 = settings.get("http2", {})
        h2_options: dict[str, Any] = {}
        if "initialStreamWindowSize" in h2:
            h2_options["initial_stream_window_size"] = quantity(h2["initialStreamWindowSize"])
        if "initialConnectionWindowSize" in h2:
            h2_options["initial_connection_window_size"] = quantity(
                h2["initialConnectionWindowSize"]
            )
        if "maxConcurrentStreams" in h2:
            h2_options["max_concurrent_streams"] = int(h2["maxConcurrentStreams"])
        options = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        cluster["typed_extension_protocol_options"] = {
            options: {
                "@type": f"type.googleapis.com/{options}",
                "explicit_http_config": {"http2_protocol_options": h2_options},
            }
        }
        active = settings.get("healthCheck", {}).get("active")
        if active is not None and active.get("type") == "GRPC":
            cluster["health_checks"] = [
                {
                    "timeout": active["timeout"],
                    "interval": active["interval"],
                    "unhealthy_threshold": active["unhealthyThreshold"],
                    "healthy_threshold": active["healthyThreshold"],
                    "grpc_health_check": {"service_name": active["grpc"]["service"]},
                }
            ]
        clusters.append(cluster)
    return filters, clusters


def eg_hostnames(httproutes: list[dict[str, Any]]) -> list[str]:
    """The hostnames Envoy Gateway makes a virtual host of: each HTTPRoute's, '*' for
    one that names none."""
    return sorted({h for r in httproutes for h in r["spec"].get("hostnames") or ["*"]})


def eg_routes(
    httproutes: list[dict[str, Any]], filter_names: list[str], hostname: str = "*"
) -> list[dict[str, Any]]:
    """Envoy routes named as Envoy Gateway names them, with its own metadata: those of
    the virtual host of ``hostname`` (in the name, dots as '_')."""
    out = []
    for httproute in httproutes:
        if hostname not in (httproute["spec"].get("hostnames") or ["*"]):
            continue
        meta = httproute["metadata"]
        cluster = f"httproute/{meta['namespace']}/{meta['name']}"
        for rule_index, rule in enumerate(httproute["spec"]["rules"]):
            for match_index, match in enumerate(rule["matches"]):
                name = (
                    f"httproute/{meta['namespace']}/{meta['name']}/rule/{rule_index}"
                    f"/match/{match_index}/{hostname.replace('.', '_')}"
                )
                entry = gateway_api_route(name, rule, match, cluster)
                entry["metadata"] = {
                    "filter_metadata": {
                        "envoy-gateway": {
                            "resources": [
                                {
                                    "kind": "HTTPRoute",
                                    "name": meta["name"],
                                    "namespace": meta["namespace"],
                                }
                            ]
                        }
                    }
                }
                entry["typed_per_filter_config"] = {
                    f: {
                        "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                        "config": {},
                    }
                    for f in filter_names
                }
                out.append(entry)
    # Gateway API precedence: the longest path prefix first.
    return sorted(out, key=_longest_path_first)


# The static runtime layer of Envoy Gateway's bootstrap (since v1.0:
# internal/xds/bootstrap/bootstrap.yaml.tpl): RE2's program size limit lifted, a
# warning above 1000 instructions.
EG_RUNTIME: Final = {
    "name": "global_config",
    "static_layer": {
        "envoy.restart_features.use_eds_cache_for_ads": True,
        "re2.max_program_size.error_level": 4294967295,
        "re2.max_program_size.warn_level": 1000,
    },
}


# Envoy Gateway's connection manager path handling (listener.go, with the
# ClientTrafficPolicy defaults: slashes merged, escaped slashes unescaped and redirected).
EG_PATH_SETTINGS = {
    "normalize_path": True,
    "merge_slashes": True,
    "path_with_escaped_slashes_action": "UNESCAPE_AND_REDIRECT",
}


_LIST = re.compile(r"^\.\.(\w+)$")
_FILTER = re.compile(r"^\.\.(\w+)\[\?\(@\.name=='([^']*)'\)\]((?:\.\w+)*)$")


def json_path(document: Any, expression: str) -> list[Any]:
    """The subset of JSONPath our patches use: ``..key[?(@.name=='X')].a.b``, and
    ``..key`` (every list so named)."""
    whole = _LIST.fullmatch(expression)
    if whole is not None:
        return [
            holder[whole.group(1)]
            for holder in _walk(document)
            if isinstance(holder, dict) and isinstance(holder.get(whole.group(1)), list)
        ]
    found = _FILTER.fullmatch(expression)
    if found is None:
        raise ValueError(f"unsupported JSONPath {expression!r}")
    key, name, tail = found.groups()
    out = []
    for holder in _walk(document):
        if isinstance(holder, dict) and isinstance(holder.get(key), list):
            for item in holder[key]:
                if isinstance(item, dict) and item.get("name") == name:
                    target = item
                    for part in filter(None, tail.split(".")):
                        target = target[part]
                    out.append(target)
    return out


def _walk(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, dict):
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def apply_patch(resource: dict[str, Any], operation: dict[str, Any]) -> None:
    """One EnvoyPatchPolicy operation (add/replace) on a resource, in place (without a
    jsonPath, its ``path`` is from the resource's root)."""
    targets = json_path(resource, operation["jsonPath"]) if "jsonPath" in operation else [resource]
    if not targets:
        raise LookupError(f"jsonPath {operation['jsonPath']!r} matches nothing")
    parts = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
    if operation["op"] not in ("add", "replace"):
        raise ValueError(f"unsupported op {operation['op']}")
    *parents, last = parts
    for found in targets:
        holder = found
        for part in parents:
            holder = holder[int(part)] if isinstance(holder, list) else holder[part]
        value = copy.deepcopy(operation["value"])
        if isinstance(holder, list):
            # RFC 6902: "add" inserts before the index ("-": at the end).
            if operation["op"] != "add":
                raise ValueError("only 'add' into a list is emulated")
            index = len(holder) if last == "-" else int(last)
            if not 0 <= index <= len(holder):
                raise LookupError(f"add: {operation['path']} is out of range")
            holder.insert(index, value)
            continue
        if operation["op"] == "replace" and last not in holder:
            raise LookupError(f"replace: {operation['path']} does not exist")
        holder[last] = value


def envoy_gateway_bootstrap(
    extension_policy: dict[str, Any],
    patch_policy: dict[str, Any],
    httproutes: list[dict[str, Any]],
    listener_name: str,
) -> dict[str, Any]:
    filters, clusters = eg_ext_proc(extension_policy)
    names = [f["name"] for f in filters]
    route_config = {
        "name": listener_name,
        "virtual_hosts": [
            {
                "name": f"{listener_name}/{host.replace('.', '_')}",
                "domains": [host],
                "routes": eg_routes(httproutes, names, host),
            }
            for host in eg_hostnames(httproutes)
        ],
    }
    clusters += [
        static_cluster(
            f"httproute/{r['metadata']['namespace']}/{r['metadata']['name']}", "pool.invalid", 8000
        )
        for r in httproutes
    ]
    config = bootstrap(
        listener_name,
        [*filters, ROUTER],
        route_config,
        clusters,
        dict(EG_PATH_SETTINGS),
        EG_RUNTIME,
    )
    (listener,) = config["static_resources"]["listeners"]
    named = {c["name"]: c for c in config["static_resources"]["clusters"]}
    for patch in patch_policy["spec"]["jsonPatches"]:
        kind = patch["type"].rsplit(".", 1)[-1]
        if kind == "Cluster":
            target = named[patch["name"]]  # a cluster Envoy Gateway made
        else:
            assert patch["name"] == listener_name, patch["name"]
            target = {"Listener": listener, "RouteConfiguration": route_config}[kind]
        apply_patch(target, patch["operation"])
    return config
