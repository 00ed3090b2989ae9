"""Points 4 to 7: bodies at the edges of what the parsers and vLLM accept.

Each answer is a clean JSON reply (200 or a 4xx with a reason, naming no internals),
never a 5xx.
"""

from __future__ import annotations

import json

import pytest

from tests.hostile.conftest import shipped_stack
from tests.hostile.h2client import H2
from tests.hostile.load import post


@pytest.fixture(scope="module", params=["one-message", "two-message"])
def gateway(request, tmp_path_factory):
    with shipped_stack(tmp_path_factory.mktemp(request.param), request.param) as stack:
        yield stack


def assert_clean_error(content: bytes, code: int) -> None:
    """vLLM's error shape with a message that names no internals (point 6)."""
    error = json.loads(content)["error"]
    assert error["code"] == code
    for internal in ("class", "gRPC", "ext_proc", "state", "Traceback"):
        assert internal not in error["message"], error


def nested(depth: int) -> bytes:
    """A strip-route body with ids and a value nested ``depth`` levels deep."""
    deep = "[" * depth + "1" + "]" * depth
    return (
        '{"model":"tiny","messages":[{"role":"user","content":"hi"}],'
        f'"deep":{deep},"kv_transfer_params":{{"prompt_token_ids":[1,2,3]}}}}'
    ).encode()


def test_deep_nesting_is_stripped_or_refused_never_a_server_error(gateway):
    replies = {
        depth: post(gateway.url + "/v1/chat/completions", nested(depth))
        for depth in (100, 300, 600, 900, 1100, 5000)
    }
    print("\n" + ", ".join(f"depth {d}: {status}" for d, (status, _) in replies.items()))
    for depth, (status, content) in replies.items():
        assert status in (200, 400), (depth, content[:200])
        if status == 400:
            assert_clean_error(content, 400)
    assert replies[300][0] == replies[600][0] == 200  # orjson reads them; json.dumps writes


def test_ids_beyond_32_bits_never_reach_the_upstream(gateway):
    gateway.clear()
    for ids in ([2**64], [2**31], [int("9" * 4300)]):
        data = json.dumps(
            {"model": "tiny", "messages": [], "kv_transfer_params": {"prompt_token_ids": ids}}
        ).encode()
        status, content = post(gateway.url + "/trusted/v1/chat/completions", data)
        assert status == 400, content[:200]
        assert_clean_error(content, 400)
    assert gateway.received() == []


def test_trailers_without_a_body_are_a_bad_request(gateway):
    client = H2(gateway.gateway)
    try:
        stream = client.open("/v1/chat/completions", [])
        client.trailers(stream, [("x-checksum", "0")])
        reply = client.wait(stream)
    finally:
        client.close()
    assert reply.status == 400, reply.body
    assert_clean_error(reply.body, 400)
    assert json.loads(reply.body)["error"]["message"] == "request body is empty"


def test_a_body_of_many_carriers_is_refused_at_once(gateway):
    # Every item of a derender-style list names a carrier: removing each would be
    # Python work per item (once quadratic). Refused with a clean 400 instead, nothing
    # forwarded, and a plain request right after it is answered.
    gateway.clear()
    for count in (65, 87_000):
        items = ",".join(['{"kv_transfer_params":0}'] * count)
        data = ('{"model":"tiny","messages":[],"generate_responses":[' + items + "]}").encode()
        status, content = post(gateway.url + "/v1/chat/completions", data)
        print(f"\n{count} carriers, {len(data)} bytes: {status}")
        assert status == 400, content[:200]
        assert_clean_error(content, 400)
        assert json.loads(content)["error"]["message"].startswith("request carries more than")
    assert gateway.received() == []
    plain = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert post(gateway.url + "/v1/chat/completions", plain.encode())[0] == 200
