"""Token ids: one value, read from a request's raw bytes or from a parsed document.

A decode request's ``prompt_token_ids`` is usually most of its body: 128k ids are
about 900 KB. ``Ids.read`` takes them from the body's bytes without building a Python
int per id; ``Ids.of`` takes them from a parsed document (any JSON value, or ids
``read`` already). Either way the rule is decided in one place and one way, on the
canonical text: ids are valid when their text is a *well-formed* array and no id
reaches the bound (``Ids.fault``). The canonical text is what orjson writes for the
list; it is also what a proof signs (``proof.canonical``).

Well-formed is a strict subset of JSON: ``[``, then integers without a sign,
fraction, exponent or leading zero, of at most ``MAX_DIGITS`` digits, separated by
``,``, then ``]``; nothing else, not even an empty array. orjson writes exactly that
for a non-empty list of ints in ``[0, 10**MAX_DIGITS)`` and something else for any
other list (a bool, a negative, a float, a string, a nested list, a larger int), so
for a parsed list "well-formed" is "every item is such an int". ``read`` accepts
those arrays also with one space after each comma (Python's ``json.dumps`` default):
every such array is one JSON value, ended by its only ``]``, which ``json.loads`` and
orjson both read as the same list, whose canonical text is the array without those
spaces. tests/core/test_ids.py checks both constructions against each other.

Why an id fails is looked for only once the text showed that one does: the first
item that is not a non-negative int, else (every item is one, some too long to be
well-formed) the largest, which no route's bound admits (``MAX_BOUND``).

The compiled part ``core._ids`` (``_ids.c``) does each check in one pass over the text:
``read``'s (well-formed, compacted, counted) and ``fault``'s (the bound, and why the
ids fail, on the text orjson writes for a parsed list: its first item that is not a
run of digits is the first that is not a non-negative int). The functions below are
the reference it is compared with (tests/core/test_ids_native.py); it answers
``NotImplemented`` where it cannot tell, and the reference decides. Given the bound
``fault`` will be asked about, the compiled ``read`` checks it in its own pass; ids
that pass are below it, so ``fault`` of it (or of a higher bound) needs no pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from types import ModuleType
from typing import Any, Final

import numpy as np
import orjson
from numpy.typing import NDArray

from ext_proc.core import native
from ext_proc.core.bytescan import count, find, has_run, translate
from ext_proc.core.vllm_request import TOKEN_ID_BOUND

# The most digits a well-formed id has: its value fits in 64 bits (a longer run of
# digits is one orjson may read differently from json.loads, see reading.py).
MAX_DIGITS: Final = 18
# No bound is above vLLM's, so an id of more than MAX_DIGITS digits is never below one.
MAX_BOUND: Final = TOKEN_ID_BOUND
_ZERO: Final = np.uint8(ord("0"))
# A comma, once a digit's value is taken from every byte (it wraps).
_COMMA: Final = np.uint8(ord(",") - ord("0") + 256)
_SPACE: Final = np.uint8(ord(" "))
_COMMA_CLASS: Final = ord(",")  # a comma's class is the comma itself
_ZERO_INT: Final = 0
# The compiled checks, None where the reference runs (``native``; the tests swap it).
_NATIVE: ModuleType | None = native.module("core._ids")


class Kind(Enum):
    MALFORMED = "malformed"  # an item that is not a non-negative integer
    OUT_OF_RANGE = "out_of_range"  # an id at or above the bound


@dataclass(frozen=True, slots=True)
class Fault:
    """Why ids are not valid: the first malformed item's index, or the largest id and
    the index of its first occurrence."""

    kind: Kind
    index: int
    value: int = 0


# The items of ids built from the bytes: their text is all there is.
_READ: Final = object()


class Ids:
    """Token ids: how many there are and their canonical text, with the checks the
    policy and the proof need. ``read`` and ``of`` build it; nothing else does."""

    __slots__ = ("_below", "_items", "_text", "count")

    def __init__(
        self, count: int, text: bytes | memoryview | None, items: Any = None, below: int = 0
    ) -> None:
        self.count = count  # 0 for anything but a non-empty list
        # The canonical text once known: ids read from a view of a bytes object (the
        # body) keep the view, copied into bytes only when the text is asked for.
        self._text = text
        self._items = items  # the parsed value, or _READ: built from the bytes
        # A bound every id is known to be below (0: none known): ``fault`` of it, or of
        # any higher bound, is None without another pass (ids read from the bytes).
        self._below = below

    def __repr__(self) -> str:
        return f"Ids(count={self.count})"

    @classmethod
    def read(
        cls, span: bytes | memoryview, *, runs_checked: bool = False, bound: int | None = None
    ) -> Ids | None:
        """The ids ``span`` (from ``[`` to the first ``]`` after it) holds when it is a
        well-formed array, with or without a space after each comma; None otherwise:
        the caller parses it like any other JSON. ``span``: bytes, or a view of bytes
        (the body's, not copied: the text stays that view until it is asked for).
        ``runs_checked``: the caller has shown that no run of digits in ``span`` is
        longer than ``MAX_DIGITS`` (a pass over the bytes saved). ``bound`` (at most
        ``MAX_BOUND``): the bound ``fault`` will be asked about, which the compiled read
        checks in the same pass (the answer is ``fault``'s either way)."""
        if _NATIVE is not None:
            if bound is None:
                found = _NATIVE.read(span)
                return None if found is None else cls(found[0], found[1], _READ)
            assert 0 < bound <= MAX_BOUND
            found = _NATIVE.read(span, bound)
            return None if found is None else cls(found[0], found[1], _READ, found[2] and bound)
        text = _compact(bytes(span))
        if text is None or not _well_formed(text, runs_checked=runs_checked):
            return None
        return cls(count(text, _COMMA_CLASS, 1) + 1, text, _READ)

    @classmethod
    def of(cls, value: Any) -> Ids:
        """The ids a parsed document holds at a member: ``value`` is any JSON value, or
        ids already read from the bytes (returned as they are)."""
        if isinstance(value, Ids):
            return value
        return cls(len(value) if isinstance(value, list) else 0, None, value)

    @property
    def text(self) -> bytes:
        """What orjson writes for the ids' value; raises ``TypeError`` when it cannot
        (``orjson.JSONEncodeError``: an int of 64 bits or more, say)."""
        text = self._text
        if text is None:
            text = self._text = orjson.dumps(self._items)
        elif not isinstance(text, bytes):
            text = self._text = bytes(text)  # the view's copy, made once
        return text

    @property
    def signed(self) -> bytes | None:
        """The text a proof signs: the canonical text, None where it does not stand
        for the value (orjson writes NaN and infinities as null) or cannot be written.
        Ids read from the bytes are well-formed: their text as it is."""
        if self._items is _READ:
            return self.text
        try:
            text = self.text
        except TypeError:
            return None
        return None if b"null" in text else text

    def to_list(self) -> Any:
        """The value as ``json.loads`` reads it (ids read from bytes: their list)."""
        return orjson.loads(self.text) if self._items is _READ else self._items

    def fault(self, bound: int) -> Fault | None:
        """None when every id is below ``bound`` (at most ``MAX_BOUND``) and the ids are
        a non-empty list; otherwise why not."""
        assert 0 < bound <= MAX_BOUND
        if self._below and bound >= self._below:
            return None  # read from the bytes (well-formed, not empty), every id below
        if _NATIVE is not None and self.count:
            decided, fault = self._native_fault(bound)
            if decided:
                return fault
        text = self._canonical()
        if text is None:
            return self._why_not()
        if not _reaches(text, bound):
            return None
        value, index = _largest(text)
        return Fault(Kind.OUT_OF_RANGE, index, value)

    def _native_fault(self, bound: int) -> tuple[bool, Fault | None]:
        """Whether the compiled pass over the text (the ids read from the bytes, or what
        orjson writes for the list) decided, and ``fault``'s answer when it did; the
        reference decides where it did not, or where there is no text (an int of 64
        bits or more)."""
        assert _NATIVE is not None
        try:
            text = self.text
        except TypeError:
            return False, None
        # Ids read from the bytes are well-formed (``read``): only the bound is left.
        found = _NATIVE.fault(text, bound, self._items is _READ)
        if found is None or found is NotImplemented:
            return found is None, None
        malformed, index, value = found
        return True, Fault(Kind.MALFORMED if malformed else Kind.OUT_OF_RANGE, index, value)

    def _canonical(self) -> bytes | None:
        """The canonical text when it is well-formed; None otherwise."""
        if self._items is _READ:
            return self.text  # ``read`` checked it
        if not self.count:
            return None
        try:
            text = self.text
        except TypeError:
            return None
        return text if _well_formed(text) else None

    def _why_not(self) -> Fault:
        """Why a value that is not well-formed holds no valid ids (see the module
        docstring). Every pass over the items runs in C: no per-item Python loop."""
        items = self._items
        if not isinstance(items, list) or not items:
            return Fault(Kind.MALFORMED, 0)
        # The first item that is not an int (a bool is not one here, nor a float), and
        # the first negative int before it.
        kinds = set(map(type, items))
        end = len(items)
        if kinds != {int}:
            types = list(map(type, items))
            end = min(types.index(kind) for kind in kinds - {int})
        negative = list(map(_ZERO_INT.__gt__, items[:end]))
        if True in negative:
            return Fault(Kind.MALFORMED, negative.index(True))
        if end < len(items):
            return Fault(Kind.MALFORMED, end)
        # Every item a non-negative int and yet not well-formed: one has more than
        # MAX_DIGITS digits, beyond every bound.
        highest = max(items)
        return Fault(Kind.OUT_OF_RANGE, items.index(highest), highest)


def written(value: Any) -> orjson.Fragment:
    """orjson's ``default`` hook: ids are written as their canonical text."""
    if isinstance(value, Ids):
        return orjson.Fragment(value.text)
    raise TypeError(f"{type(value).__name__} is not JSON")


def listed(value: Any) -> Any:
    """``json.dumps``'s ``default`` hook: ids are written as the list they are."""
    if isinstance(value, Ids):
        return value.to_list()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _reaches(text: bytes, bound: int) -> bool:
    """Whether some id of well-formed ``text`` is ``bound`` (positive) or more. With
    ``limit = bound - 1`` of ``n`` digits: an id of more than ``n`` digits (no leading
    zeros) is over it; once there is none, every run of ``n`` digits is a whole id, and
    those are compared with ``limit`` digit by digit, keeping the ids equal to it so far
    (usually none after the first digit)."""
    limit = str(bound - 1).encode()
    digits = _digits(text)
    is_digit = digits < 10
    same = _runs(is_digit, len(limit))
    if not same.any():  # every id is shorter than the limit
        return False
    if bool((same[:-1] & is_digit[len(limit) :]).any()):  # one is longer
        return True
    for place, digit in enumerate(limit):
        column = digits[place : place + len(same)]
        if bool((same & (column > digit - _ZERO)).any()):
            return True
        same = same & (column == digit - _ZERO)
        if not same.any():
            return False
    return False


def _largest(text: bytes) -> tuple[int, int]:
    """The largest id of well-formed ``text`` and the index of its first occurrence.
    Without leading zeros, it is among the longest ids; once no run of digits is
    longer, every run of that length is a whole id, whose digits give its value
    (``MAX_DIGITS`` fit in 64 bits)."""
    digits = _digits(text)
    is_digit = digits < 10
    runs, longest = is_digit, 1
    while longest < MAX_DIGITS:
        longer = runs[:-1] & is_digit[longest:]
        if not longer.any():
            break
        runs, longest = longer, longest + 1
    firsts = np.flatnonzero(runs)
    values = digits[firsts].astype(np.int64)
    for place in range(1, longest):  # a column at a time: 8 bytes per id at most
        values *= 10
        values += digits[firsts + place]
    top = int(values.argmax())
    index = int(np.count_nonzero(digits[: firsts[top]] == _COMMA))
    return int(values[top]), index


def _digits(text: bytes) -> NDArray[np.uint8]:
    """Each byte between the brackets as a digit's value; any other byte is 10 or more
    (it wraps)."""
    return np.frombuffer(text, np.uint8)[1:-1] - _ZERO


# Each byte between the brackets as a class: "z" a zero, "d" another digit, "," a
# comma, "x" anything else.
_CLASSES: Final = bytes(
    0x7A if i == 0x30 else 0x64 if 0x31 <= i <= 0x39 else 0x2C if i == 0x2C else 0x78
    for i in range(256)
)
# Each byte as "0" for a digit and " " for anything else: a run of too many digits.
_DIGIT_RUNS: Final = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
# An empty item (two commas, or one at either end) or a leading zero, in those classes.
_NOT_JSON: Final = (b",,", b",zz", b",zd")


def _well_formed(text: bytes, *, runs_checked: bool = False) -> bool:
    """Whether ``text`` is a well-formed array (module docstring); ``runs_checked``:
    no run of digits in it is longer than ``MAX_DIGITS``, as the caller has shown."""
    if len(text) < 3 or text[0] != ord("[") or text[-1] != ord("]"):
        return False
    inner = memoryview(text)[1:-1]
    classes = translate(inner, _CLASSES)
    if find(classes, b"x") != -1 or classes.startswith((b",", b"zz", b"zd")):
        return False
    if classes.endswith(b",") or any(find(classes, pattern) != -1 for pattern in _NOT_JSON):
        return False
    return (
        runs_checked
        or len(classes) <= MAX_DIGITS
        or not has_run(translate(inner, _DIGIT_RUNS), 0x30, MAX_DIGITS + 1)
    )


def _runs(is_digit: NDArray[np.bool_], length: int) -> NDArray[np.bool_]:
    """Where a run of at least ``length`` digits starts (``length - 1`` fewer places
    than ``is_digit``), by doubling: a run of 2k digits is two runs of k."""
    runs, covered = is_digit, 1
    while covered < length:
        step = min(covered, length - covered)
        runs, covered = runs[:-step] & runs[step:], covered + step
    return runs


def _compact(span: bytes) -> bytes | None:
    """``span`` without the space after each comma (Python's ``json.dumps`` default);
    None when a space stands anywhere else (``read`` would refuse it). Once every space
    is known to follow a comma, deleting them all (``bytes.translate``) is the same as
    replacing each ", ", at a third of ``bytes.replace``'s cost on many separators."""
    if find(span, b" ") == -1:
        return span
    raw = np.frombuffer(span, np.uint8)
    spaces = raw == _SPACE
    if bool(spaces[0]) or bool((spaces[1:] & (raw[:-1] != _COMMA_CLASS)).any()):
        return None
    return span.translate(None, b" ")
