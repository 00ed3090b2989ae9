"""devstack.upstream: the stand-in answers with the fields vLLM 0.32 adds, where vLLM puts them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from devstack import tokens
from devstack.upstream import (
    ADMIN_PATH,
    FIRST_GRPC_STATUS_HEADER,
    FIRST_STATUS_HEADER,
    Recorded,
    Recorder,
    _first_copy,
    _handle,
    _respond,
    openai_response,
)

HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo"}]
RENDERED = "<|system|>Be brief.\n<|user|>héllo\n"


def reply(path: str, document: Any) -> dict[str, Any]:
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    return openai_response(Recorded("POST", path, [], body, body))


def test_chat_with_return_token_ids_reports_the_prompt_ids_at_the_top_level():
    payload = reply(
        "/v1/chat/completions", {"model": "m", "messages": HELLO, "return_token_ids": True}
    )
    expected = [tokens.BOS, *RENDERED.encode()]
    assert payload["prompt_token_ids"] == expected
    assert all(0 <= i < 1000 for i in expected)
    assert payload["kv_transfer_params"] is None
    (choice,) = payload["choices"]
    assert choice["token_ids"] == [tokens.EOS]
    assert payload["usage"] == {
        "prompt_tokens": len(expected),
        "completion_tokens": 1,
        "total_tokens": len(expected) + 1,
    }


def test_ids_are_deterministic_and_follow_the_prompt():
    asked = {"model": "m", "messages": HELLO, "return_token_ids": True}
    changed = {**asked, "messages": [{"role": "user", "content": "other"}]}
    first = reply("/v1/chat/completions", asked)["prompt_token_ids"]
    assert reply("/v1/chat/completions", asked)["prompt_token_ids"] == first
    assert reply("/v1/chat/completions", changed)["prompt_token_ids"] != first


def test_an_empty_prompt_still_has_one_id():
    payload = reply("/v1/chat/completions", {"messages": [], "return_token_ids": True})
    assert payload["prompt_token_ids"] == [tokens.BOS]


@pytest.mark.parametrize("asked", [None, False, "true", 1])
def test_without_return_token_ids_the_fields_are_null(asked):
    document: dict[str, Any] = {"model": "m", "messages": HELLO}
    if asked is not None:
        document["return_token_ids"] = asked
    payload = reply("/v1/chat/completions", document)
    # vLLM serializes every field (model_dump), so the keys are there, set to null.
    assert payload["prompt_token_ids"] is None
    assert payload["choices"][0]["token_ids"] is None
    assert payload["kv_transfer_params"] is None
    assert payload["usage"]["prompt_tokens"] == len(RENDERED.encode()) + 1


def test_a_prefill_request_gets_the_connector_parameters():
    document = {
        "messages": HELLO,
        "return_token_ids": True,
        "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
    }
    payload = reply("/v1/chat/completions", document)
    params = payload["kv_transfer_params"]
    assert params == tokens.CONNECTOR_REPLY
    assert (params["do_remote_prefill"], params["do_remote_decode"]) == (True, False)
    assert params is not tokens.CONNECTOR_REPLY
    assert payload["prompt_token_ids"][0] == tokens.BOS


@pytest.mark.parametrize("flag", [False, "true", 1, None])
def test_only_a_true_do_remote_decode_is_a_prefill(flag):
    document = {"messages": HELLO, "kv_transfer_params": {"do_remote_decode": flag}}
    assert reply("/v1/chat/completions", document)["kv_transfer_params"] is None


def test_reused_ids_replace_the_rendered_prompt_as_in_vllm():
    document = {
        "messages": HELLO,
        "return_token_ids": True,
        "kv_transfer_params": {"prompt_token_ids": [7, 8, 9], "do_remote_prefill": True},
    }
    payload = reply("/v1/chat/completions", document)
    assert payload["prompt_token_ids"] == [7, 8, 9]
    assert payload["usage"]["prompt_tokens"] == 3
    assert payload["kv_transfer_params"] is None


@pytest.mark.parametrize(
    "change",
    [
        {"echo": True},
        {"kv_transfer_params": {"prompt_token_ids": [1, True]}},
        {"kv_transfer_params": {"prompt_token_ids": [1, -2]}},
        {"kv_transfer_params": {"prompt_token_ids": []}},
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        },
    ],
)
def test_ids_vllm_would_not_reuse_leave_the_rendered_prompt(change):
    document = {"messages": HELLO, "kv_transfer_params": {"prompt_token_ids": [7, 8, 9]}}
    payload = reply("/v1/chat/completions", {**document, **change, "return_token_ids": True})
    assert payload["prompt_token_ids"][0] == tokens.BOS


def test_completions_carry_the_ids_per_choice():
    payload = reply("/v1/completions", {"prompt": "ab", "return_token_ids": True})
    (choice,) = payload["choices"]
    assert choice["prompt_token_ids"] == [tokens.BOS, ord("a"), ord("b")]
    assert choice["token_ids"] == [tokens.EOS]
    assert "prompt_token_ids" not in payload
    assert payload["kv_transfer_params"] is None
    tokens_in = reply("/v1/completions", {"prompt": [5, 6], "return_token_ids": True})
    assert tokens_in["choices"][0]["prompt_token_ids"] == [5, 6]


def test_responses_carry_transfer_parameters_and_count_the_input():
    document = {
        "instructions": "Be brief.",
        "input": "hi",
        "kv_transfer_params": {"do_remote_decode": True},
    }
    payload = reply("/v1/responses", document)
    assert payload["kv_transfer_params"] == tokens.CONNECTOR_REPLY
    assert payload["usage"]["input_tokens"] == len(b"<|system|>Be brief.\nhi") + 1


@pytest.mark.parametrize("body", [b"", b"not json", b"[1, 2]", b'{"messages": 3}'])
def test_any_body_gets_an_answer(body):
    payload = reply("/v1/chat/completions", body)
    assert payload["prompt_token_ids"] is None
    assert payload["stub_received"]["body"] == body.decode()


def test_the_admin_path_counts_recorded_requests_without_their_bodies():
    recorder = Recorder()
    for _ in range(3):
        _respond(recorder, Recorded("POST", "/v1/chat/completions", [], b"{}", b"{}"))
    admin = Recorded("GET", ADMIN_PATH + "?count", [], b"", b"")
    assert _respond(recorder, admin) == (200, {"count": 3, "incomplete": 0})
    assert len(_respond(recorder, Recorded("GET", ADMIN_PATH, [], b"", b""))[1]) == 3


async def _cut_short(recorder: Recorder, sent: bytes) -> None:
    """``sent`` to the stand-in over a real socket, the connection closed after it."""
    server = await asyncio.start_server(lambda r, w: _handle(recorder, r, w), "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(sent)
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        for _ in range(100):  # until the stand-in has seen the connection end
            if recorder.incomplete or recorder.requests:
                break
            await asyncio.sleep(0.01)


HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n"


def test_a_request_whose_connection_ends_before_its_body_is_counted_not_recorded():
    recorder = Recorder()
    asyncio.run(_cut_short(recorder, HEAD + b"{}"))
    assert (recorder.incomplete, recorder.requests) == (1, [])
    admin = Recorded("GET", ADMIN_PATH + "?count", [], b"", b"")
    assert _respond(recorder, admin) == (200, {"count": 0, "incomplete": 1})
    _respond(recorder, Recorded("DELETE", ADMIN_PATH, [], b"", b""))
    assert recorder.incomplete == 0


def test_a_whole_request_is_recorded_not_counted_incomplete():
    recorder = Recorder()
    asyncio.run(_cut_short(recorder, HEAD + b'{"a": 1}  '))
    assert (recorder.incomplete, len(recorder.requests)) == (0, 1)


def test_a_request_asking_to_fail_once_fails_its_first_copy_only():
    recorder = Recorder()
    asked = [(FIRST_STATUS_HEADER, "503"), (FIRST_GRPC_STATUS_HEADER, "14")]
    first = Recorded("POST", "/v1/chat/completions", asked, b"{}", b"{}")
    assert _first_copy(recorder, first) == (503, [("grpc-status", "14")])
    _respond(recorder, first)
    # The same request again (a retry): answered as usual; another body fails once too.
    assert _first_copy(recorder, first) == (None, [])
    other = Recorded("POST", "/v1/chat/completions", asked, b"{ }", b"{ }")
    assert _first_copy(recorder, other) == (503, [("grpc-status", "14")])
    # Without the headers, or with values that are no status: the usual reply.
    plain = Recorded("POST", "/v1/completions", [], b"{}", b"{}")
    assert _first_copy(recorder, plain) == (None, [])
    odd = Recorded("POST", "/v1/completions", [(FIRST_STATUS_HEADER, "99x")], b"{}", b"{}")
    assert _first_copy(recorder, odd) == (None, [])
