"""Nothing after this processor's filter changes the request it decided, unless the
deployment declares it; a declared ext_proc filter still leaves the path and routing
headers alone."""

import copy

import pytest
import yaml

from ext_proc.tools.check_envoy import check
from tests.tools.check_envoy.shipped import (
    EXT_PROC,
    HCM,
    SHIPPED,
    SHIPPED_DIR,
    clean,
    ext_proc_index,
    filter_names,
    found,
    hcm,
    mutated,
)

_T = "type.googleapis.com/envoy.extensions.filters.http."
ROUTER = "envoy.filters.http.router"
OPTIONS_TYPE = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
UNBOUNDED = [("declared-filter-unbounded", HCM)]
LUA = {
    "name": "rewrite",
    "typed_config": {
        "@type": _T + "lua.v3.Lua",
        "default_source_code": {
            "inline_string": (
                "function envoy_on_request(h) h:headers():replace(':path', '/v1/x') end"
            )
        },
    },
}
# One of each kind that can change a request's headers or body.
CHANGERS = {
    "lua": LUA,
    "wasm": {"name": "wasm", "typed_config": {"@type": _T + "wasm.v3.Wasm"}},
    "ext_proc": {
        "name": "picker",
        "typed_config": {
            "@type": _T + "ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}},
        },
    },
    "header_mutation": {
        "name": "headers",
        "typed_config": {"@type": _T + "header_mutation.v3.HeaderMutation", "mutations": {}},
    },
    "ext_authz": {"name": "authz", "typed_config": {"@type": _T + "ext_authz.v3.ExtAuthz"}},
    "decompressor": {
        "name": "gunzip",
        "typed_config": {"@type": _T + "decompressor.v3.Decompressor"},
    },
    "grpc_json_transcoder": {
        "name": "transcoder",
        "typed_config": {"@type": _T + "grpc_json_transcoder.v3.GrpcJsonTranscoder"},
    },
    "composite": {"name": "composite", "typed_config": {"@type": _T + "composite.v3.Composite"}},
    "ecds": {"name": "discovered", "config_discovery": {"config_source": {"ads": {}}}},
    "local_ratelimit-adding-headers": {
        "name": "limit",
        "typed_config": {
            "@type": _T + "local_ratelimit.v3.LocalRateLimit",
            "stat_prefix": "x",
            "request_headers_to_add_when_not_enforced": [{"header": {"key": "a", "value": "b"}}],
        },
    },
}
# Filters known to leave the request alone.
KEEPERS = {
    "buffer": {"name": "hold2", "typed_config": {"@type": _T + "buffer.v3.Buffer"}},
    "cors": {"name": "cors", "typed_config": {"@type": _T + "cors.v3.Cors"}},
    "rbac": {"name": "rbac", "typed_config": {"@type": _T + "rbac.v3.RBAC"}},
    "fault": {"name": "fault", "typed_config": {"@type": _T + "fault.v3.HTTPFault"}},
    "health_check": {
        "name": "health",
        "typed_config": {"@type": _T + "health_check.v3.HealthCheck"},
    },
    "local_ratelimit": {
        "name": "limit",
        "typed_config": {"@type": _T + "local_ratelimit.v3.LocalRateLimit", "stat_prefix": "x"},
    },
}


def before_router(entry):
    def change(config):
        chain = hcm(config)["http_filters"]
        chain.insert(filter_names(config).index(ROUTER), copy.deepcopy(entry))

    return change


def _router(config):
    return hcm(config)["http_filters"][filter_names(config).index(ROUTER)]["typed_config"]


@pytest.mark.parametrize("kind", list(CHANGERS))
def test_a_filter_that_can_change_the_request_after_the_decision_is_an_error(kind):
    report = mutated(before_router(CHANGERS[kind]))
    assert ("filter-after-decision", HCM) in found(report)


@pytest.mark.parametrize("kind", list(KEEPERS))
def test_a_filter_that_keeps_the_request_passes(kind):
    assert clean(mutated(before_router(KEEPERS[kind])))


def test_a_filter_before_the_processor_is_not_this_rules_business():
    # Whatever runs before the decision is what the processor judges (and, before the
    # header step, whatever it writes into the router's retry headers the step removes).
    assert clean(mutated(lambda c: hcm(c)["http_filters"].insert(0, LUA)))


def test_an_upstream_filter_of_the_router_is_an_error():
    def change(config):
        _router(config)["upstream_http_filters"] = [
            LUA,
            {"name": "codec", "typed_config": {"@type": _T + "upstream_codec.v3.UpstreamCodec"}},
        ]

    assert found(mutated(change)) == [
        ("filter-after-decision", f"{HCM} filter {ROUTER} upstream_http_filters")
    ]


def test_an_upstream_filter_of_a_cluster_is_an_error():
    def change(config):
        (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "prefill"]
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": OPTIONS_TYPE,
                "explicit_http_config": {"http_protocol_options": {}},
                "http_filters": [LUA],
            }
        }

    assert found(mutated(change)) == [("filter-after-decision", "cluster 'prefill' http_filters")]


def _declared(entry, declared):
    config = copy.deepcopy(SHIPPED)
    before_router(entry)(config)
    return check(config, declared=frozenset(declared))


# An endpoint picker's own header, written after the decision.
PICKER_HEADER = {
    "name": "picker",
    "typed_config": {
        "@type": _T + "header_mutation.v3.HeaderMutation",
        "mutations": {
            "request_mutations": [
                {"append": {"header": {"key": "x-gateway-destination-endpoint", "value": "a"}}}
            ]
        },
    },
}


def test_a_declared_filter_passes():
    assert clean(_declared(PICKER_HEADER, {"picker"}))


def test_a_declared_filter_that_may_write_anything_is_refused_by_the_router_header_rule():
    # Declared or not, a Lua script could write x-envoy-retry-on (rules/writers).
    assert _declared(LUA, {"rewrite"}).codes() == ["router-header-writer"]


EPP = copy.deepcopy(CHANGERS["ext_proc"])


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        ({"disallow_system": True}, []),
        (None, UNBOUNDED),
        ({"disallow_system": False}, UNBOUNDED),
        (
            {"disallow_system": True, "allow_all_routing": True},
            [("declared-filter-unbounded", HCM)],
        ),
        ({"disallow_system": True, "allow_envoy": True}, [("declared-filter-unbounded", HCM)]),
    ],
    ids=["bounded", "no-rules", "system-allowed", "routing-allowed", "envoy-allowed"],
)
def test_a_declared_endpoint_picker_may_not_change_path_or_routing(rules, expected):
    entry = copy.deepcopy(EPP)
    if rules is not None:
        entry["typed_config"]["mutation_rules"] = rules
    report = _declared(entry, {"picker"})
    assert found(report) == expected
    assert found(report, "warning") == []


def test_a_declared_filter_not_in_the_chain_is_a_warning():
    report = check(copy.deepcopy(SHIPPED), declared=frozenset({"picker"}))
    assert (found(report), found(report, "warning")) == ([], [("declared-filter-absent", HCM)])


def test_the_processors_own_filter_is_not_judged():
    # This processor's filter after its first one is one of ours: not a filter after
    # the decision.
    def change(config):
        chain = hcm(config)["http_filters"]
        second = copy.deepcopy(chain[ext_proc_index(config)])
        second["name"] = EXT_PROC + ".second"
        chain.insert(filter_names(config).index(ROUTER), second)

    assert "filter-after-decision" not in mutated(change).codes()


RATE_LIMITED = yaml.safe_load((SHIPPED_DIR / "envoy-ratelimit.yaml").read_text())
LIMIT = "envoy.filters.http.local_ratelimit"


def _limit(config):
    (entry,) = [f for f in hcm(config)["http_filters"] if f["name"] == LIMIT]
    return entry["typed_config"]


def test_the_tenant_rate_limit_after_the_decision_passes():
    """envoy-ratelimit.yaml: a local_ratelimit after the processor's filter and its hold,
    keyed on the processor's dynamic metadata, adds no request header."""
    names = filter_names(RATE_LIMITED)
    assert (
        names.index(LIMIT) > names.index("envoy.filters.http.buffer") > ext_proc_index(RATE_LIMITED)
    )
    assert check(RATE_LIMITED).findings == ()


@pytest.mark.parametrize("level", ["filter", "route"])
def test_the_tenant_rate_limit_adding_a_request_header_is_refused(level):
    """Shadow mode's request headers (request_headers_to_add_when_not_enforced) would
    reach the upstream after the decision: refused in the filter, and not a per-route
    field the check reads."""
    config = copy.deepcopy(RATE_LIMITED)
    added = [{"header": {"key": "x-tenant-id", "value": "%REQ(x-auth-tenant)%"}}]
    if level == "filter":
        _limit(config)["request_headers_to_add_when_not_enforced"] = added
        expected = ("filter-after-decision", HCM)
    else:
        entry = next(
            r
            for r in hcm(config)["route_config"]["virtual_hosts"][0]["routes"]
            if r["name"] == "team-a"
        )
        entry["typed_per_filter_config"][LIMIT] = {
            **{k: v for k, v in _limit(config).items() if k != "rate_limits"},
            "request_headers_to_add_when_not_enforced": added,
        }
        expected = ("per-route-field-refused", f"{HCM} route vllm/team-a {LIMIT}")
    assert expected in found(check(config))
