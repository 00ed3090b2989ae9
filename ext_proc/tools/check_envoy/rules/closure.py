"""What the check reads is all a policed request can meet: the listeners in front of
this processor's routes hold no filter chain it does not read, and a ``mint`` or
``honor`` route reaches only clusters it reads.

A listener carries policed routes when one of its connection managers runs this
processor's filter (or when ``--listener`` names it). Every filter chain of such a
listener, ``default_filter_chain`` included, must end in an HTTP connection manager
given inline, read whole by the rules: Envoy hands a connection to whichever chain its
``filter_chain_match`` (or ``filter_chain_matcher``) picks, and the listener filters
that pick it (``tls_inspector``, ``http_inspector``) are the client's to steer: an
HTTP/1.0 request is no ``http/1.1`` to ``http_inspector`` and falls through to the
default chain. A ``tcp_proxy`` (or any other terminal filter) there forwards the bytes
uninspected, ids and all; a connection manager from ECDS (``config_discovery``) is read
by no rule. The network filters before the connection manager are of types known to
leave the bytes alone (``NETWORK_KEEPERS``), the listener filters of types known only to
choose a chain (``LISTENER_FILTERS``). Listeners from LDS are not read at all.

No other listener, named with ``--listener`` or not, reaches a cluster a policed route
reaches (``bypasses``): a ``tcp_proxy`` or a connection manager without this processor's
filter in front of the decode cluster forwards a client's ``kv_transfer_params`` verbatim,
around the processor. A chain reaches the clusters its filters name; a chain this check
cannot read to the end (a terminal filter other than an inline connection manager or
``tcp_proxy``, a filter before it that is not a keeper, routes from RDS, a cluster chosen
per request) may reach every cluster. A cluster it reaches is apart from the policed
ones only when proven so: every host of both an IP address (or a pipe) and no address
and port shared. A DNS name on either side proves nothing: the decode Service's FQDN and
its short name, another Service for the same pods, a pod's IP and any port of the
Service (which maps to any targetPort) reach the same server, and no offline check
resolves them.

A decided route's cluster is one the bootstrap lists in ``static_resources`` (which CDS
cannot replace or remove: Envoy's cluster manager docs), of no extension type, named by
the route itself: a cluster chosen per request (``CHOSEN_PER_REQUEST``: a client's
header names it, or a plugin picks it) may be one from CDS or ODCDS whose retry and
mirror policies resend the decided body, and none of them is read here. A static
cluster of type ORIGINAL_DST lists no host: it connects where the request or the
connection says, so it serves a decided route only when its host comes from a header
the header step removes from every client's request (``host_chosen``)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, Final

from ext_proc.tools.carrier_headers import ROUTING_HEADERS
from ext_proc.tools.check_envoy.findings import Finding, error
from ext_proc.tools.check_envoy.reader import (
    CHOSEN_PER_REQUEST,
    EXT_PROC,
    HCM,
    ORIGINAL_DST,
    Chain,
    Clusters,
    Route,
    discovery_type,
    is_ours,
    walk,
)
from ext_proc.tools.check_envoy.rules import filter_types
from ext_proc.tools.check_envoy.rules.replay import decided

_N: Final = "type.googleapis.com/envoy.extensions.filters.network."
# Network filters that allow, refuse or count a connection and pass its bytes on as
# they came (each filter's Envoy 1.40 docs).
NETWORK_KEEPERS: Final = frozenset(
    {
        _N + "rbac.v3.RBAC",
        _N + "local_ratelimit.v3.LocalRateLimit",
        _N + "ratelimit.v3.RateLimit",
        _N + "connection_limit.v3.ConnectionLimit",
        _N + "ext_authz.v3.ExtAuthz",
    }
)


TCP_PROXY: Final = _N + "tcp_proxy.v3.TcpProxy"

_L: Final = "type.googleapis.com/envoy.extensions.filters.listener."
# Listener filters allowed on a listener that carries policed routes: each only reads
# the connection's first bytes to choose a filter chain, and every chain of the listener
# is checked (Envoy 1.40's listener filter docs).
LISTENER_FILTERS: Final[Mapping[str, str]] = MappingProxyType(
    {
        _L + "http_inspector.v3.HttpInspector": (
            "http_inspector docs: sets the application protocol it detects, which only "
            "selects a filter chain"
        ),
        _L + "tls_inspector.v3.TlsInspector": (
            "tls_inspector docs: sets the server name and ALPN the client sent, which only "
            "select a filter chain"
        ),
    }
)
# Why some listener filters are refused (Envoy 1.40's docs), for the finding's message.
_LISTENER_FILTER_HARM: Final[Mapping[str, str]] = MappingProxyType(
    {
        _L + "proxy_protocol.v3.ProxyProtocol": (
            "it takes the connection's source and destination addresses from a PROXY "
            "header the client may send"
        ),
        _L + "original_dst.v3.OriginalDst": (
            "it restores the connection's destination, which an ORIGINAL_DST cluster "
            "connects to and use_original_dst hands to another listener"
        ),
        _L + "original_src.v3.OriginalSrc": (
            "it makes upstream connections from the client's address, which upstreams may trust"
        ),
    }
)


def _is_bootstrap(config: Any) -> bool:
    return isinstance(config, dict) and isinstance(config.get("static_resources"), dict)


def _listeners(config: Any, names: frozenset[str] | None) -> list[dict[str, Any]]:
    """The listeners the check reads: those named, else every one (a bootstrap's static
    listeners; anything with filter chains in a document that is no bootstrap)."""
    if names is None and _is_bootstrap(config):
        listed = config["static_resources"].get("listeners", [])
        return [entry for entry in listed if isinstance(entry, dict)]
    return [
        entry
        for entry in walk(config)
        if ("filter_chains" in entry or "default_filter_chain" in entry)
        and (names is None or entry.get("name") in names)
    ]


def _chains(listener: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    place = f"listener {listener.get('name')}"
    for index, chain in enumerate(listener.get("filter_chains", [])):
        if isinstance(chain, dict):
            name = f" ({chain['name']})" if chain.get("name") else ""
            yield f"{place} filter_chains[{index}]{name}", chain
    default = listener.get("default_filter_chain")
    if isinstance(default, dict):
        yield f"{place} default_filter_chain", default


def _manager(chain: dict[str, Any]) -> dict[str, Any] | None:
    """The chain's connection manager, given inline as its last filter; None for any
    other ending."""
    filters = chain.get("filters", [])
    last = filters[-1] if isinstance(filters, list) and filters else None
    config = last.get("typed_config") if isinstance(last, dict) else None
    return config if isinstance(config, dict) and config.get("@type") == HCM else None


def _policed(listener: dict[str, Any], namespace: str) -> bool:
    for _, chain in _chains(listener):
        manager = _manager(chain)
        for entry in manager.get("http_filters", []) if manager else []:
            if (
                isinstance(entry, dict)
                and entry.get("typed_config", {}).get("@type") == EXT_PROC
                and is_ours(entry, namespace)
            ):
                return True
    return False


def listeners(config: Any, names: frozenset[str] | None, namespace: str) -> Iterator[Finding]:
    """Every listener that carries policed routes (every one named) holds only chains
    that end in a connection manager the rules read."""
    dynamic = config.get("dynamic_resources") if isinstance(config, dict) else None
    if names is None and isinstance(dynamic, dict):
        source = sorted({"lds_config", "lds_resources_locator"} & set(dynamic))
        if source:
            yield error(
                "listeners-unseen",
                "",
                f"listeners come from LDS (dynamic_resources.{source[0]}), which this check "
                "cannot read: their filter chains may reach the model servers uninspected. "
                "Name the listeners in front of model servers (--listener) and list them in "
                "static_resources",
            )
    for listener in _listeners(config, names):
        if names is None and not _policed(listener, namespace):
            continue
        yield from _listener_filters(listener)
        for place, chain in _chains(listener):
            yield from _chain(place, chain)
    yield from bypasses(config, namespace)


def _listener_filters(listener: dict[str, Any]) -> Iterator[Finding]:
    given = listener.get("listener_filters", [])
    for index, entry in enumerate(given if isinstance(given, list) else [given]):
        typed = entry.get("typed_config") if isinstance(entry, dict) else None
        kind = typed.get("@type") if isinstance(typed, dict) else None
        if kind in LISTENER_FILTERS:
            continue
        name = entry.get("name") if isinstance(entry, dict) else None
        harm = _LISTENER_FILTER_HARM.get(str(kind), "what it does to the connection is unread")
        yield error(
            "listener-filter-unknown",
            f"listener {listener.get('name')} listener_filters[{index}]",
            f"listener filter {name} ({kind or 'no typed_config'}) on a listener carrying "
            f"policed routes is not known only to choose a filter chain: {harm}. Known: "
            f"{', '.join(k.removeprefix(_L) for k in LISTENER_FILTERS)}. Remove it",
        )


def _chain(place: str, chain: dict[str, Any]) -> Iterator[Finding]:
    filters = [f for f in chain.get("filters", []) if isinstance(f, dict)]
    if not filters:
        # Envoy closes a connection whose chain has no filter: nothing is forwarded.
        return
    *before, last = filters
    for entry in before:
        kind = entry.get("typed_config", {}).get("@type", "config_discovery (ECDS)")
        if kind not in NETWORK_KEEPERS:
            yield error(
                "network-filter-unknown",
                place,
                f"network filter {entry.get('name')} ({kind}) runs before the connection "
                "manager and is not known to pass the bytes on as they came. Remove it",
            )
    if _manager(chain) is not None:
        return
    if "config_discovery" in last:
        ending = f"{last.get('name')}, a filter from ECDS (config_discovery)"
    else:
        ending = f"{last.get('name')} ({last.get('typed_config', {}).get('@type')})"
    yield error(
        "filter-chain-unchecked",
        place,
        f"this filter chain of a listener carrying policed routes ends in {ending}, not in "
        "an HTTP connection manager given inline: a connection the listener hands it "
        "reaches an upstream uninspected. Remove the chain, or make it a connection "
        "manager this check reads",
    )


# A set of clusters, or None: every cluster.
Reach = frozenset[str] | None


def _named(node: Any) -> Reach:
    """The clusters a filter's configuration (or a route's action) names: ``cluster``,
    ``cluster_name``, weighted clusters, mirrors; None when one is chosen per request."""
    names: set[str] = set()
    for entry in walk(node):
        if any(key in entry for key in CHOSEN_PER_REQUEST):
            return None
        names.update(
            str(entry[k]) for k in ("cluster", "cluster_name") if isinstance(entry.get(k), str)
        )
        weighted = entry.get("weighted_clusters")
        listed = weighted.get("clusters", []) if isinstance(weighted, dict) else []
        names.update(str(c["name"]) for c in listed if isinstance(c, dict) and "name" in c)
    return frozenset(names)


def _union(reaches: Iterator[Reach]) -> Reach:
    names: set[str] = set()
    for reach in reaches:
        if reach is None:
            return None
        names |= reach
    return frozenset(names)


def _kind(entry: dict[str, Any]) -> Any:
    typed = entry.get("typed_config")
    return typed.get("@type") if isinstance(typed, dict) else None


def _reach(chain: dict[str, Any]) -> Reach:
    """The clusters a filter chain can send to; None where it cannot be read to the end."""
    filters = [f for f in chain.get("filters", []) if isinstance(f, dict)]
    if not filters:
        return frozenset()
    *before, last = filters
    if any(_kind(entry) not in NETWORK_KEEPERS for entry in before):
        # sni_cluster, set_filter_state and their kind pick tcp_proxy's cluster per
        # connection.
        return None
    config = last.get("typed_config")
    if _kind(last) == TCP_PROXY:
        return _named(config)
    manager = _manager(chain)
    if manager is None or not isinstance(manager.get("route_config"), dict):
        return None
    entries = [f for f in manager.get("http_filters", []) if isinstance(f, dict)]
    if any(_kind(entry) not in filter_types.TABLE for entry in entries):
        return None
    return _union(_named(part) for part in (manager.get("route_config"), entries))


def _guarded(listed: list[dict[str, Any]], namespace: str) -> Reach:
    """The clusters a policed route (one with this processor's policy metadata, on a
    listener that runs its filter) reaches; None: every cluster (one is chosen per
    request, or routes come from RDS)."""
    reaches: list[Reach] = []
    for listener in listed:
        if not _policed(listener, namespace):
            continue
        for _, chain in _chains(listener):
            manager = _manager(chain)
            if manager is None:
                continue
            if not isinstance(manager.get("route_config"), dict):
                reaches.append(None)
                continue
            for entry in walk(manager["route_config"]):
                metadata = entry.get("metadata")
                given = metadata.get("filter_metadata") if isinstance(metadata, dict) else None
                if isinstance(given, dict) and namespace in given and "route" in entry:
                    reaches.append(_named(entry["route"]))
    return _union(iter(reaches))


# What a host names when it names this machine: the connection reaches whatever listens
# on the port on all addresses (a model server's default).
_LOCAL: Final = "local"


class _Unproven(ValueError):
    """A cluster's addresses are not all known; the message says why."""


class _PickedLater(_Unproven):
    """A cluster lists no hosts: they are picked at run time (or it is not listed)."""


def _host(address: Any) -> str | None:
    """One spelling per IP address: its canonical form (an IPv4-mapped IPv6 address as
    the IPv4 one), and every name of this machine (a loopback or unspecified address;
    localhost and its subdomains, which RFC 6761 reserves for the loopback) as one;
    None for a DNS name: which addresses it resolves to (another Service for the same
    pods, a pod's own IP) no offline check can tell."""
    text = str(address).lower().rstrip(".")
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return _LOCAL if text == "localhost" or text.endswith(".localhost") else None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return _LOCAL if ip.is_loopback or ip.is_unspecified else str(ip)


def _address(address: Any) -> str:
    """An endpoint's address as ``host:port`` (``_host``) or a pipe's path; ``_Unproven``
    for one the check cannot compare."""
    socket = address.get("socket_address") if isinstance(address, dict) else None
    pipe = address.get("pipe") if isinstance(address, dict) else None
    if isinstance(pipe, dict):
        return f"unix:{pipe.get('path')}"
    if not isinstance(socket, dict):
        raise _Unproven(f"connects to {_kinds(address)}, not an IP address or a pipe")
    given = socket.get("address")
    if socket.get("resolver_name"):
        raise _Unproven(f"resolves {given} with the resolver {socket['resolver_name']}")
    port = socket.get("port_value", 0)
    if isinstance(port, str) and port.strip().isdigit():
        port = int(port)
    if type(port) is not int or "named_port" in socket:
        raise _Unproven(f"names no port number for {given}")
    host = _host(given)
    if host is None:
        raise _Unproven(f"names the DNS name {given}")
    return f"{host}:{port}"


def _kinds(address: Any) -> str:
    return ", ".join(sorted(address)) if isinstance(address, dict) and address else "no address"


def _hosts(cluster: Any) -> frozenset[str]:
    """Every address a listed cluster connects to (``_address``: its endpoints' and
    their additional addresses); ``_Unproven`` when they are not all known: hosts picked
    at run time, from EDS or LEDS, or named by DNS."""
    if not isinstance(cluster, dict):
        raise _PickedLater("is not listed in static_resources (its hosts unseen)")
    kind = discovery_type(cluster.get("type", "STATIC"))
    if "cluster_type" in cluster or kind == ORIGINAL_DST:
        raise _PickedLater("picks its hosts or clusters at run time")
    if kind not in {"STATIC", "STRICT_DNS", "LOGICAL_DNS"}:
        raise _PickedLater(f"takes its hosts from {kind}")
    found: set[str] = set()
    assignment = cluster.get("load_assignment", {})
    for locality in assignment.get("endpoints", []) if isinstance(assignment, dict) else []:
        if not isinstance(locality, dict):
            continue
        if "leds_cluster_locality_config" in locality:
            raise _PickedLater("takes its hosts from LEDS")
        for entry in locality.get("lb_endpoints", []):
            endpoint = entry.get("endpoint") if isinstance(entry, dict) else None
            if not isinstance(endpoint, dict):
                raise _Unproven("lists an endpoint by name (endpoint_name)")
            extra = endpoint.get("additional_addresses", [])
            addresses = [endpoint.get("address")] + [
                more.get("address") if isinstance(more, dict) else more
                for more in (extra if isinstance(extra, list) else [extra])
            ]
            found.update(_address(address) for address in addresses)
    return frozenset(found)


def _bypassed(reach: frozenset[str], guarded: frozenset[str], config: Any) -> list[str]:
    """Each cluster of ``reach`` that reaches a policed upstream, or may: one not proven
    to share no address with any cluster a policed route reaches, with why."""
    # A document that is no bootstrap lists its clusters elsewhere: none is seen.
    listed = (
        {
            str(c["name"]): c
            for c in config["static_resources"].get("clusters", [])
            if isinstance(c, dict) and "name" in c
        }
        if _is_bootstrap(config)
        else {}
    )
    policed: set[str] = set()
    unknown: list[str] = []
    for name in sorted(guarded):
        try:
            policed |= _hosts(listed.get(name))
        except _PickedLater:
            # Its hosts are unseen, so compared by name only: llm-d's ORIGINAL_DST cluster
            # goes where its endpoint picker says, and Envoy Gateway's readiness listener
            # beside it reaches Envoy's own stats (a side cluster naming a picked pod's
            # address is not found).
            continue
        except _Unproven as why:
            unknown.append(f"the policed cluster {name!r} {why}")
    found: list[str] = []
    for name in sorted(reach):
        if name in guarded:
            found.append(f"{name!r}, which a policed route reaches")
            continue
        try:
            hosts = _hosts(listed.get(name))
        except _Unproven as why:
            found.append(f"{name!r}, which {why}")
            continue
        if hosts & policed:
            found.append(f"{name!r}, which lists a host of a cluster a policed route reaches")
        elif unknown:
            found.append(f"{name!r}, while {unknown[0]}")
    return found


def bypasses(config: Any, namespace: str) -> Iterator[Finding]:
    """Every filter chain of a listener that runs no filter of this processor, named or
    not, reaches only clusters proven apart from those a policed route reaches: every
    host of each an IP address (or a pipe), none shared."""
    listed = _listeners(config, None)
    guarded = _guarded(listed, namespace)
    if guarded is not None and not guarded:
        return
    for listener in listed:
        if _policed(listener, namespace):
            continue
        for place, chain in _chains(listener):
            reach = _reach(chain)
            if reach is None:
                found = ["every cluster (the chain cannot be read to its end)"]
            elif guarded is None:
                found = [
                    f"{name!r}, and a policed route may reach any cluster" for name in sorted(reach)
                ]
            else:
                found = _bypassed(reach, guarded, config)
            if found:
                yield error(
                    "policed-cluster-bypassed",
                    place,
                    "this listener runs no filter of this processor and its chain reaches "
                    f"{'; '.join(found)}: the check cannot prove it reaches none of the "
                    "policed upstreams, and a request reaching one here does so uninspected "
                    "(a client's kv_transfer_params verbatim). Remove the chain, run this "
                    "processor's filter on it, send it to clusters whose hosts are IP "
                    "addresses (or pipes) no policed cluster lists, the policed clusters' "
                    "hosts IP addresses too (a DNS name may resolve to any of them), or "
                    "serve it from another Envoy",
                )


def decided_clusters(route: Route, chain: Chain, known: Clusters | None) -> Iterator[Finding]:
    """A ``mint`` or ``honor`` route names its clusters itself, each a static one of no
    extension type (``known`` None: no bootstrap, its clusters are listed elsewhere)."""
    decision = decided(route, chain)
    if decision is None:
        return
    action = route.entry["route"]
    why = f"this {decision.value} route's body, decided once, could reach upstreams twice"
    weighted = action.get("weighted_clusters", {}).get("clusters", [])
    holders = [(route.place, action)] + [
        (f"{route.place} weighted_cluster #{index}", cluster)
        for index, cluster in enumerate(weighted)
        if isinstance(cluster, dict)
    ]
    for place, holder in holders:
        for key in CHOSEN_PER_REQUEST:
            if key in holder:
                yield error(
                    "decided-cluster-chosen",
                    place,
                    f"{key} chooses the cluster per request: any cluster, one from CDS or "
                    f"ODCDS too, with retry and mirror policies unread here ({why}). Name "
                    "the cluster",
                )
    if known is None:
        return
    for _, holder in holders:
        name = holder.get("cluster") if holder is action else holder.get("name")
        if name is not None:
            yield from _named_cluster(
                f"{route.place} cluster {str(name)!r}", str(name), known, decision.value, why
            )


def _named_cluster(
    place: str, name: str, known: Clusters, decided_as: str, why: str
) -> Iterator[Finding]:
    """Why the cluster ``name`` a ``decided_as`` route names is not read whole here: not a
    static one, of an extension type, or ORIGINAL_DST with its host chosen by a client."""
    if name not in known.static:
        source = "clusters come from CDS" if known.from_cds else "no such cluster is listed"
        yield error(
            "decided-cluster-unseen",
            place,
            f"the cluster is not a static one ({source}), so its retry and mirror "
            f"policies are unchecked ({why} if they resend). List it in static_resources",
        )
    elif name in known.extension:
        yield error(
            "decided-cluster-unseen",
            place,
            "the cluster is of an extension type (cluster_type): it picks further "
            f"clusters or hosts at run time, their policies unread ({why}). Route to "
            "a cluster the bootstrap lists",
        )
    elif name in known.original_dst:
        chosen = host_chosen(known.original_dst[name])
        if chosen is not None:
            yield error(
                "decided-cluster-chosen",
                place,
                f"the cluster is of type ORIGINAL_DST and {chosen}: a client sends "
                f"this {decided_as} route's decided body to a host of its choosing "
                "(a mint route signs the parameters that host answers). Route to a "
                "cluster that lists its hosts, or read the host from a header the "
                "header step removes",
            )


# The header an ORIGINAL_DST cluster reads the host from by default.
ORIGINAL_DST_HEADER: Final = "x-envoy-original-dst-host"


def host_chosen(lb_config: Any) -> str | None:
    """Why a client can choose the host of an ORIGINAL_DST cluster configured by
    ``lb_config`` (its ``original_dst_lb_config``); None when only a header the header
    step removes from every request names it (``carrier_headers.ROUTING_HEADERS``:
    llm-d's endpoint picker writes ``x-gateway-destination-endpoint`` after the
    decision). Envoy's docs warn that the header is not sanitised; a host from dynamic
    metadata is whatever a filter wrote; without either, the host is the connection's
    restored destination, which a PROXY protocol header (a client's, where the
    listener accepts one) or the original destination of a redirected connection sets."""
    config = lb_config if isinstance(lb_config, dict) else {}
    if "metadata_key" in config:
        return "its host comes from dynamic metadata (metadata_key), which no rule bounds"
    if config.get("use_http_header") is not True:
        return "its host is the connection's restored destination (original_dst, PROXY protocol)"
    header = str(config.get("http_header_name") or ORIGINAL_DST_HEADER).lower()
    if header not in ROUTING_HEADERS:
        return f"its host comes from the request header {header}, which the header step keeps"
    return None
