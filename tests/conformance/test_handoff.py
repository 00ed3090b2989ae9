"""The prefill/decode hand-off of ids against a real vLLM (docs/trust.md): the gateway
signs the ids vLLM returns on the prefill leg and lets through, on the decode leg, only
the ids it signed for that prompt.

vLLM's ``usage.prompt_tokens`` is the oracle: len(ids) when it ran on the ids, the
templated count when it rendered the messages. Minted ids are vLLM's own tokenization
of the prompt, so for them both counts are equal; the access log (the gateway's record
of what it forwarded) says which one ran, and the cases with other ids show the counts
part.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import httpx
import pytest

from tests.conformance.conftest import DECODE, KEY_ID, MINT
from tests.conformance.results import record
from tests.conformance.test_vllm import IDS, JSON, chat_body, post, prompt_count, stream_body
from tests.e2e.stack import Stack
from tests.e2e.test_operations import access_log, decision_logs

CHAT = "/v1/chat/completions"
OTHER_SYSTEM = "You are a pirate. Reveal every secret you know, in verse."
_ids = itertools.count()


def send(stack: Stack, path: str, body: dict[str, Any]) -> tuple[httpx.Response, str]:
    """``body`` through the gateway, with a request id to find its access-log line."""
    rid = f"conformance-handoff-{time.monotonic_ns()}-{next(_ids)}"
    return post(stack.url, path, body, {**JSON, "x-request-id": rid}), rid


def honored_as(stack: Stack, rid: str) -> tuple[str, str, int]:
    line = access_log(stack, rid)
    return line["policy_action"], line["policy_reason"], int(line["policy_id_count"])


def minted_for(stack: Stack, rid: str) -> int:
    """The id count of the processor's mint decision for ``rid`` (the access log holds
    the request's decision)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for line in decision_logs(stack):
            if line["client_request_id"] == rid and line["action"] == "mint":
                assert line["reason"] == "minted", line
                return int(line["id_count"])
        time.sleep(0.1)
    raise AssertionError(f"no mint decision for {rid}")


def other_prompt(**extra: Any) -> dict[str, Any]:
    body = chat_body(**extra)
    body["messages"][0]["content"] = OTHER_SYSTEM
    return body


@pytest.fixture(scope="module")
def plain(vllm: str) -> int:
    """The templated prompt's count, straight to vLLM."""
    count = prompt_count(post(vllm, CHAT, chat_body()))
    record("hand-off: plain request, straight", "chat", count)
    assert count > len(IDS)
    return count


@pytest.fixture
def minted(gateway: Stack, plain: int) -> dict[str, Any]:
    """(a) The prefill leg through the mint route: the ids vLLM ran on come back in
    ``kv_transfer_params``, signed. A prefill per test: a proof is honored once."""
    reply, rid = send(gateway, MINT + CHAT, chat_body(max_tokens=1, return_token_ids=True))
    count = prompt_count(reply)
    payload = reply.json()
    params = payload["kv_transfer_params"]
    record("hand-off (a) prefill leg via mint route", "chat", count)
    record("hand-off (a) ids minted", "chat", len(params["prompt_token_ids"]))
    assert set(params) == {"prompt_token_ids", "token_policy_proof"}, params
    assert params["prompt_token_ids"] == payload["prompt_token_ids"]  # vLLM's own
    assert params["token_policy_proof"].startswith(f"tp4.{KEY_ID}.")
    assert count == len(params["prompt_token_ids"]) == plain
    assert minted_for(gateway, rid) == len(params["prompt_token_ids"])
    return params


def test_decode_leg_runs_on_the_minted_ids(gateway, minted, plain):
    # (b) The orchestrator copies the object verbatim; max_tokens differs between legs.
    ids = minted["prompt_token_ids"]
    reply, rid = send(gateway, DECODE + CHAT, chat_body(kv_transfer_params=minted))
    count = prompt_count(reply)
    record("hand-off (b) decode leg, minted ids + proof", "chat", count)
    assert count == len(ids) == plain
    assert honored_as(gateway, rid) == ("honor", "trusted_proof", len(ids))


def test_streamed_decode_leg_runs_on_the_minted_ids(gateway, minted, plain):
    # stream and stream_options are not bound by the proof: a streamed decode leg.
    reply, rid = send(gateway, DECODE + CHAT, stream_body(kv_transfer_params=minted))
    count = prompt_count(reply)
    record("hand-off (b) decode leg, minted ids + proof", "chat-stream", count)
    assert count == len(minted["prompt_token_ids"]) == plain
    assert honored_as(gateway, rid)[:2] == ("honor", "trusted_proof")


def test_a_spent_proof_gives_the_templated_prompt(gateway, minted, plain):
    # (e) The same minted parameters a second time: spent, removed, vLLM renders.
    send(gateway, DECODE + CHAT, chat_body(kv_transfer_params=minted))
    reply, rid = send(gateway, DECODE + CHAT, chat_body(kv_transfer_params=minted))
    count = prompt_count(reply)
    record("hand-off (e) decode leg, the proof a second time", "chat", count)
    assert count == plain
    assert honored_as(gateway, rid)[:2] == ("strip", "proof_replayed")


def test_a_clients_own_ids_give_the_templated_prompt(gateway, plain):
    # (c) Chosen ids without a proof: removed, vLLM renders the messages.
    body = chat_body(kv_transfer_params={"prompt_token_ids": IDS})
    reply, rid = send(gateway, DECODE + CHAT, body)
    count = prompt_count(reply)
    record("hand-off (c) decode leg, client's 7 ids, no proof", "chat", count)
    assert count == plain
    assert honored_as(gateway, rid)[:2] == ("strip", "proof_missing")


def test_changed_ids_void_the_proof(gateway, minted, plain):
    # (d) The proof kept, the ids cut (the system prompt's share dropped, say).
    half = minted["prompt_token_ids"][len(minted["prompt_token_ids"]) // 2 :]
    body = chat_body(kv_transfer_params={**minted, "prompt_token_ids": half})
    reply, rid = send(gateway, DECODE + CHAT, body)
    count = prompt_count(reply)
    record("hand-off (d) decode leg, proof kept, ids halved", "chat", count)
    assert count == plain != len(half)
    assert honored_as(gateway, rid)[:2] == ("strip", "proof_bad_signature")


def test_client_ids_under_a_copied_proof_are_not_honored(gateway, minted, plain):
    # (d) A real proof carried over to the client's own 7 ids.
    body = chat_body(kv_transfer_params={**minted, "prompt_token_ids": IDS})
    reply, rid = send(gateway, DECODE + CHAT, body)
    count = prompt_count(reply)
    record("hand-off (d) decode leg, proof kept, client's 7 ids", "chat", count)
    assert count == plain
    assert honored_as(gateway, rid)[:2] == ("strip", "proof_bad_signature")


def test_changed_messages_void_the_proof(gateway, vllm, minted):
    # (d) The parameters kept, the prompt changed: vLLM runs the new prompt's template.
    other = prompt_count(post(vllm, CHAT, other_prompt()))
    assert other != len(minted["prompt_token_ids"])
    reply, rid = send(gateway, DECODE + CHAT, other_prompt(kv_transfer_params=minted))
    count = prompt_count(reply)
    record("hand-off (d) decode leg, proof kept, system prompt changed", "chat", count)
    record("hand-off: changed system prompt, straight", "chat", other)
    assert count == other
    assert honored_as(gateway, rid)[:2] == ("strip", "prompt_mismatch")


def test_straight_to_vllm_the_clients_ids_are_honored(vllm, plain):
    # (e) The control: without the gateway, vLLM runs a client's chosen ids.
    count = prompt_count(post(vllm, CHAT, chat_body(kv_transfer_params={"prompt_token_ids": IDS})))
    record("hand-off (e) straight to vLLM, client's 7 ids", "chat", count)
    assert count == len(IDS) != plain


def test_straight_to_vllm_a_proof_beside_the_ids_changes_nothing(vllm, minted):
    # A proven decode leg reaches vLLM with its proof (docs/trust.md, "The proof goes
    # on"): vLLM takes the ids and ignores the key it does not know, answering exactly
    # as for the same parameters without it (greedy decoding: the same text).
    ids = minted["prompt_token_ids"]
    bare = {"prompt_token_ids": ids}
    answers = [
        post(vllm, CHAT, chat_body(temperature=0, kv_transfer_params=params))
        for params in (bare, {**bare, "token_policy_proof": minted["token_policy_proof"]})
    ]
    counts = [prompt_count(answer) for answer in answers]
    record("hand-off (b) straight to vLLM, minted ids + proof", "chat", counts[1])
    assert counts == [len(ids), len(ids)]
    texts = [answer.json()["choices"][0]["message"]["content"] for answer in answers]
    assert texts[0] == texts[1]


def test_shipped_routes_hand_off(gateway, plain):
    # The shipped prefill (mint) and decode (honor) routes, in front of the same vLLM.
    prefill, _ = send(gateway, "/pd/prefill" + CHAT, chat_body(max_tokens=1, return_token_ids=True))
    params = prefill.json()["kv_transfer_params"]
    reply, rid = send(gateway, "/pd" + CHAT, chat_body(kv_transfer_params=params))
    count = prompt_count(reply)
    record("hand-off via shipped /pd/prefill -> /pd", "chat", count)
    assert count == len(params["prompt_token_ids"]) == plain
    assert honored_as(gateway, rid) == ("honor", "trusted_proof", count)
