import json

import orjson
import pytest

from ext_proc.core import body, ids
from ext_proc.core.errors import BadRequest, Refusal, UnsupportedMediaType
from ext_proc.core.vllm_request import KV_KEY as KV
from ext_proc.core.vllm_request import policed_keys
from tests.parsing import read, rewritten


@pytest.mark.parametrize(
    "content_type",
    [
        b"application/json",
        b"Application/JSON",
        b"application/json; charset=utf-8",
        b" application/json ",
    ],
)
def test_json_media_types_accepted(content_type):
    body.check_headers([content_type], [])


@pytest.mark.parametrize(
    "content_types",
    [
        [],
        [b"text/plain"],
        [b"application/x-www-form-urlencoded"],
        [b"application/jsonx"],
        [b"application/json-seq"],
        [b"application/vnd.api+json"],
        [b"multipart/form-data; boundary=x"],
        [b"application/json", b"application/json"],
    ],
)
def test_other_media_types_refused(content_types):
    with pytest.raises(UnsupportedMediaType) as caught:
        body.check_headers(content_types, [])
    assert caught.value.status == 415
    assert caught.value.reason == "unsupported_media_type"


@pytest.mark.parametrize("encodings", [[b"gzip"], [b"identity, br"], [b"identity", b"deflate"]])
def test_compressed_bodies_refused(encodings):
    with pytest.raises(UnsupportedMediaType) as caught:
        body.check_headers([b"application/json"], encodings)
    assert caught.value.reason == "content_encoding"


@pytest.mark.parametrize("encodings", [[], [b"identity"], [b"Identity"]])
def test_identity_encoding_accepted(encodings):
    body.check_headers([b"application/json"], encodings)


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
        body.Parsed(document, False), [(KV, key) for key in ("prompt_token_ids", "prompt_features")]
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
        body.serialize(document)
    assert caught.value.reason == "body_too_deep"
    # Read by json.loads (a NaN elsewhere), written by json.dumps alone.
    parsed = body.Parsed({"n": float("nan"), "x": document, KV: {}}, orjson_safe=False)
    with pytest.raises(BadRequest) as caught:
        rewritten(parsed, [(KV,)])
    assert caught.value.reason == "body_too_deep"


def test_scan_counts_an_upper_bound_on_the_values():
    raw = b'{"a": [1, 2, {"b": "x,y:[{"}], "c": 18446744073709551616}'
    shape = body.scan(raw)
    assert shape.long_digits
    # 8 values in the document; the separators inside the string count too.
    assert shape.values == raw.count(b",") + raw.count(b":") + raw.count(b"[") + raw.count(b"{") + 1
    assert shape.values >= 8


@pytest.mark.parametrize("at", [0, 1, 17, 18, 19, (1 << 20) - 10, (1 << 20) - 18, (1 << 20) + 3])
def test_scan_finds_a_long_run_of_digits_anywhere_even_across_blocks(at):
    raw = b" " * at + b"1" * 19 + b" " * 40
    assert body.scan(raw).long_digits
    assert not body.scan(raw.replace(b"1" * 19, b"1" * 18 + b" ")).long_digits


def test_scan_counts_every_separator_once_across_blocks():
    raw = (b"[1," * 1_000_000)[: 3 << 20]
    assert body.scan(raw).values == raw.count(b",") + raw.count(b"[") + 1


def test_scan_stops_past_the_limit():
    raw = b"[" + b"1," * (3 << 20) + b"1]"
    shape = body.scan(raw, 1000)
    assert 1000 < shape.values <= 1000 + (1 << 20)


# --- lacks_key: proven from the bytes that json.loads reads no such member -----------

CHAT = {"model": "m", "messages": [{"role": "user", "content": 'é "q" \\ \n 🙂 \u00e9'}]}


@pytest.mark.parametrize("ensure_ascii", [False, True])
@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
def test_a_chat_without_the_key_lacks_it(ensure_ascii, bom):
    raw = bom + json.dumps(CHAT, ensure_ascii=ensure_ascii).encode()
    assert body.lacks_key(raw, KV)
    assert KV not in json.loads(raw)


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({**CHAT, KV: None}),
        json.dumps({**CHAT, "extra": {KV: {}}}),  # nested: judged by the parse
        json.dumps({**CHAT, "note": KV}),  # a string that is the key: likewise
    ],
)
def test_the_key_written_anywhere_is_not_lacking(text):
    assert not body.lacks_key(text.encode(), KV)


@pytest.mark.parametrize(
    "extra",
    [{"note": f"what is {KV}?"}, {f"max_{KV}": 1}, {f"{KV}_2": 1}],
    ids=["prose", "longer-name", "suffixed-name"],
)
def test_the_key_inside_other_text_is_lacking(extra):
    raw = json.dumps({**CHAT, **extra}).encode()
    assert body.lacks_key(raw, KV)
    assert KV not in json.loads(raw)


@pytest.mark.parametrize("position", range(len(KV)))
@pytest.mark.parametrize("spell", ["\\u{:04x}", "\\u{:04X}"])
def test_any_character_of_the_key_escaped_is_not_lacking(position, spell):
    key = KV[:position] + spell.format(ord(KV[position])) + KV[position + 1 :]
    raw = ('{"messages": [], "' + key + '": {"prompt_token_ids": [1]}}').encode()
    assert KV in json.loads(raw)  # json.loads reads the key
    assert not body.lacks_key(raw, KV)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"])
def test_other_encodings_are_never_proven_from_their_bytes(encoding):
    raw = json.dumps({**CHAT, KV: {"prompt_token_ids": [1]}}).encode(encoding)
    assert KV in json.loads(raw)
    assert not body.lacks_key(raw, KV)
    assert not body.lacks_key(json.dumps(CHAT).encode(encoding), KV)


@pytest.mark.parametrize(
    "raw",
    [b"", b"[]", b'"x"', b"null", b'{"messages": [', b"[{}]", b" " * 64 + b"{}", b"{}" + b" " * 64],
)
def test_only_what_looks_like_one_object_is_proven(raw):
    assert not body.lacks_key(raw, KV)


def test_an_unreadable_object_without_the_key_lacks_it():
    # json.loads refuses it (vLLM answers 400): no document, so no such member.
    raw = b'{"messages": \xff, "n": NaN}'
    assert body.lacks_key(raw, KV)
    with pytest.raises(UnicodeDecodeError):
        json.loads(raw)


@pytest.mark.parametrize("key", ['a"b', "a\\b", "a/b", "a b", "é"])
def test_keys_with_other_spellings_are_not_proven(key):
    with pytest.raises(ValueError, match="only printable ASCII"):
        body.lacks_key(b"{}", key)


@pytest.mark.parametrize("accents", [0, 1, 15, 16, 17, 100])
def test_escapes_of_the_key_are_found_among_any_number_of_other_escapes(accents):
    accented = json.dumps("é" * accents)  # ensure_ascii: one \u00e9 each
    assert accented.count("\\u00") == accents
    assert body.lacks_key(f'{{"m": {accented}}}'.encode(), KV)
    member = '"kv\\u005ftransfer_params": {"prompt_token_ids": [1]}'
    for text in (f'{{{member}, "m": {accented}}}', f'{{"m": {accented}, {member}}}'):
        assert KV in json.loads(text)
        assert not body.lacks_key(text.encode(), KV)


# --- ids lifted out of the bytes (body._lifted, ext_proc/core/ids.py) ------------------

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


def test_short_arrays_and_parses_without_lifting_keep_lists():
    raw = json.dumps({KV: {"prompt_token_ids": [1, 2, 3]}}).encode()
    assert _lifted_ids(read(raw, lift_ids=True)) is None
    long = json.dumps({KV: {"prompt_token_ids": LONG_IDS}}).encode()
    assert _lifted_ids(read(long)) is None


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


def test_passing_content_headers_are_remembered_only_when_short():
    body._check_remembered.cache_clear()
    body.check_headers([b"application/json"], [b"identity"])
    assert body._check_remembered.cache_info().currsize == 1
    long_type = b"application/json; x=" + b"a" * 4096
    body.check_headers([long_type], [])
    body.check_headers([b"application/json"], [b" " * 4096])
    assert body._check_remembered.cache_info().currsize == 1
    with pytest.raises(UnsupportedMediaType):  # refusals are never remembered
        body.check_headers([b"text/plain"], [])
    with pytest.raises(UnsupportedMediaType):
        body.check_headers([b"text/plain"], [])
    assert body._check_remembered.cache_info().currsize == 1


def test_without_removes_members_at_any_path_and_copies_only_their_way():
    document = {
        "a": {"kv_transfer_params": 1, "keep": 2},
        "list": [{"kv_transfer_params": 3}, {"other": 4}],
        "b": [1, 2],
        "kv_transfer_params": {"x": 1},
    }
    parsed = body.Parsed(json.loads(json.dumps(document)), True)
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


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ('{"kv_transfer_params": {}}', 1, True),
        ('{"kv_transfer_params": {}}', 0, False),
        ('{"a": {"kv_transfer_params": 1}, "kv_transfer_params": {}}', 1, False),
        ('{"a": "kv_transfer_params", "kv_transfer_params": {}}', 1, False),  # in a string
        ('{"kv\\u005ftransfer_params": {}}', 1, False),  # an escape: no count proves it
        ('{"m": "\\u00e9", "kv_transfer_params": {}}', 1, True),  # not the key's
        # Part of another name, or of prose: not the key written as a string.
        ('{"max_kv_transfer_params": 1, "kv_transfer_params": {}}', 1, True),
        ('{"a": "what is kv_transfer_params?", "kv_transfer_params": {}}', 1, True),
        ("[1]", 5, False),  # not braced
    ],
)
def test_spelled_counts_every_spelling(text, limit, expected):
    counted = body.spelled(text.encode(), (KV,))
    assert (counted is not None and counted[KV] <= limit) is expected


def test_spelled_never_counts_a_utf16_body():
    raw = json.dumps({"a": {"kv_transfer_params": 1}}).encode("utf-16")
    assert body.spelled(raw, (KV,)) is None
    assert json.loads(raw)["a"]["kv_transfer_params"] == 1
