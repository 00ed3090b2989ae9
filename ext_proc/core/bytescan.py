"""Searches and maps over raw bytes by SIMD (stringzilla, numpy): several times faster
than ``bytes.find``, ``bytes.translate`` and ``bytes.count`` on the bodies the service
reads, where the bytes sought are frequent."""

from __future__ import annotations

import functools
import re
from typing import Final, Protocol

import numpy as np
import stringzilla

from ext_proc.core import native
from ext_proc.core.events import Body

# The compiled scan (ext_proc/core/_scan.c), None where the reference here runs.
COMPILED: Final = native.module("core._scan")

# Below this size, bytes.count is as fast as numpy (whose call costs more).
_VECTOR_MIN: Final = 1 << 14


def find(raw: Body, needle: bytes, start: int = 0) -> int:
    """``raw.find(needle, start)``: a single byte in bytes by ``bytes.find`` itself
    (memchr, which outpaces the vector search there), a longer needle or a view (which
    ``bytes.find`` does not search) by stringzilla."""
    if len(needle) == 1 and isinstance(raw, bytes):
        return raw.find(needle, start)
    found: int = stringzilla.find(raw, needle, start)
    return found


def occurrences(raw: Body, needle: bytes, most: int) -> int:
    """``min(raw.count(needle), most)``: non-overlapping occurrences, searched for only
    until ``most`` are found."""
    found, at = 0, 0
    while found < most and (at := find(raw, needle, at)) != -1:
        found += 1
        at += len(needle)
    return found


def translate(raw: bytes | memoryview, table: bytes) -> bytes:
    """``bytes(raw).translate(table)``."""
    out: bytes = stringzilla.translate(raw, table)
    return out


def count(raw: Body, byte: int, start: int = 0) -> int:
    """``raw.count(bytes([byte]), start)``."""
    if len(raw) - start < _VECTOR_MIN:
        if isinstance(raw, bytes):
            return raw.count(byte, start)
        return bytes(raw[start:]).count(byte)  # fewer than _VECTOR_MIN bytes copied
    return int(np.count_nonzero(np.frombuffer(raw, np.uint8, offset=start) == byte))


def has_run(raw: Body, byte: int, length: int) -> bool:
    """Whether ``raw`` holds ``length`` copies of ``byte`` in a row (``length`` 15 or
    more). Such a run starts at most 7 bytes before an 8-byte boundary of ``raw`` and
    then still covers 8 more bytes: one whole aligned word of ``byte``. A large ``raw``
    is looked at only around those words: each stretch of consecutive whole words is
    part of one run, which goes on into the word before it (its last bytes that are
    ``byte``) and the one after it (its first), neither of which is whole; so the runs
    of the stretches are the runs that cover a word, every long run among them. A body
    of short numbers has no such word and is settled by one comparison over its words;
    however many stretches there are, each is measured by the same few vector passes
    (no search that may crawl through near matches)."""
    if length < 15:
        raise ValueError(f"a run of {length} may cover no whole word")
    if len(raw) < _VECTOR_MIN:
        return find(raw, bytes([byte]) * length) != -1
    whole = len(raw) // 8
    words = np.frombuffer(raw, np.uint64, count=whole)
    full = np.flatnonzero(words == np.uint64(int.from_bytes(bytes([byte]) * 8, "little")))
    if not len(full):
        return False
    # The stretches of consecutive whole words: their first and last word.
    breaks = np.flatnonzero(np.diff(full) != 1)
    firsts = full[np.concatenate(([0], breaks + 1))]
    lasts = full[np.concatenate((breaks, [len(full) - 1]))]
    matrix = np.frombuffer(raw, np.uint8, count=whole * 8).reshape(whole, 8)
    # The word before each stretch (none before the first word: nothing runs on).
    before = (matrix[np.maximum(firsts - 1, 0), ::-1] == byte).cumprod(axis=1).sum(axis=1)
    before[firsts == 0] = 0
    # The word after it; after the last whole word, the bytes left over.
    after = (matrix[np.minimum(lasts + 1, whole - 1)] == byte).cumprod(axis=1).sum(axis=1)
    tail = bytes(raw[whole * 8 :])  # fewer than 8 bytes
    after[lasts == whole - 1] = len(tail) - len(tail.lstrip(bytes([byte])))
    runs = before + 8 * (lasts - firsts + 1) + after
    return bool((runs >= length).any())


_QUOTE: Final = ord('"')
# Below this size one regular expression finds every name sooner than the vectors
# (whose dozen calls cost more than the search).
_QUOTED_VECTOR_MIN: Final = 1 << 18


def quoted(raw: Body, names: tuple[bytes, ...], most: int) -> dict[bytes, int]:
    """For each of ``names`` (each at least 3 bytes, none holding a quote or a
    backslash) that ``raw`` writes between two quotes, how often it does, counted to
    ``most`` (at least 1), in one pass however many names there are: the quotes of
    ``raw`` that begin ``b'"' + name + b'"'``. A name it never writes so is absent (a
    body usually names none of them, and the answer then costs nothing per name).

    Every string token ``"name"`` begins at a quote and runs to the next quote, so
    each is counted (a JSON member's name among them, at any depth); a quote that
    closes one run and begins the next is read as both, which may count more than the
    tokens, never fewer.

    The compiled scan (``COMPILED``) goes from each quote to the next and looks the
    run between them up among the names. The reference searches a small ``raw`` with
    one regular expression for every quote that begins a quoted run of the bytes
    names are made of, and keeps the runs that are names; a large one by vectors:
    each quote's next four bytes are compared, as one word, with each name's first
    four bytes (a name of three with its closing quote), and only the quotes that
    match one are compared in full."""
    if most < 1:
        raise ValueError(f"most is {most}, not at least 1")
    if COMPILED is not None:
        return matcher(names, b"").quoted(raw, most)
    _check(names)
    counts: dict[bytes, int] = {}
    if len(raw) < _QUOTED_VECTOR_MIN:
        wanted = _names(names)
        # re's matches of any buffer (a view too) are bytes, as the names are.
        for found in _pattern(names).findall(raw):
            if found in wanted:
                counts[found] = min(counts.get(found, 0) + 1, most)
        return counts
    arr = np.frombuffer(raw, np.uint8)
    quotes = np.flatnonzero(arr == _QUOTE)
    quotes = quotes[quotes + 4 < len(raw)]
    words = arr[quotes + 1].astype(np.uint32)
    for shift in (1, 2, 3):
        words |= arr[quotes + 1 + shift].astype(np.uint32) << np.uint32(8 * shift)
    heads = _heads(names)
    slot = np.minimum(np.searchsorted(heads[0], words), len(heads[0]) - 1)
    for at in quotes[heads[0][slot] == words].tolist():
        for name in heads[1][_word(raw, at + 1)]:
            token = b'"' + name + b'"'
            if counts.get(name, 0) < most and raw[at : at + len(token)] == token:
                counts[name] = counts.get(name, 0) + 1
    return counts


class Matcher(Protocol):
    """The compiled scan of one tuple of names (ext_proc/core/_scan.c)."""

    def quoted(
        self, raw: bytes | bytearray | memoryview, most: int, portable: bool = False, /
    ) -> dict[bytes, int]:
        """``quoted(raw, names, most)``; ``portable``: by the SSE2 loop even where the
        CPU has AVX2 (the tests compare the two)."""

    def spelled(
        self, raw: bytes | bytearray | memoryview, most: int, portable: bool = False, /
    ) -> dict[bytes, int] | None:
        """None when ``raw`` is not braced (``spelling._braced``) or holds ``\\u00``
        and one of the escape bytes, else ``quoted(raw, names, most)``."""


@functools.cache
def matcher(names: tuple[bytes, ...], escapes: bytes) -> Matcher:
    """The compiled scan of ``names`` (checked as the reference checks them), with
    ``escapes`` the bytes that after ``\\u00`` start an escape of one of their
    characters; only where ``COMPILED`` is not None."""
    if COMPILED is None:
        raise RuntimeError("the compiled scan is not built")
    _check(names)
    made: Matcher = COMPILED.Matcher(names, escapes)
    return made


@functools.cache
def _check(names: tuple[bytes, ...]) -> None:
    """Refuses names the scans are not made for (``_heads``, ``_pattern``)."""
    _heads(names)
    _pattern(names)


@functools.cache
def _names(names: tuple[bytes, ...]) -> frozenset[bytes]:
    return frozenset(names)


def _word(raw: Body, at: int) -> int:
    return int.from_bytes(raw[at : at + 4], "little")


@functools.cache
def _heads(names: tuple[bytes, ...]) -> tuple[np.ndarray, dict[int, tuple[bytes, ...]]]:
    """Each name's first four bytes (a name of three: with its closing quote) as a
    little-endian word, and the names that begin with each word."""
    by_word: dict[int, list[bytes]] = {}
    for name in names:
        if len(name) < 3 or b'"' in name:
            raise ValueError(f"{name!r}: at least 3 bytes, no quote")
        by_word.setdefault(int.from_bytes((name + b'"')[:4], "little"), []).append(name)
    words = np.array(sorted(by_word), dtype=np.uint32)
    return words, {word: tuple(found) for word, found in by_word.items()}


@functools.cache
def _pattern(names: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """Each quote that begins a quoted run of the bytes names are made of, and the run
    (read once: possessive, no backtracking); ``quoted`` keeps the runs that are names.
    A match takes only its opening quote, so the run's closing quote is looked at
    again as the next run's opening one: no quote that begins ``"name"`` is passed."""
    alphabet = sorted(set(b"".join(names)))
    if not alphabet or any(byte in b'"\\' for byte in alphabet):
        raise ValueError("names are made of bytes other than quote and backslash")
    members = b"".join(re.escape(bytes([byte])) for byte in alphabet)
    return re.compile(b'"(?=([' + members + b']++)")')
