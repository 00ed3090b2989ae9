"""A two-turn conversation through the real Envoy (envoy/envoy-turns.yaml) in front of
the recording stand-in, answering as a NIXL pair with ``bidirectional_kv_xfer``
(devstack.tokens.TURN_REPLY): the turns route signs the decode server's turn
parameters, the next turn's prefill leg reads them back once, and a replayed turn or
one presented with another conversation reaches the prefill server as nothing but the
route's own connector request (docs/trust.md#turns).

What reached the stand-in is read as the bytes that arrived."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devstack import tokens, upstream
from tests.e2e.conftest import ENVOY, KEY_ID
from tests.e2e.stack import Stack, new_key
from tests.e2e.test_gateway import chat
from tests.e2e.test_handoff import PREFILL, PREFILL_REQUEST_PARAMS, sent_upstream

TURNS = "/pd/turns/v1/chat/completions"
BIDIRECTIONAL = {upstream.BIDIRECTIONAL_HEADER: "1"}
READ_BACK = {
    k: v
    for k, v in tokens.TURN_REPLY.items()
    if k.startswith(("remote_", "tp_", "dcp_", "pp_", "transfer_"))
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("turns")
    source = ENVOY / "envoy-turns.yaml"
    with Stack(workdir, source=source, proof_keys={KEY_ID: new_key()}) as running:
        yield running


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=20) as c:
        yield c


def post(client: httpx.Client, stack: Stack, path: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = client.post(stack.url + path, json=body, headers=BIDIRECTIONAL)
    assert reply.status_code == 200, reply.text
    document = reply.json()
    assert isinstance(document, dict)
    return document


def first_turn(
    client: httpx.Client, stack: Stack, **extra: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Turn 1's two legs (``extra``: more members of both); the conversation so far (its
    messages and the answer as the next turn repeats it) and the decode response's
    signed turn parameters."""
    prefill = post(client, stack, PREFILL, chat(max_tokens=1, return_token_ids=True, **extra))
    decode = post(
        client,
        stack,
        TURNS,
        chat(kv_transfer_params=prefill["kv_transfer_params"], return_token_ids=True, **extra),
    )
    params = decode["kv_transfer_params"]
    assert params["token_policy_proof"].startswith("tt4.")
    answer = decode["choices"][0]["message"]["content"]
    messages = [*chat()["messages"], {"role": "assistant", "content": answer}]
    stack.clear()
    return messages, params


def next_turn(
    messages: list[dict[str, Any]], params: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    return chat(
        messages=[*messages, {"role": "user", "content": "and then?"}],
        max_tokens=1,
        return_token_ids=True,
        kv_transfer_params=params,
        **extra,
    )


def test_the_next_turn_reads_the_first_back_once_and_its_answer_is_signed(client, stack):
    messages, params = first_turn(client, stack)
    computed = params["remote_num_tokens"]
    reply = post(client, stack, PREFILL, next_turn(messages, params))
    _, sent = sent_upstream(stack)
    assert sent["kv_transfer_params"] == {
        **PREFILL_REQUEST_PARAMS,
        **READ_BACK,
        "remote_num_tokens": computed,
    }
    assert len(sent["cache_salt"]) >= 16
    # The prefill server's prompt began with the tokens read back: the decode leg's
    # parameters are signed as any prefill's.
    assert reply["kv_transfer_params"]["token_policy_proof"].startswith("tp4.")
    stack.clear()
    # The same turn again: spent; the prefill server gets the route's request only.
    post(client, stack, PREFILL, next_turn(messages, params))
    _, sent = sent_upstream(stack)
    assert sent["kv_transfer_params"] == PREFILL_REQUEST_PARAMS
    assert "cache_salt" not in sent


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda m: [m[0], m[1], {"role": "assistant", "content": "not what it said"}],
            id="answer",
        ),
        pytest.param(lambda m: [{"role": "system", "content": "another"}, *m[1:]], id="system"),
        pytest.param(lambda m: m[1:], id="dropped-message"),
    ],
)
def test_a_turn_presented_with_another_conversation_reads_nothing_back(client, stack, change):
    messages, params = first_turn(client, stack)
    post(client, stack, PREFILL, next_turn(change(messages), params))
    _, sent = sent_upstream(stack)
    assert sent["kv_transfer_params"] == PREFILL_REQUEST_PARAMS
    assert "cache_salt" not in sent


def tool(*names: str) -> dict[str, Any]:
    """A tool whose parameters' properties are ``names``, in that order."""
    properties = {name: {"type": "string"} for name in names}
    parameters = {"type": "object", "properties": properties}
    return {"type": "function", "function": {"name": "weather", "parameters": parameters}}


@pytest.mark.parametrize(("names", "read"), [(("city", "day"), True), (("day", "city"), False)])
def test_a_turn_is_read_back_only_with_its_tools_in_the_order_the_server_renders(
    client, stack, names, read
):
    # vLLM renders a tool's parameters in the request's order: listed otherwise, they
    # are another prompt, and the first turn's blocks are not read for it.
    messages, params = first_turn(client, stack, tools=[tool("city", "day")])
    post(client, stack, PREFILL, next_turn(messages, params, tools=[tool(*names)]))
    _, sent = sent_upstream(stack)
    assert (sent["kv_transfer_params"] != PREFILL_REQUEST_PARAMS) is read
    assert ("cache_salt" in sent) is read


def test_the_plain_decode_route_signs_no_turn(client, stack):
    prefill = post(client, stack, PREFILL, chat(max_tokens=1, return_token_ids=True))
    decode = post(
        client,
        stack,
        "/pd/v1/chat/completions",
        chat(kv_transfer_params=prefill["kv_transfer_params"], return_token_ids=True),
    )
    # The decode server's turn parameters go back as it wrote them, unsigned: the next
    # turn's prefill route reads nothing back for them.
    assert "token_policy_proof" not in decode["kv_transfer_params"]
    messages = [
        *chat()["messages"],
        {"role": "assistant", "content": decode["choices"][0]["message"]["content"]},
    ]
    stack.clear()
    post(client, stack, PREFILL, next_turn(messages, decode["kv_transfer_params"]))
    _, sent = sent_upstream(stack)
    assert sent["kv_transfer_params"] == PREFILL_REQUEST_PARAMS
    assert json.dumps(sent).find("stub-decode-engine") == -1
