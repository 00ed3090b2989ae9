"""A JSON array of token ids read as bytes, without building a Python int per id.

A decode request's ``prompt_token_ids`` is usually most of its body: 128k ids are
about 900 KB. Parsing them into a list of ints and checking that list costs more than
everything else a large body needs, and the policy asks only how many ids there are,
the largest and where it stands, and (to check a proof) their canonical rendering.
``read`` checks the array's form and counts its ids with a few SIMD passes over its
bytes; ``RawIds.reaches`` compares them with a bound and ``RawIds.largest`` finds the
largest with a few more (numpy). What ``read`` does not accept, the caller parses like
any other array.

What ``read`` accepts is a strict subset of JSON: ``[``, then integers without a sign,
fraction, exponent or leading zero, separated by ``,`` or ``, `` (compact, or Python's
``json.dumps`` default), then ``]``; nothing else, not even an empty array. Every such
array is one JSON value, ended by its only ``]``; with at most ``MAX_DIGITS`` digits
per integer (the caller's part), ``json.loads`` and orjson both read it as the same
list of ints below 2**63, and its canonical rendering (what orjson writes for that
list) is the array with the spaces after the commas removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import orjson
from numpy.typing import NDArray

from ext_proc.bytescan import count, find, translate

# The most digits an id may have here: its value fits in 64 bits (a longer run of
# digits is one orjson may read differently from json.loads, see body.py).
MAX_DIGITS: Final = 18
_ZERO: Final = np.uint8(ord("0"))
# A comma, once a digit's value is taken from every byte (it wraps).
_COMMA: Final = np.uint8(ord(",") - ord("0") + 256)
_SPACE: Final = np.uint8(ord(" "))
_COMMA_CLASS: Final = ord(",")  # a comma's class is the comma itself


@dataclass(frozen=True, slots=True)
class RawIds:
    """Token ids as their canonical JSON text (``read`` checked its form)."""

    text: bytes  # e.g. b"[5,17,0]": exactly what orjson writes for the list
    count: int

    def fragment(self) -> orjson.Fragment:
        """The ids as orjson writes them back into a document."""
        return orjson.Fragment(self.text)

    def to_list(self) -> list[int]:
        ids: list[int] = orjson.loads(self.text)
        return ids

    def reaches(self, bound: int) -> bool:
        """Whether some id is ``bound`` (positive) or more. With ``limit = bound - 1``
        of ``n`` digits: an id of more than ``n`` digits (no leading zeros) is over it;
        once there is none, every run of ``n`` digits is a whole id, and those are
        compared with ``limit`` digit by digit, keeping the ids equal to it so far
        (usually none after the first digit)."""
        limit = str(bound - 1).encode()
        digits = _digits(self.text)
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

    def largest(self) -> tuple[int, int]:
        """The largest id and the index of its first occurrence. Without leading
        zeros, it is among the longest ids; once no run of digits is longer, every run
        of that length is a whole id, whose digits give its value (``MAX_DIGITS`` fit
        in 64 bits)."""
        digits = _digits(self.text)
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
# An empty item (two commas, or one at either end) or a leading zero, in those classes.
_NOT_JSON: Final = (b",,", b",zz", b",zd")


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


def read(span: bytes) -> RawIds | None:
    """``span`` (from ``[`` to the first ``]`` after it) as ids, when it is an array of
    the form the module docstring describes; None otherwise. ``span`` must hold no run
    of more than ``MAX_DIGITS`` digits (the caller knows: ``body.scan``)."""
    text = _compact(span)
    if text is None:
        return None
    if len(text) < 3 or text[0] != ord("[") or text[-1] != ord("]"):
        return None
    classes = translate(memoryview(text)[1:-1], _CLASSES)
    if find(classes, b"x") != -1 or classes.startswith((b",", b"zz", b"zd")):
        return None
    if classes.endswith(b",") or any(find(classes, pattern) != -1 for pattern in _NOT_JSON):
        return None
    return RawIds(text, count(classes, _COMMA_CLASS) + 1)
