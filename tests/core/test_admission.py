import json
import tracemalloc

import pytest

from ext_proc.core import admission, memory, proof, reading
from ext_proc.core.budget import Account, Budget
from ext_proc.core.errors import PayloadTooLarge, ServiceUnavailable
from ext_proc.core.vllm_request import KV_KEY as KV


def account(limit=1 << 40):
    return Account(Budget(limit))


def test_a_body_is_charged_its_parsed_cost_before_it_is_parsed():
    raw = b'{"a": [1, 2, 3], "kv_transfer_params": {"x": 1}}'
    held = account()
    shape = admission.admit(raw, held, 100)
    assert held.held == memory.cost(len(raw), shape.values)
    # A budget that cannot hold it refuses it before anything is parsed.
    with pytest.raises(ServiceUnavailable):
        admission.admit(raw, account(memory.cost(len(raw), shape.values) - 1), 100)


def test_too_many_values_are_refused_before_anything_is_held():
    held = account()
    with pytest.raises(PayloadTooLarge) as refused:
        admission.admit(b'{"a": [1, 2, 3, 4, 5]}', held, 4)
    assert refused.value.reason == "body_too_complex"
    assert held.held == 0


def test_the_size_limit():
    admission.check_size(10, 10)
    with pytest.raises(PayloadTooLarge) as refused:
        admission.check_size(11, 10)
    assert refused.value.reason == "body_too_large"


@pytest.mark.parametrize(
    "raw",
    [
        # orjson refuses NaN: json.loads reads it.
        b'{"n": NaN, "kv_transfer_params": {}}',
        # orjson reads 300 levels but writes only 254: json.dumps writes the rewrite.
        b'{"d": ' + b"[" * 300 + b"]" * 300 + b', "kv_transfer_params": {"x": 1}}',
    ],
)
def test_the_slow_path_is_charged_once_before_it_runs(raw):
    held = account()
    shape = admission.admit(raw, held, 100_000)
    parsed = admission.parse(raw, shape, held)
    out = admission.without(parsed, ((KV,),), held)
    assert KV not in json.loads(out)
    # One allowance covers json.loads and json.dumps.
    assert held.held == memory.cost(len(raw), shape.values) + memory.slow_extra(len(raw))
    # Not affordable: refused before the slow parser or writer runs.
    tight = account(memory.cost(len(raw), shape.values))
    shape = admission.admit(raw, tight, 100_000)
    parsed = reading.parse(raw, shape)
    slow = (
        (lambda: admission.parse(raw, shape, tight))
        if parsed is None
        else (lambda: admission.without(parsed, ((KV,),), tight))
    )
    with pytest.raises(ServiceUnavailable):
        slow()


def test_orjsons_readings_cost_nothing_more():
    raw = b'{"a": 1, "kv_transfer_params": {"x": 1}}'
    held = account()
    shape = admission.admit(raw, held, 100)
    parsed = admission.parse(raw, shape, held)
    admission.without(parsed, ((KV, "x"),), held)
    assert held.held == memory.cost(len(raw), shape.values)


def test_the_slow_parser_reads_only_bodies_with_a_bounded_cost():
    few = b'{"n": NaN, "a": [' + b"1," * 1000 + b"1]}"
    assert not admission.parse(few, reading.scan(few), account()).orjson_safe  # json.loads
    many = b'{"n": NaN, "a": [' + b"1," * memory.SLOW_PARSE_MAX_VALUES + b"1]}"
    large = b'{"n": NaN, "a": "' + b"x" * memory.SLOW_PARSE_MAX_BYTES + b'"}'
    for raw in (many, large):
        held = account()
        with pytest.raises(PayloadTooLarge) as refused:
            admission.parse(raw, reading.scan(raw), held)
        assert refused.value.reason == "body_needs_slow_parse"
        assert held.held == 0
    # The same sizes in plain JSON are orjson's: no limit but the caller's.
    for raw in (many.replace(b"NaN", b"0"), large.replace(b"NaN", b"0")):
        assert admission.parse(raw, reading.scan(raw), account()).orjson_safe


def test_json_dumps_writes_only_bodies_small_enough_for_the_slow_path():
    # 300 levels: orjson reads them and cannot write them back.
    deep = b'{"d":' + b"[" * 300 + b"0" + b"]" * 300 + b',"kv_transfer_params":{},"a":"'
    small_raw = deep + b"a" * 1000 + b'"}'
    small = admission.parse(small_raw, reading.scan(small_raw), account())
    assert small.orjson_safe
    assert json.loads(admission.without(small, ((KV,),), account()))["d"] == small.document["d"]
    large_raw = deep + b"a" * memory.SLOW_PARSE_MAX_BYTES + b'"}'
    large = admission.parse(large_raw, reading.scan(large_raw), account())
    with pytest.raises(PayloadTooLarge) as refused:
        admission.without(large, ((KV,),), account())
    assert refused.value.reason == "body_needs_slow_parse"


# --- the prompt digest (proof.prompt_digest): json.dumps gated and charged like the parse

CHAT_PATH = "/v1/chat/completions"
MiB = 1 << 20
# Deeper than the 254 levels orjson writes (it reads 1024): only json.dumps renders it.
DEPTH = 300
ASTRAL = "\U0001f600"  # 4 bytes of UTF-8, 12 characters of json.dumps's ASCII escapes


def deep_chat(inner: bytes) -> bytes:
    """A chat request whose other member holds ``inner`` nested DEPTH levels deep."""
    head = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"x":'
    return head + b"[" * DEPTH + inner + b"]" * DEPTH + b"}"


def one_string(size: int, text: str) -> bytes:
    unit = text.encode()
    return deep_chat(b'"' + unit * ((size - 2 * DEPTH - 64) // len(unit)) + b'"')


DIGEST_BODIES = {
    # The bulk of the body in one string: json.dumps's text is 1x (ASCII) or 3x (astral
    # escapes) the bytes, held twice while its chunks are joined.
    "ascii_15mib": lambda: one_string(15 * MiB, "a"),
    "astral_15mib": lambda: one_string(15 * MiB, ASTRAL),
    "ascii_4mib": lambda: one_string(4 * MiB - 1024, "a"),
    "astral_4mib": lambda: one_string(4 * MiB - 1024, ASTRAL),
    # Per value: sort_keys sorts each object's items into a list of pairs.
    "many_keys": lambda: deep_chat(b"{" + b",".join(b'"k%d":1' % i for i in range(30_000)) + b"}"),
    # Per value: a float's repr can be several times its literal.
    "floats": lambda: deep_chat(b"1e15," * 60_000 + b"0"),
}


@pytest.mark.parametrize("name", sorted(DIGEST_BODIES))
def test_the_digest_fallback_peaks_within_its_charge(name):
    # What the parsed document and the work on it may hold: the charge but the body's
    # copies (memory.COPIES, the raw bytes among them, allocated before tracing).
    raw = DIGEST_BODIES[name]()
    held = account()
    shape = admission.admit(raw, held, memory.MAX_JSON_VALUES)
    allowed = memory.slow_allowed(len(raw), shape.values)
    assert allowed is ("15mib" not in name)
    tracemalloc.start()
    try:
        parsed = admission.parse(raw, shape, held)
        assert parsed.orjson_safe  # orjson read it: its parse is not the slow one
        assert proof.prompt_digest(parsed.document, True, CHAT_PATH) is None
        tracemalloc.reset_peak()  # the fallback's peak, the document held
        if allowed:
            digest = admission.digest(parsed, CHAT_PATH, held)
            assert digest == proof.prompt_digest_slow(parsed.document, CHAT_PATH)
        else:
            with pytest.raises(PayloadTooLarge) as refused:
                admission.digest(parsed, CHAT_PATH, held)
            assert refused.value.reason == "body_needs_slow_parse"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    size = len(raw)
    charged = held.held - memory.COPIES * size
    print(f"{name}: {size} bytes, peak {peak / size:.1f}x, charged {charged / size:.1f}x")
    assert peak <= charged, (peak, charged)
    if allowed:  # charged before json.dumps ran, as for the slow parser and writer
        assert held.held == memory.cost(size, shape.values) + memory.slow_extra(size)
