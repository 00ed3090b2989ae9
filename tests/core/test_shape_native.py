"""The compiled shape scan (``core._shape``) against the reference in reading.py: the
same number of values and the same answer on long runs of digits, on any bytes, at
every place of a 64-byte chunk and across the scan's 1 MiB blocks, with and without a
limit on the values, on the loop the CPU runs and on the portable one."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import bodies
from ext_proc.core import reading

pytestmark = pytest.mark.unit

COMPILED = reading._NATIVE
needs_compiled = pytest.mark.skipif(COMPILED is None, reason="core._shape is not built")
BLOCK = reading._BLOCK
LONG = reading._LONG_DIGITS


def check(raw: bytes | bytearray | memoryview, max_values: int | None = None) -> None:
    """Both loops answer as the reference, with and without the limit."""
    assert COMPILED is not None
    want = reading._scanned(bytes(raw), max_values)
    most = -1 if max_values is None else max(0, min(max_values, len(raw) + 1))
    for portable in (False, True):
        got = COMPILED.shape(raw, most, portable)
        assert got == (want.values, want.long_digits), (portable, max_values)
    assert reading.scan(bytes(raw), max_values) == want


def test_the_block_is_the_references() -> None:
    if COMPILED is not None:
        assert COMPILED.BLOCK == BLOCK


@needs_compiled
@pytest.mark.parametrize("decision", bodies.DECISIONS)
@pytest.mark.parametrize("size", ["2k", "64k", "1m"])
def test_every_bench_body(size: str, decision: str) -> None:
    check(bodies.build(size, decision).data)


def _runs() -> Iterator[bytes]:
    """Runs of digits of 18 and 19 (and near) at every place of two chunks, in text of
    separators, letters, bytes at and above 0x80 and the bytes next to the digits."""
    for length in (1, 15, 16, 17, 18, 19, 20, 63, 64, 65, 130):
        for at in range(0, 130, 1 if length in (18, 19) else 7):
            for filler in (b" ", b",", b"/", b":", b"\xb0", b"\xff", b"[{"):
                raw = (filler * 200)[:at] + b"9" * length + (filler * 200)[: 200 - at]
                yield raw


@needs_compiled
def test_runs_at_every_place_of_a_chunk() -> None:
    for raw in _runs():
        check(raw)


@needs_compiled
@pytest.mark.parametrize(
    "filler", [b" ", b",", b"\xb9", b"1,", b"1234567,", b"123456 ", b"9" * 12 + b":"]
)
def test_runs_across_groups_of_eight_and_pairs_of_chunks(filler: bytes) -> None:
    # The vector loops skip the search for runs where each aligned 8 bytes hold a
    # non-digit and the run carried in is short: runs of 8 to 20 digits (the longest
    # such bytes can hide, 14, and 19 carried across a pair of chunks) at every place
    # of the first three 128-byte pairs, after and before digits of the filler.
    for length in (*range(8, 21), 26, 27):
        for at in range(0, 3 * 128):
            raw = (filler * 400)[:at] + b"9" * length + (filler * 400)[: 440 - at]
            check(raw)


@needs_compiled
@pytest.mark.parametrize("prefix", [0, 64, 128 * 63 - 64, 128 * 63, 128 * 63 + 64])
@pytest.mark.parametrize("carried", [7, 8, 11, 12, 13, 18])
def test_a_run_carried_into_eight_bytes_with_a_non_digit(prefix: int, carried: int) -> None:
    # ``carried`` digits end a pair of chunks; the next pair leads with up to 7 digits
    # and then holds a non-digit in each group of 8 (the short cut's case).
    for lead in range(0, 9):
        start = b" " * (prefix + 128 - carried) + b"5" * carried
        raw = start + b"5" * lead + b"," + (b"1 2345 " * 40)
        check(raw)


@needs_compiled
@pytest.mark.parametrize("byte", [b",", b":", b"[", b"{", b",:[{"])
def test_separators_at_every_byte_place_past_a_byte_counter(byte: bytes) -> None:
    # Each place of the vector loops' byte counters takes up to 4 a round: every byte a
    # separator, over lengths around the rounds after which the counters are summed.
    for rounds in (62, 63, 64, 126, 127, 190):
        for extra in (-64, -1, 0, 1, 64, 127, 128):
            size = rounds * 128 + extra
            check((byte * size)[:size])
            check((byte * size)[:size] + b"7" * 19)


@needs_compiled
@pytest.mark.parametrize("length", [17, 18, 19, 20, 40])
@pytest.mark.parametrize("cut", [-20, -19, -18, -10, -1, 0, 1, 9, 18, 19])
def test_runs_across_a_block_boundary(length: int, cut: int) -> None:
    # The run starts ``cut`` bytes before the block's end, in short digit runs and
    # separators (a body of ids), and the limit stops at either block.
    start = BLOCK - cut
    text = (b"12345," * (BLOCK // 3))[: 2 * BLOCK + 77]
    raw = text[:start] + b"7" * length + text[start + length :]
    raw = raw[: 2 * BLOCK + 77]
    check(raw)
    first_block = reading._scanned(raw[:BLOCK]).values
    for limit in (first_block - 1, first_block, first_block + 1, 10**9):
        check(raw, limit)


@needs_compiled
def test_the_limit_stops_at_a_blocks_end() -> None:
    raw = b"[" + b"1," * (BLOCK * 3 // 2) + b"1]"
    for limit in (-(2**70), -5, 0, 1, 1000, BLOCK // 2, BLOCK, 10**12, 2**70):
        check(raw, limit)
        assert reading.scan(raw, limit) == reading._scanned(raw, limit)
    check(b"", 0)
    check(b"")


@needs_compiled
def test_the_separators_and_the_bytes_next_to_them() -> None:
    every = bytes(range(256))
    for shift in range(64):
        check(b" " * shift + every * 3)
    # 0x5B | 0x20 and 0x7B | 0x20 are "{"; no other byte is.
    assert [b for b in range(256) if b | 0x20 == ord("{")] == [ord("["), ord("{")]


@needs_compiled
def test_any_buffer() -> None:
    raw = b'{"a": [1, 2, 3], "b": "' + b"1" * 19 + b'"}'
    check(bytearray(raw))
    check(memoryview(raw))
    # A view inside a longer buffer: the digits after its end are not read.
    longer = b"1" * 10 + b"2" * 30
    assert COMPILED is not None
    assert COMPILED.shape(memoryview(longer)[:18], -1) == (1, False)
    assert COMPILED.shape(memoryview(longer)[:19], -1) == (1, True)


@needs_compiled
def test_wrong_arguments_raise() -> None:
    assert COMPILED is not None
    with pytest.raises(TypeError):
        COMPILED.shape("text", -1)
    with pytest.raises(TypeError):
        COMPILED.shape(b"x")
    with pytest.raises(TypeError):
        COMPILED.shape(b"x", None)


_FRAGMENTS = st.sampled_from(
    [b"0", b"1", b"9", b"123456789", b"9" * 18, b"9" * 19, b",", b":", b"[", b"{", b"]",
     b"}", b" ", b'"', b"/", b"\x80", b"\xff", b"\xda", b"a", b"\xb9", b"z" * 40]
)  # fmt: skip


@needs_compiled
@settings(max_examples=400, deadline=None)
@given(st.lists(_FRAGMENTS, max_size=120), st.integers(0, 63))
def test_fragment_soups(parts: list[bytes], pad: int) -> None:
    check(b"x" * pad + b"".join(parts))


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes(raw: bytes) -> None:
    check(raw)


@needs_compiled
@pytest.mark.skipif(sys.platform != "linux", reason="mprotect through the C library")
def test_the_scan_reads_nothing_past_the_end(
    at_a_guard_page: Callable[[bytes], memoryview],
) -> None:
    assert COMPILED is not None
    for size in range(0, 300):
        raw = (b"12345678901234567,{" * 20)[:size]
        want = reading._scanned(raw)
        for portable in (False, True):
            view = at_a_guard_page(raw)
            assert COMPILED.shape(view, -1, portable) == (want.values, want.long_digits)
