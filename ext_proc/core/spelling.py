"""How often a body's bytes spell a member name, told before any parse: never fewer
than the members so named in the document ``json.loads`` reads from them.

Why it is sound. ``json.loads`` decodes the bytes in the encoding
``json.detect_encoding`` names, and an object it reads ends with ``}`` (then
whitespace). In UTF-16/32 every ASCII character has a zero byte, so such a body begins
with a zero or a byte-order mark (big-endian, or any mark) or ends with a zero
(little-endian): it never has a brace at both ends (``_braced``), and nothing is told
from its bytes. What remains is UTF-8, with or without a byte-order mark. A body that
is not valid UTF-8 is refused by ``json.loads`` (vLLM answers 400); in valid UTF-8 a
byte below 0x80 stands only for its own ASCII character (overlong forms are invalid),
so a character of a key written as itself is its own byte in the body. A JSON string
spells a character either as itself or as an escape; the two-character escapes stand
for ``"`` ``\\`` ``/`` and control characters, none of which a key holds
(``_spellings`` refuses such keys), so any other spelling uses ``\\u00XY`` (a surrogate
pair stands for a character beyond ASCII), whose bytes ``\\u00X`` are in the body.
Hence a member named ``key``, at any depth and however many times (duplicate keys),
puts ``key`` as written or one of its escapes in the body. Whether the body is valid
JSON is not decided here: vLLM refuses a body it cannot read (400).
tests/core/test_parity_property.py checks the property on generated bodies: removing
any clause (the braces, the key as written, any escape) makes it fail.
"""

from __future__ import annotations

import codecs
import functools
from collections import Counter
from collections.abc import Iterable
from typing import Final

from ext_proc.core import bytescan
from ext_proc.core.bytescan import find, quoted
from ext_proc.core.events import Body

# JSON's whitespace, and how far from each end of a body its braces are looked for.
_WHITESPACE: Final = b" \t\n\r"
_EDGE: Final = 64
# How an escape of an ASCII character starts, and how many of them are checked one by
# one (text escaped to ASCII holds one per accented letter: then one search each).
_ESCAPE: Final = b"\\u00"
_ESCAPES_CHECKED: Final = 16
# How far ``spelled`` counts: none, one, or more.
SPELLED_MOST: Final = 2


def spelled(raw: Body, keys: Iterable[str]) -> Counter[str] | None:
    """For each of ``keys``, how many times ``raw`` writes it as itself between two
    quotes, up to ``SPELLED_MOST``: no fewer than the members so named in the document
    ``json.loads`` reads from ``raw``, at any depth, duplicates counted (a key never
    written so counts 0 and is absent from the Counter). None when that cannot be told
    from the bytes (``raw`` is not braced, or holds an escape that may spell a character
    of a key).

    Why it is sound: every member named ``key`` in a braced UTF-8 body spells it as
    written or with an escape (module docstring); a member written as itself is the
    string token ``"key"``, its quotes unescaped, and distinct tokens share no byte, so
    without any escape of the key's characters their number is at most the number of
    quotes in ``raw`` that begin ``"key"`` (``bytescan.quoted``). Quoted, a key that is
    part of another name (``tokens`` in ``max_tokens``) or of prose is not counted.

    The compiled scan (``bytescan.COMPILED``) looks at the braces, searches the
    escapes and counts the names in one call; the reference here does each in turn
    (``bytescan.quoted`` counts): the same answers (tests/core/test_scan_native.py)."""
    asked = tuple(keys)
    if bytescan.COMPILED is not None:
        found = _compiled(asked).spelled(raw, SPELLED_MOST)
        if found is None:
            return None
    else:
        if not _braced(raw):
            return None
        names, escapes = _all_spellings(asked)
        if _holds_any(raw, escapes):
            return None
        found = quoted(raw, names, SPELLED_MOST)
    counted: Counter[str] = Counter()
    for name, count in found.items():
        counted[name.decode()] = count
    return counted


@functools.cache
def _all_spellings(keys: tuple[str, ...]) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """``keys`` as written, and the starts of every escape of their characters."""
    escapes: set[bytes] = set()
    for key in keys:
        escapes.update(_spellings(key)[1])
    return tuple(_spellings(key)[0] for key in keys), tuple(sorted(escapes))


@functools.cache
def _compiled(keys: tuple[str, ...]) -> bytescan.Matcher:
    """The compiled scan of ``keys`` as written and of the bytes that after
    ``_ESCAPE`` start an escape of one of their characters (the last byte of each of
    ``_all_spellings``'s escapes)."""
    names, escapes = _all_spellings(keys)
    if not all(len(e) == len(_ESCAPE) + 1 and e.startswith(_ESCAPE) for e in escapes):
        raise ValueError(f"{escapes!r}: each {_ESCAPE!r} and one more byte")
    return bytescan.matcher(names, bytes(e[-1] for e in escapes))


@functools.cache
def _spellings(key: str) -> tuple[bytes, tuple[bytes, ...]]:
    """``key`` as written, and the starts of the ``\\u`` escapes of its characters
    (``\\u00`` and the first hex digit of the character's code): every JSON spelling
    of ``key`` in UTF-8 contains the first or one of the others."""
    if not all(0x20 < ord(c) < 0x7F and c not in '"\\/' for c in key):
        raise ValueError(f"{key!r}: only printable ASCII without quote, slash or backslash")
    escapes = sorted({_ESCAPE + f"{ord(c):02x}"[:1].encode() for c in key})
    return key.encode(), tuple(escapes)


def _holds_any(raw: Body, escapes: tuple[bytes, ...]) -> bool:
    """Whether ``raw`` holds one of ``escapes``, each ``_ESCAPE`` and one more byte. One
    search finds every ``_ESCAPE`` when there are few (usually none); past
    ``_ESCAPES_CHECKED`` of them, one search per escape from there."""
    at = find(raw, _ESCAPE)
    for _ in range(_ESCAPES_CHECKED):
        if at == -1:
            return False
        if raw[at : at + len(_ESCAPE) + 1] in escapes:  # each _ESCAPE and one byte
            return True
        at = find(raw, _ESCAPE, at + 1)
    return at != -1 and any(find(raw, escape, at) != -1 for escape in escapes)


def _braced(raw: Body) -> bool:
    """Whether ``raw``, after an optional UTF-8 byte-order mark and whitespace, starts
    with a brace and ends with one (the module docstring says why that rules out
    UTF-16/32)."""
    bom = len(codecs.BOM_UTF8)
    start = bom if raw[:bom] == codecs.BOM_UTF8 else 0
    head = bytes(raw[start : start + _EDGE]).lstrip(_WHITESPACE)
    tail = bytes(raw[-_EDGE:]).rstrip(_WHITESPACE)
    return head.startswith(b"{") and tail.endswith(b"}")
