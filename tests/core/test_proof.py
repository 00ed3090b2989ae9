import base64
import contextlib
import dataclasses
import json
import math
import tracemalloc

import blake3
import orjson
import pytest

from ext_proc.core import proof
from ext_proc.core.errors import BadRequest
from tests.core import previous_proofs
from tests.parsing import read

KEYS = proof.KeySet({"k1": b"k" * 32}, "k1")
PROMPT = {"model": "m", "messages": [{"role": "user", "content": "héllo"}]}


CHAT_PATH = "/v1/chat/completions"


def digest(document=PROMPT, orjson_safe=True, endpoint=CHAT_PATH):
    return proof.prompt_digest(document, orjson_safe, endpoint)


def minted(params, expiry=100):
    return {
        **params,
        proof.PROOF_KEY: proof.mint(KEYS, params, digest(), expiry, minted=expiry - 20),
    }


def test_round_trip():
    params = minted({"prompt_token_ids": [1, 2], "remote_port": 5600})
    assert proof.verify(KEYS, params, digest(), now=100, skew=0) is None


def test_format():
    token = proof.mint(KEYS, {"prompt_token_ids": [1]}, digest(), 1234, minted=1214)
    assert token is not None
    version, key_id, minted_at, expiry, nonce, partition, shown, mac = token.split(".")
    assert (version, key_id, minted_at, expiry, partition) == ("tp4", "k1", "1214", "1234", "-")
    assert len(nonce) == 16
    assert len(shown) == len(mac) == 43
    tag = proof.mint(
        KEYS, {"prompt_token_ids": [1]}, digest(), 1234, minted=1214, partition="A" * 22
    )
    assert tag is not None
    assert tag.split(".")[5] == "A" * 22


def _b64(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_the_mac_is_keyed_blake3_as_documented():
    # docs/trust.md's definition, written out with the test's copy of the key.
    params = {"prompt_token_ids": [7, 8], "remote_port": 5600}
    partition = "P" * 21 + "A"
    token = proof.mint(
        KEYS, params, digest(), 1234, bytes(range(12)), minted=1214, partition=partition
    )
    assert token is not None
    nonce, shown = _b64(bytes(range(12))), _b64(digest())
    key = blake3.blake3(b"k" * 32, derive_key_context="ext_proc token_policy_proof tp4 MAC key")
    message = (
        f'tp4\nk1\n1214\n1234\n{partition}\n{shown}\n{{"remote_port":5600}}\n[7,8]\n{nonce}'
    ).encode()
    mac = blake3.blake3(message, key=key.digest()).digest()
    assert token == f"tp4.k1.1214.1234.{nonce}.{partition}.{shown}.{_b64(mac)}"


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}
TOOL_REORDERED = {"type": "function", "function": {"name": "f", "parameters": {"a": 2, "b": 1}}}


def tp2_params(document=PROMPT, endpoint=CHAT_PATH):
    """Parameters a replica of the release before tp3 signed for ``document``."""
    params = {"prompt_token_ids": [7, 8], "remote_port": 5600}
    old_digest = previous_proofs.digest(document, endpoint)
    token = previous_proofs.mint_tp2("k1", b"k" * 32, params, old_digest, 1234, bytes(12))
    return {**params, proof.PROOF_KEY: token}


def test_a_tp2_proof_minted_as_the_previous_release_did_is_superseded():
    # Its own key, a current expiry, the prompt it was minted for: still not honored.
    params = tp2_params()
    assert params[proof.PROOF_KEY].startswith("tp2.k1.1234.")
    assert proof.verify(KEYS, params, digest(), now=1200, skew=5) == "proof_superseded"


def test_why_tp2_is_not_verified_its_digest_binds_no_member_order():
    # The same tool's schema in another order is another prompt (the chat template
    # writes the members in the request's order): tp3 tells the two apart, tp2 cannot,
    # so a tp2 proof would carry ids to a prompt they were not computed for.
    signed, sent = {**PROMPT, "tools": [TOOL]}, {**PROMPT, "tools": [TOOL_REORDERED]}
    assert previous_proofs.digest(signed, CHAT_PATH) == previous_proofs.digest(sent, CHAT_PATH)
    assert digest(signed) != digest(sent)


def test_a_tp1_proof_is_superseded():
    params = {"prompt_token_ids": [7, 8], proof.PROOF_KEY: f"tp1.k1.1234.{'A' * 43}.{'A' * 43}"}
    assert proof.verify(KEYS, params, digest(), now=1200, skew=5) == "proof_superseded"


@pytest.mark.parametrize(
    "token",
    [
        "tp2.k1.1234",  # too few parts
        f"tp2.k1.1234.{'A' * 15}.{'A' * 43}.{'A' * 43}",  # a nonce one character short
        f"tp5.k1.1234.{'A' * 16}.-.{'A' * 43}.{'A' * 43}",  # no format this release knows
        f"tp3.k1.1234.{'A' * 16}.-.{'A' * 43}.{'A' * 43}",  # tp3 had no partition
        f"tp4.k1.1234.{'A' * 16}.{'A' * 43}.{'A' * 43}",  # a tp4 without its partition
        f"tp4.k1.1234.{'A' * 16}.-.{'A' * 43}.{'A' * 43}",  # a tp4 without its minting time
        f"tp1.k1.1234.{'A' * 16}.{'A' * 43}.{'A' * 43}",  # tp1 had no nonce
    ],
)
def test_only_the_exact_shape_of_an_earlier_format_is_superseded(token):
    params = {"prompt_token_ids": [7, 8], proof.PROOF_KEY: token}
    assert proof.verify(KEYS, params, digest(), now=1200, skew=5) == "proof_malformed"


def test_a_turn_claim_never_reads_a_superseded_prefill_proof():
    # A tp2 proof where a turn is expected is no turn, as a tp4 one is not; a tt3 one is
    # a turn of the format before, superseded.
    assert proof.claim(KEYS, tp2_params(), proof.TURN_VERSION) == "proof_malformed"
    assert proof.claim(KEYS, tp3_params(), proof.TURN_VERSION) == "proof_malformed"
    turn = tp3_params(version="tt3")
    assert proof.claim(KEYS, turn, proof.TURN_VERSION) == "proof_superseded"
    assert proof.claim(KEYS, turn) == "proof_malformed"


def tp3_params(version="tp3"):
    """Parameters the release before tp4 signed for ``PROMPT`` (tp3's digest is tp4's)."""
    params = {"prompt_token_ids": [7, 8], "remote_port": 5600}
    token = previous_proofs.mint_tp3("k1", b"k" * 32, params, digest(), 1234, bytes(12), version)
    return {**params, proof.PROOF_KEY: token}


def test_a_tp3_proof_is_superseded_it_names_no_partition():
    # Its own key, a current expiry, the prompt it was minted for, on a route of no
    # tenant: still not honored. A tp3 proof may have been minted on a tenant's route,
    # and nothing in it says so: honored here, the tenant's prompt KV would be cached
    # under the client's raw salt.
    params = tp3_params()
    assert params[proof.PROOF_KEY].startswith("tp3.k1.1234.")
    for partition in (proof.NO_PARTITION, "A" * 22):
        found = proof.verify(KEYS, params, digest(), now=1200, skew=5, partition=partition)
        assert found == "proof_superseded"


def test_every_mint_is_another_proof_of_the_same_parameters():
    # Two prefill responses alike to the byte in one second are two proofs, each spent
    # on its own (replay.py): neither decode is refused as the other's replay.
    params = {"prompt_token_ids": [1], "remote_block_ids": [3]}
    first, second = (proof.mint(KEYS, params, digest(), 100, minted=90) for _ in range(2))
    assert first != second
    for token in (first, second):
        assert proof.verify(KEYS, {**params, proof.PROOF_KEY: token}, digest(), 100, 0) is None
    tickets = {proof.ticket({proof.PROOF_KEY: t}, 0).key for t in (first, second)}
    assert len(tickets) == 2
    fixed = proof.mint(KEYS, params, digest(), 100, nonce=bytes(12), minted=90)
    assert fixed == proof.mint(KEYS, params, digest(), 100, nonce=bytes(12), minted=90)


def test_canonical_form_ignores_key_order_and_the_proof_only():
    a = proof.canonical({"b": 1, "a": [1, 2], "prompt_token_ids": [3]})
    b = proof.canonical({"prompt_token_ids": [3], "a": [1, 2], "b": 1, proof.PROOF_KEY: "x"})
    assert a == b
    assert a != proof.canonical({"b": 1, "a": [1, 2], "prompt_token_ids": [3, 4]})
    assert proof.canonical({"prompt_token_ids": [1]}) != proof.canonical(
        {"prompt_token_ids": [True]}
    )
    assert proof.canonical({"prompt_token_ids": [1]}) != proof.canonical(
        {"prompt_token_ids": [1.0]}
    )
    assert proof.canonical({"x": "é"}) != proof.canonical({"x": "e"})


@pytest.mark.parametrize(
    "params",
    [{"x": float("nan")}, {"prompt_token_ids": [1, float("nan")]}, {"prompt_token_ids": [None]}],
)
def test_parameters_that_cannot_be_rendered_exactly_are_not_provable(params):
    assert proof.canonical(params) is None
    assert proof.mint(KEYS, params, digest(), 100, minted=90) is None


def test_digest_binds_every_prompt_field_but_the_unbound_ones():
    base = digest()
    assert digest({**PROMPT, "max_tokens": 1, "stream": True, "return_token_ids": True}) == base
    assert digest({**PROMPT, "kv_transfer_params": {"a": 1}}) == base
    for changed in (
        {**PROMPT, "model": "n"},
        {**PROMPT, "tools": []},
        {**PROMPT, "chat_template_kwargs": {"x": 1}},
        {**PROMPT, "temperature": 0.5},
        {**PROMPT, "messages": [{"role": "system", "content": "s"}, *PROMPT["messages"]]},
    ):
        assert digest(changed) != base


def test_digest_is_the_same_whichever_parser_read_the_document():
    raw = json.dumps({**PROMPT, "kv_transfer_params": {"n": 10**30}}).encode()
    parsed = read(raw)
    assert not parsed.orjson_safe  # a huge integer elsewhere: json.loads read it
    assert digest(parsed.document, parsed.orjson_safe) == digest()
    utf16 = read(json.dumps(PROMPT).encode("utf-16"))
    assert digest(utf16.document, utf16.orjson_safe) == digest()


# A tool whose parameters vLLM keeps in the request's member order: its chat templates
# write them so (transformers' ``tojson`` does not sort keys).
TOOL_AB = b'{"type":"function","function":{"name":"f","parameters":{"a":1,"b":2}}}'
TOOL_BA = b'{"type":"function","function":{"name":"f","parameters":{"b":2,"a":1}}}'


def with_tool(tool: bytes, space: bytes = b"") -> bytes:
    return b'{"model":"m",%s"tools":[%s]}' % (space, tool)


def test_digest_binds_the_order_the_server_renders_members_in():
    ordered = read(with_tool(TOOL_AB)).document
    assert digest(ordered) != digest(read(with_tool(TOOL_BA)).document)
    # json.dumps, where only it renders, binds the same order.
    assert proof.prompt_digest_slow(ordered, CHAT_PATH) != proof.prompt_digest_slow(
        read(with_tool(TOOL_BA)).document, CHAT_PATH
    )


@pytest.mark.parametrize(
    ("variant", "same"),
    [
        # Whitespace is no part of the document.
        (with_tool(TOOL_AB.replace(b":", b" : ").replace(b",", b" ,\n "), b" \t"), True),
        # A duplicate key keeps its first place and its last value, as json.loads reads.
        (with_tool(TOOL_AB.replace(b'"b":2', b'"b":0,"a":1,"b":2')), True),
        (with_tool(TOOL_AB.replace(b'"a":1', b'"b":0,"a":1')), False),
        # An escaped key is its character.
        (with_tool(TOOL_AB.replace(b'"a"', b'"\\u0061"')), True),
    ],
)
def test_the_order_bound_is_the_one_json_loads_reads(variant, same):
    parsed = read(variant)
    assert list(parsed.document["tools"][0]["function"]["parameters"]) == list(
        json.loads(variant)["tools"][0]["function"]["parameters"]
    )
    expected = digest(read(with_tool(TOOL_AB)).document)
    assert (digest(parsed.document, parsed.orjson_safe) == expected) is same


def test_nan_in_a_prompt_field_is_not_null():
    assert digest({**PROMPT, "temperature": float("nan")}, False) != digest(
        {**PROMPT, "temperature": None}, False
    )


def _without_nonce(params):
    """The proof as the format before the nonce wrote it (tp1, five fields)."""
    _, key_id, _, expiry, _, _, shown, mac = params[proof.PROOF_KEY].split(".")
    return ".".join(("tp1", key_id, expiry, shown, mac))


def _without_partition(params):
    """The proof as tp3 wrote it (six fields, no partition)."""
    _, key_id, _, expiry, nonce, _, shown, mac = params[proof.PROOF_KEY].split(".")
    return ".".join(("tp3", key_id, expiry, nonce, shown, mac))


def _other_partition(params):
    fields = params[proof.PROOF_KEY].split(".")
    fields[5] = "A" * 22
    return ".".join(fields)


def _other_nonce(params):
    version, key_id, minted_at, expiry, nonce, partition, shown, mac = params[
        proof.PROOF_KEY
    ].split(".")
    other = ("B" if nonce[0] == "A" else "A") + nonce[1:]
    return ".".join((version, key_id, minted_at, expiry, other, partition, shown, mac))


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda p: p.pop(proof.PROOF_KEY), "proof_missing"),
        (lambda p: p.update({proof.PROOF_KEY: None}), "proof_missing"),
        (lambda p: p.update({proof.PROOF_KEY: ["tp1"]}), "proof_malformed"),
        (lambda p: p.update({proof.PROOF_KEY: _without_partition(p)}), "proof_superseded"),
        (
            lambda p: p.update({proof.PROOF_KEY: "tp2" + _without_partition(p)[3:]}),
            "proof_superseded",
        ),
        (lambda p: p.update({proof.PROOF_KEY: _without_nonce(p)}), "proof_superseded"),
        (lambda p: p.update({proof.PROOF_KEY: _other_partition(p)}), "proof_bad_signature"),
        (lambda p: p.update({proof.PROOF_KEY: _other_nonce(p)}), "proof_bad_signature"),
        (lambda p: p.update({proof.PROOF_KEY: p[proof.PROOF_KEY] + "x"}), "proof_malformed"),
        (
            lambda p: p.update({proof.PROOF_KEY: p[proof.PROOF_KEY].replace(".k1.", ".k9.")}),
            "proof_unknown_key",
        ),
        (
            lambda p: p.update({proof.PROOF_KEY: p[proof.PROOF_KEY].replace(".100.", ".999.")}),
            "proof_bad_signature",
        ),
        (lambda p: p.update(prompt_token_ids=[1, 3]), "proof_bad_signature"),
        (lambda p: p.update(extra=True), "proof_bad_signature"),
        (lambda p: p.update(prompt_token_ids=[1, float("nan")]), "proof_malformed"),
    ],
)
def test_every_rejection_reason(edit, reason):
    params = minted({"prompt_token_ids": [1, 2]})
    edit(params)
    assert proof.verify(KEYS, params, digest(), now=100, skew=0) == reason


def test_expiry_with_skew():
    params = minted({"prompt_token_ids": [1]}, expiry=100)
    assert proof.verify(KEYS, params, digest(), now=105, skew=5) is None
    assert proof.verify(KEYS, params, digest(), now=105.5, skew=5) == "proof_expired"


def test_a_proof_that_outlives_this_deployments_lifetime_is_refused():
    # Minted (at 100) with a longer lifetime than the connector's lease allows here.
    params = {"prompt_token_ids": [1, 2]}
    params[proof.PROOF_KEY] = proof.mint(KEYS, params, digest(), 200, minted=100)
    for lifetime, why in [(20, "proof_outlives_lease"), (99, "proof_outlives_lease"), (100, None)]:
        found = proof.verify(KEYS, params, digest(), now=100, skew=5, lifetime=lifetime)
        assert found == why, lifetime


def test_prompt_mismatch():
    params = minted({"prompt_token_ids": [1]})
    other = digest({**PROMPT, "model": "n"})
    assert proof.verify(KEYS, params, other, now=90, skew=0) == "prompt_mismatch"


def test_a_key_of_another_deployment_with_the_same_id_fails():
    params = minted({"prompt_token_ids": [1]})
    theirs = proof.KeySet({"k1": b"z" * 32}, "k1")
    assert proof.verify(theirs, params, digest(), now=90, skew=0) == "proof_bad_signature"


def test_no_signing_key_mints_nothing():
    assert (
        proof.mint(proof.KeySet({"k1": b"k" * 32}, None), {"a": 1}, digest(), 1, minted=1) is None
    )


def nested(depth, leaf=1):
    deep: object = leaf
    for _ in range(depth):
        deep = [deep]
    return deep


def test_a_prompt_too_deep_to_render_is_a_refusal_not_a_crash():
    document = {**PROMPT, "x": nested(5000)}
    assert proof.prompt_digest(document, False, CHAT_PATH) is None
    with pytest.raises(BadRequest) as caught:
        proof.prompt_digest_slow(document, CHAT_PATH)
    assert caught.value.reason == "body_too_deep"


def rendered_digest(document, endpoint=CHAT_PATH):
    """The digest as docs/trust.md defines it, the rendering written out whole."""
    bound = {k: v for k, v in document.items() if k not in proof.UNBOUND_FIELDS}
    rendering = None
    if not any(isinstance(v, float) and not math.isfinite(v) for v in _values(bound)):
        with contextlib.suppress(TypeError, orjson.JSONEncodeError):  # orjson: null for NaN
            rendering = b"o" + orjson.dumps(bound)
    if rendering is None:
        text = json.dumps(bound, separators=(",", ":"), ensure_ascii=True)
        rendering = b"j" + text.encode()
    named = endpoint.encode()
    return blake3.blake3(b"%d:%s" % (len(named), named) + rendering).digest()


def _values(value):
    yield value
    if isinstance(value, dict | list):
        for child in value.values() if isinstance(value, dict) else value:
            yield from _values(child)


@pytest.mark.parametrize(
    ("extra", "orjson_safe", "fast"),
    [
        ({"x": [1.5, "é"]}, True, True),
        # Deeper than the 254 levels orjson writes, though it reads them.
        ({"x": nested(300, "\U0001f600" * 70_000)}, True, False),
        ({"x": nested(300, float("nan"))}, False, False),
        ({"x": [float("inf")]}, False, False),
        ({"x": 2**70}, False, False),
        ({"x": "\ud800"}, False, False),
        # json.loads read it, but orjson renders the bound fields exactly.
        ({"x": [1.5, "é"], "max_tokens": float("nan")}, False, True),
    ],
)
def test_json_dumps_renders_the_digest_only_where_orjson_cannot(extra, orjson_safe, fast):
    document = {**PROMPT, **extra}
    found = proof.prompt_digest(document, orjson_safe, CHAT_PATH)
    assert (found is not None) is fast
    digest = found if fast else proof.prompt_digest_slow(document, CHAT_PATH)
    # The same bytes hashed as when the rendering was built whole: proofs minted before
    # still verify.
    assert digest == rendered_digest(document)


def test_a_proof_is_bound_to_the_endpoint_it_was_minted_for():
    params = minted({"prompt_token_ids": [1, 2]})
    assert proof.verify(KEYS, params, digest(), now=90, skew=0) is None
    for other in ("/v1/messages", "/v1/responses", "/v1/completions", "/v1/chat/completions/"):
        assert proof.verify(KEYS, params, digest(endpoint=other), 90, 0) == "prompt_mismatch"


def test_endpoint_and_prompt_cannot_run_into_each_other():
    # Length-prefixed: moving bytes between the endpoint and the fields changes the digest.
    assert digest({}, endpoint="/v1/a") != digest({}, endpoint="/v1/a" + "o{}")
    assert proof.prompt_digest({}, True, "/a") != proof.prompt_digest({}, True, "/a\n")


def _respell_last(text: str) -> list[str]:
    """Every other base64url character that decodes ``text`` to the same bytes."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    head = text[:-1]
    same = proof._unb64(text)
    return [head + c for c in alphabet if c != text[-1] and proof._unb64(head + c) == same]


def test_only_the_canonical_base64_of_a_proof_is_accepted():
    params = minted({"prompt_token_ids": [1, 2]})
    version, key_id, minted_at, expiry, nonce, _, shown, mac = params[proof.PROOF_KEY].split(".")
    partition = "B" * 21 + "A"
    respelled_macs = _respell_last(mac)
    respelled_digests = _respell_last(shown)
    respelled_partitions = _respell_last(partition)
    assert len(respelled_macs) == 3  # 43 characters carry 2 spare bits: 4 spellings
    assert len(respelled_digests) == 3
    assert len(respelled_partitions) == 15  # 22 carry 4: 16 spellings
    for fields in (
        [(partition, shown, m) for m in respelled_macs]
        + [(partition, d, mac) for d in respelled_digests]
        + [(p, shown, mac) for p in respelled_partitions]
    ):
        token = ".".join((version, key_id, minted_at, expiry, nonce, *fields))
        assert proof.verify(KEYS, {**params, proof.PROOF_KEY: token}, digest(), 0, 0) == (
            "proof_malformed"
        )


def test_parameters_too_large_to_render_are_not_provable_and_cost_little():
    # A client chooses what a proof's parameters hold before the MAC is checked: a huge
    # astral string would make json.dumps hold several times the body uncharged.
    big = {"prompt_token_ids": [1], "remote_engine_id": "\U0001f600" * (1 << 20)}
    tracemalloc.start()
    try:
        assert proof.canonical(big) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    # A well-formed proof of other parameters: refused before any rendering.
    token = proof.mint(KEYS, {"prompt_token_ids": [1]}, digest(), 100, minted=90)
    assert proof.verify(KEYS, {**big, proof.PROOF_KEY: token}, digest(), 100, 0) == (
        "proof_malformed"
    )
    signed = {"prompt_token_ids": [1], "remote_block_ids": list(range(8192)), "h": "é" * 1000}
    assert proof.canonical(signed) is not None  # a long prompt's block ids sign
    assert proof.mint(KEYS, big, digest(), 100, minted=90) is None


def test_a_settled_claim_is_verify():
    params = minted({"prompt_token_ids": [1, 2], "remote_port": 5600})
    claim = proof.claim(KEYS, params)
    assert isinstance(claim, proof.Claim)
    for now, skew, lifetime, seen in [
        (100, 0, math.inf, digest()),
        (101, 0, math.inf, digest()),  # expired
        (50, 0, 10, digest()),  # outlives the lease
        (100, 0, math.inf, digest({"model": "other"})),  # another prompt
    ]:
        for partition in (proof.NO_PARTITION, "A" * 22):
            expected = proof.verify(
                KEYS, params, seen, now, skew, lifetime=lifetime, partition=partition
            )
            assert claim.settle(seen, now, skew, lifetime, partition=partition) == expected
    forged = dataclasses.replace(claim, shown=bytes(32))
    assert forged.settle(digest(), 100, 0, math.inf) == "proof_bad_signature"


TEAM_A, TEAM_B = "A" * 22, "B" * 21 + "A"


def test_a_proof_is_honored_only_in_the_partition_it_was_minted_in():
    params = {"prompt_token_ids": [1, 2]}
    tagged = {
        **params,
        proof.PROOF_KEY: proof.mint(KEYS, params, digest(), 100, minted=90, partition=TEAM_A),
    }
    plain = minted(params)
    for found, partition, reason in [
        (tagged, TEAM_A, None),
        (tagged, proof.NO_PARTITION, "proof_partition_mismatch"),
        (tagged, TEAM_B, "proof_partition_mismatch"),
        (plain, TEAM_A, "proof_partition_mismatch"),
        (plain, proof.NO_PARTITION, None),
    ]:
        assert proof.verify(KEYS, found, digest(), 100, 0, partition=partition) == reason
    # After the MAC and the lifetime, before the prompt.
    assert proof.verify(KEYS, tagged, digest(), 101, 0, partition=TEAM_B) == "proof_expired"
    other = digest({"model": "other"})
    assert proof.verify(KEYS, tagged, other, 100, 0, partition=TEAM_B) == (
        "proof_partition_mismatch"
    )
    assert proof.verify(KEYS, tagged, other, 100, 0, partition=TEAM_A) == "prompt_mismatch"


def test_what_a_claim_refuses_before_any_mac():
    params = minted({"prompt_token_ids": [1]})
    assert proof.claim(KEYS, {"prompt_token_ids": [1]}) == "proof_missing"
    assert proof.claim(KEYS, {**params, proof.PROOF_KEY: "tp4.x"}) == "proof_malformed"
    assert proof.claim(proof.KeySet({}, None), params) == "proof_unknown_key"


# --- the minting time --------------------------------------------------------------------


def test_a_proof_states_when_it_was_minted_under_its_mac():
    params = {"prompt_token_ids": [7, 8], "remote_port": 5600}
    token = proof.mint(KEYS, params, digest(), 1234, bytes(12), minted=1214)
    assert token is not None
    version, key_id, minted_at, expiry, *_ = token.split(".")
    assert (version, key_id, minted_at, expiry) == ("tp4", "k1", "1214", "1234")
    signed = {**params, proof.PROOF_KEY: token}
    assert proof.verify(KEYS, signed, digest(), 1220, 0, lifetime=20) is None
    # Another minting time, the rest as signed: another MAC.
    for other in ("1215", "1213"):
        moved = token.replace(".1214.1234.", f".{other}.1234.")
        found = proof.verify(KEYS, {**params, proof.PROOF_KEY: moved}, digest(), 1220, 0)
        assert found == "proof_bad_signature", other


def test_a_proof_minted_for_longer_than_this_processors_lifetime_is_refused():
    # Minted for 20 s: a processor whose proofs live 10 s refuses it at any moment of
    # its life (its lease bound, ttl + 2 x skew, would not hold for it), even when its
    # expiry lies no further ahead than its own lifetime.
    params = {"prompt_token_ids": [1, 2]}
    token = proof.mint(KEYS, params, digest(), 120, minted=100)
    signed = {**params, proof.PROOF_KEY: token}
    for now in (100, 111, 115):
        for lifetime, why in [(10, "proof_outlives_lease"), (19, "proof_outlives_lease")]:
            assert proof.verify(KEYS, signed, digest(), now, 5, lifetime=lifetime) == why
        assert proof.verify(KEYS, signed, digest(), now, 5, lifetime=20) is None
    turn = proof.mint(KEYS, params, digest(), 400, version=proof.TURN_VERSION, minted=100)
    claim = proof.claim(KEYS, {**params, proof.PROOF_KEY: turn}, proof.TURN_VERSION)
    assert isinstance(claim, proof.Claim)
    assert claim.authentic(390, 5, 299) == "proof_outlives_lease"
    assert claim.authentic(390, 5, 300) is None


def test_a_proof_minted_ahead_of_this_clock_by_more_than_the_skew_is_refused():
    # No minter within the skew states a later time: a proof that does comes from a
    # clock outside it, and dated by that time it would look minted after a record
    # that began after it was spent (tests/edge/test_record.py).
    params = {"prompt_token_ids": [1, 2]}
    token = proof.mint(KEYS, params, digest(), 115, minted=110)
    signed = {**params, proof.PROOF_KEY: token}
    for now, why in [(100, "proof_outlives_lease"), (104.9, "proof_outlives_lease")]:
        assert proof.verify(KEYS, signed, digest(), now, 5, lifetime=20) == why
    assert proof.verify(KEYS, signed, digest(), 105, 5, lifetime=20) is None


@pytest.mark.parametrize(
    "spelt",
    [
        "0100",  # a leading zero: 100 spelt twice
        "+100",
        "100.0",
        "1e2",
        "121",  # minted after its expiry: no minter writes it
        "0",
    ],
)
def test_a_minting_time_has_one_spelling(spelt):
    params = {"prompt_token_ids": [1, 2]}
    token = proof.mint(KEYS, params, digest(), 120, minted=100)
    assert token is not None
    respelt = token.replace(".100.120.", f".{spelt}.120.")
    assert respelt != token
    found = proof.verify(KEYS, {**params, proof.PROOF_KEY: respelt}, digest(), 110, 5)
    assert found == "proof_malformed"


def test_a_ticket_is_dated_by_the_minting_time_less_the_skew():
    token = proof.mint(KEYS, {"remote_engine_id": "e"}, bytes(32), 5000, minted=4990)
    assert token is not None
    found = proof.ticket({proof.PROOF_KEY: token}, 2)
    assert (found.expires_at, found.minted_after) == (5000 + 3 * 2, 4990 - 2)
    found = proof.ticket({proof.PROOF_KEY: token}, 0.5)
    assert (found.expires_at, found.minted_after) == (5003, 4989)
