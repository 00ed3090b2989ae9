"""Conformance against a real vLLM: its own usage counts say which tokens it ran.

A request with ids counts exactly len(ids) prompt tokens when vLLM honors them, and the
templated count (system prompt included) when it renders the messages instead.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conformance.conftest import ANY_CALLER, DENY, VOCAB
from tests.conformance.results import record

IDS = [5, 6, 7, 8, 9, 10, 11]
PD_KEYS = {
    "do_remote_prefill": False,
    "do_remote_decode": False,
    "remote_block_ids": None,
    "remote_engine_id": None,
    "remote_host": None,
    "remote_port": None,
}
SYSTEM = "You are a careful assistant. Never reveal the secret."
USER = "hello there"
JSON = {"content-type": "application/json"}


def chat_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "max_tokens": 2,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
        **extra,
    }


def stream_body(**extra: Any) -> dict[str, Any]:
    return chat_body(stream=True, stream_options={"include_usage": True}, **extra)


def responses_body(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_output_tokens": 2, "instructions": SYSTEM, "input": USER, **extra}


def messages_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "max_tokens": 2,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": USER}],
        **extra,
    }


ENDPOINTS = {
    "chat": ("/v1/chat/completions", chat_body),
    "chat-stream": ("/v1/chat/completions", stream_body),
    "responses": ("/v1/responses", responses_body),
    "messages": ("/v1/messages", messages_body),
}


def prompt_count(reply: httpx.Response) -> int:
    assert reply.status_code == 200, reply.text
    if reply.headers["content-type"].startswith("text/event-stream"):
        usage = None
        for line in reply.text.splitlines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
        assert usage is not None, reply.text
    else:
        usage = reply.json()["usage"]
    return int(usage.get("prompt_tokens", usage.get("input_tokens")))


def post(
    base: str, path: str, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None
) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(base + path, content=content, headers=headers or JSON, timeout=120)


@pytest.fixture(scope="session")
def baselines(vllm: str) -> dict[str, int]:
    """Templated prompt counts, straight to vLLM without ids."""
    counts = {
        name: prompt_count(post(vllm, path, make())) for name, (path, make) in ENDPOINTS.items()
    }
    assert all(count > len(IDS) for count in counts.values()), counts
    return counts


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_hole_exists_straight_to_vllm(vllm, baselines, endpoint):
    path, make = ENDPOINTS[endpoint]
    count = prompt_count(post(vllm, path, make(kv_transfer_params={"prompt_token_ids": IDS})))
    record("straight, no ids", endpoint, baselines[endpoint])
    record("straight, 7 ids", endpoint, count)
    assert count == len(IDS)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_aggregated_strip_runs_the_templated_prompt(gateway, baselines, endpoint):
    path, make = ENDPOINTS[endpoint]
    body = make(kv_transfer_params={"prompt_token_ids": IDS, **PD_KEYS})
    count = prompt_count(post(gateway.url, path, body))
    record("gateway /v1 strip, 7 ids", endpoint, count)
    assert count == baselines[endpoint]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_aggregated_deny_answers_400(gateway, endpoint):
    path, make = ENDPOINTS[endpoint]
    reply = post(gateway.url, DENY + path, make(kv_transfer_params={"prompt_token_ids": IDS}))
    record("gateway deny route, 7 ids", endpoint, reply.status_code)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "kv_transfer_params.prompt_token_ids"


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_disaggregated_strips_a_clients_unproven_ids(gateway, baselines, endpoint):
    # The shipped decode route honors only what the deployment minted (docs/trust.md):
    # a client's own ids, P/D keys and all, are removed before vLLM reads them.
    path, make = ENDPOINTS[endpoint]
    body = make(kv_transfer_params={"prompt_token_ids": IDS, **PD_KEYS})
    count = prompt_count(post(gateway.url, "/pd" + path, body))
    record("gateway /pd honor, 7 unproven ids + P/D keys", endpoint, count)
    assert count == baselines[endpoint]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_trust_any_caller_honors_well_formed_ids(gateway, endpoint):
    # The gateway's validation passes what vLLM's reuse path takes, on every endpoint.
    path, make = ENDPOINTS[endpoint]
    body = make(kv_transfer_params={"prompt_token_ids": IDS, **PD_KEYS})
    count = prompt_count(post(gateway.url, ANY_CALLER + path, body))
    record("gateway honor, trust_any_caller, 7 ids + P/D keys", endpoint, count)
    assert count == len(IDS)


@pytest.mark.parametrize(
    ("ids", "label"),
    [
        ([1, True, 3], "bool id"),
        ([], "empty"),
        ([-1], "negative"),
        ([1.0], "float"),
        ([1, VOCAB], "out of vocabulary"),
    ],
)
@pytest.mark.parametrize("endpoint", ["chat", "responses", "messages"])
def test_trusted_malformed_ids_are_denied_before_vllm(gateway, vllm, endpoint, ids, label):
    # Trusted ids are validated at least as strictly as vLLM does (the answer is the
    # gateway's own 400, in vLLM's shape).
    path, make = ENDPOINTS[endpoint]
    body = make(kv_transfer_params={"prompt_token_ids": ids})
    reply = post(gateway.url, ANY_CALLER + path, body)
    record(f"gateway trust_any_caller + vocab, {label}", endpoint, reply.status_code)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "kv_transfer_params.prompt_token_ids"
    assert error["message"].startswith("kv_transfer_params.prompt_token_ids")  # the gateway's


def _ids_doc(endpoint: str) -> dict[str, Any]:
    _, make = ENDPOINTS[endpoint]
    return make(kv_transfer_params={"prompt_token_ids": IDS})


def _variant(name: str) -> tuple[bytes, dict[str, str]]:
    text = json.dumps(_ids_doc("chat"))
    if name == "duplicate kv key, ids in the last":
        shadow = '{"kv_transfer_params": {"x": 1}, '
        return (shadow + text[1:]).encode(), JSON
    if name == "escaped key name":
        return text.replace('"prompt_token_ids"', '"\\u0070rompt_token_ids"').encode(), JSON
    if name == "utf-16 body":
        return text.encode("utf-16"), JSON
    if name == "utf-8 BOM":
        return b"\xef\xbb\xbf" + text.encode(), JSON
    if name == "NaN elsewhere":
        return text.replace('"max_tokens": 2', '"max_tokens": 2, "x_nan": NaN').encode(), JSON
    if name == "charset and upper-case media type":
        return text.encode(), {"content-type": "Application/JSON; charset=latin-1"}
    if name == "duplicate ids key, ids last":
        inner = '"kv_transfer_params": {"prompt_token_ids": [], "prompt_token_ids": '
        return text.replace('"kv_transfer_params": {"prompt_token_ids": ', inner).encode(), JSON
    raise AssertionError(name)


VARIANTS = [
    "duplicate kv key, ids in the last",
    "escaped key name",
    "utf-16 body",
    "utf-8 BOM",
    "NaN elsewhere",
    "charset and upper-case media type",
    "duplicate ids key, ids last",
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_parser_parity_variants_vllm_accepts_are_stripped(vllm, gateway, baselines, variant):
    data, headers = _variant(variant)
    straight = prompt_count(post(vllm, "/v1/chat/completions", data, headers))
    record(f"parity: {variant}", "straight", straight)
    assert straight == len(IDS), "vLLM must honor this variant for the case to matter"
    through = post(gateway.url, "/v1/chat/completions", data, headers)
    if through.status_code == 200:
        count = prompt_count(through)
        record(f"parity: {variant}", "gateway /v1", count)
        assert count == baselines["chat"]
    else:
        record(f"parity: {variant}", "gateway /v1", through.status_code)
        assert through.status_code in (400, 415)


@pytest.mark.parametrize(
    ("headers", "data"),
    [({"content-type": "text/plain"}, None), ({}, None)],
    ids=["text/plain", "no content-type"],
)
def test_non_json_media_types_refused_by_both(vllm, gateway, headers, data):
    body = json.dumps(_ids_doc("chat")).encode()
    straight = httpx.post(vllm + "/v1/chat/completions", content=body, headers=headers, timeout=60)
    through = httpx.post(
        gateway.url + "/v1/chat/completions", content=body, headers=headers, timeout=60
    )
    assert straight.status_code == 400
    assert through.status_code == 415
