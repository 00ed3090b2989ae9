"""Turns through the stream machine: a decode route whose responses are processed signs
the decode server's turn parameters; the next turn's prefill leg honors them once, for
the same conversation only, and signs its response only when the prefill server's
prompt begins with the tokens read back (ext_proc/core/turns.py)."""

import dataclasses
import json

import pytest

from ext_proc.core import policy, proof, tenants, turns
from ext_proc.core.decisions import Allow, Mint, Strip
from ext_proc.core.events import (
    BodyMode,
    ContinueBody,
    ContinueResponseBody,
    ContinueResponseHeaders,
    Peer,
    Reject,
    RequestBody,
    ResponseBody,
    ResponseHeaders,
    RouteMetadata,
)
from ext_proc.core.proof import Trust
from ext_proc.core.reasons import Reason
from ext_proc.core.replay import Verdict
from ext_proc.core.route_policy import Action, IdentityType, RoutePolicy, Topology
from ext_proc.core.vllm_request import CONNECTOR_REQUESTS
from ext_proc.edge.record import LocalRecord
from tests.core import previous_proofs
from tests.core.messages import BUFFERED, CHAT_PATH, KEYS, OK_JSON, headers
from tests.driver import DAY, Driven

NOW = 1000.0
DECODE_ROUTE = RouteMetadata({"topology": "disaggregated", "action": "honor"}, 2.0)
PREFILL_ROUTE = RouteMetadata(
    {"topology": "disaggregated", "action": "mint", "connector": "nixl"}, 3.0
)
NIXL = tuple(CONNECTOR_REQUESTS["nixl"].items())
SYSTEM = {"role": "system", "content": "be brief"}
TURN1 = [SYSTEM, {"role": "user", "content": "hello"}]
PROMPT_IDS = list(range(100, 120))  # the decode server's prompt: 20 tokens
OUTPUT_IDS = [7, 8, 9, 10]
HELD = 23  # prompt + output less the last output token: what its blocks hold
TURN_PARAMS = {
    "do_remote_prefill": False,
    "do_remote_decode": True,
    "remote_block_ids": [[4, 5]],
    "remote_engine_id": "decode-engine",
    "remote_request_id": "cmpl-1",
    "remote_host": "10.0.0.2",
    "remote_port": 5601,
    "tp_size": 1,
    "dcp_size": 1,
    "pp_size": 1,
    "remote_num_tokens": HELD,
    "remote_blocks_expiry_time": 1234.5,
    "transfer_mode": "pull",
}


TENANT_KEY = b"t" * 32


def trust(now=NOW):
    return Trust(keys=lambda: KEYS, clock=lambda: now, tenant_key=TENANT_KEY)


def record():
    return LocalRecord.anonymous(64, lambda: NOW, began=NOW - DAY)


def request(route, body, *, response=BUFFERED, spent=None, now=NOW):
    stream = Driven(trust=trust(now), spent=spent or record())
    stream.handle(headers(route, response=response))
    answers = stream.handle(RequestBody(json.dumps(body).encode(), True))
    return stream, answers


def respond(stream, body):
    assert stream.handle(ResponseHeaders(OK_JSON, False)) == [ContinueResponseHeaders()]
    (answer,) = stream.handle(ResponseBody(json.dumps(body).encode(), True))
    assert isinstance(answer, ContinueResponseBody)
    return answer


def decode_response(content="hi there", params=TURN_PARAMS):
    return {
        "choices": [
            {"message": {"role": "assistant", "content": content}, "token_ids": OUTPUT_IDS}
        ],
        "prompt_token_ids": PROMPT_IDS,
        "kv_transfer_params": params,
    }


def decode_leg(messages=TURN1, **more):
    """A decode leg whose parameters carry a prefill proof for its prompt."""
    document = {"model": "m", "messages": messages, "max_tokens": 8, **more}
    digest = proof.prompt_digest(document, True, CHAT_PATH)
    params = {"do_remote_prefill": True, "remote_block_ids": [[1]], "prompt_token_ids": PROMPT_IDS}
    token = proof.mint(KEYS, params, digest, int(NOW) + 10, minted=int(NOW))
    return {**document, "kv_transfer_params": {**params, proof.PROOF_KEY: token}}


def tenant_route(route, source):
    """``route`` naming the tenant ``source``."""
    return RouteMetadata({**route.values, "tenant": source}, route.size + 1)


def prefill_proven(route, messages=TURN1):
    """A decode leg whose parameters a prefill (mint) ``route`` signed, through the
    stream: its proof binds the route's partition."""
    document = {"model": "m", "messages": messages, "max_tokens": 8}
    stream, _ = request(route, document, response=None)
    reply = {
        "prompt_token_ids": PROMPT_IDS,
        "kv_transfer_params": {"do_remote_prefill": True, "remote_block_ids": [[1]]},
    }
    answer = respond(stream, reply)
    assert stream.decision == Mint(Reason.MINTED, len(PROMPT_IDS))
    return {**document, "kv_transfer_params": json.loads(answer.replacement)["kv_transfer_params"]}


def first_turn(leg=None, route=DECODE_ROUTE, **options):
    """The decode leg of turn 1 (``leg``, else ``decode_leg()``) on a ``route`` that
    processes responses: the signed object."""
    stream, _ = request(route, leg or decode_leg())
    assert stream.decision.reason is Reason.TRUSTED_PROOF
    answer = respond(stream, decode_response(**options))
    assert stream.decision == Mint(Reason.MINTED, HELD)
    return json.loads(answer.replacement)["kv_transfer_params"]


def second_turn(params, answer="hi there", **changes):
    body = {
        "model": "m",
        "messages": [
            *TURN1,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "more"},
        ],
        "max_tokens": 1,
        "return_token_ids": True,
        "kv_transfer_params": params,
    }
    body.update(changes)
    return body


def forwarded(answers):
    (answer,) = answers
    assert isinstance(answer, ContinueBody)
    return json.loads(answer.replacement)


def test_the_decode_response_is_signed_as_a_turn_of_this_conversation():
    params = first_turn()
    assert params[proof.PROOF_KEY].startswith("tt4.k1.")
    assert {
        k: v for k, v in params.items() if k not in (proof.PROOF_KEY, turns.TURN_KEY)
    } == TURN_PARAMS
    sequence = (PROMPT_IDS + OUTPUT_IDS)[:HELD]
    tokens = turns._b64(turns.tokens_digest(sequence))
    assert params[turns.TURN_KEY] == {"messages": 2, "tokens": tokens}
    # Never a decode leg's proof: the decode route reads it as malformed.
    stream, _ = request(
        DECODE_ROUTE, {"model": "m", "messages": TURN1, "kv_transfer_params": params}
    )
    assert stream.decision.reason is Reason.PROOF_MALFORMED


def test_the_next_turn_reads_the_conversation_back_once():
    params = first_turn()
    spent = record()
    stream, answers = request(PREFILL_ROUTE, second_turn(params), spent=spent)
    assert isinstance(stream.decision, Strip)
    assert stream.decision.reason is Reason.TURN_READ_BACK
    sent = forwarded(answers)
    read_back = {
        k: v for k, v in TURN_PARAMS.items() if k not in ("do_remote_prefill", "do_remote_decode")
    }
    assert sent["kv_transfer_params"] == {**dict(CONNECTOR_REQUESTS["nixl"]), **read_back}
    assert len(sent["cache_salt"]) >= 16
    # The prefill server's prompt begins with the tokens read back: its response is signed.
    response = {
        "prompt_token_ids": (PROMPT_IDS + OUTPUT_IDS + [1, 2, 3]),
        "kv_transfer_params": {"do_remote_prefill": True, "remote_block_ids": [1]},
    }
    answer = respond(stream, response)
    assert stream.decision == Mint(Reason.MINTED, len(response["prompt_token_ids"]))
    assert json.loads(answer.replacement)["kv_transfer_params"][proof.PROOF_KEY].startswith("tp4.")
    # The same proof again: spent, nothing read back.
    again, answers = request(PREFILL_ROUTE, second_turn(params), spent=spent)
    assert again.decision.reason is Reason.PROOF_REPLAYED
    assert forwarded(answers)["kv_transfer_params"] == dict(CONNECTOR_REQUESTS["nixl"])
    assert "cache_salt" not in forwarded(answers)


@pytest.mark.parametrize("audit", [False, True])
def test_a_turn_the_record_cannot_consult_is_refused_with_a_503_not_recomputed(audit):
    """The record of spent proofs did not answer for the turn (it cannot say the turn
    was not read back before): the next turn's prefill leg is refused with a 503 to
    retry, in audit mode too, instead of prefilling the whole conversation again."""
    params = first_turn()
    stream = Driven(trust=trust(), audit=audit)
    stream.handle(headers(PREFILL_ROUTE, response=BUFFERED))
    asked = stream.stream.handle(RequestBody(json.dumps(second_turn(params)).encode(), True))
    assert asked.ask is not None
    (answer,) = stream.stream.spent(Verdict.UNAVAILABLE).answers
    assert isinstance(answer, Reject)
    assert answer.status == 503
    assert answer.headers == (("retry-after", b"1"),)
    assert answer.details == "token_policy_proof_record_unavailable"
    assert json.loads(answer.body)["error"]["type"] == "ServiceUnavailableError"
    assert stream.budget.used == 0


def test_a_turn_minted_before_the_record_began_is_not_read_back_and_is_prefilled():
    """The record began after the turn was minted (a processor restarted whole): no
    retry can ever vouch for the turn, so the prefill leg goes on without it, as for a
    turn read back before (the conversation prefilled again), named for the reason."""
    params = first_turn()
    spent = LocalRecord.anonymous(64, lambda: NOW + 1, began=NOW + 1)
    stream, answers = request(PREFILL_ROUTE, second_turn(params), spent=spent)
    assert stream.decision.reason is Reason.PROOF_PREDATES_RECORD
    assert forwarded(answers)["kv_transfer_params"] == dict(CONNECTOR_REQUESTS["nixl"])
    assert "cache_salt" not in forwarded(answers)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (second_turn({}, answer="something else"), Reason.PROMPT_MISMATCH),
        (second_turn({}, model="other"), Reason.PROMPT_MISMATCH),
        (
            second_turn(
                {},
                messages=[
                    {"role": "user", "content": "hello"},
                    {"role": "assistant", "content": "hi there"},
                    {"role": "user", "content": "x"},
                ],
            ),
            Reason.PROMPT_MISMATCH,
        ),
        (second_turn({}, messages=TURN1), Reason.PROMPT_MISMATCH),
        (second_turn({}, return_token_ids=False), Reason.TURN_NOT_CHECKABLE),
        (second_turn({}, stream=True), Reason.TURN_NOT_CHECKABLE),
    ],
)
def test_a_turn_presented_with_another_conversation_reads_nothing_back(body, reason):
    body["kv_transfer_params"] = first_turn()
    stream, answers = request(PREFILL_ROUTE, body)
    assert stream.decision.reason is reason
    assert forwarded(answers)["kv_transfer_params"] == dict(CONNECTOR_REQUESTS["nixl"])


# A tool as turn 1 declares it. vLLM keeps its parameters in the request's member order
# (its ``tools`` become ``tool.model_dump()``, whose free ``parameters`` dict is the
# request's: vllm/renderers/online_renderer.py) and chat templates write them in it
# (transformers' ``tojson`` does not sort keys).
TOOL = (
    b'{"type":"function","function":{"name":"f","parameters":{"type":"object",'
    b'"properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}'
)


def second_turn_bytes(params, tool):
    """``second_turn(params)`` with ``tools: [<tool>]``, as raw bytes."""
    body = json.dumps(second_turn(params)).encode()
    return body[:-1] + b', "tools": [' + tool + b"]}"


@pytest.mark.parametrize(
    ("tool", "reason"),
    [
        (TOOL, Reason.TURN_READ_BACK),
        # Other whitespace: the same document.
        (TOOL.replace(b",", b" ,\n  ").replace(b":", b": "), Reason.TURN_READ_BACK),
        # The tool's parameters listed in another order: another prompt to the server.
        (
            TOOL.replace(
                b'"city":{"type":"string"},"days":{"type":"integer"}',
                b'"days":{"type":"integer"},"city":{"type":"string"}',
            ),
            Reason.PROMPT_MISMATCH,
        ),
        # A duplicate key keeps its first place and its last value (json.loads).
        (TOOL.replace(b'"city":', b'"days":0,"city":'), Reason.PROMPT_MISMATCH),
        (
            TOOL.replace(
                b'"days":{"type":"integer"}', b'"days":{"type":"integer"},"city":{"type":"string"}'
            ),
            Reason.TURN_READ_BACK,
        ),
    ],
)
def test_a_turn_is_read_back_only_for_tools_in_the_order_the_server_renders(tool, reason):
    params = first_turn(decode_leg(tools=[json.loads(TOOL)]))
    stream = Driven(trust=trust(), spent=record())
    stream.handle(headers(PREFILL_ROUTE, response=BUFFERED))
    answers = stream.handle(RequestBody(second_turn_bytes(params, tool), True))
    assert stream.decision.reason is reason
    read_back = forwarded(answers)["kv_transfer_params"] != dict(CONNECTOR_REQUESTS["nixl"])
    assert read_back is (reason is Reason.TURN_READ_BACK)


def test_a_tampered_or_expired_turn_reads_nothing_back():
    params = first_turn()
    tampered = {**params, "remote_num_tokens": HELD + 16}
    stream, _ = request(PREFILL_ROUTE, second_turn(tampered))
    assert stream.decision.reason is Reason.PROOF_BAD_SIGNATURE
    late = NOW + 300 + 6
    stream, _ = request(PREFILL_ROUTE, second_turn(params), now=late)
    assert stream.decision.reason is Reason.PROOF_EXPIRED
    # A prefill leg's proof is no turn: the route writes its own request as ever.
    prefill_proof = {
        **TURN_PARAMS,
        proof.PROOF_KEY: proof.mint(KEYS, TURN_PARAMS, b"d" * 32, 2000, minted=1990),
    }
    stream, _ = request(PREFILL_ROUTE, second_turn(prefill_proof))
    assert stream.decision.reason is Reason.UNPROVEN


def test_a_prefill_prompt_that_diverges_from_the_tokens_read_back_is_not_signed():
    stream, _ = request(PREFILL_ROUTE, second_turn(first_turn()))
    diverged = [*PROMPT_IDS, 7, 8, 99, 1, 2]  # a template that renders the answer otherwise
    answer = respond(
        stream, {"prompt_token_ids": diverged, "kv_transfer_params": {"do_remote_prefill": True}}
    )
    assert stream.decision == Allow(Reason.TURN_PROMPT_DIVERGED)
    assert answer.replacement is None


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ({**decode_response(), "prompt_token_ids": None}, Reason.TURN_IDS_MISSING),
        ({**decode_response(), "choices": []}, Reason.TURN_IDS_MISSING),
        (
            decode_response(params={**TURN_PARAMS, "do_remote_decode": False}),
            Reason.NOTHING_TO_MINT,
        ),
        (
            decode_response(params={**TURN_PARAMS, "remote_num_tokens": 25}),
            Reason.RESPONSE_CONNECTOR_OUT_OF_BOUNDS,
        ),
        (decode_response(params=None), Reason.NOTHING_TO_MINT),
    ],
)
def test_a_decode_response_without_a_checkable_turn_is_not_signed(response, reason):
    stream, _ = request(DECODE_ROUTE, decode_leg())
    answer = respond(stream, response)
    assert stream.decision == Allow(reason)
    assert answer.replacement is None


def test_a_decode_route_whose_responses_are_not_processed_signs_nothing():
    stream, _ = request(DECODE_ROUTE, {"model": "m", "messages": TURN1}, response=BodyMode.NONE)
    assert stream.last.final  # the RPC ends at the decision, as before


@pytest.mark.parametrize(
    "turn",
    [
        {"messages": 2, "tokens": "é" * 43},
        {"messages": 2, "tokens": "!" * 43},
        {"messages": 2, "tokens": "A" * 42 + "B"},  # spare bits set: not canonical
        {"messages": True, "tokens": "A" * 43},
        {"messages": 2},
        {"messages": 2, "tokens": "A" * 43, "more": 1},
        "not an object",
    ],
)
def test_a_malformed_turn_member_is_read_only_under_a_valid_mac(turn):
    # Changed in a proof the gateway minted: the MAC fails before the member is read.
    params = {**first_turn(), turns.TURN_KEY: turn}
    stream, answers = request(PREFILL_ROUTE, second_turn(params))
    assert stream.decision.reason is Reason.PROOF_BAD_SIGNATURE
    assert forwarded(answers)["kv_transfer_params"] == dict(CONNECTOR_REQUESTS["nixl"])
    # Signed so (with the gateway's key): malformed, and nothing is read back.
    signed = {**TURN_PARAMS, turns.TURN_KEY: turn}
    expiry = int(NOW) + 100
    token = proof.mint(KEYS, signed, b"d" * 32, expiry, version=proof.TURN_VERSION, minted=int(NOW))
    stream, answers = request(PREFILL_ROUTE, second_turn({**signed, proof.PROOF_KEY: token}))
    assert stream.decision.reason is Reason.PROOF_MALFORMED
    assert forwarded(answers)["kv_transfer_params"] == dict(CONNECTOR_REQUESTS["nixl"])


@pytest.mark.parametrize(
    ("leg", "reason"),
    [
        # Unproven: its parameters removed, what its server read is not the deployment's.
        ({"model": "m", "messages": TURN1}, Reason.TURN_LEG_UNPROVEN),
        (
            decode_leg(chat_template_kwargs={"kv_transfer_params": {"x": 1}}),
            Reason.REQUEST_MAY_ECHO,
        ),
        (
            decode_leg(
                [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]
            ),
            Reason.TURN_MEDIA_UNBOUND,
        ),
    ],
)
def test_a_turn_is_signed_only_for_a_proven_text_leg_that_cannot_echo(leg, reason):
    stream, _ = request(DECODE_ROUTE, leg)
    answer = respond(stream, decode_response())
    assert stream.decision == Allow(reason)
    assert answer.replacement is None


def test_a_replayed_decode_leg_signs_no_turn():
    spent, leg = record(), decode_leg()
    request(DECODE_ROUTE, leg, spent=spent)
    stream, _ = request(DECODE_ROUTE, leg, spent=spent)
    assert stream.decision.reason is Reason.PROOF_REPLAYED
    respond(stream, decode_response())
    assert stream.decision == Allow(Reason.TURN_LEG_UNPROVEN)


def test_a_listed_peers_turn_object_is_checked_and_spent_like_any():
    router = (IdentityType.URI, "spiffe://td/router")
    route = RoutePolicy(
        Topology.DISAGGREGATED,
        Action.MINT,
        peers=frozenset({router}),
        connector=NIXL,
    )
    params = first_turn()
    body = second_turn(params)

    def prefix(count):
        return proof.prompt_digest({**body, "messages": body["messages"][:count]}, True, CHAT_PATH)

    evidence = policy.Evidence(
        lambda: b"d" * 32,
        Peer(True, (router,)),
        KEYS,
        NOW,
        5.0,
        20.0,
        prefix=prefix,
        turn_lifetime=300.0,
    )
    tampered = {**body, "kv_transfer_params": {**params, "remote_host": "10.9.9.9"}}
    decision = policy.decide(route, tampered, evidence)
    assert decision.reason is Reason.PROOF_BAD_SIGNATURE
    assert decision.connector == NIXL
    assert policy.decide(route, body, evidence).reason is Reason.TURN_READ_BACK
    spent = dataclasses.replace(evidence, spent=Reason.PROOF_REPLAYED)
    assert policy.decide(route, body, spent).reason is Reason.PROOF_REPLAYED
    # A peer's own parameters without a turn proof are its own, as ever.
    own = {**body, "kv_transfer_params": {"do_remote_decode": True, "remote_host": "10.0.0.1"}}
    assert policy.decide(route, own, evidence).reason is Reason.TRUSTED_PEER


def test_a_tenant_routes_read_back_salt_is_fresh_and_the_tenants():
    prefill, decode = (tenant_route(r, "route:a") for r in (PREFILL_ROUTE, DECODE_ROUTE))
    salts = []
    for _ in range(2):
        params = first_turn(prefill_proven(prefill), decode)
        stream, answers = request(prefill, second_turn(params))
        assert stream.decision.reason is Reason.TURN_READ_BACK
        salts.append(forwarded(answers)["cache_salt"])
    # Each read-back's blocks serve no other prompt, and are the tenant's: a salt of
    # the tenant's key, not the tenant's own salt that every other request gets.
    tenant_key = tenants.key_for(TENANT_KEY, "route:a")
    assert salts[0] != salts[1]
    assert all(len(salt) == 43 for salt in salts)
    assert tenants.salt(tenant_key, None) not in salts


@pytest.mark.parametrize(
    ("minted", "read"),
    [("route:a", None), (None, "route:a"), ("route:a", "route:b"), ("route:b", "route:a")],
)
def test_a_turn_is_read_back_only_in_the_partition_it_was_minted_in(minted, read):
    # The prefill server caches the blocks it reads back under its own request's salt:
    # a turn of one tenant's conversation read back on a route of another (or of none)
    # would put that conversation's KV in the other's partition.
    def on(route, source):
        return route if source is None else tenant_route(route, source)

    leg = prefill_proven(on(PREFILL_ROUTE, minted))
    params = first_turn(leg, on(DECODE_ROUTE, minted))
    stream, answers = request(on(PREFILL_ROUTE, read), second_turn(params))
    assert stream.decision.reason == "proof_partition_mismatch"
    # Nothing read back: the route's own connector request, no turn's keys.
    assert forwarded(answers)["kv_transfer_params"] == dict(CONNECTOR_REQUESTS["nixl"])


def test_a_turn_of_the_format_before_is_superseded():
    # tt3 bound no partition: whichever route it was minted on, it is not read back.
    params = first_turn()
    old = {k: v for k, v in params.items() if k != proof.PROOF_KEY}
    digest = turns.conversation(
        proof.prompt_digest({"model": "m", "messages": TURN1, "max_tokens": 8}, True, CHAT_PATH),
        turns.message_digest(turns.answer("hi there")),
    )
    token = previous_proofs.mint_tp3("k1", b"k" * 32, old, digest, int(NOW) + 10, bytes(12), "tt3")
    stream, answers = request(PREFILL_ROUTE, second_turn({**old, proof.PROOF_KEY: token}))
    assert stream.decision.reason is Reason.PROOF_SUPERSEDED
    assert forwarded(answers)["kv_transfer_params"] == dict(CONNECTOR_REQUESTS["nixl"])
