"""Searches and maps over raw bytes by SIMD (stringzilla, numpy): several times faster
than ``bytes.find``, ``bytes.translate`` and ``bytes.count`` on the bodies the service
reads, where the bytes sought are frequent."""

from __future__ import annotations

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
