"""Tenants: the tenant a request names, and the cache_salt its body is forwarded with,
as values and through the stream."""

import json

import pytest

from ext_proc.core import classified, proof, tenants
from ext_proc.core.errors import BadRequest
from ext_proc.core.events import (
    NO_PEER,
    ContinueBody,
    ContinueHeaders,
    ContinueResponseBody,
    ContinueResponseHeaders,
    Peer,
    RequestBody,
    ResponseBody,
    ResponseHeaders,
    RouteMetadata,
)
from ext_proc.core.proof import Trust
from ext_proc.core.reasons import Reason
from ext_proc.core.route_policy import IdentityType, TenantKind, TenantSource
from ext_proc.core.vllm_request import KV_KEY as KV
from tests.core.messages import BUFFERED, DUPLEX, JSON, OK_JSON, error_body, headers, only
from tests.driver import Driven

KEY = b"t" * 32
HEADER = TenantSource(TenantKind.HEADER, "x-auth-tenant")
BY_HEADER = RouteMetadata({"action": "strip", "tenant": "header:x-auth-tenant"}, 2.0)
BY_PEER = RouteMetadata({"action": "strip", "tenant": "peer_san"}, 2.0)
BY_ROUTE = RouteMetadata({"action": "strip", "tenant": "route:team-a"}, 2.0)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
SPIFFE = "spiffe://cluster.local/ns/a/sa/client"
A = "header:x-auth-tenant:team-a"
B = "header:x-auth-tenant:team-b"


def salt_of(tenant, part=None, key=KEY):
    return tenants.salt(tenants.key_for(key, tenant), part)


def test_the_salt_is_keyed_by_deployment_tenant_and_client_salt():
    plain = salt_of("header:team-a")
    assert len(plain) == 43
    assert plain.isascii()
    assert not set(plain) & set("@/\\\0")  # vLLM refuses these in a salt
    assert salt_of("header:team-a") == plain  # the same tenant keeps its prefix cache
    assert salt_of("header:team-b") != plain
    assert salt_of("header:team-a", key=b"u" * 32) != plain
    # The client's own salt divides its tenant's partition; it never names another's.
    mine = salt_of("header:team-a", "s1")
    assert mine not in (plain, salt_of("header:team-b", "s1"), salt_of("header:team-a", "s2"))
    # The tenant and the client's salt are not one concatenated string.
    assert salt_of("header:team-a", "bc") != salt_of("header:team-ab", "c")


def test_a_partitions_tag_is_the_tenants_own_and_no_salt():
    def tag_of(tenant, key=KEY):
        return tenants.tag(tenants.key_for(key, tenant))

    tag = tag_of("route:team-a")
    assert len(tag) == 22
    assert tag == tag_of("route:team-a")
    assert tag not in (tag_of("route:team-b"), tag_of("header:x:team-a"))
    assert tag != tag_of("route:team-a", b"u" * 32)
    # A proof names the partition, never a salt the engine is sent.
    assert not salt_of("route:team-a").startswith(tag)


def test_the_member_written_is_a_partition_key_both_engines_read():
    assert tenants.CACHE_SALT in classified.PARTITION_MEMBERS


def test_the_tenant_is_typed_by_its_source():
    tenant = (("x-auth-tenant", b"team-a"),)
    assert tenants.identify(HEADER, tenant, NO_PEER) == "header:x-auth-tenant:team-a"
    route = TenantSource(TenantKind.ROUTE, "team-a")
    assert tenants.identify(route, (), NO_PEER) == "route:team-a"
    peer = Peer(True, ((IdentityType.DNS, "a.example"), (IdentityType.URI, SPIFFE)))
    assert tenants.identify(TenantSource(TenantKind.PEER_SAN), (), peer) == f"uri:{SPIFFE}"


@pytest.mark.parametrize(
    ("source", "found", "peer"),
    [
        (HEADER, (), NO_PEER),
        (HEADER, (("x-auth-tenant", b""),), NO_PEER),
        (HEADER, (("x-auth-tenant", b"a"), ("x-auth-tenant", b"b")), NO_PEER),
        # Two values as Envoy joins them when it hands headers over as attributes.
        (HEADER, (("x-auth-tenant", b"a,b"),), NO_PEER),
        (HEADER, (("x-other", b"a"),), NO_PEER),
        (TenantSource(TenantKind.PEER_SAN), (), NO_PEER),
        (TenantSource(TenantKind.PEER_SAN), (), Peer(True, ((IdentityType.DNS, "a.example"),))),
        (TenantSource(TenantKind.PEER_SAN), (), Peer(False, ((IdentityType.URI, SPIFFE),))),
    ],
)
def test_a_request_without_one_identity_names_no_tenant(source, found, peer):
    assert tenants.identify(source, found, peer) is None


def test_two_header_sources_with_equal_values_are_two_tenants():
    other = TenantSource(TenantKind.HEADER, "x-other-tenant")
    one = tenants.identify(HEADER, (("x-auth-tenant", b"team-a"),), NO_PEER)
    two = tenants.identify(other, (("x-other-tenant", b"team-a"),), NO_PEER)
    assert None not in (one, two)
    assert one != two


def test_every_byte_of_a_header_value_tells_tenants_apart():
    found = [
        tenants.identify(HEADER, (("x-auth-tenant", value.encode()),), NO_PEER)
        for value in ("研究所", "ラボ部", "???", "team-€", "team-?")
    ]
    assert None not in found
    assert len(set(found)) == len(found)


@pytest.mark.parametrize("value", [["a", "b"], "", 1, {"a": 1}, True])
def test_a_client_salt_is_a_non_empty_string_or_nothing(value):
    assert tenants.client_part({}) is None
    assert tenants.client_part({"cache_salt": None}) is None
    assert tenants.client_part({"cache_salt": "s"}) == "s"
    with pytest.raises(BadRequest) as refused:
        tenants.client_part({"cache_salt": value})
    assert refused.value.reason is Reason.CACHE_SALT_MALFORMED


def send(route, body, *, extra=JSON, key=KEY, peer=NO_PEER):
    stream = Driven(trust=Trust(tenant_key=key))
    request = headers(route, extra=extra)
    request = type(request)(
        request.headers, False, request.body_mode, route, peer, request.path, None
    )
    answers = stream.handle(request)
    if not isinstance(only(answers), ContinueHeaders):  # refused at the headers
        return stream, answers
    return stream, stream.handle(RequestBody(json.dumps(body).encode(), True))


def forwarded(answers):
    answer = only(answers)
    assert isinstance(answer, ContinueBody)
    assert answer.replacement is not None
    return json.loads(answer.replacement)


def tenant(name):
    return (*JSON, ("x-auth-tenant", name))


def test_each_tenant_gets_its_own_salt_whatever_salt_it_sends():
    _, a = send(BY_HEADER, CHAT, extra=tenant(b"team-a"))
    _, b = send(BY_HEADER, CHAT, extra=tenant(b"team-b"))
    assert forwarded(a) == {**CHAT, "cache_salt": salt_of("header:x-auth-tenant:team-a")}
    assert forwarded(b) == {**CHAT, "cache_salt": salt_of("header:x-auth-tenant:team-b")}
    # Team b sends team a's salt: it is combined with team b, never team a's.
    _, copied = send(
        BY_HEADER, {**CHAT, "cache_salt": forwarded(a)["cache_salt"]}, extra=tenant(b"team-b")
    )
    mine = salt_of("header:x-auth-tenant:team-b", forwarded(a)["cache_salt"])
    assert forwarded(copied)["cache_salt"] == mine
    assert forwarded(copied)["cache_salt"] != forwarded(a)["cache_salt"]


def test_the_salt_is_written_into_the_one_rewrite_of_a_strip():
    body = {**CHAT, "cache_salt": "mine", "kv_transfer_params": {"prompt_token_ids": [1]}}
    stream, answers = send(BY_ROUTE, body)
    assert stream.decision.reason is Reason.STRIPPED_BY_POLICY
    # The members keep their order; the salt stays where the client put it.
    assert list(forwarded(answers)) == ["model", "messages", "cache_salt"]
    assert forwarded(answers)["cache_salt"] == salt_of("route:team-a", "mine")


def test_the_peer_san_names_the_tenant():
    peer = Peer(True, ((IdentityType.URI, SPIFFE),))
    _, answers = send(BY_PEER, CHAT, peer=peer)
    assert forwarded(answers)["cache_salt"] == salt_of(f"uri:{SPIFFE}")


def test_a_request_that_names_no_tenant_is_refused_before_its_body():
    _, answers = send(BY_HEADER, CHAT)
    error = error_body(answers)
    assert only(answers).status == 401
    assert only(answers).details == "token_policy_tenant_missing"
    assert "x-auth-tenant" in error["message"]


def test_a_tenant_route_without_a_tenant_key_refuses_every_request():
    _, answers = send(BY_ROUTE, CHAT, key=None)
    error_body(answers)
    assert only(answers).status == 500
    assert only(answers).details == "token_policy_tenant_key_missing"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/messages",  # SGLang's Anthropic API: no cache_salt
        "/api/chat",  # SGLang's Ollama API
        "/api/generate",
        "/vertex_generate",  # SGLang reads parameters.cache_salt, the client's
        "/cohere/v2/chat",  # vLLM's Cohere API
        "/v2/embed",
        "/v1/embeddings",  # SGLang's has none
        "/invocations",  # SageMaker's: whichever API the body names
        "/v1/something_new",
        "/prefix/api/chat",
    ],
)
def test_a_tenant_route_refuses_an_endpoint_that_does_not_carry_the_salt(path):
    stream = Driven(trust=Trust(tenant_key=KEY))
    answers = stream.handle(headers(BY_ROUTE, extra=JSON, path=path))
    assert only(answers).status == 400
    assert only(answers).details == "token_policy_tenant_endpoint_refused"
    assert error_body(answers)["message"].startswith(path)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/generate",
        "/prefix/v1/chat/completions",
        "/tokenize",  # the tokenizer alone
        "/v1/messages/count_tokens",
        "/v1/models",  # a public read
        "/health",
    ],
)
def test_a_tenant_route_serves_what_carries_the_salt_or_caches_nothing(path):
    stream = Driven(trust=Trust(tenant_key=KEY))
    assert stream.handle(headers(BY_ROUTE, extra=JSON, path=path)) == [ContinueHeaders()]


def test_a_strict_route_serves_what_its_engine_carries_the_salt_in():
    # vLLM's Anthropic API carries cache_salt; SGLang's does not.
    for engine, status in (("vllm 0.32.0", None), ("sglang 0.5.23", 400)):
        route = RouteMetadata({**BY_ROUTE.values, "strict_body": engine}, 3.0)
        stream = Driven(trust=Trust(tenant_key=KEY))
        answers = stream.handle(headers(route, extra=JSON, path="/v1/messages"))
        if status is None:
            assert answers == [ContinueHeaders()]
        else:
            assert only(answers).status == status


def test_a_client_salt_that_is_not_a_string_is_refused():
    _, answers = send(BY_ROUTE, {**CHAT, "cache_salt": ["a", "b"]})
    assert error_body(answers)["param"] == "cache_salt"
    assert only(answers).details == "token_policy_cache_salt_malformed"


def test_a_route_without_a_tenant_source_forwards_the_clients_salt():
    route = RouteMetadata({"action": "strip"}, 1.0)
    _, answers = send(route, {**CHAT, "cache_salt": "mine"})
    assert only(answers) == ContinueBody(None)


def test_a_strict_route_refuses_a_path_under_a_servers_mount():
    # /metrics/v1/embeddings is Prometheus' app's, though vLLM's model for
    # /v1/embeddings carries cache_salt.
    route = RouteMetadata({**BY_ROUTE.values, "strict_body": "vllm 0.32.0"}, 3.0)
    for path in ("/metrics/v1/embeddings", "/root/METRICS/v1/chat/completions"):
        stream = Driven(trust=Trust(tenant_key=KEY))
        answers = stream.handle(headers(route, extra=JSON, path=path))
        assert only(answers).details == "token_policy_tenant_endpoint_refused"


# --- a prefill/decode pair knows its tenant ---------------------------------------------

NOW = 1000.0
KEYS = proof.KeySet({"k1": b"k" * 32}, "k1")
PREFILL_REPLY = {"prompt_token_ids": [5, 6, 7], "kv_transfer_params": {"remote_block_ids": [1]}}


def pair_route(action, source):
    """A mint or honor route naming ``source`` (None: no tenant source)."""
    values = {"topology": "disaggregated", "action": action}
    if source is not None:
        values["tenant"] = source
    return RouteMetadata(values, float(len(values)))


def through(route, body, extra):
    """``body`` sent on ``route`` with headers ``extra``, the processor holding the
    pair's keys and the tenant key; the stream and its answers."""
    stream = Driven(trust=Trust(keys=lambda: KEYS, clock=lambda: NOW, tenant_key=KEY))
    assert stream.handle(headers(route, extra=extra)) == [ContinueHeaders()]
    return stream, stream.handle(RequestBody(json.dumps(body).encode(), True))


def minted_on(source, body, extra=JSON):
    """The kv_transfer_params a mint route naming ``source`` signs for ``body``."""
    stream, _ = through(pair_route("mint", source), {**body, "return_token_ids": True}, extra)
    assert stream.handle(ResponseHeaders(OK_JSON, False)) == [ContinueResponseHeaders()]
    answer = only(stream.handle(ResponseBody(json.dumps(PREFILL_REPLY).encode(), True)))
    assert isinstance(answer, ContinueResponseBody)
    assert answer.replacement is not None
    return json.loads(answer.replacement)["kv_transfer_params"]


SALTED = {**CHAT, "cache_salt": "client-salt"}
TEAM_A = tenant(b"team-a")


@pytest.mark.parametrize(
    ("minted", "honored"),
    [
        # (mint route's source, body, headers), then the honor route's.
        (("route:team-a", CHAT, JSON), (None, CHAT, JSON)),
        (("route:team-a", SALTED, JSON), (None, SALTED, JSON)),
        ((None, CHAT, JSON), ("route:team-a", CHAT, JSON)),
        ((None, SALTED, JSON), ("route:team-a", SALTED, JSON)),
        (("route:team-a", CHAT, JSON), ("route:team-b", CHAT, JSON)),
        (("header:x-auth-tenant", CHAT, TEAM_A), ("route:team-a", CHAT, JSON)),
        (("header:x-auth-tenant", SALTED, TEAM_A), ("header:x-auth-tenant", SALTED, tenant(b"b"))),
    ],
)
def test_a_proof_is_not_honored_in_another_partition(minted, honored):
    # The engine caches the KV a decode leg loads under the decode request's salt: a
    # proof honored in another partition (none, the client's raw salt, another
    # tenant's) would put the tenant's prompt there. The prompt digest alone, which
    # covers the client's own salt, matches in every case.
    source, body, extra = minted
    params = minted_on(source, body, extra)
    source, body, extra = honored
    stream, answers = through(pair_route("honor", source), {**body, KV: params}, extra)
    assert stream.decision.reason == "proof_partition_mismatch"
    # Removed (the route strips unproven parameters), the prompt recomputed.
    assert KV not in forwarded(answers)


@pytest.mark.parametrize(
    ("source", "body", "extra"),
    [
        ("route:team-a", CHAT, JSON),
        ("route:team-a", SALTED, JSON),
        ("header:x-auth-tenant", SALTED, TEAM_A),
        (None, SALTED, JSON),
        (None, CHAT, JSON),
    ],
)
def test_a_proof_is_honored_in_the_partition_it_was_minted_in(source, body, extra):
    params = minted_on(source, body, extra)
    stream, _ = through(pair_route("honor", source), {**body, KV: params}, extra)
    assert stream.decision.reason is Reason.TRUSTED_PROOF


def test_an_honor_route_that_denies_unproven_refuses_another_partitions_proof():
    params = minted_on("route:team-a", CHAT)
    route = RouteMetadata({**pair_route("honor", "route:team-b").values, "unproven": "deny"}, 4.0)
    _, answers = through(route, {**CHAT, KV: params}, JSON)
    assert only(answers).status == 400
    assert only(answers).details == "token_policy_proof_partition_mismatch"


# --- the tenant handed on: llm-d's fairness id and the partition id reported ----------

FAIR = RouteMetadata(
    {"action": "strip", "tenant": "header:x-auth-tenant", "fairness_id": True}, 3.0
)
FAIRNESS = "x-llm-d-inference-fairness-id"


def tag_of(tenant, key=KEY):
    return tenants.tag(tenants.key_for(key, tenant))


def opened(route, extra, *, mode=BUFFERED, eos=False, audit=False):
    """A stream of a tenant key, and its answers to headers with ``extra``."""
    stream = Driven(trust=Trust(tenant_key=KEY), audit=audit)
    event = headers(route, extra=extra, mode=mode, eos=eos)
    return stream, stream.handle(event)


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_the_fairness_id_is_the_tenants_partition_and_replaces_the_clients(mode):
    forged = (*tenant(b"team-a"), (FAIRNESS, b"team-z"), (FAIRNESS, b"team-y"))
    stream, answers = opened(FAIR, forged, mode=mode)
    if mode is DUPLEX:  # the headers are answered with the body
        assert answers == []
        answers = stream.handle(RequestBody(json.dumps(CHAT).encode(), True))
    expected = ContinueHeaders((FAIRNESS,), ((FAIRNESS, tag_of(A).encode()),))
    assert answers[0] == expected
    # The partition id is the proof's tag: not the salt, not the tenant, not the key.
    assert tag_of(A) not in (salt_of(A), A, KEY.decode())


def test_a_bodiless_request_gets_its_tenants_fairness_id_too():
    stream, answers = opened(FAIR, tenant(b"team-b"), eos=True)
    assert answers == [ContinueHeaders((FAIRNESS,), ((FAIRNESS, tag_of(B).encode()),))]
    assert stream.outcome.partition == tag_of(B)


def test_a_request_naming_no_tenant_in_audit_mode_goes_without_a_fairness_id():
    stream, answers = opened(FAIR, (*JSON, (FAIRNESS, b"team-z")), eos=True, audit=True)
    assert answers == [ContinueHeaders((FAIRNESS,))]
    assert stream.outcome.partition is None


def test_a_route_without_fairness_id_writes_no_header():
    stream, answers = opened(BY_HEADER, (*tenant(b"team-a"), (FAIRNESS, b"mine")), eos=True)
    assert answers == [ContinueHeaders()]
    assert stream.outcome.partition == tag_of(A)


def test_fairness_id_needs_a_tenant_source():
    stream, answers = opened(
        RouteMetadata({"action": "strip", "fairness_id": True}, 2.0), JSON, eos=True
    )
    error_body(answers)
    assert only(answers).status == 500
    message = stream.outcome.decision.refusal.detail
    assert (
        "'ext_proc.token_policy.fairness_id' needs field 'ext_proc.token_policy.tenant'" in message
    )


def test_a_fairness_route_whose_headers_were_skipped_is_refused():
    """One message per request: no answer to a body can write a header, so the client's
    copy would pass; the route must send its headers (envoy-config writes that)."""
    stream = Driven(trust=Trust(tenant_key=KEY))
    preamble = headers(FAIR, extra=(*tenant(b"team-a"), (FAIRNESS, b"team-z")))
    answers = stream.handle(RequestBody(json.dumps(CHAT).encode(), True, preamble))
    error_body(answers)
    assert only(answers).status == 500
    assert stream.outcome.decision.refusal.detail.endswith("(request_header_mode SEND)")


@pytest.mark.parametrize(
    ("route", "extra", "partition"),
    [
        (BY_HEADER, (*JSON, ("x-auth-tenant", b"team-a")), "header:x-auth-tenant:team-a"),
        (BY_ROUTE, JSON, "route:team-a"),
        (FAIR, (*JSON, ("x-auth-tenant", b"team-b")), "header:x-auth-tenant:team-b"),
    ],
)
def test_every_decision_of_a_tenants_request_reports_its_partition(route, extra, partition):
    stream, _ = send(route, CHAT, extra=extra)
    assert stream.outcome.decision.action != "deny"
    assert stream.outcome.partition == tag_of(partition)


@pytest.mark.parametrize(
    ("route", "extra"),
    [
        # A route without a tenant source: whatever the client sends names no partition.
        (RouteMetadata({"action": "strip"}, 1.0), (*JSON, ("x-tenant-id", b"team-a"))),
        (BY_HEADER, JSON),  # refused: no tenant
    ],
)
def test_a_request_without_an_authenticated_tenant_reports_no_partition(route, extra):
    stream, _ = send(route, CHAT, extra=extra)
    assert stream.outcome.partition is None
