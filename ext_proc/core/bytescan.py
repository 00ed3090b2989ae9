"""Searches and maps over raw bytes by SIMD (stringzilla, numpy): several times faster
than ``bytes.find``, ``bytes.translate`` and ``bytes.count`` on the bodies the service
reads, where the bytes sought are frequent."""

from __future__ import annotations

import functools
import re
from typing import Final

import numpy as np
import stringzilla

# Below this size, bytes.count is as fast as numpy (whose call costs more).
_VECTOR_MIN: Final = 1 << 14


def find(raw: bytes, needle: bytes, start: int = 0) -> int:
    """``raw.find(needle, start)``."""
    found: int = stringzilla.find(raw, needle, start)
    return found


def occurrences(raw: bytes, needle: bytes, most: int) -> int:
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


def count(raw: bytes, byte: int, start: int = 0) -> int:
    """``raw.count(bytes([byte]), start)``."""
    if len(raw) - start < _VECTOR_MIN:
        return raw.count(byte, start)
    return int(np.count_nonzero(np.frombuffer(raw, np.uint8, offset=start) == byte))


def has_run(raw: bytes, byte: int, length: int) -> bool:
    """Whether ``raw`` holds ``length`` copies of ``byte`` in a row (``length`` 15 or
    more). Such a run starts at most 7 bytes before an 8-byte boundary of ``raw`` and
    then still covers 8 more bytes: one whole aligned word of ``byte``. A large ``raw``
    without such a word (a body of short numbers, say) is settled by one vector
    comparison over its words; otherwise the run is searched for."""
    if length < 15:
        raise ValueError(f"a run of {length} may cover no whole word")
    if len(raw) >= _VECTOR_MIN:
        words = np.frombuffer(raw, np.uint64, count=len(raw) // 8)
        if not bool((words == np.uint64(int.from_bytes(bytes([byte]) * 8, "little"))).any()):
            return False
    return find(raw, bytes([byte]) * length) != -1


_QUOTE: Final = ord('"')
# Below this size one regular expression finds every name sooner than the vectors
# (whose dozen calls cost more than the search).
_QUOTED_VECTOR_MIN: Final = 1 << 18


def quoted(raw: bytes, names: tuple[bytes, ...], most: int) -> dict[bytes, int]:
    """For each of ``names`` (each at least 3 bytes, none holding a quote or a
    backslash) that ``raw`` writes between two quotes, how often it does, counted to
    ``most``, in one pass however many names there are: the occurrences of
    ``b'"' + name + b'"'`` whose opening quote does not close an earlier quoted run of
    the bytes names are made of. That is every occurrence whose opening quote follows a
    byte no name holds, as a JSON member's opening quote does (it follows a brace, a
    comma or whitespace). A name it never writes so is absent (a body usually names
    none of them, and the answer then costs nothing per name).

    A small ``raw`` is searched by one regular expression for every quoted run of the
    bytes names are made of, and the runs that are names are counted; a large one by
    vectors: each quote's next four bytes are compared, as one word, with each name's
    first four bytes (a name of three with its closing quote), and only the quotes that
    match one are compared in full. Two occurrences of the same token never overlap:
    each begins at its own opening quote and ends at a closing quote that no name
    holds."""
    counts: dict[bytes, int] = {}
    if len(raw) < _QUOTED_VECTOR_MIN:
        wanted = _names(names)
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
            if counts.get(name, 0) < most and raw.startswith(b'"' + name + b'"', at):
                counts[name] = counts.get(name, 0) + 1
    return counts


@functools.cache
def _names(names: tuple[bytes, ...]) -> frozenset[bytes]:
    return frozenset(names)


def _word(raw: bytes, at: int) -> int:
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
    """Every quoted run of the bytes that names are made of, each run read once
    (possessive: no backtracking); ``quoted`` keeps the runs that are names.

    A run found so is never one that hides a name behind it: a match that ends at the
    opening quote of a later ``"name"`` ends there only when the byte before that quote
    is one names are made of, which a member's opening quote in JSON never follows (it
    follows a brace, a comma or whitespace)."""
    alphabet = sorted(set(b"".join(names)))
    if not alphabet or any(byte in b'"\\' for byte in alphabet):
        raise ValueError("names are made of bytes other than quote and backslash")
    members = b"".join(re.escape(bytes([byte])) for byte in alphabet)
    return re.compile(b'"([' + members + b']++)"')
