"""envoygen.inputs: input files and their base, and every invalid input refused with
the field it names (route policy values checked as the processor reads them)."""

from __future__ import annotations

import copy

import pydantic
import pytest

from ext_proc.core import route_policy
from ext_proc.tools import envoygen
from tests.tools.envoygen.configs import (
    EXAMPLE,
    LISTENER_TLS,
    TLS,
    example,
    forwarding,
    generate,
    mutate,
    routes_with,
    set_at,
)

# --- input files and their base -------------------------------------------------------


def test_base_keys_apply_unless_given_again(tmp_path):
    (tmp_path / "base.yaml").write_text(EXAMPLE.read_text())
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mid.yaml").write_text("base: ../base.yaml\nbody_mode: streamed\n")
    leaf = tmp_path / "sub" / "leaf.yaml"
    leaf.write_text("base: mid.yaml\nadmin_port: 9902\n")
    assert envoygen.read_input(leaf) == example() | {"body_mode": "streamed", "admin_port": 9902}


def test_base_cycle_is_refused(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(envoygen.GeneratorError, match="base chain returns"):
        envoygen.read_input(tmp_path / "a.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("base: missing.yaml\n", "cannot read"),
        ("base: [a]\n", "base: expected a path"),
        ("- a list\n", "must be a mapping"),
    ],
)
def test_bad_input_files(tmp_path, text, message):
    (tmp_path / "in.yaml").write_text(text)
    with pytest.raises(envoygen.GeneratorError, match=message):
        envoygen.read_input(tmp_path / "in.yaml")


# --- route policy ---------------------------------------------------------------------


def test_policy_input_follows_route_policy_fields():
    assert set(envoygen.PolicyInput.model_fields) == set(route_policy.FIELDS)


def test_policy_metadata_writes_only_given_fields():
    policy = envoygen.PolicyInput.model_validate({"topology": "disaggregated", "vocab_size": 7})
    assert policy.metadata() == {"topology": "disaggregated", "vocab_size": 7}


def test_policy_metadata_always_states_the_topology():
    assert envoygen.PolicyInput().metadata() == {"topology": "aggregated"}
    policy = envoygen.PolicyInput.model_validate({"action": "deny"})
    assert policy.metadata() == {"topology": "aggregated", "action": "deny"}


@pytest.mark.parametrize(
    ("field", "value"),
    [("audit", "yes"), ("max_ids", True), ("vocab_size", 1.5), ("topology", "both")],
)
def test_policy_values_are_checked_as_the_processor_reads_them(field, value):
    with pytest.raises(pydantic.ValidationError, match=field):
        envoygen.PolicyInput.model_validate({field: value})


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"action": "strip", "peers": "uri:spiffe://a/b"}, "peers"),
        ({"action": "mint", "trust_any_caller": True}, "trust_any_caller"),
        ({"topology": "aggregated", "unproven": "deny"}, "unproven"),
    ],
)
def test_policy_fields_that_need_another_action(policy, field):
    with pytest.raises(pydantic.ValidationError, match=f"'ext_proc.token_policy.{field}'"):
        envoygen.PolicyInput.model_validate(policy)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("peers", "uri:a|"),
        # Untyped: which part of the certificate would it name?
        ("peers", "spiffe://cluster.local/ns/llm-d/sa/router"),
        ("unproven", "allow"),
        ("trust_any_caller", "yes"),
    ],
)
def test_new_policy_fields_are_checked_as_the_processor_reads_them(field, value):
    with pytest.raises(pydantic.ValidationError) as caught:
        envoygen.PolicyInput.model_validate({"action": "honor", field: value})
    ((error,),) = [caught.value.errors()]
    assert error["loc"] == (field,)


def test_peers_need_the_mutual_tls_listener():
    data = example()
    data["routes"][1]["policy"]["peers"] = "uri:spiffe://cluster.local/ns/llm-d/sa/router"
    with pytest.raises(envoygen.GeneratorError, match=r"routes\.1\.policy\.peers: needs listener"):
        envoygen.load_input(data)
    envoygen.load_input(data | {"listener_tls": LISTENER_TLS})


@pytest.mark.parametrize(
    ("mint", "honor"),
    [
        ("route:team-a", None),
        (None, "route:team-a"),
        ("route:team-a", "route:team-b"),
        ("header:x-auth-tenant", "peer_san"),
    ],
)
def test_a_prefill_decode_pair_naming_different_tenant_sources_is_refused(mint, honor):
    # A proof binds the cache partition of its mint route: the pair could never hand
    # off, and honoring across would put one tenant's prompt in another's partition.
    data = example()
    for index, source in ((0, mint), (1, honor)):
        if source is not None:
            data["routes"][index]["policy"]["tenant"] = source
    message = r"routes\.1\.policy\.tenant: this honor route names .* mint route routes\.0 "
    with pytest.raises(envoygen.GeneratorError, match=message):
        envoygen.load_input(data)


def test_a_prefill_decode_pair_naming_one_tenant_source_is_written():
    data = example()
    for index in (0, 1):
        data["routes"][index]["policy"]["tenant"] = "route:team-a"
    data["routes"][2]["policy"]["tenant"] = "route:team-b"  # a strip route pairs with none
    envoygen.load_input(data)


# --- invalid inputs name their field --------------------------------------------------

INVALID = [
    (set_at("listener_prot", 1), "listener_prot: Extra inputs are not permitted"),
    (set_at("listener_port", 70000), "listener_port:"),
    (set_at("listener_address", "localhost"), "listener_address:"),
    (set_at("processor", "nohost"), "processor:"),
    (set_at("processor", "ext-proc:0"), "processor:"),
    (set_at("body_mode", "chunked"), "body_mode:"),
    (set_at("message_timeout_seconds", 0), "message_timeout_seconds:"),
    (set_at("upstreams.ext_proc", "127.0.0.1:1"), "reserved for the processor"),
    (set_at("upstreams.aggregated", "127.0.0.1"), "upstream 'aggregated'"),
    (set_at("routes", []), "routes:"),
    (set_at("routes.1.upstream", "agregated"), "routes.1.upstream: 'agregated' is not one of"),
    (set_at("routes.0.prefix", "pd/v1/"), "routes.0.prefix:"),
    (set_at("routes.0.prefix", "/pd/%761/"), "routes.0.prefix:"),  # the upstream decodes it
    (set_at("routes.1.prefix_rewrite", "/%69nference/v1/"), "routes.1.prefix_rewrite:"),
    (set_at("routes.3.prefix", "/v1/"), "routes.3.prefix: '/v1/' is matched by an earlier route"),
    (set_at("routes.3.name", "aggregated"), "routes.3.name: 'aggregated' is used by an earlier"),
    (set_at("routes.1.policy.action", "allow"), "routes.1.policy.action:"),
    (set_at("routes.1.policy.topolgy", "aggregated"), "routes.1.policy.topolgy: Extra inputs"),
    (set_at("routes.0.policy.vocab_size", 0), "routes.0.policy.vocab_size:"),
    (set_at("routes.0.policy.max_ids", "many"), "routes.0.policy.max_ids:"),
    (set_at("routes.1.body_limit_bytes", -1), "routes.1.body_limit_bytes:"),
    (set_at("processor", "unix:"), "processor:"),
    (set_at("one_message", "yes"), "one_message:"),
    (set_at("processor_tls", {"server_name": "ext-proc.local"}), "processor_tls.ca_file:"),
    (set_at("processor_tls", TLS | {"ca_file": "ca.crt"}), "processor_tls.ca_file:"),
    (set_at("processor_tls", TLS | {"cert_file": "/c"}), "cert_file and key_file go together"),
    (set_at("processor_tls", TLS | {"server_name": "a b"}), "processor_tls.server_name:"),
    (set_at("listener_tls", {"cert_file": "/c", "key_file": "/k"}), "listener_tls.client_ca_file:"),
    (
        set_at("listener_tls", {"cert_file": "c", "key_file": "/k", "client_ca_file": "/a"}),
        "listener_tls.cert_file:",
    ),
    # The rewrite's metadata comes from the route's prefix and prefix_rewrite only.
    (
        set_at("routes.1.policy.match_prefix", "/pd/v1/"),
        "routes.1.policy.match_prefix: Value error, written from the route's prefix",
    ),
    (
        set_at("routes.2.policy.prefix_rewrite", "/v1/"),
        "routes.2.policy.prefix_rewrite: Value error, written from the route's prefix",
    ),
    (set_at("routes.1.prefix_rewrite", "v1/"), "routes.1.prefix_rewrite:"),
    # A rewrite the processor could not read back (not a printable path prefix).
    (set_at("routes.1.prefix_rewrite", "/v1 x/"), "routes.1: Value error, invalid route policy"),
    # keep_other_keys cannot go on a mint route (route_policy).
    (set_at("routes.0.policy.keep_other_keys", True), "routes.0.policy"),
    (set_at("max_downstream_connections", 0), "max_downstream_connections:"),
    (set_at("max_downstream_connections", "many"), "max_downstream_connections:"),
    (set_at("max_heap_size_bytes", 1024 * 1024), "max_heap_size_bytes:"),
]


@pytest.mark.parametrize(("change", "message"), INVALID)
def test_invalid_input_names_the_field(change, message):
    with pytest.raises(envoygen.GeneratorError) as caught:
        envoygen.load_input(mutate(change))
    assert message in str(caught.value)


def test_input_must_be_a_mapping():
    with pytest.raises(envoygen.GeneratorError, match="must be a mapping"):
        envoygen.load_input(["not", "a", "mapping"])


def test_route_names_default_to_upstream_and_index():
    data = example()
    for entry in data["routes"]:
        del entry["name"]
    assert list(forwarding(generate(data))) == [
        "prefill-0",
        "disaggregated-1",
        "aggregated-2",
        "aggregated-3",
    ]


def test_one_message_needs_buffered_bodies():
    with pytest.raises(envoygen.GeneratorError, match="one_message: needs body_mode buffered"):
        envoygen.load_input(example() | {"one_message": True, "body_mode": "streamed"})


def test_mint_route_buffer_holds_a_prefill_response():
    data = example()
    data["routes"][0]["body_limit_bytes"] = 1024 * 1024
    with pytest.raises(envoygen.GeneratorError, match=r"routes\.0\.body_limit_bytes: 1048576"):
        envoygen.load_input(data)
    # The route's own limit, or the default every route has.
    with pytest.raises(envoygen.GeneratorError, match=r"routes\.0\.body_limit_bytes: 1048576"):
        envoygen.load_input(example() | {"body_limit_bytes": 1024 * 1024})
    data["routes"][0]["body_limit_bytes"] = envoygen.MINT_BUFFER_MIN
    # Other routes may buffer less.
    data["routes"][2]["body_limit_bytes"] = 1024
    envoygen.load_input(data | {"body_limit_bytes": 1024 * 1024})


def test_heap_must_hold_the_largest_body():
    data = example()
    data["routes"][2]["body_limit_bytes"] = 128 * 1024**2
    message = (
        r"max_heap_size_bytes: 134217728 does not exceed the largest body buffer \(134217728\)"
    )
    with pytest.raises(envoygen.GeneratorError, match=message):
        envoygen.load_input(data | {"max_heap_size_bytes": 128 * 1024**2})
    envoygen.load_input(data | {"max_heap_size_bytes": 256 * 1024**2})


# --- routes near vLLM's token endpoints -----------------------------------------------


def test_token_endpoints_cannot_be_exposed():
    # Gone: the token endpoints are answered 404 whatever the input says.
    with pytest.raises(envoygen.GeneratorError, match="expose_token_endpoints: Extra inputs"):
        envoygen.load_input(example() | {"expose_token_endpoints": True})


@pytest.mark.parametrize(
    "prefix", ["/inference/v1/", "/x/Inference/", "/render", "/derender/x", "/Render/x"]
)
def test_a_route_under_a_token_endpoint_is_refused(prefix):
    data = routes_with({"prefix": prefix, "upstream": "aggregated"})
    with pytest.raises(envoygen.GeneratorError, match=r"routes\.0\.prefix: .* token endpoint"):
        envoygen.load_input(data)


@pytest.mark.parametrize("rewrite", ["/inference/", "/Inference/v1/"])
def test_a_route_rewritten_into_the_token_in_api_is_refused(rewrite):
    data = routes_with({"prefix": "/gen/", "prefix_rewrite": rewrite, "upstream": "aggregated"})
    with pytest.raises(envoygen.GeneratorError, match=r"routes\.0\.prefix_rewrite: .* token-in"):
        envoygen.load_input(data)


def test_token_endpoint_names_are_reserved():
    data = example()
    data["routes"][2]["name"] = "token-endpoint-v1"
    with pytest.raises(envoygen.GeneratorError, match=r"routes\.2\.name: .* reserved"):
        envoygen.load_input(data)


def test_a_copied_route_states_its_own_rewrite():
    # What the end-to-end and benchmark stacks do to routes they copy or build.
    original = forwarding(generate(example()))["disaggregated"]
    copied = copy.deepcopy(original)
    copied["match"] = {"prefix": "/pd-any/v1/"}
    envoygen.state_rewrite(copied)
    fields = copied["metadata"]["filter_metadata"]["ext_proc.token_policy"]
    assert (fields["match_prefix"], fields["prefix_rewrite"]) == ("/pd-any/v1/", "/v1/")
    del copied["route"]["prefix_rewrite"]
    envoygen.state_rewrite(copied)
    assert not set(envoygen.REWRITE_FIELDS) & set(fields)
    bare = {"match": {"prefix": "/x/"}, "route": {"prefix_rewrite": "/"}}
    envoygen.state_rewrite(bare)
    assert bare == {"match": {"prefix": "/x/"}, "route": {"prefix_rewrite": "/"}}
