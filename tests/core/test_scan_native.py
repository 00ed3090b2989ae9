"""The compiled carrier scan (ext_proc/core/_scan.c) against the Python reference
(bytescan.quoted's regular expression and vectors, spelling's escape search): the same
answers on any bytes, JSON-like or not, small or past the vector threshold."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import bodies
from ext_proc.core import bytescan, spelling
from ext_proc.core.vllm_request import CARRIER_NAMES

pytestmark = pytest.mark.unit

NAMES = tuple(name.encode() for name in CARRIER_NAMES)
SMALL_NAMES = (b"abc", b"abcd", b"kv_x", b"x_kv_x", b"tokens", b"zzz")
# Past it the reference counts by vectors, below it by a regular expression.
VECTOR_MIN = bytescan._QUOTED_VECTOR_MIN


@pytest.fixture(autouse=True)
def _built() -> None:
    assert bytescan.COMPILED is not None, "ext_proc.core._scan is not built (make)"


def reference_quoted(raw: bytes, names: tuple[bytes, ...], most: int) -> dict[bytes, int]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bytescan, "COMPILED", None)
        return bytescan.quoted(raw, names, most)


def reference_spelled(raw: bytes, keys: tuple[str, ...]) -> Counter[str] | None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bytescan, "COMPILED", None)
        return spelling.spelled(raw, keys)


def same_answers(raw: bytes, keys: tuple[str, ...] = CARRIER_NAMES) -> None:
    names, escapes = spelling._all_spellings(keys)
    scan = bytescan.matcher(names, bytes(escape[-1] for escape in escapes))
    # The braces and the escape search, on any bytes.
    told = spelling._braced(raw) and not spelling._holds_any(raw, escapes)
    for most in (1, 2, 3):
        expected = reference_quoted(raw, names, most)
        assert bytescan.quoted(raw, names, most) == expected
        assert scan.spelled(raw, most) == (expected if told else None)
        # A view ends where it ends: the bytes after it (an escape's last byte, a
        # closing quote) are never read.
        view = memoryview(raw + AFTER)[: len(raw)]
        assert scan.spelled(view, most) == (expected if told else None)
        assert scan.quoted(view, most) == expected
        # The portable (SSE2) loop, where the CPU runs AVX2, answers alike.
        assert scan.spelled(view, most, True) == (expected if told else None)
        assert scan.quoted(view, most, True) == expected
    assert spelling.spelled(raw, keys) == reference_spelled(raw, keys)
    # Unbraced bodies are settled before any scan: the escape search is compared too.
    braced = b"{" + raw + b"}"
    assert spelling.spelled(braced, keys) == reference_spelled(braced, keys)


# What follows the bytes of a view in its buffer: an escape's last byte for every key
# set here, then quoted names.
AFTER = b'6"abc"tokens"kv_transfer_params"'


def padded(raw: bytes, size: int, filler: bytes = b" ") -> bytes:
    """``raw`` grown past ``size`` with ``filler`` at both ends (names then lie far
    from the buffer's start and end as well as at them)."""
    pad = filler * (max(0, size - len(raw)) // (2 * len(filler)) + 1)
    return pad + raw + pad


# --- hand-written adversarial cases ---------------------------------------------------

ADVERSARIAL = [
    b"",
    b'"',
    b'""',
    b'"abc"',
    b'"abc',
    b'abc"',
    b'"abc"abc"',  # a closing quote that opens the next run
    b'"x"abc"',
    b'"ab"abc"abc"',
    b'"abc""abc"',
    b'"abcd"abc"',
    b'"\\"abc"',
    b'"a\\"abc"',
    b'"kv_x" "kv_x" "kv_x" "kv_x"',
    b'"x_kv_x"kv_x"',
    b'{"tokens": 1, "max_tokens": 2, "tokens_": 3, "Tokens": 4}',
    b'"zzz"zzz"zzz"zzz"zzz"',
    b'"\xff\xfeabc"abc"',
    b"\\u00",
    b"\\u005",
    b"\\u005f",
    b"\\\\u0061",
    b"\\u00e9" * 17 + b"\\u0061",
    b"\\u00e9" * 40,
    b"\\U0061 \\u0161 \\u00 61",
    b'{"kv\\u005ftransfer_params": 1}',
    b"abc\\u006",
    b"abc\\u00",
    b"\\",
    b"\\\\\\",
]


@pytest.mark.parametrize("raw", ADVERSARIAL)
@pytest.mark.parametrize("size", [0, VECTOR_MIN])
@pytest.mark.parametrize("filler", [b" ", b'"', b"a", b"\\"])
def test_adversarial_bodies_get_the_same_answers(raw: bytes, size: int, filler: bytes) -> None:
    body = padded(raw, size, filler) if size else raw
    same_answers(body, tuple(name.decode() for name in SMALL_NAMES))
    same_answers(body)


@pytest.mark.parametrize("size", [0, VECTOR_MIN])
def test_names_at_both_ends_of_the_buffer(size: int) -> None:
    for name in (b"abc", b"tokens", b"kv_transfer_params"):
        token = b'"' + name + b'"'
        middle = b" " * size
        for body in (token, token + middle, middle + token, token + middle + token):
            same_answers(body, ("abc", "tokens", "kv_transfer_params"))
            for cut in range(1, len(token)):
                same_answers(body[cut:], ("abc", "tokens", "kv_transfer_params"))
                same_answers(body[:-cut], ("abc", "tokens", "kv_transfer_params"))


BOM = b"\xef\xbb\xbf"
EDGES = [
    b"{}",
    b"{",
    b"}",
    b"}{",
    b" { } ",
    BOM + b"{}",
    BOM + b" \t\r\n{}\n",
    b" " + BOM + b"{}",
    BOM[:2] + b"{}",
    BOM,
    b"\x00{}",
    b"{}\x00",
    b"\x0b{}",
    b"{}\x0c",
]


@pytest.mark.parametrize("edge", EDGES, ids=repr)
@pytest.mark.parametrize("spaces", [0, 1, 60, 61, 62, 63, 64, 65, 130])
def test_braces_are_looked_for_as_the_reference_does(edge: bytes, spaces: int) -> None:
    for space in (b" ", b"\t", b"\n", b"\r"):
        pad = space * spaces
        opening, closing = edge[: len(edge) // 2], edge[len(edge) // 2 :]
        for raw in (
            edge,
            pad + edge,
            edge + pad,
            opening + pad + closing,
            pad + opening + b'"abc"' + closing + pad,
            BOM + pad + edge + pad,
        ):
            same_answers(raw, ("abc",))


def test_an_escape_at_the_end_of_the_buffer() -> None:
    for body in (b"{}\\u006", b"{}\\u0061", b"{} \\u0061", b"{}\\u00", b"{}\\u"):
        assert spelling.spelled(body, ("abc",)) == reference_spelled(body, ("abc",))


def test_the_compiled_scan_counts_a_quote_that_closes_and_opens() -> None:
    # Both implementations count each quote that begins "abc": the reference's
    # regular expression takes only the opening quote of each run.
    assert bytescan.quoted(b'"x"abc"', SMALL_NAMES, 2) == {b"abc": 1}
    assert reference_quoted(b'"x"abc"', SMALL_NAMES, 2) == {b"abc": 1}
    assert reference_quoted(b'"abc"abc"', SMALL_NAMES, 2) == {b"abc": 2}


def test_names_given_twice_are_counted_once_per_quote() -> None:
    names = (b"abc", b"abc", b"tokens")
    raw = b'{"abc": "tokens", "abc": 1}'
    assert bytescan.quoted(raw, names, 5) == reference_quoted(raw, names, 5)


@pytest.mark.parametrize("names", [(b"ab",), (b'ab"c',), (b"a\\bc",), (), (b"abc", b"")], ids=repr)
def test_names_the_scan_is_not_made_for_are_refused_alike(names: tuple[bytes, ...]) -> None:
    with pytest.raises(ValueError, match="bytes"):
        reference_quoted(b'{"abc": 1}', names, 2)
    with pytest.raises(ValueError, match="bytes"):
        bytescan.quoted(b'{"abc": 1}', names, 2)


@pytest.mark.parametrize("most", [0, -1])
def test_a_count_to_less_than_one_is_refused_alike(most: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        reference_quoted(b'"abc"', SMALL_NAMES, most)
    with pytest.raises(ValueError, match="at least 1"):
        bytescan.quoted(b'"abc"', SMALL_NAMES, most)


def test_views_and_bytearrays_are_scanned_as_their_bytes() -> None:
    raw = b'{"abc": 1, "tokens": [1]}'
    scan = bytescan.matcher(SMALL_NAMES, b"567")
    expected = {b"abc": 1, b"tokens": 1}
    assert scan.quoted(bytearray(raw), 2) == expected
    assert scan.quoted(memoryview(raw), 2) == expected
    assert scan.spelled(memoryview(b"x" + raw)[1:], 2) == expected


@pytest.mark.parametrize("size", sorted(bodies.SIZES))
@pytest.mark.parametrize("decision", bodies.DECISIONS)
def test_bench_bodies_get_the_same_answers(size: str, decision: str) -> None:
    same_answers(bodies.build(size, decision).data)


# --- generated bodies -----------------------------------------------------------------

FRAGMENTS = st.sampled_from(
    [
        b'"',
        b"\\",
        b"\\u00",
        b"\\u005",
        b"\\u006",
        b"\\u00e9",
        b"\\u0041",
        b"\\u0031",
        b'\\"',
        b"{",
        b"}",
        b":",
        b",",
        b" ",
        b"a",
        b"_",
        b"\xc3\xa9",
        b"\xff",
        b"\x00",
        b"\t",
        b"\n",
        b" " * 30,
        b"\xef\xbb\xbf",
    ]
    + [b'"' + name + b'"' for name in (*SMALL_NAMES, *NAMES[:8])]
    + [name for name in (*SMALL_NAMES, *NAMES[:8])]
    + [b'"' + name[:-1] + b'"' for name in SMALL_NAMES]  # near misses
    + [b'"' + name + b'x"' for name in SMALL_NAMES]
    + [b'"x' + name + b'"' for name in SMALL_NAMES]
)
pieces = st.lists(FRAGMENTS, max_size=40).map(b"".join)
random_bytes = st.binary(max_size=200)
json_values = st.recursive(
    st.one_of(st.none(), st.integers(), st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(st.text(max_size=6), st.sampled_from([*CARRIER_NAMES[:10], "abc"])),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(pieces, random_bytes, st.lists(st.one_of(pieces, random_bytes)).map(b"".join)),
    st.sampled_from([b"", b"{", b" {", b"\xef\xbb\xbf{"]),
    st.sampled_from([b"", b"}", b"} \n"]),
)
def test_generated_bytes_get_the_same_answers(raw: bytes, opening: bytes, closing: bytes) -> None:
    raw = opening + raw + closing
    same_answers(raw, tuple(name.decode() for name in SMALL_NAMES))
    same_answers(raw)


@settings(max_examples=200, deadline=None)
@given(json_values, st.booleans())
def test_generated_json_gets_the_same_answers(value: object, ascii_only: bool) -> None:
    raw = json.dumps({"v": value}, ensure_ascii=ascii_only).encode()
    same_answers(raw, (*CARRIER_NAMES[:10], "abc"))
    same_answers(raw)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces, pieces, st.sampled_from([b" ", b'"', b"a", b'"abc" ', b"\\u00e9 "]))
def test_large_bodies_cross_the_vector_path_alike(head: bytes, tail: bytes, filler: bytes) -> None:
    middle = filler * (VECTOR_MIN // len(filler) + 1)
    raw = head + middle + tail
    assert len(raw) >= VECTOR_MIN
    same_answers(raw, tuple(name.decode() for name in SMALL_NAMES))
    same_answers(raw)


# --- no read past the end ---------------------------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="mprotect through the C library")
def test_the_scan_reads_nothing_past_the_end(
    at_a_guard_page: Callable[[bytes], memoryview],
) -> None:
    scan = bytescan.matcher(SMALL_NAMES, b"567")
    for ending in (b'"abc"', b'"abc', b"\\u00", b"\\u006", b"\\u", b"\\", b'"', b"x"):
        for size in range(len(ending), 200):
            raw = (b' "x" \\u00e9' * 40)[: size - len(ending)] + ending
            view = at_a_guard_page(raw)
            assert scan.quoted(view, 2) == reference_quoted(raw, SMALL_NAMES, 2)
            assert scan.spelled(view, 2) == scan.spelled(raw, 2)
            assert scan.quoted(view, 2, True) == scan.quoted(view, 2)
            assert scan.spelled(view, 2, True) == scan.spelled(raw, 2)
            # Braced: the escape search runs to the last byte too.
            braced = b"{" + raw + b"}"
            view = at_a_guard_page(braced)
            assert scan.spelled(view, 2) == scan.spelled(braced, 2)
            assert scan.spelled(view, 2, True) == scan.spelled(braced, 2)
