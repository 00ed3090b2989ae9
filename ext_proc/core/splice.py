"""A body with members removed by cutting their bytes out of it, where that is shown to
forward the document ``writing.removed`` would write; None where it is not (the caller
then parses and rewrites: the reference).

Why it is sound: ``json.loads`` of the cut bytes is ``removed(parse(raw))``.
``raw`` was read by orjson (``Parsed.orjson_safe``): strict RFC 8259 JSON in UTF-8, no
byte-order mark (a body with one, in UTF-16/32, with NaN or huge integers is parsed by
json.loads and rewritten), and ``json.loads`` reads from it the document the policy
judged (``reading``). Take a path whose member that document holds, named ``key`` in
an object ``O``. ``raw`` holds no escape that may spell a character of ``key``
(``spelling.spelled``), so the member's key is the string token ``"key"`` as written.
The bytes ``"key"`` occur exactly once in ``raw`` (searched, or counted by the scan
the judgment ran: ``Body``): any other member named ``key``, at
any depth, an earlier duplicate that json.loads drops included, would be another token
(distinct tokens share no byte). That occurrence is therefore this member's key, and
``O`` holds no other member of that name. JSON's grammar puts around it, inside
``O``'s bytes: ``{`` or ``,``, whitespace, ``"key"``, whitespace, ``:``, whitespace, the
value, whitespace, ``,`` or ``}``. The value's end is found by a scan that reads a
string to its first quote after an even number of backslashes, and an object or array
to the brace or bracket that brings its depth back to zero, strings skipped whole (in
valid JSON every quote, brace and bracket outside a string is structural; a ``}``
inside a string of the value is skipped with the string); a number or literal ends at
its last byte. An array of ids read by ``ids.Ids.read`` (``Parsed.lifted``) holds no
quote, brace, bracket or backslash: it is skipped, not searched. The cut is the key to
the value's end with the comma before the key, or else the one after the value (the
first member), or else none (the only member: ``{}`` remains). What remains is valid
JSON in which ``O`` holds the same members in the same order but that one, each with
the same bytes, every other byte unchanged (whitespace included): ``json.loads`` reads
the same values and resolves the same duplicate keys (none named ``key``), which is
``removed``'s document. Several paths are cut from the last to the first, each on
bytes that are again such a document, the offsets before it unmoved; a member inside
another one cut goes with it.

A document nested beyond what orjson writes is rewritten by json.dumps, which may
refuse it (``writing``); a cut would forward it instead, so only documents shown to be
shallower are cut (``_shallow``): the cut refuses nothing the rewrite forwards, and
forwards nothing it refuses. Every step is checked on the bytes; any surprise gives
None, never a guess.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import stringzilla

from ext_proc.core import events
from ext_proc.core.bytescan import find
from ext_proc.core.reading import Parsed
from ext_proc.core.spelling import spelled
from ext_proc.core.vllm_request import Path

# Below this size, rewriting what remains (orjson) costs less than finding the cut.
MIN_BYTES: Final = 256 * 1024
# How deep a document may be nested, and how many of its values are walked to show it
# (well within the 254 levels orjson writes; a larger document is rewritten).
_NESTED: Final = 128
_CONTAINERS: Final = frozenset({dict, list})  # what orjson reads a document into
_WALKED: Final = 4096
# A span of the body, from its first byte to past its last.
Span = tuple[int, int]
_WHITESPACE: Final = b" \t\n\r"
_ESCAPE: Final = b"\\u00"
_QUOTE, _BACKSLASH, _COLON, _COMMA = b'"'[0], b"\\"[0], b":"[0], b","[0]
_OPENERS: Final = frozenset(b"{[")
_STRUCTURAL: Final = b'"{}[]'
# The bytes of a number or of true, false and null.
_SCALAR: Final = b"0123456789+-.eEtrufalsn"


@dataclass(frozen=True, slots=True)
class Body:
    """A body's bytes, with what ``spelling.spelled`` answered for the names ``asked``
    (None: it could not tell): when it answered, no escape in the bytes may spell one of
    them, and each count is that of the bytes ``"name"`` in the body, up to 2
    (``bytescan.quoted``: every quote that begins them)."""

    raw: events.Body
    asked: frozenset[str] = frozenset()
    spelled: Mapping[str, int] | None = None


def without(body: Body, parsed: Parsed, paths: Iterable[Path]) -> bytes | None:
    """``body`` with the member at each of ``paths`` cut out (a path that names nothing
    in ``parsed``'s document is skipped, as ``writing.removed`` skips it); None when a
    cut is not shown to forward ``removed``'s document (module docstring)."""
    raw = body.raw
    keys = _keys(parsed, paths)
    if keys is None or not _shallow(parsed.document):
        return None
    if not keys:
        return bytes(raw)  # nothing to remove: the body reads as the document
    skip = parsed.lifted
    counted = body.spelled is not None and body.asked.issuperset(keys)
    if not counted and not _plain(raw, keys, skip):
        return None
    spans: list[Span] = []
    for key in keys:
        once = counted and body.spelled is not None and body.spelled.get(key) == 1
        span = _member(raw, key, skip, once=once)
        if span is None:
            return None
        spans.append(span)
    outermost = _outermost(spans)
    if outermost is None:
        return None
    spliced: events.Body = raw
    for start, end in reversed(outermost):
        cut = _cut(spliced, start, end)
        if cut is None:
            return None
        view = memoryview(spliced)
        spliced = b"".join((view[: cut[0]], view[cut[1] :]))
    return spliced if isinstance(spliced, bytes) else bytes(spliced)


def _keys(parsed: Parsed, paths: Iterable[Path]) -> list[str] | None:
    """The names of the members ``paths`` name in ``parsed``'s document; None when one
    is not cut here: a body orjson did not read, a name not written as itself."""
    if not parsed.orjson_safe:
        return None
    keys: list[str] = []
    for path in paths:
        if _holds(parsed.document, path):
            key = path[-1]
            if not isinstance(key, str) or not _printable(key):
                return None
            keys.append(key)
    return keys


def _shallow(document: Any) -> bool:
    """Whether ``document`` is shown to be nested within ``_NESTED`` levels by a walk
    of at most ``_WALKED`` values: what orjson writes, so that the rewrite neither
    refuses it nor runs json.dumps (``writing``), and a cut forwards what a rewrite
    would."""
    pending: list[tuple[Any, int]] = [(document, 1)]
    walked = 0
    while pending:
        value, depth = pending.pop()
        items = value.values() if isinstance(value, dict) else value
        walked += len(items)
        if depth > _NESTED or walked > _WALKED:
            return False
        if not _CONTAINERS.isdisjoint(map(type, items)):  # a list of scalars: one C pass
            pending.extend((item, depth + 1) for item in items if type(item) in _CONTAINERS)
    return True


def _outermost(spans: list[Span]) -> list[Span] | None:
    """``spans`` in order, those inside another left out (a member inside a removed one
    goes with it); None when two overlap otherwise, which members of JSON never do."""
    outermost: list[Span] = []
    for start, end in sorted(spans):
        if outermost and start < outermost[-1][1]:
            if end > outermost[-1][1]:
                return None
            continue
        outermost.append((start, end))
    return outermost


@functools.cache
def _printable(key: str) -> bool:
    """Whether ``key`` is printable ASCII without quote, slash or backslash: written as
    itself, its token is its own bytes between quotes (``spelling``)."""
    return key != "" and all(0x20 < ord(c) < 0x7F and c not in '"\\/' for c in key)


def _plain(raw: events.Body, keys: list[str], skip: Span | None) -> bool:
    """Whether ``raw`` holds no escape that may spell a character of one of ``keys``
    (each printable ASCII). Every such escape begins with ``\\u00`` (``spelling``): a
    body without one needs no more; otherwise ``spelled`` tells (None: it may)."""
    if _first(raw, _ESCAPE, 0, skip) == -1:
        return True
    try:
        return spelled(raw, keys) is not None
    except ValueError:  # a key ``spelled`` does not take: not shown
        return False


def _holds(document: Any, path: Path) -> bool:
    """Whether ``document`` holds a member at ``path``, walked as ``writing.removed``
    walks it (object keys, list indexes on the way)."""
    container = document
    for step in path[:-1]:
        if isinstance(container, dict) and isinstance(step, str):
            container = container.get(step)
        elif isinstance(container, list) and isinstance(step, int) and 0 <= step < len(container):
            container = container[step]
        else:
            return False
    return isinstance(container, dict) and path[-1] in container


def _member(raw: events.Body, key: str, skip: Span | None, *, once: bool) -> Span | None:
    """The span from the opening quote of the one token ``"key"`` in ``raw`` to the
    end of its member's value; None when ``raw`` does not write it exactly once
    (``once``: already counted so) or the bytes after it are not ``: value``."""
    token = b'"' + key.encode() + b'"'
    at = _first(raw, token, 0, skip)
    if at == -1 or (not once and _first(raw, token, at + len(token), skip) != -1):
        return None
    colon = _skip(raw, at + len(token))
    if colon >= len(raw) or raw[colon] != _COLON:
        return None
    end = _value_end(raw, _skip(raw, colon + 1), skip)
    return None if end is None else (at, end)


def _first(raw: events.Body, needle: bytes, start: int, skip: Span | None) -> int:
    """``raw.find(needle, start)`` for a ``needle`` holding a quote or a backslash,
    never looking inside ``skip``, the span of a lifted array, which holds neither:
    ``needle`` lies wholly inside it nowhere, so an occurrence that meets it crosses
    one of its ends, and is looked for there."""
    if skip is None or start >= skip[1]:
        found: int = stringzilla.find(raw, needle, start)
        return found
    if start < skip[0]:
        found = stringzilla.find(raw, needle, start, skip[0] + len(needle) - 1)
        if found != -1:
            return found
    found = stringzilla.find(raw, needle, max(start, skip[1] - len(needle) + 1))
    return found


def _cut(raw: events.Body, start: int, end: int) -> Span | None:
    """The bytes to cut for the member from ``start`` to ``end``: with the comma before
    it, or else the one after it, or else none (the only member of its object)."""
    before = start - 1
    while before >= 0 and raw[before] in _WHITESPACE:
        before -= 1
    after = _skip(raw, end)
    if before < 0 or after >= len(raw):
        return None
    if raw[before] == _COMMA:
        return before, end
    if raw[before] != b"{"[0]:
        return None
    if raw[after] == _COMMA:
        return start, after + 1
    return (start, end) if raw[after] == b"}"[0] else None


def _skip(raw: events.Body, at: int) -> int:
    """The first position from ``at`` that is not JSON whitespace (``len(raw)``: none)."""
    while at < len(raw) and raw[at] in _WHITESPACE:
        at += 1
    return at


def _value_end(raw: events.Body, at: int, skip: Span | None) -> int | None:
    """The end of the JSON value that starts at ``at``; None when none does."""
    if at >= len(raw):
        return None
    first = raw[at]
    if first == _QUOTE:
        return _string_end(raw, at)
    if first in _OPENERS:
        return _nested_end(raw, at, skip)
    end = at
    while end < len(raw) and raw[end] in _SCALAR:
        end += 1
    return end if end > at else None


def _string_end(raw: events.Body, at: int) -> int | None:
    """The end of the string whose opening quote is at ``at``: past the first quote
    after it that an even number of backslashes precedes."""
    quote = at
    while True:
        quote = find(raw, b'"', quote + 1)
        if quote == -1:
            return None
        escapes = 0
        while raw[quote - 1 - escapes] == _BACKSLASH:
            escapes += 1
        if escapes % 2 == 0:
            return quote + 1


def _nested_end(raw: events.Body, at: int, skip: Span | None) -> int | None:
    """The end of the object or array that opens at ``at``: past the brace or bracket
    that brings the depth back to zero, strings skipped whole, and the lifted array
    ``skip`` too when the scan meets its ``[`` (it holds no quote, brace or bracket
    but its own two: the scan would find its ``]`` next)."""
    depth = 0
    while True:
        at = stringzilla.find_first_of(raw, _STRUCTURAL, at)
        if at == -1:
            return None
        if skip is not None and at == skip[0]:
            at = skip[1]
            if depth == 0:  # the array is the value
                return at
            continue
        byte = raw[at]
        if byte == _QUOTE:
            end = _string_end(raw, at)
            if end is None:
                return None
            at = end
            continue
        depth += 1 if byte in _OPENERS else -1
        at += 1
        if depth == 0:
            return at
