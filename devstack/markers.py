"""A generated block inside a hand-written file, between two marker comments: the rest
of the file is left as it is."""

from __future__ import annotations


def splice(text: str, begin: str, end: str, block: str) -> str:
    """``text`` with everything from ``begin`` to ``end`` (both kept) replaced by
    ``block``, which is written between them on lines of its own. Raises ValueError
    when a marker is missing."""
    start = text.index(begin) + len(begin)
    stop = text.index(end, start)
    return text[:start] + "\n\n" + block.strip("\n") + "\n\n" + text[stop:]
