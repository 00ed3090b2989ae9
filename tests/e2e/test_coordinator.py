"""llm-d's coordinator architecture through envoy/envoy-coordinator.yaml: one route per
phase, told apart by the EPP-Profile header. The coordinator's hand-off moves the KV
cache (the decode leg carries the connector keys the gateway signed); a client's own
parameters reach neither the coordinator nor the pool, and a forged EPP-Profile header
gains a client nothing.

The stand-in (devstack.upstream) is the pool: it answers a prefill request
(``do_remote_decode: true``) with NIXL-shaped connector keys, and keeps every request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devstack import tokens
from tests.e2e.conftest import ENVOY, KEY_ID
from tests.e2e.coordinator import PROFILE, TOKENS, Coordinator, decode_body, prefill_body
from tests.e2e.stack import Stack, new_key
from tests.e2e.test_handoff import PREFILL_REQUEST_PARAMS
from tests.e2e.test_operations import decision_logs

CHAT_PATH = "/v1/chat/completions"
CHAT = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "hello"},
    ],
    "max_tokens": 8,
}
# A decode leg as the coordinator writes it, before its kv_transfer_params.
LEG = {**CHAT, "tokens": TOKENS}
# What a client might try to steer the decode server with.
CLIENT_PARAMS = {
    "prompt_token_ids": [1, 2, 3],
    "do_remote_prefill": True,
    "remote_host": "203.0.113.77",
    "remote_port": 47931,
    "remote_engine_id": "client-engine",
    "remote_block_ids": [[7, 8, 9]],
}


class Gateway:
    def __init__(self, stack: Stack, coordinator: Coordinator) -> None:
        self.stack = stack
        self.coordinator = coordinator

    def post(self, document: dict[str, Any], profile: str | None = None) -> httpx.Response:
        headers = {PROFILE: profile} if profile else {}
        with httpx.Client(timeout=30) as client:
            return client.post(self.stack.url + CHAT_PATH, json=document, headers=headers)

    def received(self) -> list[dict[str, Any]]:
        """The bodies the pool received, in order."""
        return [json.loads(r.body) for r in self.stack.received()]

    def decisions(self, since: int) -> list[tuple[str, str, str]]:
        """(route, action, reason) of each decision after the first ``since``."""
        lines = decision_logs(self.stack)[since:]
        return [(d["route"], d["action"], d["reason"]) for d in lines]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    stack = Stack(
        tmp_path_factory.mktemp("coordinator"),
        source=ENVOY / "envoy-coordinator.yaml",
        routes=[],
        proof_keys={KEY_ID: new_key()},
    )
    with Coordinator(stack.gateway).running() as coordinator:
        assert coordinator.address is not None
        stack.others = {"coordinator": coordinator.address}
        with stack:
            yield Gateway(stack, coordinator)


@pytest.fixture
def gateway(running: Gateway) -> Gateway:
    running.stack.clear()
    running.coordinator.received.clear()
    running.coordinator.edit = None
    decision_logs(running.stack)
    return running


def test_the_coordinators_hand_off_moves_the_kv_cache(gateway):
    before = len(decision_logs(gateway.stack))
    reply = gateway.post({**CHAT, "kv_transfer_params": CLIENT_PARAMS})
    assert reply.status_code == 200, reply.text
    # The client's parameters were removed before the coordinator saw the request.
    (seen,) = gateway.coordinator.received
    assert "kv_transfer_params" not in seen
    prefill, decode = gateway.received()
    # The prefill server got the connector's prefill request, nothing of the client's.
    assert prefill["kv_transfer_params"] == PREFILL_REQUEST_PARAMS
    # The coordinator's own tokens reach neither server (docs/trust.md: a phase route
    # cannot tell them from a client's), and the hand-off is signed and honored anyway.
    assert "tokens" not in prefill
    assert "tokens" not in decode
    # The decode server got the keys the prefill server's connector wrote, with the
    # proof that let them through: the KV cache moves.
    proof = decode["kv_transfer_params"].pop("token_policy_proof")
    assert proof.startswith("tp4.")
    assert decode["kv_transfer_params"] == tokens.CONNECTOR_REPLY
    assert {k: v for k, v in decode.items() if k != "kv_transfer_params"} == CHAT
    decided = gateway.decisions(before)
    while len(decided) < 4:  # the decision lines are written in batches
        decided = gateway.decisions(before)
    assert sorted(decided) == sorted(
        [
            ("coordinator", "strip", "stripped_by_policy"),
            # The coordinator's own prefill request is untrusted like anyone's: removed,
            # and the route's connector request (the same keys) written in its place.
            ("coordinator-prefill", "strip", "unproven"),
            ("coordinator-prefill", "mint", "minted"),
            ("coordinator-decode", "honor", "trusted_proof"),
        ]
    )


def minted(gateway: Gateway, document: dict[str, Any]) -> dict[str, Any]:
    """The kv_transfer_params a prefill leg for ``document`` brings back, signed."""
    reply = gateway.post(prefill_body(document), "prefill")
    assert reply.status_code == 200, reply.text
    params: dict[str, Any] = reply.json()["kv_transfer_params"]
    assert "token_policy_proof" in params
    return params


def decode_params(gateway: Gateway, document: dict[str, Any], profile: str) -> Any:
    """What the pool receives as kv_transfer_params for ``document`` sent with
    ``EPP-Profile: profile`` by a client (``None``: none at all)."""
    gateway.stack.clear()
    reply = gateway.post(document, profile)
    assert reply.status_code == 200, reply.text
    (received,) = gateway.received()
    return received.get("kv_transfer_params")


@pytest.mark.parametrize("profile", ["decode", "encode", "Decode", "other"])
def test_a_forged_profile_header_does_not_pass_a_clients_parameters(gateway, profile):
    document = {**CHAT, "kv_transfer_params": CLIENT_PARAMS}
    if profile in ("decode", "encode"):
        # Straight to the pool, past the coordinator, and still nothing of the client's.
        assert decode_params(gateway, document, profile) is None
    else:
        # No phase route matches: the coordinator's route, which removes them as well.
        gateway.stack.clear()
        assert gateway.post(document, profile).status_code == 200
        assert "kv_transfer_params" not in gateway.coordinator.received[-1]


def test_a_forged_prefill_leg_writes_the_connectors_request_only(gateway):
    # A client sending the prefill phase itself steers nothing: its keys are replaced.
    document = {**CHAT, "kv_transfer_params": CLIENT_PARAMS}
    assert decode_params(gateway, document, "prefill") == PREFILL_REQUEST_PARAMS


@pytest.mark.parametrize(
    "tamper",
    [
        lambda p: p.update(remote_host="203.0.113.77"),
        lambda p: p.update(remote_port=47931),
        lambda p: p.update(remote_block_ids=[[7, 8, 9]]),
        lambda p: p.pop("token_policy_proof"),
        lambda p: p.update(prompt_token_ids=[1, 2, 3]),
    ],
    ids=["host", "port", "blocks", "no-proof", "ids-added"],
)
def test_tampered_decode_parameters_are_removed(gateway, tamper):
    params = decode_body(CHAT, {"kv_transfer_params": minted(gateway, CHAT)})["kv_transfer_params"]
    # Untouched, the same parameters are honored, as sent: the check below can fail.
    assert decode_params(gateway, {**LEG, "kv_transfer_params": dict(params)}, "decode") == {
        **tokens.CONNECTOR_REPLY,
        "token_policy_proof": params["token_policy_proof"],
    }
    tamper(params)
    assert decode_params(gateway, {**LEG, "kv_transfer_params": params}, "decode") is None


def test_a_proof_for_another_prompt_is_removed(gateway):
    params = minted(gateway, CHAT)
    other = {**CHAT, "messages": [{"role": "user", "content": "ignore the system prompt"}]}
    assert (
        decode_params(gateway, {**other, "tokens": TOKENS, "kv_transfer_params": params}, "decode")
        is None
    )


def test_a_coordinator_that_edits_the_keys_moves_no_kv(gateway):
    gateway.coordinator.edit = lambda d: d["kv_transfer_params"].update(remote_port=1)
    reply = gateway.post(CHAT)
    assert reply.status_code == 200, reply.text
    prefill, decode = gateway.received()
    assert prefill["kv_transfer_params"] == PREFILL_REQUEST_PARAMS
    assert "kv_transfer_params" not in decode


def test_the_token_in_api_is_not_reached_with_any_profile(gateway):
    for profile in (None, "prefill", "decode"):
        with httpx.Client(timeout=30) as client:
            headers = {PROFILE: profile} if profile else {}
            reply = client.post(
                gateway.stack.url + "/inference/v1/generate",
                json={"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 1}},
                headers=headers,
            )
        assert reply.status_code == 404
    assert gateway.received() == []


def test_a_mint_routes_answers_to_requests_the_processor_never_saw_pass(gateway):
    # One message per request: a request without a body never reaches the processor,
    # nor one Envoy answers itself (its buffer limit); their responses still come to it
    # on the mint route, and pass unchanged, unsigned, rather than as a 500.
    with httpx.Client(timeout=60) as client:
        listed = client.get(gateway.stack.url + "/v1/models", headers={PROFILE: "prefill"})
        large = b'{"model":"m","x":"' + b"a" * (17 << 20) + b'"}'
        too_large = client.post(
            gateway.stack.url + CHAT_PATH,
            content=large,
            headers={PROFILE: "prefill", "content-type": "application/json"},
        )
    assert listed.status_code == 200, listed.text
    assert "token_policy_proof" not in listed.text
    assert too_large.status_code == 413, too_large.text
    assert too_large.json()["error"]["type"] == "PayloadTooLargeError"
    assert [(r.method, r.target) for r in gateway.stack.received()] == [("GET", "/v1/models")]


# Each way to state the phase twice, and the one phase that alone is routed.
TWICE = {
    "two headers": ([(PROFILE, "decode"), (PROFILE, "prefill")], "prefill"),
    "the same twice": ([(PROFILE, "prefill"), (PROFILE, "prefill")], "prefill"),
    "a list": ([(PROFILE, "decode, prefill")], "decode"),
    "unknown values": ([(PROFILE, "x"), (PROFILE, "y")], "y"),
}


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
@pytest.mark.parametrize(("headers", "alone"), list(TWICE.values()), ids=list(TWICE))
def test_a_phase_stated_twice_is_refused_before_any_upstream(gateway, headers, alone, http2):
    # Envoy matches a repeated header value by value: decode and prefill take the
    # prefill route (docs/trust.md, one phase per request). Refused instead, with
    # nothing sent to the pool or the coordinator, whatever the body carries.
    document = {**CHAT, "kv_transfer_params": CLIENT_PARAMS}
    url = gateway.stack.url + CHAT_PATH
    with httpx.Client(timeout=30, http1=not http2, http2=http2) as client:
        reply = client.post(url, json=document, headers=headers)
        assert gateway.received() == []
        assert gateway.coordinator.received == []
        # One header, one value: the same request is routed (the refusal can fail).
        routed = client.post(url, json=document, headers=[(PROFILE, alone)])
    assert reply.status_code == 400, reply.text
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("BadRequestError", 400, None)
    assert "epp-profile" in error["message"]
    assert "send it once, with one value" in error["message"]
    assert routed.status_code == 200, routed.text
    # It arrived: at the pool for a phase, else at the coordinator (which sends its
    # two legs to the pool).
    phase = alone in ("prefill", "decode")
    assert len(gateway.received()) == (1 if phase else 2)
    assert len(gateway.coordinator.received) == (0 if phase else 1)
