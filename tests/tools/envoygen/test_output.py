"""envoygen.output: the config is fail closed, each option changes what it should and
nothing else, vLLM's token endpoints are answered 404 before every route, and every
shipped config has Envoy's edge limits."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import yaml

from ext_proc.core import route_policy, vllm_request
from ext_proc.core.route_policy import Accept, Action, Topology
from ext_proc.edge.attributes import READ_HEADERS, attribute_keys
from ext_proc.edge.server import SERVICE_NAME
from ext_proc.tools import carrier_headers, envoygen, refused_paths, token_endpoints
from ext_proc.tools.check_envoy import check
from ext_proc.tools.envoy_names import PROCESSOR_FAILED, RETRY_SAFE, RETRY_UNSAFE
from ext_proc.tools.envoygen import route_headers
from ext_proc.tools.router_headers import ROUTER_HEADERS
from tests.filters import assert_fails_closed
from tests.tools.envoygen.configs import (
    ARCHITECTURES,
    INPUTS,
    LISTENER_TLS,
    REPO,
    TLS,
    clusters_of,
    endpoint_of,
    example,
    ext_proc_of,
    filters_of,
    forwarding,
    generate,
    hcm_of,
    routes_of,
    routes_with,
)

# --- the filter, routes and clusters --------------------------------------------------


def test_fail_closed_filter():
    config = generate(example())
    filt = ext_proc_of(config)
    assert_fails_closed(filt)
    assert filt["grpc_service"]["envoy_grpc"]["cluster_name"] == envoygen.PROCESSOR_CLUSTER


def test_namespace_follows_input():
    data = example() | {"namespace": "acme.policy"}
    config = generate(data)
    keys = [*attribute_keys("acme.policy").all(), *READ_HEADERS.values()]
    assert ext_proc_of(config)["request_attributes"] == keys
    assert len(forwarding(config)) == 4
    for entry in forwarding(config).values():
        assert list(entry["metadata"]["filter_metadata"]) == ["acme.policy"]


def test_routes_carry_policy_and_body_limit():
    data = example()
    data["routes"][2]["body_limit_bytes"] = 1024
    config = generate(data)
    by_name = forwarding(config)
    assert list(by_name) == ["prefill", "disaggregated", "aggregated", "default"]
    pd = by_name["disaggregated"]
    assert pd["match"] == {"prefix": "/pd/v1/"}
    assert pd["route"]["prefix_rewrite"] == "/v1/"
    assert pd["request_body_buffer_limit"] == 16 * 1024 * 1024
    assert by_name["aggregated"]["request_body_buffer_limit"] == 1024
    assert "prefix_rewrite" not in by_name["aggregated"]["route"]
    # What the processor reads back, field by field, the way CEL renders values; a
    # rewritten route's prefix and rewrite come with it.
    for entry, expected in (
        (
            pd,
            route_policy.RoutePolicy(
                Topology.DISAGGREGATED,
                Action.HONOR,
                262144,
                131072,
                match_prefix="/pd/v1/",
                prefix_rewrite="/v1/",
            ),
        ),
        (
            by_name["prefill"],
            route_policy.RoutePolicy(
                Topology.DISAGGREGATED,
                Action.MINT,
                262144,
                131072,
                match_prefix="/pd/prefill/v1/",
                prefix_rewrite="/v1/",
                connector=tuple(vllm_request.CONNECTOR_REQUESTS["nixl"].items()),
            ),
        ),
        (by_name["aggregated"], route_policy.RoutePolicy(Topology.AGGREGATED, Action.STRIP)),
    ):
        fields = entry["metadata"]["filter_metadata"]["ext_proc.token_policy"]
        assert isinstance(fields.get("max_ids", 1), int)  # written 131072, not 131072.0
        values = {k: v if isinstance(v, bool) else str(v) for k, v in fields.items()}
        assert route_policy.parse(values, float(len(fields))) == expected


def test_clusters():
    config = generate(example())
    clusters = clusters_of(config)
    assert list(clusters) == ["ext_proc", "aggregated", "disaggregated", "prefill"]
    processor = clusters["ext_proc"]
    assert processor["type"] == "STATIC"
    options = processor["typed_extension_protocol_options"][envoygen.HTTP_OPTIONS]
    h2 = options["explicit_http_config"]["http2_protocol_options"]
    assert h2 == {
        "initial_stream_window_size": 32 * 1024 * 1024,
        "initial_connection_window_size": 64 * 1024 * 1024,
        "max_concurrent_streams": 8,
        "max_outbound_frames": 18704,
    }
    (check,) = processor["health_checks"]
    assert check["grpc_health_check"]["service_name"] == envoygen.PROCESSOR_SERVICE
    assert clusters["aggregated"]["type"] == "STRICT_DNS"


# Envoy's HTTP/2 DATA frames carry 16 KiB each (nghttp2's payload size, whatever the
# peer allows); Envoy ends a connection whose frames not yet written pass
# max_outbound_frames (10,000 unless set) as a flood, resetting every stream on it.
ENVOY_DATA_FRAME = 16 * 1024
ENVOY_DEFAULT_OUTBOUND_FRAMES = 10_000


@pytest.mark.parametrize("limit", [16 * 1024**2, 100 * 1024**2, 512 * 1024**2])
def test_a_processor_connection_queues_its_bodies_without_tripping_the_flood_limit(limit):
    """A processor slow to read yet granting its windows lets Envoy queue every body on a
    connection unsent: the streams a connection carries, each a largest body with its
    headers and attributes (up to 1 MiB) in 16 KiB frames, fit under max_outbound_frames
    with Envoy's own default left for everything else."""
    processor = clusters_of(generate(example() | {"body_limit_bytes": limit}))["ext_proc"]
    options = processor["typed_extension_protocol_options"][envoygen.HTTP_OPTIONS]
    h2 = options["explicit_http_config"]["http2_protocol_options"]
    frames_per_body = -(-(limit + 1024**2) // ENVOY_DATA_FRAME)
    assert h2["max_concurrent_streams"] >= 1
    assert (
        h2["max_concurrent_streams"] * frames_per_body + ENVOY_DEFAULT_OUTBOUND_FRAMES
        <= h2["max_outbound_frames"]
    )


def test_processor_service_name_matches_the_server():
    assert envoygen.PROCESSOR_SERVICE == SERVICE_NAME


def test_dns_processor_gets_strict_dns():
    data = example() | {"processor": "ext-proc-token-policy-headless.llm-d.svc.cluster.local:50051"}
    processor = clusters_of(generate(data))["ext_proc"]
    assert processor["type"] == "STRICT_DNS"
    endpoint = processor["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {
        "address": "ext-proc-token-policy-headless.llm-d.svc.cluster.local",
        "port_value": 50051,
    }


def test_local_replies_keep_processor_denials():
    mappers = hcm_of(generate(example()))["local_reply_config"]["mappers"]
    assert len(mappers) == 7
    for mapper in mappers:
        text = json.dumps(mapper["filter"])
        # Envoy's details for the filter's own failures never start as a denial's do.
        assert (
            "!response.code_details.startsWith('token_policy_')" in text
            or f"response.code_details.startsWith('{PROCESSOR_FAILED}')" in text
        )
        assert mapper["body_format_override"]["content_type"] == "application/json"
        assert set(mapper["body_format_override"]["json_format"]["error"]) == {
            "message",
            "type",
            "param",
            "code",
        }


def test_a_processor_failure_is_a_503_with_retry_after_before_the_upstream_only():
    config = generate(example())
    (processor,) = [f for f in filters_of(config) if f["name"] == envoygen.EXT_PROC_FILTER]
    assert processor["typed_config"]["status_on_error"] == {"code": "ServiceUnavailable"}
    mappers = hcm_of(config)["local_reply_config"]["mappers"]
    by_filter = {
        m["filter"]["extension_filter"]["typed_config"]["expression"]: m
        for m in mappers
        if "extension_filter" in m["filter"]
    }
    safe, unsafe = by_filter[RETRY_SAFE], by_filter[RETRY_UNSAFE]
    assert safe["status_code"] == 503
    assert safe["headers_to_add"] == [
        {
            "header": {"key": "retry-after", "value": "1"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }
    ]
    assert unsafe["status_code"] == 500
    assert "headers_to_add" not in unsafe
    # Before any mapper a 503 or 504 of Envoy's own would otherwise take.
    assert mappers.index(safe) < mappers.index(unsafe) < len(mappers) - 5


GENERIC_MESSAGES = {
    "PayloadTooLargeError": "request body exceeds this route's buffer limit",
    "GatewayTimeoutError": "the gateway timed out; the upstream may have processed it",
    "RequestTimeoutError": "the request was not received in time",
    "NotFoundError": "not found",
    "GatewayError": "gateway error",
    "ServiceUnavailableError": (
        "the policy processor is unavailable; the request was not processed, retry it"
    ),
}
# Where the configuration has a tenant rate limit, its 429.
RATE_LIMITED_MESSAGE = {"RateLimitError": "the tenant's rate limit is exceeded"}


def strings_under(node: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """Every string in a loaded YAML document, with the keys that lead to it."""
    if isinstance(node, dict):
        return [hit for k, v in node.items() for hit in strings_under(v, (*path, str(k)))]
    if isinstance(node, list):
        return [hit for v in node for hit in strings_under(v, path)]
    return [(path, node)] if isinstance(node, str) else []


@pytest.mark.parametrize("path", sorted((REPO / "envoy").glob("*.yaml")), ids=lambda p: p.name)
def test_local_replies_tell_the_client_fixed_text_only(path):
    # %RESPONSE_CODE_DETAILS% can hold exception class names and the ext_proc state
    # machine's messages: the access log keeps it, no reply body carries it.
    manager = hcm_of(yaml.safe_load(path.read_text()))
    mappers = manager["local_reply_config"]["mappers"]
    # A route-choosing header stated twice (route_headers): its own fixed text.
    selecting = [
        route_headers.message(policy.removesuffix("-stated-twice"))
        for f in manager["http_filters"]
        if f["name"] == route_headers.FILTER
        for policy in f["typed_config"]["rules"]["policies"]
    ]
    generic = GENERIC_MESSAGES | (RATE_LIMITED_MESSAGE if "ratelimit" in path.name else {})
    messages = generic | {"BadRequestError": selecting}
    for mapper in mappers:
        error = mapper["body_format_override"]["json_format"]["error"]
        if error["type"] == "BadRequestError":
            assert error["message"] == selecting.pop(0)
        else:
            assert error["message"] == messages[error["type"]]
        assert error["code"] == "%RESPONSE_CODE%"
        assert "%" not in json.dumps({k: v for k, v in error.items() if k != "code"})
    assert not selecting
    types = {m["body_format_override"]["json_format"]["error"]["type"] for m in mappers}
    assert types - {"BadRequestError"} == set(generic)
    (log,) = manager["access_log"]
    assert "%RESPONSE_CODE_DETAILS%" in json.dumps(log)


@pytest.mark.parametrize(
    "path",
    [
        *sorted((REPO / "envoy").glob("*.yaml")),
        # The chart's templates are no YAML until rendered; they are made from these files.
        *sorted(p for p in (REPO / "deploy").rglob("*.yaml") if "templates" not in p.parts),
    ],
    ids=lambda p: p.relative_to(REPO).as_posix(),
)
def test_response_code_details_appear_in_access_logs_only(path):
    for document in yaml.safe_load_all(path.read_text()):
        for keys, text in strings_under(document):
            if "%RESPONSE_CODE_DETAILS%" in text:
                assert any(k in ("access_log", "accessLog") for k in keys), (keys, text)


# --- options: each changes what it should, and nothing else ---------------------------


def modes_of(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The filter's processing mode, then the mint route's override of it."""
    override = routes_of(config)["prefill"]["typed_per_filter_config"][envoygen.EXT_PROC_FILTER]
    return [ext_proc_of(config)["processing_mode"], override["overrides"]["processing_mode"]]


def test_streamed_mode():
    two = example() | {"one_message": False}
    base, config = generate(two), generate(two | {"body_mode": "streamed"})
    for mode in modes_of(config):
        assert mode["request_body_mode"] == "FULL_DUPLEX_STREAMED"
        assert mode["request_trailer_mode"] == "SEND"  # required by Envoy in this mode
        mode["request_body_mode"] = "BUFFERED"
    assert ext_proc_of(config)["failure_mode_allow"] is False
    assert config == base


def test_one_message_skips_the_headers_and_requests_them_as_attributes():
    base, config = generate(example() | {"one_message": False}), generate(example())
    filt = ext_proc_of(config)
    for mode in modes_of(config):
        assert mode["request_header_mode"] == "SKIP"
        assert mode["request_body_mode"] == "BUFFERED"
        mode["request_header_mode"] = "SEND"
    assert filt["request_attributes"] == [*attribute_keys().all(), *READ_HEADERS.values()]
    assert check(config).errors == []
    filt["request_attributes"] = list(attribute_keys().all())
    without_hold(config)
    assert config == base


def without_hold(config: dict[str, Any]) -> None:
    """Remove the buffer filter and its per-route settings."""
    hcm_of(config)["http_filters"] = [
        f for f in filters_of(config) if f["name"] != envoygen.BUFFER_FILTER
    ]
    for entry in hcm_of(config)["route_config"]["virtual_hosts"][0]["routes"]:
        per_filter = entry.get("typed_per_filter_config", {})
        per_filter.pop(envoygen.BUFFER_FILTER, None)
        if not per_filter:
            entry.pop("typed_per_filter_config", None)


BUFFER_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute"


def test_one_message_holds_the_request_until_the_decision():
    data = example()
    data["routes"][1]["body_limit_bytes"] = 4 * 1024 * 1024
    config = generate(data)
    names = [f["name"] for f in filters_of(config)]
    # Right after ext_proc: the router gets the headers only once the body is let through.
    assert names == [
        carrier_headers.FILTER,
        envoygen.EXT_PROC_FILTER,
        envoygen.BUFFER_FILTER,
        envoygen.ROUTER_FILTER,
    ]
    assert filters_of(config)[2]["typed_config"]["max_request_bytes"] == 16 * 1024 * 1024
    for name, entry in routes_of(config).items():
        hold = entry["typed_per_filter_config"][envoygen.BUFFER_FILTER]
        assert hold["@type"] == BUFFER_PER_ROUTE
        if "direct_response" in entry:
            assert hold == {"@type": BUFFER_PER_ROUTE, "disabled": True}, name
        else:
            # The filter would set the stream's limit to its own: each route restates its.
            limit = entry["request_body_buffer_limit"]
            assert hold["buffer"] == {"max_request_bytes": limit}, name
    limits = {e["request_body_buffer_limit"] for e in routes_of(config).values() if "route" in e}
    assert limits == {16 * 1024 * 1024, 4 * 1024 * 1024}
    assert check(config).errors == []
    # Without it, check-envoy refuses the config: the upstream would open before the decision.
    without_hold(config)
    errors = check(config).errors
    assert errors
    assert all("skips the request headers (one message)" in e for e in errors)


@pytest.mark.parametrize(
    "arrangement", [{"one_message": False}, {"one_message": False, "body_mode": "streamed"}]
)
def test_header_messages_hold_the_request_at_ext_proc(arrangement):
    # The headers answer holds the request: no buffer filter is needed.
    config = generate(example() | arrangement)
    assert envoygen.BUFFER_FILTER not in [f["name"] for f in filters_of(config)]
    assert check(config).errors == []


def test_decompressor_runs_before_ext_proc():
    base, config = generate(example()), generate(example() | {"decompress_gzip": True})
    names = [f["name"] for f in filters_of(config)]
    assert names == [
        carrier_headers.FILTER,
        envoygen.DECOMPRESSOR_FILTER,
        envoygen.EXT_PROC_FILTER,
        envoygen.BUFFER_FILTER,
        envoygen.ROUTER_FILTER,
    ]
    typed = filters_of(config)[1]["typed_config"]
    assert typed["decompressor_library"]["name"] == "gzip"
    # Deflate's largest expansion: the ratio check never truncates a valid body, the
    # route's buffer limit answers 413 (tests/e2e/test_decompress_limits.py).
    assert typed["decompressor_library"]["typed_config"]["max_inflate_ratio"] == 1032
    assert typed["request_direction_config"]["common_config"]["enabled"]["default_value"] is True
    assert typed["response_direction_config"]["common_config"]["enabled"]["default_value"] is False
    del filters_of(config)[1]
    assert config == base


def test_unix_socket_processor():
    data = example() | {"processor": "unix:/run/ext-proc/ext_proc.sock"}
    base, config = generate(example()), generate(data)
    processor = clusters_of(config)["ext_proc"]
    assert processor["type"] == "STATIC"
    assert endpoint_of(processor)["address"] == {"pipe": {"path": "/run/ext-proc/ext_proc.sock"}}
    processor["load_assignment"] = clusters_of(base)["ext_proc"]["load_assignment"]
    assert config == base


CLIENT_CERT = {
    "cert_file": "/etc/ext-proc/tls/envoy.crt",
    "key_file": "/etc/ext-proc/tls/envoy.key",
}


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_tls_to_the_processor(mutual):
    settings = TLS | (CLIENT_CERT if mutual else {})
    base, config = generate(example()), generate(example() | {"processor_tls": settings})
    socket = clusters_of(config)["ext_proc"].pop("transport_socket")
    assert socket["name"] == envoygen.TLS_SOCKET
    context = socket["typed_config"]
    assert context["sni"] == "ext-proc.local"
    common = context["common_tls_context"]
    assert common["alpn_protocols"] == ["h2"]
    validation = common["validation_context"]
    assert validation["trusted_ca"] == {"filename": "/etc/ext-proc/tls/ca.crt"}
    assert validation["match_typed_subject_alt_names"] == [
        {"san_type": "DNS", "matcher": {"exact": "ext-proc.local"}}
    ]
    if mutual:
        assert common["tls_certificates"] == [
            {
                "certificate_chain": {"filename": "/etc/ext-proc/tls/envoy.crt"},
                "private_key": {"filename": "/etc/ext-proc/tls/envoy.key"},
            }
        ]
    else:
        assert "tls_certificates" not in common
    assert config == base


def test_description_becomes_the_header_comment():
    spec = envoygen.load_input(example() | {"description": "What it is.\n\nWhat it gives up.\n"})
    text = envoygen.render(spec, source="in.yaml")
    assert text.startswith(
        "# Generated by `python -m ext_proc envoy-config` from in.yaml;\n"
        "# edit the input, not this file.\n#\n# What it is.\n#\n# What it gives up.\n#\n"
    )
    plain = envoygen.render(envoygen.load_input(example()))
    assert "What it is." not in plain
    assert yaml.safe_load(text) == yaml.safe_load(plain)


# --- the prefill (mint) route processes its response ----------------------------------


MINT_RESPONSE = {
    "response_header_mode": "SEND",
    "response_body_mode": "BUFFERED",
    "response_trailer_mode": "SKIP",
}


@pytest.mark.parametrize(
    "options",
    [{}, {"one_message": False}, {"one_message": False, "body_mode": "streamed"}],
    ids=["one-message", "two-message", "streamed"],
)
def test_mint_route_processes_the_response_with_the_filters_request_modes(options):
    config = generate(example() | options)
    filter_mode = ext_proc_of(config)["processing_mode"]
    assert filter_mode["response_header_mode"] == "SKIP"
    assert "response_body_mode" not in filter_mode  # NONE: proto3 JSON leaves it out
    per_route = routes_of(config)["prefill"]["typed_per_filter_config"]
    assert set(per_route) - {envoygen.BUFFER_FILTER} == {envoygen.EXT_PROC_FILTER}
    override = per_route[envoygen.EXT_PROC_FILTER]
    assert override["@type"] == f"type.googleapis.com/{envoygen.PER_ROUTE_TYPE}"
    # Only the mode is overridden: failure_mode_allow stays the filter's false.
    assert list(override["overrides"]) == ["processing_mode"]
    mode = override["overrides"]["processing_mode"]
    request_side = {k: v for k, v in mode.items() if k.startswith("request_")}
    assert request_side == {k: v for k, v in filter_mode.items() if k.startswith("request_")}
    assert {k: v for k, v in mode.items() if k.startswith("response_")} == MINT_RESPONSE
    assert check(config).errors == []


def test_only_mint_routes_override_the_filter():
    data = example()
    data["routes"][2]["policy"] = {"topology": "aggregated", "action": "mint"}
    config = generate(data)
    overridden = [
        n
        for n, r in forwarding(config).items()
        if envoygen.EXT_PROC_FILTER in r.get("typed_per_filter_config", {})
    ]
    assert overridden == ["prefill", "aggregated"]


def test_a_turns_route_has_its_responses_processed_as_a_mint_route_does():
    data = example()
    data["routes"][1]["turns"] = True  # the decode (honor) route
    routes = forwarding(generate(data))
    filters = [routes[name]["typed_per_filter_config"] for name in ("prefill", "disaggregated")]
    assert filters[0][envoygen.EXT_PROC_FILTER] == filters[1][envoygen.EXT_PROC_FILTER]
    data["routes"][2]["turns"] = True  # a strip route: nothing to sign
    with pytest.raises(envoygen.GeneratorError, match="turns: only an honor"):
        generate(data)


# --- vLLM's token-in and echo endpoints -----------------------------------------------


NOT_FOUND = {"error": {"message": "not found", "type": "NotFoundError", "param": None, "code": 404}}


DISABLED = {"@type": f"type.googleapis.com/{envoygen.PER_ROUTE_TYPE}", "disabled": True}


NOT_HELD = {"@type": BUFFER_PER_ROUTE, "disabled": True}


# The matches every config has, before every policy route (ext_proc.tools.token_endpoints).
TOKEN_MATCHES = [
    {"safe_regex": {"regex": token_endpoints.ECHO_REGEX}},
    {"safe_regex": {"regex": token_endpoints.INFERENCE_REGEX}},
    {"prefix": "/render", "case_sensitive": False},
    {"prefix": "/derender", "case_sensitive": False},
]


def not_found_routes(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The leading direct responses, checked for what every one must be."""
    (vhost,) = hcm_of(config)["route_config"]["virtual_hosts"]
    leading = []
    for entry in vhost["routes"]:
        if "route" in entry or entry["name"].endswith("-refused"):
            break
        assert entry["name"].startswith(envoygen.RESERVED_ROUTE_PREFIX)
        assert entry["direct_response"] == {"status": 404}
        # Nothing is forwarded, so the processor is not asked and nothing is held.
        per_filter = dict(entry["typed_per_filter_config"])
        assert per_filter.pop(envoygen.EXT_PROC_FILTER) == DISABLED
        assert per_filter in ({}, {envoygen.BUFFER_FILTER: NOT_HELD})
        leading.append(entry)
    # After them, a direct response only right before its own policy route (the
    # endpoints that route refuses: refused_routes).
    rest = vhost["routes"][len(leading) :]
    for at, entry in enumerate(rest):
        if "route" not in entry:
            assert (
                entry["name"] == f"{envoygen.RESERVED_ROUTE_PREFIX}-{rest[at + 1]['name']}-refused"
            )
    return leading


def refused_routes(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each policy route's 404 of the endpoints it refuses, by the policy route's name."""
    (vhost,) = hcm_of(config)["route_config"]["virtual_hosts"]
    listed = vhost["routes"]
    return {
        after["name"]: entry
        for entry, after in itertools.pairwise(listed)
        if entry["name"].endswith("-refused") and "route" in after
    }


def test_token_endpoints_are_answered_404_before_every_route():
    config = generate(example())
    assert [r["match"] for r in not_found_routes(config)] == TOKEN_MATCHES
    # The path is normalised before any route matches: "//render", "/./render",
    # "/%72ender" and "/v1/..%2Frender" reach these routes
    # (tests/e2e/test_token_endpoints.py).
    manager = hcm_of(config)
    assert manager["normalize_path"] is True
    assert manager["merge_slashes"] is True
    assert manager["path_with_escaped_slashes_action"] == "UNESCAPE_AND_REDIRECT"
    assert check(config).warnings == []


def test_a_rewrite_onto_the_token_in_api_gets_its_own_404s():
    # "/pd/" rewritten to "/inf": "/pd/erence/v1/generate" is /inference/v1/generate
    # upstream. "/x" rewritten to "/v1/": "/xrender" is /v1/render upstream, and
    # "/xinference/v1/generate" is /v1/inference/v1/generate (root path /v1). "/r/"
    # rewritten to "/": "/r/inference/v1/generate" is answered by the inference regex.
    data = routes_with(
        {"name": "pd-inf", "prefix": "/pd/", "prefix_rewrite": "/inf", "upstream": "aggregated"},
        {"name": "glued", "prefix": "/x", "prefix_rewrite": "/v1/", "upstream": "aggregated"},
        {"name": "root", "prefix": "/r/", "prefix_rewrite": "/", "upstream": "aggregated"},
    )
    config = generate(data)
    derived = not_found_routes(config)[len(TOKEN_MATCHES) :]
    assert {r["name"]: r["match"] for r in derived} == {
        "token-endpoint-pd-inf-0": {"safe_regex": {"regex": "(?i)/pd/erence(/.*|%0a)?"}},
        "token-endpoint-glued-0": {"safe_regex": {"regex": "(?i)/xinference(/.*|%0a)?"}},
        "token-endpoint-glued-1": {"safe_regex": {"regex": "(?i)/xrender/?(%0a)?"}},
        "token-endpoint-glued-2": {"safe_regex": {"regex": "(?i)/xderender/?(%0a)?"}},
    }
    assert check(config).errors == []
    # Without them, those paths would reach vLLM: check-envoy says so.
    (vhost,) = hcm_of(config)["route_config"]["virtual_hosts"]
    vhost["routes"] = [r for r in vhost["routes"] if r not in derived]
    errors = check(config).errors
    assert any("pd-inf: forwards '/pd/erence/v1/generate'" in e for e in errors), errors
    assert any("glued: forwards '/xinference/v1/generate'" in e for e in errors), errors


def test_shipped_routes_need_no_404s_of_their_own():
    # /pd/v1/ and /pd/prefill/v1/ are rewritten to /v1/: the echo regex covers them.
    assert len(not_found_routes(generate(example()))) == len(TOKEN_MATCHES)
    unrewritten = routes_with({"prefix": "/v2/", "upstream": "aggregated"})
    assert len(not_found_routes(generate(unrewritten))) == len(TOKEN_MATCHES)


def test_local_404_has_vllms_error_shape():
    mappers = hcm_of(generate(example()))["local_reply_config"]["mappers"]
    (mapper,) = [m for m in mappers if "404" in json.dumps(m["filter"])]
    body = mapper["body_format_override"]
    assert body["content_type"] == "application/json"
    error = body["json_format"]["error"]
    assert error == NOT_FOUND["error"] | {"code": "%RESPONSE_CODE%"}


# --- a route's rewrite in its policy metadata -----------------------------------------


@pytest.mark.parametrize("path", sorted(INPUTS.glob("*.yaml")), ids=lambda p: p.name)
def test_rewritten_routes_state_their_rewrite(path):
    spec = envoygen.load_input(envoygen.read_input(path))
    config = envoygen.to_dict(envoygen.build(spec))
    routes = forwarding(config)
    if path.name not in ARCHITECTURES:
        assert any("prefix_rewrite" in r["route"] for r in routes.values())
    for entry in routes.values():
        fields = entry["metadata"]["filter_metadata"]["ext_proc.token_policy"]
        rewrite = entry["route"].get("prefix_rewrite")
        stated = {k: fields[k] for k in envoygen.REWRITE_FIELDS if k in fields}
        if rewrite is None:
            assert stated == {}, entry["name"]
        else:
            assert stated == {"match_prefix": entry["match"]["prefix"], "prefix_rewrite": rewrite}
            # What the processor makes of it: the upstream's path.
            policy = route_policy.parse(
                {k: v if isinstance(v, bool) else str(v) for k, v in fields.items()},
                float(len(fields)),
            )
            assert policy.upstream_path(entry["match"]["prefix"] + "chat/completions") == (
                rewrite + "chat/completions"
            )


def test_rewrite_fields_follow_the_route_input():
    data = example()
    data["routes"][1] |= {"prefix": "/decode/v1/", "prefix_rewrite": "/v2/"}
    data["routes"][2]["prefix_rewrite"] = "/v1/x/"
    routes = forwarding(generate(data))
    for name, prefix, rewrite in (
        ("disaggregated", "/decode/v1/", "/v2/"),
        ("aggregated", "/v1/", "/v1/x/"),
    ):
        fields = routes[name]["metadata"]["filter_metadata"]["ext_proc.token_policy"]
        assert (fields["match_prefix"], fields["prefix_rewrite"]) == (prefix, rewrite)
        assert routes[name]["route"]["prefix_rewrite"] == rewrite
    assert envoygen.rewrite_fields("/a/", None) == {}
    assert envoygen.rewrite_fields("/a/", "/b/") == {"match_prefix": "/a/", "prefix_rewrite": "/b/"}


# --- the gateway listener over mutual TLS ---------------------------------------------


def test_listener_requires_client_certificates():
    base, config = generate(example()), generate(example() | {"listener_tls": LISTENER_TLS})
    (listener,) = config["static_resources"]["listeners"]
    (chain,) = listener["filter_chains"]
    socket = chain.pop("transport_socket")
    assert socket["name"] == envoygen.TLS_SOCKET
    context = socket["typed_config"]
    assert context["@type"].endswith("tls.v3.DownstreamTlsContext")
    assert context["require_client_certificate"] is True
    common = context["common_tls_context"]
    assert common["tls_certificates"] == [
        {
            "certificate_chain": {"filename": "/etc/ext-proc/tls/gateway.crt"},
            "private_key": {"filename": "/etc/ext-proc/tls/gateway.key"},
        }
    ]
    assert common["validation_context"] == {
        "trusted_ca": {"filename": "/etc/ext-proc/tls/clients-ca.crt"}
    }
    assert common["alpn_protocols"] == ["h2", "http/1.1"]
    assert config == base


def test_shipped_internal_listener_trusts_its_orchestrator():
    config = yaml.safe_load((REPO / "envoy" / "envoy-internal-mtls.yaml").read_text())
    (listener,) = config["static_resources"]["listeners"]
    assert listener["filter_chains"][0]["transport_socket"]["typed_config"][
        "require_client_certificate"
    ]
    routes = forwarding(config)
    for name in ("prefill", "disaggregated"):
        fields = routes[name]["metadata"]["filter_metadata"]["ext_proc.token_policy"]
        assert fields["peers"] == "uri:spiffe://cluster.local/ns/llm-d/sa/router"
        assert "trust_any_caller" not in fields
    # Apart from the listener and the peers, the shipped base.
    base = generate(example())
    del listener["filter_chains"][0]["transport_socket"]
    for name in ("prefill", "disaggregated"):
        del routes[name]["metadata"]["filter_metadata"]["ext_proc.token_policy"]["peers"]
    assert config == base


def test_shipped_decode_route_honors_only_what_the_deployment_produced():
    for path in sorted((REPO / "envoy").glob("*.yaml")):
        if path.name in ARCHITECTURES:
            continue
        routes = forwarding(yaml.safe_load(path.read_text()))
        fields = routes["disaggregated"]["metadata"]["filter_metadata"]["ext_proc.token_policy"]
        assert fields["action"] == "honor", path.name
        assert "trust_any_caller" not in fields, path.name
        assert {"vocab_size", "max_ids"} <= set(fields), path.name
        assert routes["prefill"]["route"]["cluster"] == "prefill", path.name
        assert routes["prefill"]["route"]["prefix_rewrite"] == "/v1/", path.name


# --- Envoy's edge limits (overload manager, connection buffers, HTTP/2, timeouts) -----


OVERLOAD_ACTIONS = [
    ("envoy.overload_actions.shrink_heap", 0.95),
    ("envoy.overload_actions.stop_accepting_requests", 0.98),
]


def edge_limits(config: dict[str, Any]) -> dict[str, Any]:
    """What the generator sets for hostile load, as (monitor limits, listener, manager)."""
    overload = config["overload_manager"]
    monitors = {m["name"]: m["typed_config"] for m in overload["resource_monitors"]}
    connections = monitors["envoy.resource_monitors.global_downstream_max_connections"]
    heap = monitors["envoy.resource_monitors.fixed_heap"]
    assert connections["@type"].endswith("downstream_connections.v3.DownstreamConnectionsConfig")
    assert heap["@type"].endswith("fixed_heap.v3.FixedHeapConfig")
    assert [
        (a["name"], t["name"], t["threshold"]["value"])
        for a in overload["actions"]
        for t in a["triggers"]
    ] == [(name, "envoy.resource_monitors.fixed_heap", value) for name, value in OVERLOAD_ACTIONS]
    (listener,) = config["static_resources"]["listeners"]
    manager = hcm_of(config)
    return {
        "connections": connections["max_active_downstream_connections"],
        "heap": heap["max_heap_size_bytes"],
        "connection_buffer": listener["per_connection_buffer_limit_bytes"],
        "http1": manager.get("http_protocol_options"),
        "http2": manager["http2_protocol_options"],
        "request_headers_timeout": manager["request_headers_timeout"],
        "stream_idle_timeout": manager["stream_idle_timeout"],
    }


DEFAULT_EDGE_LIMITS = {
    "connections": 50_000,
    "heap": 1024 * 1024 * 1024,
    "connection_buffer": 32 * 1024,
    # keep_alive_after_denial: a well-framed request's 400 leaves the connection open.
    "http1": {"override_stream_error_on_invalid_http_message": True},
    "http2": {
        "max_concurrent_streams": 100,
        "initial_stream_window_size": 64 * 1024,
        "initial_connection_window_size": 1024 * 1024,
    },
    "request_headers_timeout": "10s",
    "stream_idle_timeout": "300s",
}


@pytest.mark.parametrize("path", sorted((REPO / "envoy").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_has_the_edge_limits(path):
    config = yaml.safe_load(path.read_text())
    assert edge_limits(config) == DEFAULT_EDGE_LIMITS
    # The limits leave the processing and the routes alone.
    assert check(config).errors == []


def test_edge_limits_follow_the_input():
    data = example() | {"max_downstream_connections": 1000, "max_heap_size_bytes": 512 * 1024**2}
    base, config = generate(example()), generate(data)
    assert edge_limits(config) == DEFAULT_EDGE_LIMITS | {
        "connections": 1000,
        "heap": 512 * 1024**2,
    }
    for monitor in config["overload_manager"]["resource_monitors"]:
        monitor["typed_config"] = {"@type": monitor["typed_config"]["@type"]}
    for monitor in base["overload_manager"]["resource_monitors"]:
        monitor["typed_config"] = {"@type": monitor["typed_config"]["@type"]}
    assert config == base


def test_connections_close_after_denials_on_request():
    base, config = generate(example()), generate(example() | {"keep_alive_after_denial": False})
    assert edge_limits(config) == DEFAULT_EDGE_LIMITS | {"http1": None}
    hcm_of(base).pop("http_protocol_options")
    assert config == base


def test_the_header_step_comes_first_and_takes_an_operators_headers():
    base = filters_of(generate(example()))[0]
    assert base["name"] == carrier_headers.FILTER
    removed = [m["remove"] for m in base["typed_config"]["mutations"]["request_mutations"][1:-1]]
    assert removed == [*carrier_headers.ROUTING_HEADERS, *ROUTER_HEADERS]
    extra = ["x-my-router-target", "x-prefiller-host-port", "x-request-id", "x-my-router-target"]
    step = filters_of(generate(example() | {"remove_request_headers": extra}))[0]
    mutations = step["typed_config"]["mutations"]["request_mutations"]
    removed = [m["remove"] for m in mutations if "remove" in m]
    # Each once; the request id is renewed, never merely removed.
    assert removed == [*carrier_headers.ROUTING_HEADERS, *ROUTER_HEADERS, "x-my-router-target"]
    assert mutations[-1]["append"]["header"]["key"] == carrier_headers.REQUEST_ID
    with pytest.raises(envoygen.GeneratorError, match="remove_request_headers"):
        envoygen.load_input(example() | {"remove_request_headers": ["X-Upper-Case"]})


def test_each_route_answers_the_endpoints_it_refuses_right_before_it():
    data = routes_with(
        {
            "name": "admin",
            "prefix": "/admin/",
            "prefix_rewrite": "/",
            "upstream": "aggregated",
            "policy": {"accept": "internal_endpoints|token_endpoints"},
        },
        {
            "name": "scoring",
            "prefix": "/scoring/",
            "prefix_rewrite": "/",
            "headers": {"epp-profile": "decode"},
            "upstream": "aggregated",
            "policy": {"accept": "token_endpoints"},
        },
    )
    config = generate(data)
    refused = refused_routes(config)
    # A route that accepts both classes has none; the others each theirs, by its
    # rewrite, with its own header conditions.
    assert "admin" not in refused
    assert set(refused) == {"scoring", "prefill", "disaggregated", "aggregated", "default"}
    scoring = refused["scoring"]["match"]
    assert scoring["headers"] == [{"name": "epp-profile", "string_match": {"exact": "decode"}}]
    names = refused_paths.refused_names({Accept.TOKEN_ENDPOINTS})
    assert scoring["safe_regex"]["regex"] == refused_paths.route_regex("/scoring/", "/", names)
    assert "generative_scoring" not in scoring["safe_regex"]["regex"]
    for entry in refused.values():
        assert entry["direct_response"] == {"status": 404}
        assert entry["typed_per_filter_config"][envoygen.EXT_PROC_FILTER] == DISABLED
    assert check(config).errors == []


def request_modes(config: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Each forwarding route's request_header_mode and response_body_mode, its own
    override's or else the filter's."""
    filter_mode = ext_proc_of(config)["processing_mode"]
    out = {}
    for name, entry in forwarding(config).items():
        per_filter = entry.get("typed_per_filter_config", {}).get(envoygen.EXT_PROC_FILTER)
        if per_filter is not None:
            assert set(per_filter) == {"@type", "overrides"}  # never failure_mode_allow
        mode = filter_mode if per_filter is None else per_filter["overrides"]["processing_mode"]
        out[name] = (mode["request_header_mode"], mode.get("response_body_mode", "NONE"))
    return out


def test_a_tenant_route_is_sent_its_request_headers_in_every_arrangement():
    """A request without a body must reach the processor to name its tenant: with one
    message per request a tenant route overrides the filter's mode, the rest untouched."""
    data = example()
    # The prefill/decode pair names one tenant source (a proof binds its partition).
    data["routes"][0]["policy"]["tenant"] = "header:x-auth-tenant"  # the prefill route
    data["routes"][1]["policy"]["tenant"] = "header:x-auth-tenant"  # the decode route
    data["routes"][2]["policy"]["tenant"] = "route:team-a"  # the aggregated route
    one, two = generate(data), generate(data | {"one_message": False})
    assert request_modes(one) == {
        "prefill": ("SEND", "BUFFERED"),
        "disaggregated": ("SEND", "NONE"),
        "aggregated": ("SEND", "NONE"),
        "default": ("SKIP", "NONE"),
    }
    assert request_modes(two) == {
        "prefill": ("SEND", "BUFFERED"),
        "disaggregated": ("SEND", "NONE"),
        "aggregated": ("SEND", "NONE"),
        "default": ("SEND", "NONE"),
    }
    # Without a tenant the aggregated route takes the filter's own mode.
    assert request_modes(generate(example()))["aggregated"] == ("SKIP", "NONE")
    for config in (one, two):
        codes = [finding.code for finding in check(config).findings]
        # The pair's header has no guard in this config; the modes are right.
        assert codes == ["tenant-header-unguarded"] * 2
        # The header comes with the headers message: no attribute is requested for it.
        assert "request.headers['x-auth-tenant']" not in ext_proc_of(config)["request_attributes"]


RATE_LIMIT = {"tenant_rate_limit": {"requests": 5, "interval_seconds": 2}}
FILTER_CONFIG = "type.googleapis.com/envoy.config.route.v3.FilterConfig"


@pytest.mark.parametrize(
    ("arrangement", "before"),
    [({}, envoygen.BUFFER_FILTER), ({"one_message": False}, envoygen.EXT_PROC_FILTER)],
)
def test_the_tenant_rate_limit_runs_after_the_decision(arrangement, before):
    """After the processor's answer (and the hold): the partition id is in the dynamic
    metadata by then, read under the configured namespace; a request without one is
    counted only in the filter's own bucket."""
    base = generate(example() | arrangement)
    config = generate(example() | arrangement | RATE_LIMIT)
    names = [f["name"] for f in filters_of(config)]
    assert names[-2:] == [envoygen.RATE_LIMIT_FILTER, envoygen.ROUTER_FILTER]
    assert names[-3] == before
    limit = filters_of(config)[-2]["typed_config"]
    bucket = {"max_tokens": 5, "tokens_per_fill": 5, "fill_interval": "2s"}
    assert limit["token_bucket"] == bucket  # shared_requests: a tenant's by default
    (descriptor,) = limit["descriptors"]
    assert descriptor == {"entries": [{"key": "tenant_partition"}], "token_bucket": bucket}
    assert limit["always_consume_default_token_bucket"] is False
    (action,) = limit["rate_limits"][0]["actions"]
    assert action["metadata"] == {
        "descriptor_key": "tenant_partition",
        "metadata_key": {"key": "ext_proc.token_policy", "path": [{"key": "partition"}]},
    }
    for enabled in ("filter_enabled", "filter_enforced"):
        assert limit[enabled]["default_value"] == {"numerator": 100}
    assert check(config).errors == []
    # Envoy's own 404s (the refused endpoints) count in no bucket.
    (vhost,) = hcm_of(config)["route_config"]["virtual_hosts"]
    for entry in vhost["routes"]:
        configs = entry.get("typed_per_filter_config", {})
        off = configs.pop(envoygen.RATE_LIMIT_FILTER, None)
        assert (off is not None) == ("direct_response" in entry)
        if off is not None:
            assert off == {"@type": FILTER_CONFIG, "disabled": True}
    # Nothing else changes but the 429's reply in vLLM's error shape.
    del filters_of(config)[-2]
    mappers = hcm_of(config)["local_reply_config"]["mappers"]
    (added,) = [m for m in mappers if m not in hcm_of(base)["local_reply_config"]["mappers"]]
    assert added["body_format_override"]["json_format"]["error"]["type"] == "RateLimitError"
    mappers.remove(added)
    assert config == base


@pytest.mark.parametrize(
    "limit", [{"requests": 0, "interval_seconds": 1}, {"requests": 1, "interval_seconds": 0.01}]
)
def test_the_tenant_rate_limit_is_a_bucket_envoy_takes(limit):
    with pytest.raises(envoygen.GeneratorError, match="tenant_rate_limit"):
        generate(example() | {"tenant_rate_limit": limit})


def test_requests_naming_no_tenant_share_a_bucket_of_their_own():
    limit = {**RATE_LIMIT["tenant_rate_limit"], "shared_requests": 50}
    config = generate(example() | {"tenant_rate_limit": limit})
    typed = filters_of(config)[-2]["typed_config"]
    assert typed["token_bucket"]["max_tokens"] == typed["token_bucket"]["tokens_per_fill"] == 50
    assert typed["descriptors"][0]["token_bucket"]["max_tokens"] == 5
