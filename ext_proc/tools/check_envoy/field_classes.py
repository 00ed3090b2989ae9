"""Every field of every Envoy message check-envoy walks (``coverage.WALKED``; the fields
come from Envoy's schema, ``envoy_fields.json``), classified once, with the reason:

- ``read``: a rule reads it (the reason names the rule); a field whose type is walked is
  read field by field;
- ``refused``: no rule reads it, and it can change what reaches an upstream or whether
  this processor's filter runs; an error on a listener that carries a policed route;
- ``harmless``: no rule reads it, and nothing it does changes a request this processor
  decided, or whether it decides (the reason says why).

tests/tools/check_envoy/test_coverage.py holds this equal to the generated table: a
field Envoy adds (a new envoy-data-plane) fails the unit tier until it is classified
here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

Kind = Literal["read", "refused", "harmless"]
READ: Final = "read"
REFUSED: Final = "refused"
HARMLESS: Final = "harmless"


@dataclass(frozen=True, slots=True)
class Class:
    kind: Kind
    reason: str


def _read(reader: str) -> Class:
    return Class("read", reader)


def _refused(why: str) -> Class:
    return Class("refused", why)


def _harmless(why: str) -> Class:
    return Class("harmless", why)


# Reasons shared by many fields.
_STATS = _harmless("statistics, logs or traces: nothing a request carries")
_TIMEOUT = _harmless("a timeout or a limit: reaching it ends or refuses the request")
_SOCKET = _harmless("how connections are accepted or made, not what a request carries")
_ENDPOINT = _harmless("which endpoint of the cluster serves a request, not what it carries")
_RESPONSE = _harmless("changes responses only")
_CODEC = _harmless(
    "how a codec reads or writes HTTP: the filters, this processor's included, see the "
    "request it parsed, which the router writes upstream"
)
_REMOVES = _harmless(
    "removes request headers after the filters: a removal writes no client's value, and "
    "the processor's decision is the body it forwards"
)
_ADDS = _read("rules.header_step (header-rewritten-by-route), rules.replay (retry-header-added)")
_PER_FILTER = _read("effective (the per-route configurations of each filter), rules.filters")
_WALKED = _read("coverage (walked field by field)")
_VHOSTS = _harmless("which virtual host a request takes: every virtual host is checked")
_BUFFER_LIMIT = _harmless(
    "a buffer limit; the hold's rule reads the route's request_body_buffer_limit and refuses "
    "a hold whose limit the route does not state (rules.hold)"
)
_REPLAY = _read("rules.replay (body-retried, body-hedged, body-mirrored)")
_CLOSURE = _read("rules.closure")
_PROBES = _read(
    "route_probes (rules.token_paths): it reads every key of a match, and a matcher it does "
    "not simulate is route-unreadable"
)
_MODE = _read("rules.filters (processing_mode), rules.route (mint-response-unseen)")
_TLS = _harmless("TLS of the connection, not the request it carries")
_EXTENSION = _refused(
    "an extension whose effect on the request this check cannot read (it may change it, or "
    "whether this processor decides it)"
)

_HCM: Final = "envoy.extensions.filters.network.http_connection_manager.v3."
_R: Final = "envoy.config.route.v3."
_X: Final = "envoy.extensions.filters.http.ext_proc.v3."
_B: Final = "envoy.config.bootstrap.v3.Bootstrap"

BY_MESSAGE: Final[Mapping[str, Mapping[str, Class]]] = {
    _B: {
        "node": _harmless("the node's identity towards management servers"),
        "node_context_params": _harmless("the node's identity towards management servers"),
        "static_resources": _WALKED,
        "dynamic_resources": _WALKED,
        "cluster_manager": _harmless("how clusters bind and report, not what a request carries"),
        "hds_config": _harmless("health discovery: endpoint health only"),
        "flags_path": _harmless("a directory of drain and health flags"),
        "stats_sinks": _STATS,
        "deferred_stat_options": _STATS,
        "stats_config": _STATS,
        "stats_flush_interval": _STATS,
        "stats_flush_on_admin": _STATS,
        "stats_eviction_interval": _STATS,
        "stats_server_version_override": _STATS,
        "enable_dispatcher_stats": _STATS,
        "watchdog": _harmless("kills a stuck Envoy"),
        "watchdogs": _harmless("kills a stuck Envoy"),
        "tracing": _STATS,
        "layered_runtime": _read(
            "coverage.runtime: static layers of known keys only, and the admin layer"
        ),
        "admin": _harmless(
            "the operator's interface (its runtime changes are the operator's): bind it where "
            "only the operator reaches it"
        ),
        "overload_manager": _harmless("sheds load: refuses or resets requests"),
        "header_prefix": _refused(
            "renames Envoy's x-envoy-* headers, which the rules read by name (the router's "
            "retry headers, the header step)"
        ),
        "use_tcp_for_dns_lookups": _SOCKET,
        "dns_resolution_config": _SOCKET,
        "typed_dns_resolver_config": _SOCKET,
        "bootstrap_extensions": _EXTENSION,
        "fatal_actions": _harmless("runs when Envoy crashes"),
        "config_sources": _harmless(
            "where xdstp:// resources come from; what would come is refused where it matters "
            "(CDS, RDS, ECDS)"
        ),
        "default_config_source": _harmless(
            "where xdstp:// resources come from; what would come is refused where it matters"
        ),
        "default_socket_interface": _SOCKET,
        "certificate_provider_instances": _TLS,
        "inline_headers": _harmless("a header map's storage, not its contents"),
        "perf_tracing_file_path": _STATS,
        "default_regex_engine": _refused(
            "the route simulation runs regexes with RE2, Envoy's default engine; another "
            "engine's matches cannot be told"
        ),
        "xds_delegate_extension": _harmless(
            "stores and replays xDS resources; dynamic resources are refused where it matters"
        ),
        "xds_config_tracker_extension": _STATS,
        "listener_manager": _harmless("Envoy's own listener manager implementation"),
        "application_log_config": _STATS,
        "grpc_async_client_manager_config": _harmless("a cache of gRPC clients"),
        "memory_allocator_manager": _harmless("memory release"),
        "enable_worker_cpu_affinity": _SOCKET,
    },
    _B + ".StaticResources": {
        "listeners": _read(
            "coverage (each listener that carries a policed route is walked; the others are "
            "not on a policed path), reader.managers"
        ),
        "clusters": _read(
            "coverage (the clusters the policed routes reach are walked), reader.clusters"
        ),
        "secrets": _TLS,
    },
    _B + ".DynamicResources": {
        "lds_config": _harmless(
            "listeners from LDS are other listeners: LDS cannot replace a static one"
        ),
        "lds_resources_locator": _harmless(
            "listeners from LDS are other listeners: LDS cannot replace a static one"
        ),
        "cds_config": _read("reader.clusters (decided-cluster-unseen, processor-cluster-unseen)"),
        "cds_resources_locator": _CLOSURE,
        "ads_config": _harmless(
            "the stream xDS resources come over; what comes is refused where it matters"
        ),
    },
    "envoy.config.listener.v3.Listener": {
        "name": _read("reader.managers (--listener)"),
        "address": _SOCKET,
        "additional_addresses": _SOCKET,
        "stat_prefix": _STATS,
        "filter_chains": _read("rules.closure, coverage (walked)"),
        "fcds_config": _refused("filter chains from FCDS, which this check cannot see"),
        "filter_chain_matcher": _refused(
            "chooses filter chains by a matcher tree, which this check does not evaluate"
        ),
        "use_original_dst": _refused(
            "hands connections to the listener of their original destination, whose chains "
            "this listener's checks do not cover"
        ),
        "default_filter_chain": _read("rules.closure, coverage (walked)"),
        "per_connection_buffer_limit_bytes": _TIMEOUT,
        "per_connection_buffer_high_watermark_timeout": _TIMEOUT,
        "metadata": _harmless("metadata no filter of a policed chain reads from the listener"),
        "deprecated_v1": _SOCKET,
        "drain_type": _SOCKET,
        "listener_filters": _read(
            "rules.closure (listener-filter-unknown: only types that choose a chain, "
            "closure.LISTENER_FILTERS), coverage (walked)"
        ),
        "listener_filters_timeout": _harmless(
            "which chain a connection takes when a listener filter times out: every chain of "
            "the listener is held to the same rules (rules.closure)"
        ),
        "continue_on_listener_filters_timeout": _harmless(
            "which chain a connection takes when a listener filter times out: every chain of "
            "the listener is held to the same rules (rules.closure)"
        ),
        "transparent": _SOCKET,
        "freebind": _SOCKET,
        "socket_options": _SOCKET,
        "tcp_fast_open_queue_length": _SOCKET,
        "traffic_direction": _STATS,
        "udp_listener_config": _harmless(
            "HTTP/3 over UDP: the same filter chains and connection managers run"
        ),
        "api_listener": _refused(
            "a connection manager fed by the process's own API, not by filter chains: the "
            "closure of the listener cannot be read"
        ),
        "connection_balance_config": _SOCKET,
        "reuse_port": _SOCKET,
        "enable_reuse_port": _SOCKET,
        "access_log": _STATS,
        "tcp_backlog_size": _SOCKET,
        "max_connections_to_accept_per_socket_event": _SOCKET,
        "bind_to_port": _SOCKET,
        "internal_listener": _harmless(
            "reachable through Envoy's own internal clusters too: its chains are held to the "
            "same rules"
        ),
        "enable_mptcp": _SOCKET,
        "ignore_global_conn_limit": _SOCKET,
        "bypass_overload_manager": _SOCKET,
        "tcp_keepalive": _SOCKET,
    },
    "envoy.config.listener.v3.FilterChain": {
        "filter_chain_match": _WALKED,
        "filters": _read("rules.closure (its terminal filter), coverage (walked)"),
        "use_proxy_proto": _harmless(
            "which client address the connection manager judges; none is internal without "
            "internal_address_config (rules.replay)"
        ),
        "metadata": _harmless("metadata no filter of a policed chain reads from the chain"),
        "transport_socket": _TLS,
        "transport_socket_connect_timeout": _TIMEOUT,
        "name": _harmless("a name (for filter_chain_matcher, refused)"),
    },
    "envoy.config.listener.v3.FilterChainMatch": dict.fromkeys(
        (
            "destination_port",
            "prefix_ranges",
            "address_suffix",
            "suffix_len",
            "direct_source_prefix_ranges",
            "source_type",
            "source_prefix_ranges",
            "source_ports",
            "server_names",
            "transport_protocol",
            "application_protocols",
        ),
        _harmless(
            "which connections take the chain: every chain of a policed listener, the default "
            "one included, ends in a connection manager the check reads (rules.closure)"
        ),
    ),
    "envoy.config.listener.v3.Filter": {
        "name": _harmless("a name; Envoy picks the filter by its typed_config"),
        "typed_config": _read("rules.closure (an inline HttpConnectionManager), coverage"),
        "config_discovery": _read("rules.closure (a connection manager from ECDS is refused)"),
    },
    "envoy.config.listener.v3.ListenerFilter": {
        "name": _harmless("a name; Envoy picks the filter by its typed_config"),
        "typed_config": _read(
            "rules.closure (listener-filter-unknown): its type is one of closure.LISTENER_FILTERS"
        ),
        "config_discovery": _refused("a listener filter from ECDS, which this check cannot see"),
        "filter_disabled": _harmless(
            "when the listener filter is skipped: every chain is held to the same rules"
        ),
    },
    _HCM + "HttpConnectionManager": {
        "codec_type": _CODEC,
        "stat_prefix": _STATS,
        "rds": _read("rules.manager (routes-unseen)"),
        "route_config": _read("reader.virtual_hosts, coverage (walked)"),
        "scoped_routes": _read("rules.manager (routes-unseen)"),
        "http_filters": _read("reader.read_chain, rules.filter_types, coverage (walked)"),
        "add_user_agent": _harmless("adds Envoy's own user-agent and node headers"),
        "tracing": _harmless(
            "trace headers, and the request id's trace bit: the header step renews the id "
            "before this processor's filter (rules.header_step)"
        ),
        "common_http_protocol_options": _read(
            "rules.header_step (headers_with_underscores_action); its other fields are "
            "timeouts and limits"
        ),
        "http1_safe_max_connection_duration": _TIMEOUT,
        "http_protocol_options": _CODEC,
        "http2_protocol_options": _CODEC,
        "http3_protocol_options": _CODEC,
        "server_name": _RESPONSE,
        "server_header_transformation": _RESPONSE,
        "scheme_header_transformation": _harmless(
            "the :scheme the upstream is sent, which no route of this check matches on"
        ),
        "max_request_headers_kb": _TIMEOUT,
        "stream_idle_timeout": _TIMEOUT,
        "stream_flush_timeout": _TIMEOUT,
        "request_timeout": _TIMEOUT,
        "request_headers_timeout": _TIMEOUT,
        "drain_timeout": _TIMEOUT,
        "drain_timeout_jitter": _TIMEOUT,
        "delayed_close_timeout": _TIMEOUT,
        "access_log": _STATS,
        "access_log_flush_interval": _STATS,
        "flush_access_log_on_new_request": _STATS,
        "access_log_options": _STATS,
        "use_remote_address": _harmless(
            "which address the connection manager judges; none is internal without "
            "internal_address_config (rules.replay)"
        ),
        "xff_num_trusted_hops": _harmless(
            "which address the connection manager judges; none is internal without "
            "internal_address_config (rules.replay)"
        ),
        "original_ip_detection_extensions": _harmless(
            "which address the connection manager judges; none is internal without "
            "internal_address_config (rules.replay)"
        ),
        "early_header_mutation_extensions": _refused(
            "rewrites request headers (the path among them) before route selection and before "
            "every filter: neither the route simulation nor the header rules see it"
        ),
        "internal_address_config": _read("rules.replay (retry-header-trusted)"),
        "skip_xff_append": _harmless("x-forwarded-for, which no rule trusts"),
        "via": _harmless("adds a constant via header"),
        "generate_request_id": _harmless(
            "the header step renews the request id before this processor's filter"
        ),
        "preserve_external_request_id": _harmless(
            "the header step renews the request id before this processor's filter"
        ),
        "always_set_request_id_in_response": _RESPONSE,
        "forward_client_cert_details": _harmless(
            "x-forwarded-client-cert, which neither this processor nor vLLM reads"
        ),
        "set_current_client_cert_details": _harmless(
            "x-forwarded-client-cert, which neither this processor nor vLLM reads"
        ),
        "forward_client_cert_matcher": _harmless(
            "x-forwarded-client-cert, which neither this processor nor vLLM reads"
        ),
        "proxy_100_continue": _CODEC,
        "represent_ipv4_remote_address_as_ipv4_mapped_ipv6": _SOCKET,
        "upgrade_configs": _read("rules.manager (upgrade-filter-chain), coverage (walked)"),
        "normalize_path": _read("rules.manager (path-not-normalized)"),
        "merge_slashes": _harmless(
            "route matches and the upstream see one path either way: Envoy forwards the path "
            "it matched, slashes merged or not"
        ),
        "path_with_escaped_slashes_action": _read("rules.manager (escaped-slashes-kept)"),
        "request_id_extension": _harmless(
            "the header step renews the request id before this processor's filter"
        ),
        "local_reply_config": _RESPONSE,
        "strip_matching_host_port": _VHOSTS,
        "strip_any_host_port": _VHOSTS,
        "stream_error_on_invalid_http_message": _CODEC,
        "path_normalization_options": _refused(
            "lets the path the filters see differ from the one forwarded; the route "
            "simulation and the processor assume one"
        ),
        "strip_trailing_host_dot": _VHOSTS,
        "proxy_status_config": _RESPONSE,
        "typed_header_validation_config": _refused(
            "a header validator normalises paths its own way, which the route simulation "
            "does not follow"
        ),
        "append_x_forwarded_port": _harmless("x-forwarded-port, which no rule trusts"),
        "append_local_overload": _harmless("a constant overload header"),
        "add_proxy_protocol_connection_state": _SOCKET,
        "forward_proto_config": _harmless("x-forwarded-proto, which no rule trusts"),
    },
    _HCM + "HttpConnectionManager.UpgradeConfig": {
        "upgrade_type": _harmless(
            "which upgrades the connection manager takes; each runs this chain unless it has "
            "filters of its own (rules.manager)"
        ),
        "filters": _read("rules.manager (upgrade-filter-chain)"),
        "enabled": _harmless("whether the upgrade is taken; it runs this chain either way"),
    },
    _HCM + "HttpFilter": {
        "name": _read("reader.read_chain, effective (per-route configurations by name)"),
        "typed_config": _read("rules.filter_types, coverage (walked where its type is)"),
        "config_discovery": _read("rules.filter_types (a filter from ECDS has no known type)"),
        "is_optional": _refused(
            "Envoy skips an optional filter its build lacks: this processor's filter, the "
            "hold or the header step would silently not run"
        ),
        "disabled": _read("reader.read_chain, effective.runs"),
    },
    _R + "RouteConfiguration": {
        "name": _harmless("a name"),
        "virtual_hosts": _read("reader.virtual_hosts, coverage (walked)"),
        "vhds": _read("rules.manager (routes-unseen)"),
        "internal_only_headers": _harmless("removes headers from external requests"),
        "response_headers_to_add": _RESPONSE,
        "response_headers_to_remove": _RESPONSE,
        "request_headers_to_add": _ADDS,
        "request_headers_to_remove": _REMOVES,
        "most_specific_header_mutations_wins": _harmless(
            "which level's header additions win; every level's additions are judged"
        ),
        "validate_clusters": _harmless("refuses a configuration naming unknown clusters"),
        "max_direct_response_body_size_bytes": _RESPONSE,
        "cluster_specifier_plugins": _CLOSURE,
        "request_mirror_policies": _REPLAY,
        "ignore_port_in_host_matching": _VHOSTS,
        "vhost_header": _VHOSTS,
        "ignore_path_parameters_in_path_matching": _refused(
            "route matches would ignore path parameters the upstream reads; the route "
            "simulation matches the whole path"
        ),
        "typed_per_filter_config": _PER_FILTER,
        "metadata": _harmless("metadata no rule reads from the route configuration"),
    },
    _R + "VirtualHost": {
        "name": _harmless("a name"),
        "domains": _VHOSTS,
        "routes": _read("reader.virtual_hosts, route_probes, coverage (walked)"),
        "matcher": _read("rules.manager (matcher-tree)"),
        "require_tls": _harmless("redirects plain requests: forwards nothing"),
        "virtual_clusters": _STATS,
        "rate_limits": _harmless("rate limit descriptors: a limit refuses requests"),
        "request_headers_to_add": _ADDS,
        "request_headers_to_remove": _REMOVES,
        "response_headers_to_add": _RESPONSE,
        "response_headers_to_remove": _RESPONSE,
        "cors": _RESPONSE,
        "typed_per_filter_config": _PER_FILTER,
        "include_request_attempt_count": _harmless("adds the attempt count header"),
        "include_attempt_count_in_response": _RESPONSE,
        "retry_policy": _REPLAY,
        "retry_policy_typed_config": _REPLAY,
        "hedge_policy": _REPLAY,
        "include_is_timeout_retry_header": _harmless("adds a header naming a timeout retry"),
        "per_request_buffer_limit_bytes": _BUFFER_LIMIT,
        "request_body_buffer_limit": _BUFFER_LIMIT,
        "request_mirror_policies": _REPLAY,
        "metadata": _harmless("metadata no rule reads from the virtual host"),
    },
    _R + "Route": {
        "name": _harmless("a name (findings name the route by it)"),
        "match": _read("route_probes, coverage (walked)"),
        "route": _read("rules.route, rules.replay, coverage (walked)"),
        "redirect": _read("route_probes (answers by itself)"),
        "direct_response": _read("route_probes (answers by itself)"),
        "filter_action": _read("route_probes (an action it does not simulate is unreadable)"),
        "non_forwarding_action": _read(
            "route_probes (an action it does not simulate is unreadable)"
        ),
        "metadata": _read("rules.route (the policy metadata)"),
        "decorator": _STATS,
        "typed_per_filter_config": _PER_FILTER,
        "request_headers_to_add": _ADDS,
        "request_headers_to_remove": _REMOVES,
        "response_headers_to_add": _RESPONSE,
        "response_headers_to_remove": _RESPONSE,
        "tracing": _STATS,
        "per_request_buffer_limit_bytes": _BUFFER_LIMIT,
        "stat_prefix": _STATS,
        "request_body_buffer_limit": _read("rules.hold"),
    },
    _R + "RouteMatch": dict.fromkeys(
        (
            "prefix",
            "path",
            "safe_regex",
            "connect_matcher",
            "path_separated_prefix",
            "path_match_policy",
            "case_sensitive",
            "runtime_fraction",
            "headers",
            "query_parameters",
            "grpc",
            "tls_context",
            "dynamic_metadata",
            "filter_state",
            "cookies",
        ),
        _PROBES,
    ),
    _R + "RouteAction": {
        "cluster": _read("rules.replay, coverage (its cluster walked)"),
        "cluster_header": _CLOSURE,
        "weighted_clusters": _read("rules.replay, rules.route, coverage (walked)"),
        "cluster_specifier_plugin": _CLOSURE,
        "inline_cluster_specifier_plugin": _CLOSURE,
        "cluster_not_found_response_code": _RESPONSE,
        "metadata_match": _ENDPOINT,
        "prefix_rewrite": _read("rules.route (rewrite), route_probes"),
        "regex_rewrite": _read("route_probes (rewrite-unreadable)"),
        "path_rewrite_policy": _read("route_probes (rewrite-unreadable)"),
        "path_rewrite": _refused(
            "rewrites the upstream path by a format string: neither the processor (which "
            "binds proofs to the upstream path) nor the route simulation follows it"
        ),
        "host_rewrite_literal": _harmless("the Host the upstream is sent, which vLLM ignores"),
        "auto_host_rewrite": _harmless("the Host the upstream is sent, which vLLM ignores"),
        "host_rewrite_header": _harmless("the Host the upstream is sent, which vLLM ignores"),
        "host_rewrite_path_regex": _harmless("the Host the upstream is sent, which vLLM ignores"),
        "host_rewrite": _harmless("the Host the upstream is sent, which vLLM ignores"),
        "append_x_forwarded_host": _harmless("x-forwarded-host, which no rule trusts"),
        "timeout": _TIMEOUT,
        "idle_timeout": _TIMEOUT,
        "flush_timeout": _TIMEOUT,
        "early_data_policy": _refused(
            "can send a decided body upstream in TLS early data, which a network attacker "
            "can replay to the upstream"
        ),
        "retry_policy": _REPLAY,
        "retry_policy_typed_config": _REPLAY,
        "request_mirror_policies": _REPLAY,
        "priority": _ENDPOINT,
        "rate_limits": _harmless("rate limit descriptors: a limit refuses requests"),
        "include_vh_rate_limits": _harmless("rate limit descriptors: a limit refuses requests"),
        "hash_policy": _ENDPOINT,
        "cors": _RESPONSE,
        "max_grpc_timeout": _TIMEOUT,
        "grpc_timeout_offset": _TIMEOUT,
        "upgrade_configs": _harmless(
            "enables an upgrade on the route; it runs this filter chain (one of its own is "
            "the connection manager's, rules.manager) and a CONNECT request reaches only a "
            "connect_matcher route, which route_probes refuses"
        ),
        "internal_redirect_policy": _harmless(
            "a redirected request runs the filter chain again and is decided again (rules.replay)"
        ),
        "internal_redirect_action": _harmless(
            "a redirected request runs the filter chain again and is decided again (rules.replay)"
        ),
        "max_internal_redirects": _harmless(
            "a redirected request runs the filter chain again and is decided again (rules.replay)"
        ),
        "hedge_policy": _REPLAY,
        "max_stream_duration": _TIMEOUT,
    },
    _R + "WeightedCluster": {
        "clusters": _read("rules.replay, rules.route, coverage (walked)"),
        "total_weight": _harmless("weights among the listed clusters, each of them checked"),
        "runtime_key_prefix": _harmless("weights among the listed clusters, each of them checked"),
        "header_name": _harmless("picks among the listed clusters, each of them checked"),
        "use_hash_policy": _harmless("picks among the listed clusters, each of them checked"),
    },
    _R + "WeightedCluster.ClusterWeight": {
        "name": _read("rules.replay, coverage (its cluster walked)"),
        "cluster_header": _CLOSURE,
        "weight": _harmless("its share of the route's requests"),
        "metadata_match": _ENDPOINT,
        "request_headers_to_add": _ADDS,
        "request_headers_to_remove": _REMOVES,
        "response_headers_to_add": _RESPONSE,
        "response_headers_to_remove": _RESPONSE,
        "typed_per_filter_config": _PER_FILTER,
        "host_rewrite_literal": _harmless("the Host the upstream is sent, which vLLM ignores"),
    },
    _R + "FilterConfig": {
        "config": _read("effective, coverage (walked where its type is)"),
        "is_optional": _harmless(
            "whether Envoy refuses a route-level configuration of a filter it lacks; either "
            "way it configures nothing that runs"
        ),
        "disabled": _read("effective (whether the filter runs on the route)"),
    },
    "envoy.extensions.filters.http.router.v3.Router": {
        "dynamic_stats": _STATS,
        "start_child_span": _STATS,
        "upstream_log": _STATS,
        "upstream_log_options": _STATS,
        "suppress_envoy_headers": _harmless(
            "drops the x-envoy-* headers the router itself would send upstream"
        ),
        "strict_check_headers": _harmless(
            "refuses malformed retry and timeout headers; the header step removes a "
            "client's (rules.writers)"
        ),
        "respect_expected_rq_timeout": _TIMEOUT,
        "suppress_grpc_request_failure_code_stats": _STATS,
        "upstream_http_filters": _read("rules.after_decision (filter-after-decision)"),
        "reject_connect_request_early_data": _harmless("refuses CONNECT requests in early data"),
    },
    "envoy.extensions.filters.http.buffer.v3.Buffer": {
        "max_request_bytes": _read("rules.hold"),
    },
    "envoy.extensions.filters.http.buffer.v3.BufferPerRoute": {
        "disabled": _read("effective.hold_settings"),
        "buffer": _read("effective.hold_settings, rules.hold"),
    },
    _X + "ExternalProcessor": {
        "grpc_service": _read("rules.filters (processor-cluster-missing), coverage (walked)"),
        "http_service": _refused(
            "the processor speaks gRPC: an HTTP service is another processor, reached by a "
            "cluster this check does not check"
        ),
        "failure_mode_allow": _read("rules.filters (failure-mode-allow)"),
        "processing_mode": _read("rules.filters, coverage (walked)"),
        "request_attributes": _read("rules.filters (attributes-missing), reader.is_ours"),
        "response_attributes": _harmless("what the processor is told of the response"),
        "message_timeout": _harmless("a timeout: the filter fails closed (rules.filters)"),
        "stat_prefix": _STATS,
        "mutation_rules": _refused(
            "limits which of the processor's header changes Envoy applies; one dropped "
            "silently forwards the request without it"
        ),
        "max_message_timeout": _harmless("a timeout: the filter fails closed (rules.filters)"),
        "forward_rules": _refused(
            "filters the request headers the processor is sent: it would judge requests by "
            "headers it does not see"
        ),
        "filter_metadata": _STATS,
        "allow_mode_override": _harmless(
            "lets this processor's own responses change the mode: the processor decides"
        ),
        "disable_immediate_response": _read("rules.filters (refusals-dropped)"),
        "metadata_options": _harmless(
            "dynamic metadata exchanged with the processor; route policy comes as attributes"
        ),
        "observability_mode": _read("rules.filters (observability-mode)"),
        "disable_clear_route_cache": _harmless(
            "whether the route is chosen again after the processor's header changes, which "
            "touch no header a route matches"
        ),
        "route_cache_action": _harmless(
            "whether the route is chosen again after the processor's header changes, which "
            "touch no header a route matches"
        ),
        "deferred_close_timeout": _TIMEOUT,
        "send_body_without_waiting_for_header_response": _harmless(
            "when the body is sent to the processor; the request still waits for its decision"
        ),
        "allowed_override_modes": _harmless(
            "the modes this processor's own responses may choose: the processor decides"
        ),
        "processing_request_modifier": _EXTENSION,
        "on_processing_response": _EXTENSION,
        "status_on_error": _harmless("the status of a refused request: the filter fails closed"),
        "allow_content_length_header": _read("rules.filters (content-length-allowed)"),
    },
    _X + "ExtProcPerRoute": {
        "disabled": _read("effective (ext-proc-not-running)"),
        "overrides": _read("rules.filters (override), coverage (walked)"),
    },
    _X + "ExtProcOverrides": {
        "processing_mode": _read("rules.filters (override), effective.ext_proc_mode"),
        "async_mode": _refused(
            "the filter stops waiting for the processor: requests go on undecided"
        ),
        "request_attributes": _refused(
            "replaces the attributes the processor is sent on the route, which the rules "
            "read from the filter alone (attributes-missing)"
        ),
        "response_attributes": _harmless("what the processor is told of the response"),
        "grpc_service": _read("rules.closure (the processor's own cluster)"),
        "metadata_options": _harmless(
            "dynamic metadata exchanged with the processor; route policy comes as attributes"
        ),
        "grpc_initial_metadata": _harmless("gRPC metadata sent to the processor"),
        "failure_mode_allow": _read("rules.filters (override-fails-open)"),
        "processing_request_modifier": _EXTENSION,
    },
    _X + "ProcessingMode": {
        "request_header_mode": _MODE,
        "response_header_mode": _MODE,
        "request_body_mode": _MODE,
        "response_body_mode": _MODE,
        "request_trailer_mode": _MODE,
        "response_trailer_mode": _harmless("response trailers: the processor signs bodies"),
    },
    "envoy.config.core.v3.GrpcService": {
        "envoy_grpc": _read("rules.filters (processor_cluster), coverage (walked)"),
        "google_grpc": _read("rules.filters (processor_cluster: a target, no cluster)"),
        "timeout": _harmless("a timeout: the filter fails closed (rules.filters)"),
        "initial_metadata": _harmless("gRPC metadata sent to the processor"),
        "retry_policy": _harmless(
            "retries the call to the processor, which decides again (a spent proof is refused)"
        ),
    },
    "envoy.config.core.v3.GrpcService.EnvoyGrpc": {
        "cluster_name": _read("rules.filters (processor-cluster-missing)"),
        "authority": _harmless("the :authority of the calls to the processor"),
        "retry_policy": _harmless(
            "retries the call to the processor, which decides again (a spent proof is refused)"
        ),
        "max_receive_message_length": _harmless("a limit: a larger message fails the call"),
        "skip_envoy_headers": _harmless("x-envoy-* headers on the calls to the processor"),
    },
    "envoy.config.cluster.v3.Cluster": {
        "transport_socket_matches": _TLS,
        "transport_socket_matcher": _TLS,
        "name": _read("reader.clusters, reader.http_options"),
        "alt_stat_name": _STATS,
        "type": _read("reader.clusters, rules.closure (an ORIGINAL_DST cluster's host)"),
        "cluster_type": _refused(
            "a custom cluster (an aggregate one sends to other clusters, whose settings "
            "this check does not read)"
        ),
        "eds_cluster_config": _ENDPOINT,
        "connect_timeout": _TIMEOUT,
        "per_connection_buffer_limit_bytes": _TIMEOUT,
        "per_connection_buffer_high_watermark_timeout": _TIMEOUT,
        "lb_policy": _ENDPOINT,
        "load_assignment": _read(
            "rules.closure (policed-cluster-bypassed: the addresses a cluster connects to)"
        ),
        "health_checks": _ENDPOINT,
        "max_requests_per_connection": _SOCKET,
        "circuit_breakers": _TIMEOUT,
        "upstream_http_protocol_options": _CODEC,
        "common_http_protocol_options": _CODEC,
        "http_protocol_options": _CODEC,
        "http2_protocol_options": _CODEC,
        "typed_extension_protocol_options": _read("reader.http_options, coverage (walked)"),
        "dns_refresh_rate": _ENDPOINT,
        "dns_jitter": _ENDPOINT,
        "dns_failure_refresh_rate": _ENDPOINT,
        "respect_dns_ttl": _ENDPOINT,
        "dns_lookup_family": _ENDPOINT,
        "dns_resolvers": _ENDPOINT,
        "use_tcp_for_dns_lookups": _ENDPOINT,
        "dns_resolution_config": _ENDPOINT,
        "typed_dns_resolver_config": _ENDPOINT,
        "wait_for_warm_on_init": _ENDPOINT,
        "outlier_detection": _ENDPOINT,
        "cleanup_interval": _ENDPOINT,
        "upstream_bind_config": _SOCKET,
        "lb_subset_config": _ENDPOINT,
        "ring_hash_lb_config": _ENDPOINT,
        "maglev_lb_config": _ENDPOINT,
        "original_dst_lb_config": _read(
            "rules.closure (where a decided route's ORIGINAL_DST cluster takes its host)"
        ),
        "least_request_lb_config": _ENDPOINT,
        "round_robin_lb_config": _ENDPOINT,
        "common_lb_config": _ENDPOINT,
        "transport_socket": _TLS,
        "metadata": _harmless("metadata no rule reads from the cluster"),
        "protocol_selection": _CODEC,
        "upstream_connection_options": _SOCKET,
        "close_connections_on_host_health_failure": _ENDPOINT,
        "ignore_health_on_host_removal": _ENDPOINT,
        "filters": _refused(
            "network filters on the upstream connection can change the bytes of a decided request"
        ),
        "load_balancing_policy": _ENDPOINT,
        "lrs_server": _STATS,
        "lrs_report_endpoint_metrics": _STATS,
        "track_timeout_budgets": _STATS,
        "upstream_config": _refused(
            "a generic upstream sends the request another way than the router's HTTP "
            "upstream these rules describe"
        ),
        "track_cluster_stats": _STATS,
        "preconnect_policy": _SOCKET,
        "connection_pool_per_downstream_connection": _SOCKET,
    },
    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "common_http_protocol_options": _CODEC,
        "upstream_http_protocol_options": _CODEC,
        "explicit_http_config": _CODEC,
        "use_downstream_protocol_config": _CODEC,
        "auto_config": _CODEC,
        "http_filters": _read("rules.after_decision (filter-after-decision)"),
        "header_validation_config": _CODEC,
        "outlier_detection": _ENDPOINT,
        "request_mirror_policies": _REPLAY,
        "hash_policy": _ENDPOINT,
        "retry_policy": _REPLAY,
    },
}

# Each (message, field) once.
CLASSES: Final[Mapping[tuple[str, str], Class]] = {
    (message, field): found
    for message, fields in BY_MESSAGE.items()
    for field, found in fields.items()
}
