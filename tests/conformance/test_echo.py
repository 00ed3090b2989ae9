"""Signing only what the prefill server produced, against a real vLLM started with
``--enable-scale-out`` (docs/trust.md#what-a-mint-route-signs).

vLLM's derender endpoints copy the request's nested ``generate_response(s)`` transfer
parameters into their response's top-level ``kv_transfer_params``: a mint route that
signed that response would sign the client's ids and connector keys. A proof is also
bound to the endpoint it was minted for: chat completions ignores ``system``,
``instructions`` and ``input``, so its ids replayed to messages or responses would drop
what those endpoints render. ``usage`` is the oracle, as in test_handoff.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance.conftest import DECODE, MINT, UNGUARDED_MINT
from tests.conformance.results import record
from tests.conformance.test_handoff import honored_as, send
from tests.conformance.test_vllm import (
    IDS,
    SYSTEM,
    USER,
    chat_body,
    post,
    prompt_count,
)
from tests.e2e.test_operations import access_log

CHAT = "/v1/chat/completions"
# Connector keys a forger wants signed: the decode server would dial them (SSRF).
FORGED = {"prompt_token_ids": IDS, "remote_host": "10.0.0.9", "remote_port": 5600}


def generated(params: dict[str, Any]) -> dict[str, Any]:
    """A token-in/token-out engine response, as a derender request carries it."""
    return {
        "request_id": "forged",
        "choices": [{"index": 0, "token_ids": [5, 6], "finish_reason": "length"}],
        "kv_transfer_params": params,
    }


# Each derender body also carries a chat request's fields (derender ignores them), so
# that the very same body, sent to chat completions with what came back, has the prompt
# digest the mint route computed: the forger's decode leg.
DERENDER = {
    "chat": (CHAT + "/derender", {**chat_body(), "generate_response": generated(FORGED)}),
    "completions": (
        "/v1/completions/derender",
        {**chat_body(), "generate_responses": [generated(FORGED)]},
    ),
}


@pytest.mark.parametrize("endpoint", DERENDER)
def test_derender_echoes_nested_parameters_straight_to_vllm(vllm, endpoint):
    # The finding: vLLM returns the request's nested parameters as its own.
    path, body = DERENDER[endpoint]
    reply = post(vllm, path, body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["kv_transfer_params"] == FORGED
    record(f"derender echo straight, {endpoint}", "ids echoed", len(IDS))


@pytest.mark.parametrize("endpoint", DERENDER)
def test_a_mint_route_signs_no_echo_and_the_decode_leg_renders(gateway, vllm, endpoint):
    # This mint route sits before the gateway's 404 rules, so the request reaches
    # vLLM's derender: the processor itself must refuse to sign what comes back.
    path, body = DERENDER[endpoint]
    reply, rid = send(gateway, UNGUARDED_MINT + path, body)
    # The client's nested parameters and its responses' token ids (token carriers) were
    # removed before vLLM read them: derender has nothing to render, and nothing is
    # signed.
    assert reply.status_code == 400, reply.text
    assert "token_ids" in reply.json()["error"]["message"]
    assert "token_policy_proof" not in reply.text
    echoed = None
    assert access_log(gateway, rid)["policy_response_reason"] == "endpoint_not_mintable"
    # Whatever came back buys nothing on the decode leg.
    plain = prompt_count(post(vllm, CHAT, chat_body()))
    forged = {**FORGED, "token_policy_proof": (echoed or {}).get("token_policy_proof")}
    reply, rid = send(gateway, DECODE + CHAT, {**body, "kv_transfer_params": forged})
    count = prompt_count(reply)
    record(f"derender via mint route, {endpoint}, then decode", "chat", count)
    assert count == plain != len(IDS)
    assert honored_as(gateway, rid)[0] == "strip"


@pytest.mark.parametrize("prefix", ["/pd/prefill", MINT, "/pd", ""])
@pytest.mark.parametrize("path", [CHAT + "/derender", "/v1/completions/derender"])
def test_the_gateway_answers_derender_404_before_any_route(gateway, prefix, path):
    # vLLM serves these paths (scale-out): a 404 in vLLM's error shape is the gateway's.
    reply, _ = send(gateway, prefix + path, DERENDER["chat"][1])
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == 404


# One body that every endpoint reads its own way: chat completions renders only the
# messages; messages adds ``system``; responses renders ``instructions`` and ``input``.
# Both legs send the same bound fields (proof.UNBOUND_FIELDS aside), so only the
# endpoint differs.
SHARED = {
    **chat_body(),
    "messages": [{"role": "user", "content": USER}],
    "system": SYSTEM,
    "instructions": SYSTEM,
    "input": USER,
    "max_output_tokens": 2,
}
ELSEWHERE = {"messages": "/v1/messages", "responses": "/v1/responses"}


@pytest.fixture(scope="module")
def chat_minted(gateway) -> dict[str, Any]:
    reply, _ = send(gateway, MINT + CHAT, {**SHARED, "max_tokens": 1, "return_token_ids": True})
    params = reply.json()["kv_transfer_params"]
    assert "token_policy_proof" in params
    return dict(params)


def test_the_chat_proof_is_honored_on_chat(gateway, chat_minted):
    reply, rid = send(gateway, DECODE + CHAT, {**SHARED, "kv_transfer_params": chat_minted})
    count = prompt_count(reply)
    record("chat-minted proof on chat", "chat", count)
    assert count == len(chat_minted["prompt_token_ids"])
    assert honored_as(gateway, rid)[:2] == ("honor", "trusted_proof")


@pytest.mark.parametrize("endpoint", ELSEWHERE)
def test_a_chat_proof_is_a_mismatch_on_another_endpoint(gateway, vllm, chat_minted, endpoint):
    path = ELSEWHERE[endpoint]
    own = prompt_count(post(vllm, path, SHARED))
    body = {**SHARED, "kv_transfer_params": chat_minted}
    straight = prompt_count(post(vllm, path, body))
    reply, rid = send(gateway, DECODE + path, body)
    count = prompt_count(reply)
    record("chat-minted proof replayed straight (chat's ids ran)", endpoint, straight)
    record("chat-minted proof replayed via gateway", endpoint, count)
    record("the endpoint's own rendering", endpoint, own)
    assert straight == len(chat_minted["prompt_token_ids"]) != own
    assert count == own
    assert honored_as(gateway, rid)[:2] == ("strip", "prompt_mismatch")
