"""Outside review of the compiled carrier scan (``core._scan``) and id checks
(``core._ids``) against their Python references, on inputs built from the pieces that
trip byte scanners: escapes split anywhere, near-miss names, braces, byte-order marks,
whitespace kinds, bytes past a view's end; ids of 19-20 digits sharing long prefixes,
spacing, signs and every JSON kind."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from functools import partial
from typing import cast

import pytest

from ext_proc.core import bytescan, ids, spelling
from ext_proc.core.vllm_request import CARRIER_NAMES

SCAN = bytescan.COMPILED
NATIVE_IDS = ids._NATIVE
pytestmark = pytest.mark.skipif(
    SCAN is None or NATIVE_IDS is None, reason="the compiled parts are not built"
)

NAMES = list(CARRIER_NAMES)
_PIECES = [
    b'"',
    b"\\",
    b"\\u00",
    b"\\u006b",
    b"\\u006D",
    b"\\u005f",
    b'\\"',
    b"{",
    b"}",
    b" ",
    b"\n",
    b"\xef\xbb\xbf",
    b"a",
    b":",
    b",",
    b"\\\\u0065",
    b"\x00",
    b"\xff",
    b"[1,2]",
    b"\t",
    b"\r",
    b"\x0b",
    b"\x0c",
]


def _soup(rnd: random.Random) -> bytes:
    parts = []
    for _ in range(rnd.randrange(40)):
        if rnd.random() < 0.35:
            name = rnd.choice(NAMES).encode()
            name = rnd.choice([name, name[:-1], name + b"x", name[1:]])
            parts.append(b'"' + name + b'"' if rnd.random() < 0.8 else name)
        else:
            parts.append(rnd.choice(_PIECES))
        if rnd.random() < 0.05:
            parts.append(b" " * rnd.randrange(200))
    raw = b"".join(parts)
    return b"{" + raw + b"}" if rnd.random() < 0.7 else raw


def _forms(raw: bytes) -> Iterator[bytes | bytearray | memoryview]:
    yield raw
    yield bytearray(raw)
    # A view whose buffer goes on with an escape's end and a quoted name.
    tail = b'\\u006b"kv_transfer_params"}'
    yield memoryview(b"X" + raw + tail)[1 : 1 + len(raw)]


def _reference_spelled(raw: bytes, keys: tuple[str, ...]) -> object:
    saved = bytescan.COMPILED
    setattr(bytescan, "COMPILED", None)  # noqa: B010 - a Final swapped for the reference
    try:
        return spelling.spelled(raw, keys)
    finally:
        setattr(bytescan, "COMPILED", saved)  # noqa: B010


SINGLE_KEY = [
    b'{"kv_transfer_para\\u006Ds": 1}',
    b'{"kv_transfer_para\\u006ds": 1}',
    b'{"\\u006bv_transfer_params": 1}',
    b'{"kv_transfer_params": "\\u00"}',
    b'{"kv_transfer_params": 1, "x": "\\u0020"}',
    b'\xef\xbb\xbf {"kv_transfer_params"\\"kv_transfer_params"}',
    b' \x0b{"kv_transfer_params": 1}',
    b'{"kv_transfer_params": 1}\x0c',
]


@pytest.mark.parametrize("raw", SINGLE_KEY, ids=range(len(SINGLE_KEY)))
def test_one_key_matchers_answer_as_the_reference(raw: bytes) -> None:
    for keys in (("kv_transfer_params",), tuple(NAMES)):
        for form in _forms(raw):
            assert spelling.spelled(cast(bytes, form), keys) == _reference_spelled(
                bytes(form), keys
            )


@pytest.mark.parametrize("seed", range(10))
def test_soups_are_spelled_as_the_reference_spells_them(seed: int) -> None:
    rnd = random.Random(seed)
    keysets = [tuple(NAMES), (NAMES[0],), tuple(NAMES[:3]), tuple(rnd.sample(NAMES, 5))]
    for _ in range(150):
        raw = _soup(rnd)
        keys = rnd.choice(keysets)
        for form in _forms(raw):
            assert spelling.spelled(cast(bytes, form), keys) == _reference_spelled(
                bytes(form), keys
            ), raw


BOUNDS = [1, 2, 9, 10, 11, 100, 128256, 262144, 2**31 - 1, 2**31]


def _both(make: object) -> tuple[object, object]:
    assert callable(make)

    def run() -> object:
        try:
            return ("ok", make())
        except Exception as exc:
            return ("raised", type(exc).__name__)

    saved = ids._NATIVE
    try:
        compiled = run()
        ids._NATIVE = None
        reference = run()
    finally:
        ids._NATIVE = saved
    return compiled, reference


def _fault(items: Sequence[object], bound: int) -> object:
    return ids.Ids.of(list(items)).fault(bound)


def _item(rnd: random.Random) -> object:
    pick = rnd.random()
    if pick < 0.3:
        return rnd.randrange(300000)
    if pick < 0.55:
        base = rnd.choice([2**63, 2**64 - 1, 10**19, 10**18, 10**19 + 1, 9999999999999999999])
        return base - rnd.randrange(1000) if rnd.random() < 0.5 else base
    if pick < 0.6:
        return -rnd.randrange(1, 10**19)
    if pick < 0.65:
        return rnd.choice([True, False, None, 1.0, 0.5, "1", [1], {}, float("nan"), -0.0])
    return rnd.choice([0, *BOUNDS, *(b - 1 for b in BOUNDS)])


@pytest.mark.parametrize("seed", range(10))
def test_parsed_ids_fault_as_the_reference(seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(200):
        items = [_item(rnd) for _ in range(rnd.randrange(12))]
        for bound in BOUNDS:
            compiled, reference = _both(partial(_fault, items, bound))
            assert compiled == reference, (items, bound)


LARGE_PREFIXES = [
    [10000000000000000001, 10000000000000000002],
    [10000000000000000002, 10000000000000000001, 10000000000000000002],
    [18446744073709551615, 18446744073709551614],
    [12345678901234567890, 12345678991234567890, 12345678901234567899],
    [2**31, 2**31 + 1, 2**31],
    [262143, 262144, 262145, 262145],
]


@pytest.mark.parametrize("items", LARGE_PREFIXES, ids=range(len(LARGE_PREFIXES)))
def test_the_largest_id_sharing_a_long_prefix_is_found(items: list[int]) -> None:
    for bound in BOUNDS:
        compiled, reference = _both(partial(_fault, items, bound))
        assert compiled == reference


SPANS = [
    b"[ 1]",
    b"[1 ]",
    b"[]",
    b"[ ]",
    b"[1,]",
    b"[,1]",
    b"[01]",
    b"[0]",
    b"[-0]",
    b"[1e3]",
    b"[1.0]",
    b"[" + b"9" * 18 + b"]",
    b"[" + b"9" * 19 + b"]",
    b"[1,\xc2\xa02]",
    b"[1,\t2]",
    b"[1,  2]",
    b"[1 ,2]",
    b"[1, 2",
    b"1, 2]",
    b"[1]]",
    b"[[1]]",
    b"[1,2]" + b" " * 70,
    b"[" + b",".join(b"7" for _ in range(40)) + b",]",
    b"[" + b", ".join(str(i).encode() for i in range(300)) + b"]",
]


@pytest.mark.parametrize("span", SPANS, ids=range(len(SPANS)))
def test_spans_read_as_the_reference_reads_them(span: bytes) -> None:
    def reading() -> object:
        found = ids.Ids.read(span)
        if found is None:
            return None
        return found.count, found.text, [found.fault(bound) for bound in BOUNDS]

    compiled, reference = _both(reading)
    assert compiled == reference
