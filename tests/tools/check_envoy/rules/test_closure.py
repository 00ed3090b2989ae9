"""A listener carrying policed routes holds only filter chains that end in a connection
manager the check reads, and a mint or honor route reaches only static clusters it
names itself."""

import copy

import pytest

from ext_proc.tools.check_envoy import check
from tests.tools.check_envoy.shipped import SHIPPED, at, clean, found, mutated, policy, route

LISTENER = "listener gateway"
_N = "type.googleapis.com/envoy.extensions.filters.network."
HCM_TYPE = _N + "http_connection_manager.v3.HttpConnectionManager"
HONOR, MINT = at("disaggregated"), at("prefill")


def listener(config):
    return config["static_resources"]["listeners"][0]


def tcp_proxy(cluster="disaggregated"):
    return {
        "name": "envoy.filters.network.tcp_proxy",
        "typed_config": {
            "@type": _N + "tcp_proxy.v3.TcpProxy",
            "stat_prefix": "raw",
            "cluster": cluster,
        },
    }


def http_inspector_default_tcp_proxy(config):
    """The audit's listener: the HTTP chain matched by ALPN as http_inspector tells it,
    and a default chain that proxies whatever else comes (an HTTP/1.0 request)."""
    entry = listener(config)
    entry["listener_filters"] = [
        {
            "name": "envoy.filters.listener.http_inspector",
            "typed_config": {
                "@type": "type.googleapis.com/"
                "envoy.extensions.filters.listener.http_inspector.v3.HttpInspector"
            },
        }
    ]
    entry["filter_chains"][0]["filter_chain_match"] = {"application_protocols": ["http/1.1", "h2c"]}
    entry["default_filter_chain"] = {"filters": [tcp_proxy()]}


def second_chain(*filters):
    def change(config):
        entry = listener(config)
        entry["filter_chains"][0]["filter_chain_match"] = {"destination_port": 8080}
        entry["filter_chains"].append({"name": "other", "filters": list(filters)})

    return change


def manager_from_ecds(config):
    entry = listener(config)
    entry["default_filter_chain"] = {
        "filters": [
            {
                "name": "envoy.filters.network.http_connection_manager",
                "config_discovery": {
                    "config_source": {"ads": {}},
                    "type_urls": [HCM_TYPE],
                },
            }
        ]
    }


def network_filter_before_manager(kind):
    def change(config):
        filters = listener(config)["filter_chains"][0]["filters"]
        filters.insert(
            0, {"name": "first", "typed_config": {"@type": _N + kind, "stat_prefix": "x"}}
        )

    return change


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            http_inspector_default_tcp_proxy,
            [("filter-chain-unchecked", f"{LISTENER} default_filter_chain")],
        ),
        (
            second_chain(tcp_proxy()),
            [("filter-chain-unchecked", f"{LISTENER} filter_chains[1] (other)")],
        ),
        (
            second_chain(
                {
                    "name": "redis",
                    "typed_config": {"@type": _N + "redis_proxy.v3.RedisProxy"},
                }
            ),
            [("filter-chain-unchecked", f"{LISTENER} filter_chains[1] (other)")],
        ),
        (manager_from_ecds, [("filter-chain-unchecked", f"{LISTENER} default_filter_chain")]),
        (
            network_filter_before_manager("wasm.v3.Wasm"),
            [("network-filter-unknown", f"{LISTENER} filter_chains[0]")],
        ),
        (
            network_filter_before_manager("sni_dynamic_forward_proxy.v3.FilterConfig"),
            [("network-filter-unknown", f"{LISTENER} filter_chains[0]")],
        ),
    ],
    ids=[
        "http-inspector-default-tcp-proxy",
        "tcp-proxy-chain",
        "redis-proxy-chain",
        "manager-from-ecds",
        "wasm-network-filter",
        "unknown-network-filter",
    ],
)
def test_a_chain_the_check_does_not_read_on_a_policed_listener_is_an_error(change, expected):
    assert found(mutated(change)) == expected


def test_a_network_filter_known_to_pass_the_bytes_on_passes():
    assert clean(mutated(network_filter_before_manager("rbac.v3.RBAC")))


def test_a_second_chain_ending_in_a_checked_manager_passes():
    def change(config):
        chain = copy.deepcopy(listener(config)["filter_chains"][0])
        listener(config)["default_filter_chain"] = chain

    assert clean(mutated(change))


def _raw_listener(config, *filters, name="raw"):
    # A listener of its own that runs no filter of this processor: another door.
    config["static_resources"]["listeners"].append(
        {
            "name": name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 9000}},
            "filter_chains": [{"filters": list(filters or [tcp_proxy("aggregated")])}],
        }
    )


def _cluster(config, name, port=9901, **settings):
    """A static cluster ``name`` of one host (127.0.0.1:``port``; the shipped upstreams
    are on 8081)."""
    address = {"socket_address": {"address": "127.0.0.1", "port_value": port}}
    config["static_resources"]["clusters"].append(
        {
            "name": name,
            "type": "STATIC",
            "load_assignment": {
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
            },
            **settings,
        }
    )


def _manager(route_config=None, http_filters=None, **settings):
    """An inline connection manager of no filter of this processor."""
    router = {
        "name": "envoy.filters.http.router",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
        },
    }
    config = {"@type": HCM_TYPE, "stat_prefix": "side", **settings}
    if route_config is not None:
        config["route_config"] = route_config
    config["http_filters"] = [*(http_filters or []), router]
    return {"name": "envoy.filters.network.http_connection_manager", "typed_config": config}


def _routes(*actions):
    routes = [{"match": {"prefix": "/"}, **action} for action in actions]
    return {"virtual_hosts": [{"name": "side", "domains": ["*"], "routes": routes}]}


def _to(cluster):
    return {"route": {"cluster": cluster}}


def _weighted_tcp_proxy(config):
    proxy = tcp_proxy()
    del proxy["typed_config"]["cluster"]
    proxy["typed_config"]["weighted_clusters"] = {
        "clusters": [{"name": "health", "weight": 1}, {"name": "disaggregated", "weight": 1}]
    }
    _cluster(config, "health")
    _raw_listener(config, proxy)


def _copy_of_decode(config):
    # Another name for the decode upstream's hosts.
    (decode,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "disaggregated"]
    config["static_resources"]["clusters"].append({**copy.deepcopy(decode), "name": "copy"})
    _raw_listener(config, tcp_proxy("copy"))


def _decode_host_spelt(address, kind="STATIC"):
    """A cluster naming the decode upstream's host (127.0.0.1:8081) another way: Envoy
    connects to the same socket."""

    def change(config):
        at = {"socket_address": {"address": address, "port_value": 8081}}
        _cluster(config, "alias", type=kind)
        assignment = config["static_resources"]["clusters"][-1]["load_assignment"]
        assignment["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] = at
        _raw_listener(config, tcp_proxy("alias"))

    return change


def _address(config, cluster, address, port, kind="STRICT_DNS"):
    """Make ``cluster`` (listed) one of a single host ``address``:``port``."""
    (entry,) = [c for c in config["static_resources"]["clusters"] if c["name"] == cluster]
    entry["type"] = kind
    at = {"socket_address": {"address": address, "port_value": port}}
    entry["load_assignment"]["endpoints"] = [{"lb_endpoints": [{"endpoint": {"address": at}}]}]


def _decode_by_dns(decode, side, kind="STRICT_DNS", reach="alias"):
    """The decode upstream as a Kubernetes deployment names it (``decode``, a host and
    port) and a side listener's cluster naming ``side`` (a host and port): whether both
    reach the same pods is for DNS and kube-proxy to say, never for a check that reads
    no name."""

    def change(config):
        for name in ("prefill", "disaggregated", "aggregated"):
            _address(config, name, *decode)
        if reach == "alias":
            _cluster(config, "alias")
            _address(config, "alias", *side, kind=kind)
        _raw_listener(config, tcp_proxy(reach))

    return change


# Another name, port or address for the decode pods; a Service port maps to any
# targetPort.
DNS_ALIASES = {
    "fqdn-vs-short-name": _decode_by_dns(
        ("decode.llm.svc.cluster.local", 8000), ("decode.llm", 8000)
    ),
    "short-name-vs-fqdn": _decode_by_dns(
        ("decode.llm", 8000), ("decode.llm.svc.cluster.local", 8000), "LOGICAL_DNS"
    ),
    "another-service": _decode_by_dns(("decode.llm", 8000), ("decode-direct.llm", 8000)),
    "pod-ip-vs-service": _decode_by_dns(("decode.llm", 8000), ("10.244.1.7", 8200), "STATIC"),
    "service-vs-policed-ip": lambda config: (
        _cluster(config, "alias"),
        _address(config, "alias", "decode.llm", 8000),
        _raw_listener(config, tcp_proxy("alias")),
    ),
    "another-port-on-the-name": _decode_by_dns(("decode.llm", 8000), ("decode.llm", 80)),
    # The processor's own cluster (127.0.0.1:50051) is no exception.
    "processor-cluster": _decode_by_dns(("decode.llm", 8000), (), reach="ext_proc"),
    "health-by-ip": _decode_by_dns(("decode.llm", 8000), ("127.0.0.1", 9901), "STATIC"),
}


@pytest.mark.parametrize("change", DNS_ALIASES.values(), ids=DNS_ALIASES.keys())
def test_a_side_listener_cluster_not_proven_apart_from_the_policed_ones_is_an_error(change):
    expected = ("policed-cluster-bypassed", "listener raw filter_chains[0]")
    config = copy.deepcopy(SHIPPED)
    change(config)
    assert found(check(config, listeners=frozenset({"gateway"}))) == [expected]
    assert expected in found(check(config))


def _side_eds_cluster(config):
    # Its hosts come from EDS at run time: none is listed.
    _cluster(config, "alias", type="EDS", eds_cluster_config={"eds_config": {"ads": {}}})
    del config["static_resources"]["clusters"][-1]["load_assignment"]
    _raw_listener(config, tcp_proxy("alias"))


def _side_at(address, name="alias"):
    """A side listener to a cluster ``name`` of one endpoint at ``address``."""

    def change(config):
        _cluster(config, name)
        endpoint = config["static_resources"]["clusters"][-1]["load_assignment"]["endpoints"][0]
        endpoint["lb_endpoints"][0]["endpoint"]["address"] = address
        _raw_listener(config, tcp_proxy(name))

    return change


UNLISTED_HOSTS = {
    "side-eds": _side_eds_cluster,
    "side-internal-address": _side_at({"envoy_internal_address": {"server_listener_name": "in"}}),
    "side-custom-resolver": _side_at(
        {"socket_address": {"address": "10.0.0.1", "port_value": 80, "resolver_name": "custom"}}
    ),
    "side-named-port": _side_at({"socket_address": {"address": "10.0.0.1", "named_port": "http"}}),
}


@pytest.mark.parametrize("change", UNLISTED_HOSTS.values(), ids=UNLISTED_HOSTS.keys())
def test_a_side_listener_cluster_whose_hosts_are_not_ip_literals_is_an_error(change):
    expected = ("policed-cluster-bypassed", "listener raw filter_chains[0]")
    config = copy.deepcopy(SHIPPED)
    change(config)
    assert found(check(config, listeners=frozenset({"gateway"}))) == [expected]


def _redis_proxy(config):
    # A terminal filter this check does not read: it may reach any cluster.
    _cluster(config, "cache")
    redis = {
        "name": "envoy.filters.network.redis_proxy",
        "typed_config": {
            "@type": _N + "redis_proxy.v3.RedisProxy",
            "stat_prefix": "redis",
            "settings": {"op_timeout": "1s"},
            "prefix_routes": {"catch_all_route": {"cluster": "cache"}},
        },
    }
    _raw_listener(config, redis)


def _chosen_by_sni(config):
    # sni_cluster sets tcp_proxy's cluster from the server name the client sends.
    _cluster(config, "health")
    sni = {
        "name": "envoy.filters.network.sni_cluster",
        "typed_config": {"@type": _N + "sni_cluster.v3.SniCluster"},
    }
    _raw_listener(config, sni, tcp_proxy("health"))


def _original_dst_side(config):
    _cluster(config, "anywhere", type="ORIGINAL_DST", lb_policy="CLUSTER_PROVIDED")
    del config["static_resources"]["clusters"][-1]["load_assignment"]
    _raw_listener(config, tcp_proxy("anywhere"))


def _copy_of_gateway(config):
    # The gateway's own routes on another port, without the processor's filter.
    routes = copy.deepcopy(listener(config)["filter_chains"][0]["filters"][0]["typed_config"])
    routes["http_filters"] = [
        f for f in routes["http_filters"] if f["name"] != "envoy.filters.http.ext_proc"
    ]
    entry = {"name": "envoy.filters.network.http_connection_manager", "typed_config": routes}
    _raw_listener(config, entry)


BYPASSES = {
    "tcp-proxy-to-decode": lambda config: _raw_listener(config, tcp_proxy("disaggregated")),
    "tcp-proxy-to-mint": lambda config: _raw_listener(config, tcp_proxy("prefill")),
    "tcp-proxy-to-strip": lambda config: _raw_listener(config, tcp_proxy("aggregated")),
    "tcp-proxy-weighted": _weighted_tcp_proxy,
    "tcp-proxy-to-decode-hosts": _copy_of_decode,
    "tcp-proxy-original-dst": _original_dst_side,
    "tcp-proxy-to-decode-host-v4-mapped": _decode_host_spelt("::ffff:127.0.0.1"),
    "tcp-proxy-to-decode-host-v4-mapped-hex": _decode_host_spelt("::ffff:7f00:1"),
    "tcp-proxy-to-decode-host-another-loopback": _decode_host_spelt("127.0.0.2"),
    "tcp-proxy-to-decode-host-unspecified": _decode_host_spelt("0.0.0.0"),
    "tcp-proxy-to-decode-host-localhost-dns": _decode_host_spelt("localhost", "STRICT_DNS"),
    "tcp-proxy-to-decode-host-localhost-fqdn": _decode_host_spelt("LocalHost.", "LOGICAL_DNS"),
    "tcp-proxy-chosen-by-sni": _chosen_by_sni,
    "redis-proxy": _redis_proxy,
    "manager-to-decode": lambda config: _raw_listener(
        config, _manager(_routes(_to("disaggregated")))
    ),
    "manager-mirror-to-mint": lambda config: (
        _cluster(config, "health"),
        _raw_listener(
            config,
            _manager(
                _routes(
                    {
                        "route": {
                            "cluster": "health",
                            "request_mirror_policies": [{"cluster": "prefill"}],
                        }
                    }
                )
            ),
        ),
    ),
    "manager-cluster-header": lambda config: _raw_listener(
        config, _manager(_routes({"route": {"cluster_header": "x-pool"}}))
    ),
    "manager-from-rds": lambda config: _raw_listener(
        config, _manager(rds={"route_config_name": "side", "config_source": {"ads": {}}})
    ),
    "gateway-without-processor": _copy_of_gateway,
}


@pytest.mark.parametrize("change", BYPASSES.values(), ids=BYPASSES.keys())
def test_a_listener_reaching_a_policed_cluster_around_the_processor_is_an_error(change):
    expected = ("policed-cluster-bypassed", "listener raw filter_chains[0]")
    config = copy.deepcopy(SHIPPED)
    change(config)
    # The listener in front of the model servers named, as a deployment with an admin
    # listener beside it runs the check: the other door is found all the same.
    assert found(check(config, listeners=frozenset({"gateway"}))) == [expected]
    assert expected in found(check(config))


PASSING = {
    "tcp-proxy-to-health": lambda config: (
        _cluster(config, "health"),
        _raw_listener(config, tcp_proxy("health")),
    ),
    "manager-to-health": lambda config: (
        _cluster(config, "health"),
        _raw_listener(config, _manager(_routes(_to("health")))),
    ),
    "manager-direct-response": lambda config: _raw_listener(
        config, _manager(_routes({"direct_response": {"status": 200}}))
    ),
    # Reaching no cluster, a side listener is apart from DNS-named upstreams too.
    "direct-response-beside-dns": lambda config: (
        [_address(config, n, "decode.llm", 8000) for n in ("disaggregated", "prefill")],
        _raw_listener(config, _manager(_routes({"direct_response": {"status": 200}}))),
    ),
    "tcp-proxy-to-another-ip-port": lambda config: (
        _cluster(config, "health", port=8082, type="STRICT_DNS"),
        _raw_listener(config, tcp_proxy("health")),
    ),
    "tcp-proxy-to-a-pipe": _side_at({"pipe": {"path": "/run/health.sock"}}, "health"),
}


@pytest.mark.parametrize("change", PASSING.values(), ids=PASSING.keys())
def test_a_listener_reaching_no_policed_cluster_passes(change):
    config = copy.deepcopy(SHIPPED)
    change(config)
    assert clean(check(config, listeners=frozenset({"gateway"})))


# --- the listener filters of a listener carrying policed routes ------------------------------

_L = "type.googleapis.com/envoy.extensions.filters.listener."
TYPED_STRUCT = "type.googleapis.com/xds.type.v3.TypedStruct"


def _listener_filter(typed_config):
    def change(config):
        listener(config)["listener_filters"] = [{"name": "first", "typed_config": typed_config}]

    return change


@pytest.mark.parametrize(
    "typed_config",
    [
        # The client states its source and destination addresses.
        {"@type": _L + "proxy_protocol.v3.ProxyProtocol"},
        {"@type": _L + "original_dst.v3.OriginalDst"},
        {"@type": _L + "original_src.v3.OriginalSrc"},
        {"@type": "type.googleapis.com/x.Unknown"},
        {"@type": TYPED_STRUCT, "type_url": "type.googleapis.com/x.Unknown", "value": {}},
        {"@type": TYPED_STRUCT, "type_url": _L + "proxy_protocol.v3.ProxyProtocol", "value": {}},
    ],
    ids=["proxy-protocol", "original-dst", "original-src", "unknown", "typed-struct", "typed-pp"],
)
def test_a_listener_filter_not_known_to_only_choose_a_chain_is_an_error(typed_config):
    assert found(mutated(_listener_filter(typed_config))) == [
        ("listener-filter-unknown", f"{LISTENER} listener_filters[0]")
    ]


@pytest.mark.parametrize(
    "typed_config",
    [
        {"@type": _L + "http_inspector.v3.HttpInspector"},
        {"@type": _L + "tls_inspector.v3.TlsInspector"},
        {"@type": TYPED_STRUCT, "type_url": _L + "tls_inspector.v3.TlsInspector", "value": {}},
    ],
    ids=["http-inspector", "tls-inspector", "typed-struct-tls-inspector"],
)
def test_a_listener_filter_that_only_chooses_a_chain_passes(typed_config):
    assert clean(mutated(_listener_filter(typed_config)))


def test_a_listener_filter_of_a_listener_without_policed_routes_is_not_this_rules_business():
    def change(config):
        _cluster(config, "health")
        _raw_listener(config, tcp_proxy("health"))
        pp = {"name": "pp", "typed_config": {"@type": _L + "proxy_protocol.v3.ProxyProtocol"}}
        config["static_resources"]["listeners"][-1]["listener_filters"] = [pp]

    assert clean(mutated(change))


def test_a_named_listener_is_read_whole():
    config = copy.deepcopy(SHIPPED)
    http_inspector_default_tcp_proxy(config)
    _raw_listener(config)
    report = check(config, listeners=frozenset({"gateway", "raw"}))
    assert found(report) == [
        ("filter-chain-unchecked", f"{LISTENER} default_filter_chain"),
        ("filter-chain-unchecked", "listener raw filter_chains[0]"),
        ("policed-cluster-bypassed", "listener raw filter_chains[0]"),
    ]
    # Named alone, the other listener is not read.
    assert found(check(config, listeners=frozenset({"raw"}))) == [
        ("no-connection-manager", ""),
        ("filter-chain-unchecked", "listener raw filter_chains[0]"),
        ("policed-cluster-bypassed", "listener raw filter_chains[0]"),
    ]


def test_a_listener_alone_is_read_as_well():
    # A document that is no bootstrap: the listener itself.
    config = copy.deepcopy(SHIPPED)
    http_inspector_default_tcp_proxy(config)
    assert found(check(listener(config))) == [
        ("filter-chain-unchecked", f"{LISTENER} default_filter_chain")
    ]


@pytest.mark.parametrize("source", ["lds_config", "lds_resources_locator"])
def test_listeners_from_lds_are_an_error_unless_those_in_front_are_named(source):
    def change(config):
        config["dynamic_resources"] = {source: {"ads": {}} if source == "lds_config" else "x"}

    assert found(mutated(change)) == [("listeners-unseen", "")]
    config = copy.deepcopy(SHIPPED)
    change(config)
    assert clean(check(config, listeners=frozenset({"gateway"})))


# --- the clusters a decided route reaches --------------------------------------------------


def _chosen(key, value):
    def change(config):
        action = route(config, "disaggregated")["route"]
        del action["cluster"]
        action[key] = value

    return change


PLUGIN = {"extension": {"name": "picker", "typed_config": {"@type": "type.googleapis.com/x.Y"}}}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cluster_header", "x-decode-pool"),
        ("cluster_specifier_plugin", "picker"),
        ("inline_cluster_specifier_plugin", PLUGIN),
    ],
)
def test_a_decided_routes_cluster_chosen_per_request_is_an_error(key, value):
    assert found(mutated(_chosen(key, value))) == [("decided-cluster-chosen", HONOR)]


def test_a_decided_routes_weighted_cluster_chosen_by_header_is_an_error():
    def change(config):
        action = route(config, "prefill")["route"]
        del action["cluster"]
        action["weighted_clusters"] = {
            "clusters": [
                {"name": "prefill", "weight": 50},
                {"cluster_header": "x-decode-pool", "weight": 50},
            ]
        }

    assert found(mutated(change)) == [("decided-cluster-chosen", f"{MINT} weighted_cluster #1")]


def test_a_strip_routes_cluster_chosen_per_request_is_not_this_rules_business():
    def change(config):
        _chosen("cluster_header", "x-decode-pool")(config)
        policy(config, "disaggregated")["action"] = "strip"

    assert "decided-cluster-chosen" not in mutated(change).codes()


def _from_cds(key):
    def change(config):
        config["dynamic_resources"] = {key: {"ads": {}} if key == "cds_config" else "x"}

    return change


@pytest.mark.parametrize("key", ["cds_config", "cds_resources_locator"])
def test_a_decided_routes_cluster_from_cds_is_an_error(key):
    def change(config):
        _from_cds(key)(config)
        route(config, "disaggregated")["route"]["cluster"] = "decode-from-cds"

    assert found(mutated(change)) == [
        ("decided-cluster-unseen", f"{HONOR} cluster 'decode-from-cds'")
    ]


def test_a_decided_routes_static_cluster_beside_cds_passes():
    # Envoy's cluster manager: a static cluster cannot be modified or removed by CDS.
    assert clean(mutated(_from_cds("cds_config")))


def test_a_decided_routes_cluster_of_an_extension_type_is_an_error():
    def change(config):
        (cluster,) = [
            c for c in config["static_resources"]["clusters"] if c["name"] == "disaggregated"
        ]
        cluster["cluster_type"] = {
            "name": "envoy.clusters.aggregate",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig",
                "clusters": ["aggregated"],
            },
        }

    # Its cluster_type may be refused by the field table too (coverage); this rule names
    # the route.
    assert ("decided-cluster-unseen", f"{HONOR} cluster 'disaggregated'") in found(mutated(change))


def test_a_decided_routes_weighted_cluster_not_listed_is_an_error():
    def change(config):
        action = route(config, "disaggregated")["route"]
        del action["cluster"]
        action["weighted_clusters"] = {
            "clusters": [{"name": "disaggregated", "weight": 1}, {"name": "elsewhere", "weight": 1}]
        }

    assert found(mutated(change)) == [("decided-cluster-unseen", f"{HONOR} cluster 'elsewhere'")]


# --- a decided route's cluster whose host the request names ---------------------------------


def _original_dst(name, **lb_config):
    """Cluster ``name`` of type ORIGINAL_DST: it connects to the host its
    ``original_dst_lb_config`` reads from the request (a header, metadata) or, without
    one, the connection's restored destination."""

    def change(config):
        (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
        cluster.pop("load_assignment")
        cluster.update(type="ORIGINAL_DST", lb_policy="CLUSTER_PROVIDED")
        if lb_config:
            cluster["original_dst_lb_config"] = lb_config

    return change


@pytest.mark.parametrize(
    "lb_config",
    [
        # Envoy's own header, which nothing removes from a client's request (the
        # original_dst_lb_config docs: "this header isn't sanitized by default").
        {"use_http_header": True},
        {"use_http_header": True, "http_header_name": "x-target"},
        # From dynamic metadata, or the connection's destination (a client's PROXY
        # protocol header restores it).
        {"metadata_key": {"key": "envoy.lb", "path": [{"key": "host"}]}},
        {},
    ],
    ids=["default-header", "own-header", "metadata", "connection"],
)
@pytest.mark.parametrize(("name", "place"), [("prefill", MINT), ("disaggregated", HONOR)])
def test_a_decided_routes_cluster_whose_host_the_request_names_is_an_error(lb_config, name, place):
    assert found(mutated(_original_dst(name, **lb_config))) == [
        ("decided-cluster-chosen", f"{place} cluster {name!r}")
    ]


@pytest.mark.parametrize("kind", ["original_dst", 4, "4"])
def test_original_dst_is_read_in_every_spelling_envoy_reads(kind):
    def change(config):
        _original_dst("prefill", use_http_header="yes", http_header_name="x-target")(config)
        (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "prefill"]
        cluster["type"] = kind

    assert found(mutated(change)) == [("decided-cluster-chosen", f"{MINT} cluster 'prefill'")]


def test_a_decided_routes_host_from_a_header_the_header_step_removes_passes():
    # llm-d's endpoint picker: the header step removes a client's
    # x-gateway-destination-endpoint, the picker (declared, after the decision) writes it.
    change = _original_dst(
        "disaggregated", use_http_header=True, http_header_name="X-Gateway-Destination-Endpoint"
    )
    assert clean(mutated(change))


def test_a_strip_routes_original_dst_cluster_is_not_this_rules_business():
    change = _original_dst("aggregated", use_http_header=True)
    assert "decided-cluster-chosen" not in mutated(change).codes()
