"""``core._ids.read``'s two loops (AVX2 where the CPU has it, and the portable one)
against each other and the reference, where the bound is checked: an id around the
limit of every length (1 to 10 digits, the bounds up to 2**31) at every place of two
64-byte chunks, with and without a space after each comma."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.core.ids import Ids
from tests.core.test_ids_native import COMPILED, needs_compiled, reference

pytestmark = pytest.mark.unit


# A bound of each length of its limit (bound - 1): 1 to 10 digits, 2**31 the highest.
BOUNDS = [1, 2, 10, 11, 100, 151936, 262144, 1000, 10**9, 2**31, 2**31 - 1, 1234567891]


def expected(span: bytes, bound: int) -> tuple[Any, ...] | None:
    """The reference's ``read`` of ``span``, and whether every id is below ``bound``."""
    with reference():
        read = Ids.read(span)
        if read is None:
            return None
        return read.count, read.text, read.fault(bound) is None


def assert_loops_read(span: bytes, bound: int) -> None:
    assert COMPILED is not None
    want = expected(span, bound)
    for portable in (False, True):
        assert COMPILED.read(span, bound, portable) == want, (span, bound, portable)
        plain = COMPILED.read(span, None, portable)
        assert plain == (None if want is None else want[:2]), (span, portable)


def near_limit(limit: int) -> list[int]:
    """Ids of the limit's length that differ from it in one digit, a step either way,
    and the ids one digit shorter and longer: every edge of a compare by the first two
    digits, then whole."""
    text = str(limit)
    values = {limit, limit + 1, max(limit - 1, 0), 10 ** len(text) - 1, 10 ** (len(text) - 1)}
    for place, digit in enumerate(text):
        for other in "0123456789":
            if other != digit and (place or other != "0" or len(text) == 1):
                values.add(int(text[:place] + other + text[place + 1 :]))
    values |= {limit // 10, limit * 10 + 9}
    return sorted(values)


@needs_compiled
def test_the_loop_is_named_and_the_portable_one_answers_alike() -> None:
    assert COMPILED is not None
    assert COMPILED.implementation() in ("avx2", "sse2", "scalar")
    span = b"[1,22,333]"
    for portable in (False, True):
        assert COMPILED.read(span, None, portable) == COMPILED.read(span)
        assert COMPILED.read(span, 333, portable) == (3, span, False)
        assert COMPILED.read(span, 334, portable) == (3, span, True)


@needs_compiled
@pytest.mark.parametrize("bound", BOUNDS)
def test_an_id_near_the_limit_at_every_place_is_read_alike(bound: int) -> None:
    candidates = near_limit(bound - 1)
    for value in candidates:
        for place in range(0, 136, 1):
            # Short ids before it (one or two digits, so that it starts at ``place``)
            # and after it, over three chunks.
            head = "5," * (place // 2) + ("6," if place % 2 else "")
            body = f"{head}{value},{'4,' * 40}3"
            assert_loops_read(f"[{body}]".encode(), bound)
    # The id last, ending just before the ']' at every place of a chunk.
    for value in candidates:
        for place in range(0, 130, 5):
            head = "5," * (place // 2) + ("6," if place % 2 else "")
            assert_loops_read(f"[{head}{value}]".encode(), bound)


@needs_compiled
@pytest.mark.parametrize("bound", BOUNDS)
def test_ids_near_the_limit_spaced_or_with_a_stray_space_are_read_alike(bound: int) -> None:
    values = near_limit(bound - 1)
    span = ("[" + ", ".join(map(str, values * 3)) + "]").encode()
    assert_loops_read(span, bound)
    below = [v for v in values if v < bound] or [0]
    assert_loops_read(("[" + ", ".join(map(str, below * 5)) + "]").encode(), bound)
    for at in range(0, len(span), 3):
        assert_loops_read(span[:at] + b" " + span[at:], bound)


@needs_compiled
@pytest.mark.skipif(sys.platform != "linux", reason="mprotect through the C library")
def test_read_reads_nothing_past_the_end(at_a_guard_page: Callable[[bytes], memoryview]) -> None:
    assert COMPILED is not None
    for size in range(3, 200):
        for filler in ("262143,", "9,", "1, "):
            raw = (("[" + filler * 60)[: size - 1] + "]").encode()
            view = at_a_guard_page(raw)
            for portable in (False, True):
                for bound in (None, 262144, 10):
                    assert COMPILED.read(view, bound, portable) == COMPILED.read(raw, bound)
            assert COMPILED.fault(view, 262144) == COMPILED.fault(raw, 262144)


@st.composite
def ids_and_bound(draw: st.DrawFn) -> tuple[list[int], int]:
    """A bound of 1 to 2**31 and ids around its limit (a step away, or one digit
    changed), among others."""
    bound = draw(st.integers(1, 2**31) | st.sampled_from([10**k for k in range(1, 10)]))
    limit = str(bound - 1)
    near = st.builds(
        lambda place, digit: int(limit[:place] + digit + limit[place + 1 :]),
        st.integers(0, len(limit) - 1),
        st.sampled_from("123456789"),
    ) | st.integers(-2, 2).map(lambda step: max(bound - 1 + step, 0))
    values = draw(st.lists(near | st.integers(0, 10**11), min_size=1, max_size=120))
    return values, bound


@needs_compiled
@settings(max_examples=500, deadline=None)
@given(
    ids_and_bound(),
    st.booleans(),
    st.integers(0, 2000),
    st.sampled_from([b"", b" ", b"0", b",", b"x"]),
)
def test_any_bound_on_any_ids_is_read_alike(
    values_bound: tuple[list[int], int], spaced: bool, at: int, stray: bytes
) -> None:
    values, bound = values_bound
    span = json.dumps(values, separators=(", " if spaced else ",", ":")).encode()
    at %= len(span) + 1
    assert_loops_read(span[:at] + stray + span[at:], bound)


# Spaced spans: compacted 64 bytes at a time (AVX2 shuffles of 8-byte halves, or SSE2
# copies of the runs between spaces), the last bytes one at a time. Each odd byte below
# is put at every place of three chunks of a spaced span, so that it falls on every
# edge of an 8-, 16-, 32- and 64-byte block and in the bytes left after the last one.
# Each byte as one of those a spaced span holds, mostly digits, commas and spaces.
SPACED_ALPHABET = bytes(b"0123456789, ,  , 1, 22, ]\t"[i % 26] for i in range(256))

ODD_SPACING = [b" ", b"  ", b"\t", b", ", b",", b"0", b"x", b"]", b"[", b"\n", b"\xa0", b"\x00"]


def spaced_ids(count: int, width: int = 1) -> bytes:
    """``count`` ids of about ``width`` digits, as ``json.dumps`` writes them."""
    return json.dumps([(7 * i + 1) % 10**width for i in range(count)]).encode()


@needs_compiled
@pytest.mark.parametrize("odd", ODD_SPACING)
def test_an_odd_byte_at_every_place_of_a_spaced_span_is_read_alike(odd: bytes) -> None:
    for width in (1, 3):
        span = spaced_ids(60, width)
        for at in range(len(span) + 1):
            assert_loops_read(span[:at] + odd + span[at:], 262144)
            if odd == b" ":
                # A space in place of a byte: after a comma, or replacing it.
                assert_loops_read(span[:at] + b" " + span[at + 1 :], 262144)


@needs_compiled
def test_spaced_spans_of_every_length_are_read_alike() -> None:
    # Every length of span from 3 to 300 bytes, the spaces at every place of a block.
    for shift in range(0, 8):
        for count in range(1, 60):
            values = [10**shift + i for i in range(count)]
            span = json.dumps(values).encode()
            assert_loops_read(span, 262144)
            assert_loops_read(span.replace(b", ", b" ,"), 262144)
            assert_loops_read(span.replace(b", ", b",  ", 1), 262144)
            assert_loops_read(b" " + span, 262144)
            assert_loops_read(span[:-1] + b" ]", 262144)


@needs_compiled
def test_spaced_spans_with_long_runs_between_the_spaces_are_read_alike() -> None:
    # Runs of up to 70 bytes between spaces (malformed: too many digits, or no comma
    # before a space), spanning whole blocks.
    for run in range(1, 71):
        digits = ("1234567890" * 8)[:run]
        for head in range(0, 20):
            span = f"[{'1, ' * head}{digits}, 5, 6]".encode()
            assert_loops_read(span, 2**31)
            assert_loops_read(span.replace(b", 5", b" 5"), 2**31)


@needs_compiled
def test_a_huge_spaced_span_is_read_alike() -> None:
    assert COMPILED is not None
    values = [(i * 2654435761) % 262144 for i in range(131072)]
    span = json.dumps(values).encode()
    canonical = json.dumps(values, separators=(",", ":")).encode()
    for portable in (False, True):
        assert COMPILED.read(span, 262144, portable) == (131072, canonical, True)
        assert COMPILED.read(span, 262143, portable) == (131072, canonical, False)
        assert COMPILED.read(span, None, portable) == (131072, canonical)
        assert COMPILED.read(memoryview(span), None, portable) == (131072, canonical)
        assert COMPILED.read(bytearray(span), None, portable) == (131072, canonical)
    # One stray space (no comma before it), or a doubled one, anywhere: not well-formed.
    for at in (1, 64, 1000, len(span) // 2, len(span) - 80, len(span) - 17, len(span) - 2):
        stray = span[:at] + b" " + span[at:]
        gap = span.rfind(b", ", 0, at) + 1
        doubled = span[:gap] + b" " + span[gap:]
        for portable in (False, True):
            if span[at - 1 : at] != b",":
                assert COMPILED.read(stray, 262144, portable) is None, at
            assert COMPILED.read(doubled, 262144, portable) is None, at
    assert_loops_read(span[: 64 * 40] + b"]", 262144)


@needs_compiled
@pytest.mark.skipif(sys.platform != "linux", reason="mprotect through the C library")
def test_spaced_spans_are_read_without_reading_past_the_end(
    at_a_guard_page: Callable[[bytes], memoryview],
) -> None:
    assert COMPILED is not None
    for size in range(3, 300):
        for filler in ("1, ", "262143, ", "12,  ", "3 ,", "4,\t"):
            raw = (("[" + filler * 120)[: size - 1] + "]").encode()
            view = at_a_guard_page(raw)
            for portable in (False, True):
                for bound in (None, 262144):
                    assert COMPILED.read(view, bound, portable) == COMPILED.read(raw, bound)
            assert COMPILED.read(raw, 262144, True) == expected(raw, 262144)


@needs_compiled
@settings(max_examples=400, deadline=None)
@given(st.binary(min_size=0, max_size=400).map(lambda raw: raw.translate(SPACED_ALPHABET)))
def test_any_spaced_looking_bytes_are_read_alike(raw: bytes) -> None:
    assert_loops_read(b"[" + raw + b"]", 262144)
