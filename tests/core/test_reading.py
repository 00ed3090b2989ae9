"""Reading a body: the document json.loads reads, by orjson where that is exact, with
long arrays of ids read from their bytes."""

import json

import orjson
import pytest

from ext_proc.core import ids, reading
from ext_proc.core.errors import BadRequest
from ext_proc.core.vllm_request import KV_KEY as KV
from ext_proc.core.vllm_request import policed_keys
from tests.parsing import read, rewritten


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"[1]", b'"x"', b"null", b"\xff\xfe\xff", b"{'a': 1}", b'{"a":1}x'],
)
def test_unreadable_or_non_object_bodies_refused(raw):
    with pytest.raises(BadRequest):
        read(raw)


def test_parse_matches_json_loads_on_duplicates_and_encodings():
    raw = b'{"kv_transfer_params": {"prompt_token_ids": [1]}, "kv_transfer_params": {"x": 1}}'
    assert read(raw).document == {"kv_transfer_params": {"x": 1}}
    utf16 = json.dumps({"kv_transfer_params": {"prompt_token_ids": [5]}}).encode("utf-16")
    parsed = read(utf16)
    assert policed_keys(parsed.document["kv_transfer_params"]) == ("prompt_token_ids",)
    escaped = b'{"kv_transfer_params": {"\\u0070rompt_token_ids": [5]}}'
    parsed = read(escaped)
    assert policed_keys(parsed.document["kv_transfer_params"]) == ("prompt_token_ids",)


def test_deep_nesting_refused_not_crashed():
    with pytest.raises(BadRequest):
        read(b"[" * 60_000 + b"]" * 60_000)


@pytest.mark.parametrize(
    ("raw", "fast"),
    [
        (b'{"a": 1, "kv_transfer_params": {}}', True),
        (b'{"a": 1, "a": 2}', True),
        (b'{"a": NaN}', False),
        (b'{"a": 1e400}', False),
        (b'\xef\xbb\xbf{"a": 1}', False),
        (b'{"a": "\\ud800"}', False),
        (b'{"a": 123456789012345678901234567890}', False),
        (b'{"a": 1234567890123456789}', True),  # 19 digits, within 64 bits: an int
        (b'{"a": 18446744073709551616}', False),  # 2**64: orjson reads a float
        (b'{"a": -9223372036854775809}', False),  # below -2**63
        (b'{"a": 123456789012345678}', True),
        (b'{"a": "0000000000000000000"}', True),  # a run inside a string, no float
        (b'{"a": "0000000000000000000", "b": 0.5}', False),  # a float: json.loads decides
    ],
)
def test_fast_parser_only_where_it_reads_what_json_loads_reads(raw, fast):
    parsed = read(raw)
    assert parsed.orjson_safe is fast
    assert json.dumps(parsed.document) == json.dumps(json.loads(raw))
    assert all(
        type(a) is type(b)
        for a, b in zip(parsed.document.values(), json.loads(raw).values(), strict=True)
    )


def test_scan_counts_an_upper_bound_on_the_values():
    raw = b'{"a": [1, 2, {"b": "x,y:[{"}], "c": 18446744073709551616}'
    shape = reading.scan(raw)
    assert shape.long_digits
    # 8 values in the document; the separators inside the string count too.
    assert shape.values == raw.count(b",") + raw.count(b":") + raw.count(b"[") + raw.count(b"{") + 1
    assert shape.values >= 8


@pytest.mark.parametrize("at", [0, 1, 17, 18, 19, (1 << 20) - 10, (1 << 20) - 18, (1 << 20) + 3])
def test_scan_finds_a_long_run_of_digits_anywhere_even_across_blocks(at):
    raw = b" " * at + b"1" * 19 + b" " * 40
    assert reading.scan(raw).long_digits
    assert not reading.scan(raw.replace(b"1" * 19, b"1" * 18 + b" ")).long_digits


def test_scan_counts_every_separator_once_across_blocks():
    raw = (b"[1," * 1_000_000)[: 3 << 20]
    assert reading.scan(raw).values == raw.count(b",") + raw.count(b"[") + 1


def test_scan_stops_past_the_limit():
    raw = b"[" + b"1," * (3 << 20) + b"1]"
    shape = reading.scan(raw, 1000)
    assert 1000 < shape.values <= 1000 + (1 << 20)


# --- ids lifted out of the bytes (reading._lifted, ext_proc/core/ids.py) ------------------

LONG_IDS = [(i * 7919) % 128256 for i in range(4000)]


def _resolved(document):
    """``document`` with lifted ids back as the list they are."""
    if isinstance(document, dict):
        return {k: _resolved(v) for k, v in document.items()}
    if isinstance(document, list):
        return [_resolved(v) for v in document]
    return document.to_list() if isinstance(document, ids.Ids) else document


def _lifted_ids(parsed):
    params = parsed.document.get(KV)
    value = params.get("prompt_token_ids") if isinstance(params, dict) else None
    return value if isinstance(value, ids.Ids) else None


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])
def test_a_long_array_of_ids_is_read_from_its_bytes(separators):
    document = {"model": "m", KV: {"prompt_token_ids": LONG_IDS, "remote_port": 1}, "n": 1}
    raw = json.dumps(document, separators=separators).encode()
    parsed = read(raw, lift_ids=True)
    lifted = _lifted_ids(parsed)
    assert lifted is not None
    assert lifted.count == len(LONG_IDS)
    assert parsed.orjson_safe
    assert _resolved(parsed.document) == json.loads(raw)
    assert rewritten(parsed, [(KV, "remote_port")]) == orjson.dumps(
        {"model": "m", KV: {"prompt_token_ids": LONG_IDS}, "n": 1}
    )
    # Where the array lies in the bytes, from its "[" to past its "]".
    assert parsed.lifted is not None
    start, end = parsed.lifted
    assert json.loads(raw[start:end]) == LONG_IDS
    assert (raw[start], raw[end - 1]) == (ord("["), ord("]"))


@pytest.mark.parametrize("bound", [1, 128256 - 1, 128256, 262144, ids.MAX_BOUND])
def test_the_ids_bound_given_to_the_read_answers_as_the_ids_check(bound):
    # The read may check the route's bound in its pass: every bound's fault is the
    # same as when the ids were read without it.
    document = {"model": "m", KV: {"prompt_token_ids": LONG_IDS}}
    raw = json.dumps(document).encode()
    plain = _lifted_ids(read(raw, lift_ids=True))
    bounded = _lifted_ids(reading.parse(raw, lift_ids=True, ids_bound=bound))
    assert plain is not None
    assert bounded is not None
    assert bounded.text == plain.text
    for asked in (1, bound - 1 or 1, bound, 128256, 262144, ids.MAX_BOUND):
        assert bounded.fault(asked) == plain.fault(asked)


def test_short_arrays_and_parses_without_lifting_keep_lists():
    raw = json.dumps({KV: {"prompt_token_ids": [1, 2, 3]}}).encode()
    assert read(raw, lift_ids=True).lifted is None
    assert _lifted_ids(read(raw, lift_ids=True)) is None
    long = json.dumps({KV: {"prompt_token_ids": LONG_IDS}}).encode()
    assert _lifted_ids(read(long)) is None
    assert read(long).lifted is None


IDS_TEXT = json.dumps(LONG_IDS, separators=(",", ":"))


@pytest.mark.parametrize(
    "text",
    [
        # The first copy is shadowed: json.loads keeps the last one.
        f'{{"{KV}": {{"prompt_token_ids": {IDS_TEXT}}}, "{KV}": {{"prompt_token_ids": [1]}}}}',
        f'{{"{KV}": {{"prompt_token_ids": {IDS_TEXT}, "prompt_token_ids": [1]}}}}',
        f'{{"{KV}": {{"prompt_token_ids": {IDS_TEXT}, "prompt_token_\\u0069ds": [1]}}}}',
        # The member is not the one the policy reads.
        f'{{"messages": [{{"{KV}": {{"prompt_token_ids": {IDS_TEXT}}}}}], "{KV}": {{}}}}',
        f'{{"prompt_token_ids": {IDS_TEXT}, "{KV}": {{"prompt_token_ids": [2]}}}}',
        f'{{"{KV}": {{"x": {{"prompt_token_ids": {IDS_TEXT}}}, "prompt_token_ids": [3]}}}}',
        # In a string: the bytes of a member, not a member.
        f'{{"content": "\\"prompt_token_ids\\":{IDS_TEXT}", "{KV}": {{"prompt_token_ids": [4]}}}}',
    ],
)
def test_ids_are_lifted_only_from_the_member_json_loads_keeps(text):
    raw = text.encode()
    parsed = read(raw, lift_ids=True)
    assert _resolved(parsed.document) == json.loads(raw)


@pytest.mark.parametrize(
    "ids_text",
    [
        IDS_TEXT.replace(",", ",\n", 1),
        IDS_TEXT.replace(",", ",0", 1),
        IDS_TEXT.replace(",", ",true,", 1),
        IDS_TEXT.replace(",", ",1.5,", 1),
        IDS_TEXT.replace(",", ",99999999999999999999,", 1),
    ],
)
def test_arrays_read_cannot_vouch_for_are_parsed_whole(ids_text):
    raw = f'{{"{KV}": {{"prompt_token_ids": {ids_text}}}}}'.encode()
    try:
        expected = json.loads(raw)
    except ValueError:
        with pytest.raises(BadRequest):
            read(raw, lift_ids=True)
        return
    parsed = read(raw, lift_ids=True)
    assert _lifted_ids(parsed) is None
    assert parsed.document == expected
