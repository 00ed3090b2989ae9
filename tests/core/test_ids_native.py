"""The compiled id checks (``core._ids``) against the reference in ids.py: the same
ids read, the same text, the same fault, on random and adversarial arrays, at every
place of a 64-byte chunk. Security code: any difference fails, whichever way it goes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.core import ids
from ext_proc.core.ids import MAX_BOUND, Ids

pytestmark = pytest.mark.unit

COMPILED = ids._NATIVE
needs_compiled = pytest.mark.skipif(COMPILED is None, reason="core._ids is not built")

# Bounds at every edge: 1, powers of ten and their neighbours, the shipped vocabularies,
# 2**31.
BOUNDS = sorted(
    {1, 2, 9, 11, 128256, 262144, 2**31 - 1, MAX_BOUND}
    | {10**k + d for k in range(1, 10) for d in (-1, 0, 1)}
)


@contextmanager
def reference() -> Iterator[None]:
    ids._NATIVE = None
    try:
        yield
    finally:
        ids._NATIVE = COMPILED


class _Portable:
    """``core._ids`` whose ``read`` runs its portable loop (SSE2, or one byte at a time)
    even where the CPU has AVX2."""

    def __init__(self, compiled: Any) -> None:
        self._compiled = compiled

    def read(self, span: Any, bound: int | None = None) -> Any:
        return self._compiled.read(span, bound, True)

    def fault(self, *args: Any) -> Any:
        return self._compiled.fault(*args)


@contextmanager
def portable() -> Iterator[None]:
    ids._NATIVE = _Portable(COMPILED)  # type: ignore[assignment]
    try:
        yield
    finally:
        ids._NATIVE = COMPILED


def both(call: Callable[[], Any]) -> tuple[Any, Any]:
    """``call``'s answer on the compiled checks and on the reference; the compiled
    checks' portable loop answers as the loop this CPU runs."""
    compiled = call()
    with portable():
        assert call() == compiled
    with reference():
        expected = call()
    return compiled, expected


# A few of them, where a test tries many arrays.
FEW_BOUNDS = (1, 10, 262144, MAX_BOUND)


def read_answer(span: bytes, bounds: tuple[int, ...]) -> tuple[Any, ...] | None:
    """What is read and each bound's fault; and read with each bound (checked in the
    read's pass where compiled), the faults of that bound and of its neighbours."""
    read = Ids.read(span)
    if read is None:
        assert all(Ids.read(span, bound=bound) is None for bound in bounds), span
        return None
    bounded = []
    for bound in bounds:
        ids_ = Ids.read(span, bound=bound)
        assert ids_ is not None
        near = sorted({max(bound - 1, 1), bound, min(bound + 1, MAX_BOUND), MAX_BOUND})
        bounded.append((ids_.count, ids_.text, tuple(ids_.fault(b) for b in near)))
    return read.count, read.text, tuple(read.fault(bound) for bound in bounds), bounded


def assert_same_read(span: bytes, bounds: tuple[int, ...] = tuple(BOUNDS)) -> None:
    compiled, expected = both(lambda: read_answer(span, bounds))
    assert compiled == expected, span


def assert_same_fault(value: Any) -> None:
    compiled, expected = both(lambda: [Ids.of(value).fault(bound) for bound in BOUNDS])
    assert compiled == expected, value


# Item texts at every edge of the grammar.
ITEM_TEXTS = st.one_of(
    st.integers(0, 10**6).map(str),
    st.integers(0, 10**20).map(str),
    st.sampled_from(
        [
            "0",
            "00",
            "01",
            "007",
            "-1",
            "-0",
            "+1",
            "1.0",
            "1.",
            ".5",
            "1e3",
            "1E3",
            "1e-3",
            "true",
            "false",
            "null",
            '"1"',
            "",
            "[]",
            "[1]",
            "{}",
            "9" * 18,
            "1" + "0" * 17,
            "9" * 19,
            "1" + "0" * 18,
            "18446744073709551615",
            "18446744073709551616",
            "9" * 20,
            "9" * 21,
            "9" * 64,
            "2147483647",
            "2147483648",
            "\u00e9",
            "\x00",
            "\x80",
        ]
    ),
)
SEPARATORS = st.sampled_from([",", ", ", ",  ", " ,", " , ", ",\t", ",\n", ",,", ""])
OPENINGS = st.sampled_from(["[", "[ ", " [", "", "[[", "{"])
CLOSINGS = st.sampled_from(["]", " ]", "] ", "", "]]", ",]", "}"])


@st.composite
def spans(draw: st.DrawFn) -> bytes:
    """Arrays of every shape: mostly well-formed, now and then one edge somewhere."""
    items = draw(st.lists(ITEM_TEXTS, max_size=40))
    plain = draw(st.booleans())
    separator = draw(st.sampled_from([",", ", "])) if plain else None
    text = ""
    for index, item in enumerate(items):
        if index:
            text += separator if separator is not None else draw(SEPARATORS)
        text += item
    opening, closing = ("[", "]") if plain else (draw(OPENINGS), draw(CLOSINGS))
    return (opening + text + closing).encode()


@needs_compiled
@settings(max_examples=600, deadline=None)
@given(spans())
def test_any_array_is_read_as_the_reference_reads_it(span: bytes) -> None:
    assert_same_read(span)


@needs_compiled
@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.integers(0, 10**18 - 1) | st.integers(0, 300_000), min_size=1, max_size=200),
    st.booleans(),
)
def test_long_valid_arrays_are_read_alike(values: list[int], spaced: bool) -> None:
    span = json.dumps(values, separators=(", " if spaced else ",", ":")).encode()
    assert_same_read(span)


@needs_compiled
@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.integers(0, 300_000), min_size=40, max_size=300),
    st.lists(st.sampled_from([", ", ",", ",  ", " ,", ",\t", ", ,"]), min_size=1, max_size=300),
)
def test_arrays_spaced_after_some_commas_are_read_alike(
    values: list[int], separators: list[str]
) -> None:
    # Each comma with its own spacing: one space (json.dumps), none, or an odd one; at
    # least 40 ids, so that whole 64-byte blocks are compacted.
    body = str(values[0]) + "".join(
        separators[i % len(separators)] + str(value) for i, value in enumerate(values[1:])
    )
    assert_same_read(f"[{body}]".encode())


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_read_alike(data: bytes) -> None:
    assert_same_read(data)
    assert_same_read(b"[" + data + b"]")


JSON_ITEMS = st.one_of(
    st.integers(0, 300_000),
    st.integers(0, 2**64 + 5),
    st.integers(-(2**64), 2**64),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=",]0123456789[ ", max_size=4),
    st.lists(st.integers(0, 9), max_size=2),
    st.dictionaries(st.text(max_size=1), st.integers(0, 9), max_size=1),
)


@needs_compiled
@settings(max_examples=600, deadline=None)
@given(st.one_of(st.lists(JSON_ITEMS, max_size=40), JSON_ITEMS))
def test_why_parsed_values_fail_is_found_alike(value: Any) -> None:
    assert_same_fault(value)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 262_143), min_size=1, max_size=150),
    st.integers(0, 149),
    JSON_ITEMS,
)
def test_one_odd_item_among_valid_ones_is_found_alike(values: list[int], at: int, odd: Any) -> None:
    values = list(values)
    values.insert(at % (len(values) + 1), odd)
    assert_same_fault(values)
    with contextlib.suppress(TypeError):  # an int orjson cannot write
        assert_same_read(orjson.dumps(values))


def _base() -> list[int]:
    """Ids of every length from 1 to 18 digits, over several 64-byte chunks."""
    return [int("7" * (1 + i % 18)) for i in range(30)]


@needs_compiled
@pytest.mark.parametrize("byte", list(b" ,0-.e[]\t\x80x"))
def test_a_stray_byte_at_every_place_is_read_alike(byte: int) -> None:
    span = orjson.dumps(_base())
    for at in range(len(span) + 1):
        assert_same_read(span[:at] + bytes([byte]) + span[at:], FEW_BOUNDS)
        assert_same_read(span[:at] + span[at + 1 :], FEW_BOUNDS)  # one byte fewer


@needs_compiled
def test_an_id_at_every_index_reaching_the_bound_is_named_alike() -> None:
    for bound in (10, 262144, 2**31):
        for index in range(0, 60, 3):
            for above in (bound - 1, bound, bound + 1, 10**18 - 1):
                values = [bound // 3] * 60
                values[index] = above
                assert_same_read(orjson.dumps(values))
                assert_same_fault(values)


@needs_compiled
def test_the_compiled_part_answers_for_any_buffer() -> None:
    assert COMPILED is not None
    span = b"[1,2,3]"
    assert COMPILED.read(span)[1] is span  # the same bytes: nothing to remove
    view = memoryview(b"x" + span)[1:]
    assert COMPILED.read(view)[1] is view  # a view of bytes: it cannot change either
    # A buffer that can change after the check is copied: the text is the one checked.
    for mutable in (bytearray(span), memoryview(bytearray(span))):
        count, text = COMPILED.read(mutable)
        assert (count, text, type(text)) == (3, span, bytes)
    assert COMPILED.read(memoryview(b"x[1, 2]")[1:]) == (2, b"[1,2]")
    assert COMPILED.fault(memoryview(span), 3) == (False, 2, 3)
    assert COMPILED.fault(span, 3, True) == (False, 2, 3)  # read's text: the bound alone
    assert COMPILED.fault(span, 4, True) is None
    with pytest.raises(ValueError, match="bound"):
        COMPILED.fault(span, 0)
    with pytest.raises(ValueError, match="bound"):
        COMPILED.fault(span, 2**31 + 1)
    with pytest.raises(TypeError):
        COMPILED.read("[1]")


@needs_compiled
@pytest.mark.parametrize("length", [17, 18, 19, 20, 21, 40, 70])
def test_a_long_run_ending_at_every_place_is_read_alike(length: int) -> None:
    # Short ids around it, so that the chunks it ends in look dense; the run starts at
    # every place from 1 to 140 bytes after the '['.
    for place in range(0, 140):
        head = "7," * (place // 2) + ("77," if place % 2 else "")
        span = f"[{head[1:] if place % 2 and not place // 2 else head}{'9' * length},{'1,' * 40}2]"
        assert_same_read(span.encode(), FEW_BOUNDS)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 10**18 - 1) | st.integers(0, 300_000), min_size=1, max_size=200),
    st.sampled_from(BOUNDS),
)
def test_the_bound_alone_on_reads_text_is_checked_as_with_the_grammar(
    values: list[int], bound: int
) -> None:
    assert COMPILED is not None
    text = orjson.dumps(values)
    assert COMPILED.fault(text, bound, True) == COMPILED.fault(text, bound)


@needs_compiled
def test_the_bound_given_to_read_is_checked_as_fault_checks_it() -> None:
    assert COMPILED is not None
    assert COMPILED.read(b"[5,17]", 18) == (2, b"[5,17]", True)
    assert COMPILED.read(b"[5,17]", 17) == (2, b"[5,17]", False)
    assert COMPILED.read(b"[5, 17]", 18) == (2, b"[5,17]", True)
    assert COMPILED.read(b"[5,,17]", 18) is None
    for bound in (0, -1, 2**31 + 1):
        with pytest.raises(ValueError, match="bound must be"):
            COMPILED.read(b"[1]", bound)
    with pytest.raises(TypeError):
        COMPILED.read(b"[1]", "1")
