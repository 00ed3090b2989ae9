"""Spellings: what a body's bytes prove about the member names json.loads reads."""

import json

import pytest

from ext_proc.core import bytescan, spelling
from ext_proc.core.vllm_request import KV_KEY as KV


@pytest.fixture(autouse=True, params=["compiled", "python"])
def scan(request, monkeypatch):
    """Each case holds of the compiled scan and of the Python reference."""
    if request.param == "python":
        monkeypatch.setattr(bytescan, "COMPILED", None)
    else:
        assert bytescan.COMPILED is not None, "ext_proc.core._scan is not built (make)"
    return request.param


def lacks_key(raw: bytes, key: str) -> bool:
    """True only when no object anywhere in the document json.loads reads from ``raw``
    can have the member ``key``: ``spelling.spelled`` counts none. False says nothing."""
    counted = spelling.spelled(raw, (key,))
    return counted is not None and counted[key] == 0


# --- lacks_key: proven from the bytes that json.loads reads no such member -----------

CHAT = {"model": "m", "messages": [{"role": "user", "content": 'é "q" \\ \n 🙂 \u00e9'}]}


@pytest.mark.parametrize("ensure_ascii", [False, True])
@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
def test_a_chat_without_the_key_lacks_it(ensure_ascii, bom):
    raw = bom + json.dumps(CHAT, ensure_ascii=ensure_ascii).encode()
    assert lacks_key(raw, KV)
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
    assert not lacks_key(text.encode(), KV)


@pytest.mark.parametrize(
    "extra",
    [{"note": f"what is {KV}?"}, {f"max_{KV}": 1}, {f"{KV}_2": 1}],
    ids=["prose", "longer-name", "suffixed-name"],
)
def test_the_key_inside_other_text_is_lacking(extra):
    raw = json.dumps({**CHAT, **extra}).encode()
    assert lacks_key(raw, KV)
    assert KV not in json.loads(raw)


@pytest.mark.parametrize("position", range(len(KV)))
@pytest.mark.parametrize("spell", ["\\u{:04x}", "\\u{:04X}"])
def test_any_character_of_the_key_escaped_is_not_lacking(position, spell):
    key = KV[:position] + spell.format(ord(KV[position])) + KV[position + 1 :]
    raw = ('{"messages": [], "' + key + '": {"prompt_token_ids": [1]}}').encode()
    assert KV in json.loads(raw)  # json.loads reads the key
    assert not lacks_key(raw, KV)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"])
def test_other_encodings_are_never_proven_from_their_bytes(encoding):
    raw = json.dumps({**CHAT, KV: {"prompt_token_ids": [1]}}).encode(encoding)
    assert KV in json.loads(raw)
    assert not lacks_key(raw, KV)
    assert not lacks_key(json.dumps(CHAT).encode(encoding), KV)


@pytest.mark.parametrize(
    "raw",
    [b"", b"[]", b'"x"', b"null", b'{"messages": [', b"[{}]", b" " * 64 + b"{}", b"{}" + b" " * 64],
)
def test_only_what_looks_like_one_object_is_proven(raw):
    assert not lacks_key(raw, KV)


def test_an_unreadable_object_without_the_key_lacks_it():
    # json.loads refuses it (vLLM answers 400): no document, so no such member.
    raw = b'{"messages": \xff, "n": NaN}'
    assert lacks_key(raw, KV)
    with pytest.raises(UnicodeDecodeError):
        json.loads(raw)


@pytest.mark.parametrize("key", ['a"b', "a\\b", "a/b", "a b", "é"])
def test_keys_with_other_spellings_are_not_proven(key):
    with pytest.raises(ValueError, match="only printable ASCII"):
        lacks_key(b"{}", key)


@pytest.mark.parametrize("accents", [0, 1, 15, 16, 17, 100])
def test_escapes_of_the_key_are_found_among_any_number_of_other_escapes(accents):
    accented = json.dumps("é" * accents)  # ensure_ascii: one \u00e9 each
    assert accented.count("\\u00") == accents
    assert lacks_key(f'{{"m": {accented}}}'.encode(), KV)
    member = '"kv\\u005ftransfer_params": {"prompt_token_ids": [1]}'
    for text in (f'{{{member}, "m": {accented}}}', f'{{"m": {accented}, {member}}}'):
        assert KV in json.loads(text)
        assert not lacks_key(text.encode(), KV)


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
    counted = spelling.spelled(text.encode(), (KV,))
    assert (counted is not None and counted[KV] <= limit) is expected


def test_spelled_never_counts_a_utf16_body():
    raw = json.dumps({"a": {"kv_transfer_params": 1}}).encode("utf-16")
    assert spelling.spelled(raw, (KV,)) is None
    assert json.loads(raw)["a"]["kv_transfer_params"] == 1
