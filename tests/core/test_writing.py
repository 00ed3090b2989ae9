"""Writing a document back: members removed, nothing else changed, every document
read written back or refused as too deep."""

import json

import pytest

from ext_proc.core import writing
from ext_proc.core.errors import BadRequest, Refusal
from ext_proc.core.reading import Parsed
from ext_proc.core.vllm_request import KV_KEY as KV
from tests.parsing import read, rewritten


def test_without_keeps_everything_else():
    document = {
        "model": "m",
        "messages": [{"role": "user", "content": "héllo \U0001f600"}],
        "temperature": 0.1,
        "big": 10**30,
        "kv_transfer_params": {
            "do_remote_prefill": True,
            "prompt_token_ids": [1, 2],
            "remote_block_ids": [[1, 2]],
            "prompt_features": [3],
            "remote_port": 5,
        },
        "tail": None,
    }
    original = json.loads(json.dumps(document))
    out = rewritten(
        Parsed(document, False), [(KV, key) for key in ("prompt_token_ids", "prompt_features")]
    )
    assert document == original  # input not mutated
    parsed = json.loads(out)
    expected = dict(original)
    expected["kv_transfer_params"] = {
        "do_remote_prefill": True,
        "remote_block_ids": [[1, 2]],
        "remote_port": 5,
    }
    assert parsed == expected
    assert list(parsed) == list(original)
    assert list(parsed["kv_transfer_params"]) == [
        "do_remote_prefill",
        "remote_block_ids",
        "remote_port",
    ]
    assert "héllo \U0001f600".encode() in out  # text kept as UTF-8, not escaped


def test_without_survives_lone_surrogates_and_nan():
    document = read(b'{"s": "\\ud800", "n": NaN, "kv_transfer_params": {"prompt_token_ids": [1]}}')
    out = rewritten(document, [(KV, "prompt_token_ids")])
    again = json.loads(out)
    assert again["s"] == "\ud800"
    assert again["n"] != again["n"]
    assert again["kv_transfer_params"] == {}


def test_big_integers_keep_their_exact_value_through_a_rewrite():
    raw = b'{"n": 123456789012345678901234567890, "kv_transfer_params": {"prompt_token_ids": [1]}}'
    out = json.loads(rewritten(read(raw), [(KV, "prompt_token_ids")]))
    assert out["n"] == 123456789012345678901234567890
    assert type(out["n"]) is int


def test_fast_writer_round_trips_through_json_loads():
    document = {"f": 0.1, "g": -0.0, "h": 5e-324, "s": "ü\u0000\n✓", "i": -(2**59)}
    raw = json.dumps({**document, "kv_transfer_params": {"prompt_token_ids": [1]}}).encode()
    parsed = read(raw)
    assert parsed.orjson_safe
    out = json.loads(rewritten(parsed, [(KV, "prompt_token_ids")]))
    assert json.dumps(out) == json.dumps({**json.loads(raw), "kv_transfer_params": {}})


def nested(depth: int) -> bytes:
    """A strip-route body ``depth`` levels deep (the outer object is level 1)."""
    inner = b'{"a":' * (depth - 1) + b"1" + b"}" * (depth - 1)
    return b'{"kv_transfer_params":{"prompt_token_ids":[1]},"x":' + inner + b"}"


@pytest.mark.parametrize("depth", [254, 255, 500])
def test_nesting_orjson_cannot_write_is_written_by_json_dumps(depth):
    # orjson reads 1024 levels but writes 254: past that, json.dumps writes the rewrite.
    raw = nested(depth)
    parsed = read(raw)
    assert parsed.orjson_safe
    out = rewritten(parsed, [(KV,)])
    expected = {k: v for k, v in json.loads(raw).items() if k != KV}
    assert json.loads(out) == expected


@pytest.mark.parametrize("depth", [254, 255, 1000, 1023])
def test_every_document_read_is_written_back_or_refused_as_too_deep(depth):
    raw = nested(depth)
    parsed = read(raw)  # orjson reads up to 1024 levels
    try:
        out: bytes | Refusal = rewritten(parsed, [(KV, "prompt_token_ids")])
    except BadRequest as exc:
        out = exc.refusal()
    if isinstance(out, Refusal):
        assert out.status == 400
        assert out.reason == "body_too_deep"
        assert depth > 255
    else:
        again = json.loads(out)
        assert again[KV] == {}
        assert again["x"] == parsed.document["x"]


def test_beyond_the_recursion_limit_a_rewrite_is_refused_not_raised():
    document: dict = {}
    for _ in range(5000):
        document = {"a": document}
    with pytest.raises(BadRequest) as caught:
        writing.serialize(document)
    assert caught.value.reason == "body_too_deep"
    # Read by json.loads (a NaN elsewhere), written by json.dumps alone.
    parsed = Parsed({"n": float("nan"), "x": document, KV: {}}, orjson_safe=False)
    with pytest.raises(BadRequest) as caught:
        rewritten(parsed, [(KV,)])
    assert caught.value.reason == "body_too_deep"


def test_without_removes_members_at_any_path_and_copies_only_their_way():
    document = {
        "a": {"kv_transfer_params": 1, "keep": 2},
        "list": [{"kv_transfer_params": 3}, {"other": 4}],
        "b": [1, 2],
        "kv_transfer_params": {"x": 1},
    }
    parsed = Parsed(json.loads(json.dumps(document)), True)
    paths = [
        ("a", "kv_transfer_params"),
        ("list", 0, "kv_transfer_params"),
        ("missing", "kv_transfer_params"),  # names nothing: skipped
        ("b", 5, "x"),  # an index past the end
        ("b", 0, "x"),  # a scalar on the way
    ]
    out = json.loads(rewritten(parsed, paths))
    assert out == {
        "a": {"keep": 2},
        "list": [{}, {"other": 4}],
        "b": [1, 2],
        "kv_transfer_params": {"x": 1},
    }
    assert parsed.document == document  # not modified
    assert list(out) == list(document)  # positions kept
