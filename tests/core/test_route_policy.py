import pytest

from ext_proc.core.errors import RoutePolicyError
from ext_proc.core.read_headers import CHECKED_HEADERS
from ext_proc.core.route_policy import (
    DEFAULT_NAMESPACE,
    DEFAULT_POLICY,
    FIELDS,
    SCHEMA,
    Action,
    IdentityType,
    RoutePolicy,
    TenantKind,
    TenantSource,
    Topology,
    Unproven,
    admitting,
    beside,
    items_of,
    parse,
    parse_whole,
    read_headers,
)


@pytest.mark.parametrize(
    ("values", "size", "expected"),
    [
        ({}, None, DEFAULT_POLICY),
        ({}, 0.0, RoutePolicy(Topology.AGGREGATED, Action.STRIP)),
        ({"topology": "aggregated"}, 1.0, RoutePolicy(Topology.AGGREGATED, Action.STRIP)),
        ({"topology": "disaggregated"}, 1.0, RoutePolicy(Topology.DISAGGREGATED, Action.HONOR)),
        (
            {"topology": "disaggregated", "action": "strip"},
            2.0,
            RoutePolicy(Topology.DISAGGREGATED, Action.STRIP),
        ),
        ({"action": "deny"}, 1.0, RoutePolicy(Topology.AGGREGATED, Action.DENY)),
        ({"action": "honor"}, 1.0, RoutePolicy(Topology.AGGREGATED, Action.HONOR)),
        (
            {"topology": "disaggregated", "vocab_size": "128256", "max_ids": "131072"},
            3.0,
            RoutePolicy(Topology.DISAGGREGATED, Action.HONOR, 128256, 131072),
        ),
        ({"vocab_size": 512.0}, 1.0, RoutePolicy(vocab_size=512)),
        ({"audit": True}, 1.0, RoutePolicy(audit=True)),
        ({"action": "deny", "audit": False}, 2.0, RoutePolicy(action=Action.DENY)),
        # size may be missing when the filter does not request it; fields still apply.
        ({"action": "deny"}, None, RoutePolicy(action=Action.DENY)),
    ],
)
def test_valid_metadata(values, size, expected):
    assert parse(values, size) == expected


@pytest.mark.parametrize(
    ("values", "size", "field"),
    [
        ({"topology": "aggregate"}, 1.0, "topology"),
        ({"topology": "Aggregated"}, 1.0, "topology"),
        ({"topology": True}, 1.0, "topology"),
        ({"action": "allow"}, 1.0, "action"),
        ({"action": "<struct_value>"}, 1.0, "action"),
        ({"action": 1.0}, 1.0, "action"),
        ({"vocab_size": "0"}, 1.0, "vocab_size"),
        ({"vocab_size": "-5"}, 1.0, "vocab_size"),
        ({"vocab_size": "1.5"}, 1.0, "vocab_size"),
        ({"vocab_size": 1.5}, 1.0, "vocab_size"),
        ({"vocab_size": True}, 1.0, "vocab_size"),
        ({"vocab_size": "1e+06"}, 1.0, "vocab_size"),
        ({"max_ids": "<list_value>"}, 1.0, "max_ids"),
        ({"max_ids": ""}, 1.0, "max_ids"),
        ({"audit": "true"}, 1.0, "audit"),
        ({"audit": 1.0}, 1.0, "audit"),
    ],
)
def test_invalid_field_is_named(values, size, field):
    with pytest.raises(RoutePolicyError) as caught:
        parse(values, size)
    assert caught.value.param == f"ext_proc.token_policy.{field}"
    assert f"'ext_proc.token_policy.{field}'" in caught.value.message
    assert caught.value.status == 500


def test_unknown_field_fails_closed():
    # The namespace holds 2 keys but only 'action' is known: e.g. a typo "topolgy".
    with pytest.raises(RoutePolicyError) as caught:
        parse({"action": "honor"}, 2.0)
    assert "allowed fields: topology, action, vocab_size, max_ids, audit" in caught.value.message


def test_a_whole_mapping_names_its_unknown_field():
    with pytest.raises(RoutePolicyError) as caught:
        parse_whole({"action": "honor", "topolgy": "aggregated"})
    assert caught.value.message.startswith(
        "invalid route policy metadata: unknown field 'ext_proc.token_policy.topolgy'; "
        "allowed fields: topology, action,"
    )
    assert caught.value.param == "ext_proc.token_policy.topolgy"
    assert parse_whole({"action": "honor"}) == RoutePolicy(action=Action.HONOR)


def test_unknown_field_alone_fails_closed():
    with pytest.raises(RoutePolicyError):
        parse({}, 1.0)


def test_cached_results_never_confuse_equal_values_of_other_types():
    assert parse({"audit": True}, 1.0) == RoutePolicy(audit=True)
    with pytest.raises(RoutePolicyError):
        parse({"audit": 1.0}, 1.0)
    assert parse({"vocab_size": "512"}, 1.0) == RoutePolicy(vocab_size=512)
    assert parse({"vocab_size": 512.0}, 1.0) == RoutePolicy(vocab_size=512)


def test_trust_fields():
    policy = parse(
        {
            "action": "honor",
            "unproven": "deny",
            "peers": "uri:spiffe://td/ns/llm-d/sa/router | subject:CN=router, O=acme",
            "keep_other_keys": True,
        },
        4.0,
    )
    assert policy.unproven is Unproven.DENY
    assert policy.peers == {
        (IdentityType.URI, "spiffe://td/ns/llm-d/sa/router"),
        (IdentityType.SUBJECT, "CN=router, O=acme"),
    }
    assert policy.keep_other_keys
    assert policy.untrusted_denied
    assert parse({"action": "honor", "trust_any_caller": True}, 2.0).trust_any_caller
    assert parse({"action": "mint"}, 1.0).action is Action.MINT
    assert parse({"action": "deny"}, 1.0).untrusted_denied
    assert not parse({"action": "mint"}, 1.0).untrusted_denied


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"action": "strip", "unproven": "deny"}, "unproven"),
        ({"action": "deny", "peers": "uri:spiffe://x"}, "peers"),
        ({"action": "honor", "peers": "spiffe://x"}, "peers"),  # untyped
        ({"action": "honor", "peers": "uri:spiffe://x | router.local"}, "peers"),
        ({"action": "honor", "peers": "san:spiffe://x"}, "peers"),
        ({"action": "honor", "peers": "uri:"}, "peers"),
        ({"action": "mint", "keep_other_keys": True}, "keep_other_keys"),
        ({"match_prefix": "/pd/v1/"}, "match_prefix"),
        ({"prefix_rewrite": "/v1/"}, "prefix_rewrite"),
        ({"match_prefix": "pd/", "prefix_rewrite": "/v1/"}, "match_prefix"),
        ({"match_prefix": "/pd/", "prefix_rewrite": 1.0}, "prefix_rewrite"),
        ({"action": "mint", "trust_any_caller": True}, "trust_any_caller"),
        ({"action": "honor", "unproven": "allow"}, "unproven"),
        ({"action": "honor", "peers": "a||b"}, "peers"),
        ({"action": "honor", "peers": ""}, "peers"),
        ({"action": "honor", "peers": 3.0}, "peers"),
        ({"action": "honor", "trust_any_caller": "yes"}, "trust_any_caller"),
        ({"keep_other_keys": 1.0}, "keep_other_keys"),
    ],
)
def test_trust_fields_are_validated(values, field):
    with pytest.raises(RoutePolicyError) as caught:
        parse(values, float(len(values)))
    assert caught.value.param == f"ext_proc.token_policy.{field}"


def test_the_rewrite_gives_the_upstream_path():
    policy = parse({"match_prefix": "/pd/prefill/v1/", "prefix_rewrite": "/v1/"}, 2.0)
    assert policy.upstream_path("/pd/prefill/v1/chat/completions") == "/v1/chat/completions"
    assert policy.upstream_path("/pd/prefill/v1/") == "/v1/"
    # A path the route's prefix does not cover: the metadata describes another route.
    assert policy.upstream_path("/pd/v1/chat/completions") is None
    assert policy.upstream_path("/PD/prefill/v1/chat/completions") is None
    # Without a rewrite the upstream path is the request's.
    assert DEFAULT_POLICY.upstream_path("/pd/v1/chat/completions") == "/pd/v1/chat/completions"


def test_no_vocabulary_is_larger_than_vllms_token_ids():
    assert parse({"vocab_size": str(2**31)}, 1.0) == RoutePolicy(vocab_size=2**31)
    with pytest.raises(RoutePolicyError, match="32-bit"):
        parse({"vocab_size": str(2**31 + 1)}, 1.0)


NIXL = (
    ("do_remote_decode", True),
    ("do_remote_prefill", False),
    ("remote_engine_id", None),
    ("remote_block_ids", None),
    ("remote_host", None),
    ("remote_port", None),
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("nixl", NIXL),
        (
            '{"do_remote_decode": true, "x": 5, "y": "z"}',
            (("do_remote_decode", True), ("x", 5), ("y", "z")),
        ),
    ],
)
def test_a_mint_route_names_its_connector_request(value, expected):
    policy = parse({"action": "mint", "connector": value}, 2.0)
    assert policy.connector == expected
    assert isinstance(dict(policy.connector).get("x", 5), int)  # a port stays an int


@pytest.mark.parametrize(
    "value",
    [
        "mooncake",
        "{}",
        "[1]",
        "{not json",
        '{"a": {"b": 1}}',
        '{"a": [1]}',
        '{"prompt_token_ids": [1]}',
        '{"prompt_features": null}',
        True,
        5.0,
    ],
)
def test_a_connector_request_is_a_known_name_or_an_object_of_scalars(value):
    with pytest.raises(RoutePolicyError, match="connector"):
        parse({"action": "mint", "connector": value}, 2.0)


@pytest.mark.parametrize("action", ["strip", "deny", "honor"])
def test_only_a_mint_route_writes_a_connector_request(action):
    with pytest.raises(RoutePolicyError, match="applies only to action mint"):
        parse({"action": action, "connector": "nixl"}, 2.0)


def test_of_several_bad_fields_the_first_declared_is_named():
    with pytest.raises(RoutePolicyError) as caught:
        parse({"peers": "x", "unproven": "maybe", "topology": "aggregated"}, 3.0)
    assert caught.value.param == "ext_proc.token_policy.unproven"


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_is_valid_on_the_action_it_is_admitted_on(name):
    assert admitting(name) in SCHEMA[name].actions
    assert SCHEMA[name].doc
    # Read on its own beside what it needs, its default is valid.
    default = getattr(DEFAULT_POLICY, name)
    if isinstance(default, bool):
        given = beside(name) | {name: default}
        assert parse(given, float(len(given))) is not None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("header:x-auth-tenant", TenantSource(TenantKind.HEADER, "x-auth-tenant")),
        ("peer_san", TenantSource(TenantKind.PEER_SAN)),
        ("route:team-a", TenantSource(TenantKind.ROUTE, "team-a")),
    ],
)
def test_a_route_names_where_its_tenant_comes_from(value, expected):
    assert parse({"tenant": value}, 1.0).tenant == expected
    assert DEFAULT_POLICY.tenant is None


@pytest.mark.parametrize(
    "value",
    [
        "header:X-Auth-Tenant",  # Envoy hands header names over in lower case
        "header:",
        "route:",
        "route:team a",
        "peer_san:x",
        "tenant",
        "CelMap value",  # a map, as CEL renders it
        True,
        # Removed or renewed by the header step right before the processor.
        "header:x-tenant-id",
        "header:x-cache-salt",
        "header:x-request-id",
        "header:x-prefiller-host-port",
        "header:x-envoy-original-path",
        # What the client sent: its request id moved aside, its trace context, framing.
        "header:x-client-request-id",
        "header:traceparent",
        "header:tracestate",
        "header:content-type",
    ],
)
def test_a_tenant_source_is_one_of_three_forms(value):
    with pytest.raises(RoutePolicyError) as caught:
        parse({"tenant": value}, 1.0)
    assert caught.value.param == "ext_proc.token_policy.tenant"


def test_fairness_id_is_a_flag_that_needs_a_tenant_source():
    policy = parse({"tenant": "route:team-a", "fairness_id": True}, 2.0)
    assert policy.fairness_id is True
    assert DEFAULT_POLICY.fairness_id is False
    assert parse({"fairness_id": False}, 1.0).fairness_id is False
    with pytest.raises(RoutePolicyError) as caught:
        parse({"fairness_id": True}, 1.0)
    assert caught.value.param == "ext_proc.token_policy.fairness_id"
    with pytest.raises(RoutePolicyError):
        parse({"tenant": "route:team-a", "fairness_id": "true"}, 2.0)


@pytest.mark.parametrize(
    ("values", "size", "named"),
    [
        ({}, None, set()),
        ({"action": "strip"}, 1.0, set()),
        ({"tenant": "header:x-tenant"}, 1.0, {"x-tenant"}),
        ({"tenant": "peer_san"}, 1.0, set()),
        ({"tenant": "route:acme"}, 1.0, set()),
        ({"tenant": "header:x-tenant"}, 2.0, set()),  # invalid: refused before any tenant
        ({"tenant": "header:content-type"}, 1.0, set()),  # invalid
    ],
)
def test_read_headers_are_the_checked_ones_and_the_tenants(values, size, named):
    read = read_headers(items_of(values), size, DEFAULT_NAMESPACE)
    assert read == set(CHECKED_HEADERS) | named
