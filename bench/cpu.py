"""CPU time of a process and its descendants, from /proc (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")


def _stat(pid: int) -> list[str] | None:
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces: split after it.
    return text[text.rindex(")") + 2 :].split()


def _children(pid: int) -> list[int]:
    found = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def tree_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every live descendant."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        fields = _stat(current)
        if fields is None:
            continue
        # utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
        total += (int(fields[11]) + int(fields[12])) / _TICK
        pending += _children(current)
    return total
