"""A parsed document back to bytes, with members removed or written in.

A rewritten body is this module's own serialisation of the document ``reading`` read, so
after a rewrite the bytes vLLM reads and the document the policy judged cannot diverge.
A document orjson read holds no NaN, no infinity, no oversized integer and no lone
surrogate (``reading``), so orjson also writes it back exactly, except that orjson writes
at most 254 levels of nesting though it reads 1024; any other document, and any
document orjson refuses to write, is written by ``json.dumps``, which writes every
value ``json.loads`` can read back as the same value.

Every document ``reading.parse`` returns is written back or refused: a document too
deep even for ``json.dumps`` (Python's recursion limit, about 1000 levels) is a 400
(``body_too_deep``), never an unhandled exception.

Bounded work: ``json.dumps`` costs several times orjson's per value, so this module
never runs it on its own: ``write`` returns None where only ``json.dumps`` can write a
document, and the caller decides whether it may (``memory.slow_allowed``), charges what
it costs, and calls ``serialize`` (``admission``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Final

import orjson

from ext_proc.core import ids
from ext_proc.core.errors import BadRequest
from ext_proc.core.reading import Document, Parsed
from ext_proc.core.reasons import Reason
from ext_proc.core.vllm_request import Path


def removed(parsed: Parsed, paths: Iterable[Path]) -> Document:
    """The document with the member at each of ``paths`` removed (object keys, and list
    indexes on the way; a path that names nothing is skipped), for ``write``.

    Every other member keeps its value and position; the document is not modified:
    only the objects and lists on the way to a removed member are copied, each once
    however many paths lead through it (many items of one list cost one copy of it).
    """
    document: Any = dict(parsed.document)
    # Each container copied so far, by the id of the original and of the copy.
    copies: dict[int, Any] = {id(parsed.document): document, id(document): document}
    for path in paths:
        container = document
        for step in path[:-1]:
            child = _child(container, step)
            if child is None:
                break
            copied = copies.get(id(child))
            if copied is None:
                copied = dict(child) if isinstance(child, dict) else list(child)
                copies[id(child)] = copies[id(copied)] = copied
                container[step] = copied
            container = copied
        else:
            if isinstance(container, dict):
                container.pop(path[-1], None)
    result: Document = document
    return result


def _child(container: Any, step: str | int) -> dict[str, Any] | list[Any] | None:
    """The object or list at ``step`` of ``container``; None when there is none."""
    if isinstance(container, dict) and isinstance(step, str):
        child = container.get(step)
    elif isinstance(container, list) and isinstance(step, int) and 0 <= step < len(container):
        child = container[step]
    else:
        return None
    return child if isinstance(child, dict | list) else None


def write(parsed: Parsed, document: Document) -> bytes | None:
    """``document``, derived from ``parsed`` by adding or removing values orjson writes
    exactly, as orjson writes it when ``parsed`` was read by orjson and is not nested
    beyond what orjson writes; None when only ``serialize`` (json.dumps) can write it."""
    if not parsed.orjson_safe:
        return None
    try:
        return orjson.dumps(document, default=ids.written)
    except orjson.JSONEncodeError:
        # Only nesting beyond orjson's write limit: every value in a document orjson
        # read is one it can write. json.dumps writes it as json.loads reads it.
        return None


_COMPACT: Final = (",", ":")


def serialize(document: Document) -> bytes:
    """``json.dumps``: writes NaN, Infinity and integers of any size as ``json.loads``
    reads them; raises ``BadRequest`` (``body_too_deep``) past the recursion limit."""
    try:
        try:
            return json.dumps(
                document, ensure_ascii=False, separators=_COMPACT, default=ids.listed
            ).encode()
        except UnicodeEncodeError:
            # A lone surrogate (legal in JSON escapes) cannot be UTF-8: escape everything.
            return json.dumps(document, separators=_COMPACT, default=ids.listed).encode()
    except RecursionError as exc:
        raise BadRequest(
            "request body is nested too deeply to be forwarded", reason=Reason.BODY_TOO_DEEP
        ) from exc
