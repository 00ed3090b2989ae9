"""Outside review of the strip by cutting bytes (``splice.without``): whenever it cuts,
``json.loads`` of the cut must be the reference's document (``writing.removed`` of the
body as parsed without any lifting), on bodies chosen to mislead a byte search: keys
spelled inside strings, escaped quotes before a key, duplicates, escapes, whitespace,
a byte-order mark, nesting, values holding quotes and braces, the lifted ids array."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from ext_proc.core import reading, splice, writing
from ext_proc.core.inspection import _ASKED
from ext_proc.core.spelling import spelled
from ext_proc.core.vllm_request import CARRIER_NAMES, Path

KV: Path = ("kv_transfer_params",)
IDS = ",".join(str(i % 150000) for i in range(4000))  # > reading.LIFT_MIN_BYTES


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda ids: ids.to_list()))


def _check(raw: bytes, paths: list[Path]) -> bytes | None:
    """The cut (None: not cut) after checking it reads as the reference's document."""
    reference = reading.parse(raw)
    lifted = reading.parse(raw, lift_ids=True)
    if reference is None:  # orjson does not read it (a byte-order mark): never cut
        assert lifted is None
        return None
    expected = _plain(writing.removed(reference, paths))
    assert lifted is not None
    for body in (
        splice.Body(raw, _ASKED, spelled(raw, CARRIER_NAMES)),
        splice.Body(raw),
    ):
        cut = splice.without(body, lifted, paths)
        if cut is not None:
            assert json.loads(cut) == expected, (raw, cut)
    return splice.without(splice.Body(raw, _ASKED, spelled(raw, CARRIER_NAMES)), lifted, paths)


CASES = [
    # The bytes "kv_transfer_params" begin at an escaped quote, inside another key.
    b'{"x\\"kv_transfer_params": 1, "kv_transfer_params": {"a": 2}, "b": 3}',
    b'{"kv_transfer_params": {"a": 2}, "x\\"kv_transfer_params": 1}',
    # ... and inside a string value, before and after the member.
    b'{"s": "\\"kv_transfer_params", "kv_transfer_params": {}, "t": 1}',
    b'{"kv_transfer_params": {}, "s": "\\"kv_transfer_params"}',
    # A value full of what a depth scan trips on.
    b'{"a": 0, "kv_transfer_params": {"x": "\\\\\\"}]\\\\", "y": ["}", "{", "\\\\"]}, "b": 1}',
    b'{"kv_transfer_params": "\\\\", "b": "\\"}"}',
    b'{"kv_transfer_params": -1.5e+10, "b": 1}',
    b'{"kv_transfer_params": true}',
    b'{"kv_transfer_params": null , "b" : [1, {"kv": 2}]}',
    # Whitespace everywhere, non-ASCII around.
    b'{ \n"\xc3\xa9" : "\xf0\x9f\x98\x80" ,\r\n\t"kv_transfer_params"\t:\n{ }\r\n,"z":1 }',
    b'{"kv_transfer_params":{}}',
    # Duplicates: the earlier one is what a search finds first; json.loads keeps the last.
    b'{"kv_transfer_params": {"prompt_token_ids": [1]}, "kv_transfer_params": 2}',
    b'{"a": {"kv_transfer_params": 1}, "kv_transfer_params": 2}',
    # An escape spelling the key, with and without a plain duplicate.
    b'{"\\u006bv_transfer_params": {}, "b": 1}',
    b'{"kv_transfer_params": {}, "\\u006bv_transfer_params": 1}',
    b'{"kv_transfer_params": 1, "k\\u0076_transfer_params": 2}',
    # A byte-order mark.
    b'\xef\xbb\xbf{"kv_transfer_params": {}}',
    # The lifted array, with a carrier after it and a look-alike before it.
    b'{"kv_transfer_params": {"prompt_token_ids": [' + IDS.encode() + b'], "x": 1}, "b": 2}',
    b'{"a": "\\"prompt_token_ids\\": [1]", "kv_transfer_params": {"remote_host": "h", '
    b'"prompt_token_ids": [' + IDS.encode() + b"]}}",
    b'{"x\\"prompt_token_ids": [' + IDS.encode() + b'], "kv_transfer_params": {"a": 1}}',
    b'{"kv_transfer_params": {"prompt_token_ids": ['
    + IDS.encode()
    + b'], "prompt_token_ids": [1]}}',
]

NESTED: list[Path] = [
    ("kv_transfer_params", "prompt_token_ids"),
    ("kv_transfer_params", "remote_host"),
    ("kv_transfer_params", "x"),
]


@pytest.mark.parametrize("raw", CASES, ids=range(len(CASES)))
def test_a_cut_reads_as_the_rewrite(raw: bytes) -> None:
    _check(raw, [KV])
    _check(raw, NESTED)
    _check(raw, [*NESTED, KV])


def test_the_plain_cases_are_cut() -> None:
    """The review's cases above exercise the cut, not only its refusals."""
    assert _check(b'{"kv_transfer_params":{}}', [KV]) == b"{}"
    assert _check(CASES[4], [KV]) == b'{"a": 0, "b": 1}'
    assert _check(CASES[17], [KV]) == b'{ "b": 2}'
    assert _check(CASES[0], [KV]) is None  # the escaped-quote look-alike: counted twice
    assert _check(CASES[11], [KV]) is None  # a duplicate
    assert _check(CASES[16], [KV]) is None  # a byte-order mark: not orjson's


_PIECES = [
    '"kv_transfer_params"',
    '\\"kv_transfer_params',
    "\\\\",
    '\\"',
    "}",
    "{",
    "]",
    "[",
    ",",
    ":",
    "\\u0076",
    "\\u00e9",
    "é",
    " ",
    "prompt_token_ids",
]


def _string(rnd: random.Random) -> str:
    return "".join(rnd.choice(_PIECES) for _ in range(rnd.randrange(4)))


def _value(rnd: random.Random, depth: int) -> str:
    pick = rnd.random()
    if depth > 3 or pick < 0.3:
        return json.dumps(_string(rnd))  # a string holding the pieces, escaped by json
    if pick < 0.4:
        return rnd.choice(["1", "-0.5e3", "true", "null", "[]", "{}"])
    if pick < 0.7:
        return "[" + ",".join(_value(rnd, depth + 1) for _ in range(rnd.randrange(3))) + "]"
    return _object(rnd, depth + 1)


def _object(rnd: random.Random, depth: int) -> str:
    members = []
    for _ in range(rnd.randrange(4)):
        key = rnd.choice(
            ["kv_transfer_params", "remote_host", "x", "a", json.dumps(_string(rnd))[1:-1]]
        )
        space = rnd.choice(["", " ", "\n\t"])
        members.append(f'{space}"{key}"{space}:{space}{_value(rnd, depth)}{space}')
    return "{" + ",".join(members) + "}"


@pytest.mark.parametrize("seed", range(40))
def test_random_bodies_cut_as_the_rewrite(seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(50):
        text = _object(rnd, 0)
        if rnd.random() < 0.5:
            text = '{"kv_transfer_params": ' + _object(rnd, 1) + ", " + text[1:]
        try:
            json.loads(text)
        except ValueError:
            continue
        raw = text.encode()
        _check(raw, [KV])
        _check(raw, NESTED)
