"""Request body bytes to the document vLLM reads, and a document back to bytes.

vLLM parses the raw body bytes with ``json.loads`` (encoding detection, duplicate keys:
last wins, NaN/Infinity accepted) and then validates with pydantic. The document the
policy judges must be the one ``json.loads`` returns for the same bytes. A rewritten
body is this module's own serialisation of that document, so after a rewrite the two
cannot diverge either.

Fast path (orjson, several times faster on large bodies). Why it is sound: orjson
accepts strict RFC 8259 JSON in UTF-8 only, a subset of what ``json.loads`` accepts, and
on that subset both build the same document (same strings, same duplicate-key rule:
last wins, correctly rounded floats, exact integers) with one exception: an integer
literal too large for 64 bits becomes a float in orjson. So orjson's reading is kept
only when the body has no run of 19 or more digits (every integer literal then fits in
64 bits) or the document it read holds no float at all (no literal overflowed: a run
inside a string, say a 19-digit id in a prompt, is harmless); anything orjson refuses
(NaN, Infinity, huge exponents, BOMs, UTF-16/32, lone surrogates, invalid UTF-8, deep
nesting) goes to ``json.loads``, which decides. A
document orjson read holds no NaN, no infinity, no oversized integer and no lone
surrogate, so orjson also writes it back exactly, except that orjson writes at most 254
levels of nesting though it reads 1024; any other document, and any document orjson
refuses to write, is written by ``json.dumps``, which writes every value ``json.loads``
can read back as the same value. tests/core/test_parity_property.py checks the property on
generated bodies.

Every document ``parse`` returns is written back or refused: a document too deep even
for ``json.dumps`` (Python's recursion limit, about 1000 levels) is a 400
(``body_too_deep``), never an unhandled exception.

Bounded work: the caller limits a body's size and its number of values (``Shape``,
counted before parsing) and parsing runs on the event loop, so those limits bound the
CPU one body can take. ``json.loads`` and ``json.dumps`` cost several times orjson's
per value, so this module never runs them on its own: ``parse`` and ``write`` return
None where only they can read or write a body, and the caller decides whether it may
(``memory.slow_allowed``), charges what they cost, and calls ``parse_slow`` or
``serialize`` (``admission``).
"""

from __future__ import annotations

import codecs
import functools
import json
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from ext_proc.core import ids
from ext_proc.core.bytescan import count, find, has_run, occurrences, translate
from ext_proc.core.errors import BadRequest, UnsupportedMediaType
from ext_proc.core.vllm_request import IDS_KEY, KV_KEY, Path

Document = dict[str, Any]
# One pass over the body maps every digit to "0", every byte that can start a JSON
# value or separate two (``,`` ``:`` ``[`` ``{``) to ",", everything else to " ": an
# integer literal of 19+ digits (which may not fit in 64 bits: orjson would read a float)
# is then a run of 19 zeros, and the commas bound the number of values (ten times faster
# than a regular expression, which retries at every digit).
_DIGIT, _VALUE = 0x30, 0x2C
_CLASSES: Final = bytes(
    _DIGIT if 0x30 <= i <= 0x39 else _VALUE if i in b",:[{" else 0x20 for i in range(256)
)
# Every integer of up to ids.MAX_DIGITS digits fits in 64 bits; one digit more may not.
_LONG_DIGITS: Final = ids.MAX_DIGITS + 1


@dataclass(frozen=True, slots=True)
class Shape:
    """What the raw bytes say before parsing: an upper bound on the number of JSON
    values (one more than the separators and openers, strings included) and whether an
    integer literal may exceed 64 bits."""

    values: int
    long_digits: bool


_BLOCK: Final = 1 << 20
_OVERLAP: Final = _LONG_DIGITS - 1


def scan(raw: bytes, max_values: int | None = None) -> Shape:
    """The body's shape. With ``max_values``, scanning stops at the first block past it
    (``values`` then exceeds ``max_values`` but counts only that far): a body refused
    for its number of values costs at most a block more than the limit allows."""
    values, long_digits = 1, False
    view = memoryview(raw)  # blocks are mapped from views: no copy of the body
    for start in range(0, len(raw), _BLOCK):
        # Each block also maps the bytes just before it, so that a run of digits across
        # a boundary is found; separators are counted in the block's own bytes only.
        lead = min(start, _OVERLAP)
        classes = translate(view[start - lead : start + _BLOCK], _CLASSES)
        values += count(classes, _VALUE, lead)
        long_digits = long_digits or has_run(classes, _DIGIT, _LONG_DIGITS)
        if max_values is not None and values > max_values:
            break
    return Shape(values, long_digits)


@dataclass(frozen=True, slots=True)
class Parsed:
    document: Document
    # True when orjson read the body (see the module docstring): orjson can then also
    # write the document back exactly.
    orjson_safe: bool
    # The size of the body it was read from and its number of values (``Shape``): what
    # writing it back with json.dumps costs.
    size: int = 0
    values: int = 0


def media_type(value: bytes) -> str:
    return value.split(b";", 1)[0].strip().decode("latin-1").lower()


def check_headers(content_types: list[bytes], content_encodings: list[bytes]) -> None:
    """Refuse bodies the service cannot read the way vLLM reads them.

    Only ``application/json`` is inspected, because vLLM's JSON routes refuse every
    other media type; anything else on a protected route is refused here too, so no
    body slips by under another label. A compressed body cannot be inspected. Short
    headers that pass are remembered (a few spellings carry almost every request);
    refusals and long values (the client's, up to Envoy's header limit) are not.
    """
    headers = (tuple(content_types), tuple(content_encodings))
    if sum(map(len, content_types)) + sum(map(len, content_encodings)) <= _HEADERS_REMEMBERED:
        _check_remembered(*headers)
    else:
        _check(*headers)


# The longest content headers remembered: 256 of them stay within 64 KiB.
_HEADERS_REMEMBERED: Final = 256


def _check(content_types: tuple[bytes, ...], content_encodings: tuple[bytes, ...]) -> None:
    if len(content_types) != 1 or media_type(content_types[0]) != "application/json":
        shown = b", ".join(content_types).decode("latin-1") or "none"
        raise UnsupportedMediaType(
            f"unsupported content-type ({shown}); this route accepts application/json",
            reason="unsupported_media_type",
        )
    encodings = [v.strip().lower() for v in b",".join(content_encodings).split(b",")]
    if any(e not in (b"", b"identity") for e in encodings):
        raise UnsupportedMediaType(
            "compressed request bodies (content-encoding) are not accepted on this route",
            reason="content_encoding",
        )


_check_remembered = functools.lru_cache(maxsize=256)(_check)


# JSON's whitespace, and how far from each end of a body its braces are looked for.
_WHITESPACE: Final = b" \t\n\r"
_EDGE: Final = 64
# How an escape of an ASCII character starts, and how many of them are checked one by
# one (text escaped to ASCII holds one per accented letter: then one search each).
_ESCAPE: Final = b"\\u00"
_ESCAPES_CHECKED: Final = 16


@functools.cache
def _spellings(key: str) -> tuple[bytes, tuple[bytes, ...]]:
    """``key`` as written, and the starts of the ``\\u`` escapes of its characters
    (``\\u00`` and the first hex digit of the character's code): every JSON spelling
    of ``key`` in UTF-8 contains the first or one of the others."""
    if not all(0x20 < ord(c) < 0x7F and c not in '"\\/' for c in key):
        raise ValueError(f"{key!r}: only printable ASCII without quote, slash or backslash")
    escapes = sorted({_ESCAPE + f"{ord(c):02x}"[:1].encode() for c in key})
    return key.encode(), tuple(escapes)


def _holds_any(raw: bytes, escapes: tuple[bytes, ...]) -> bool:
    """Whether ``raw`` holds one of ``escapes``, each ``_ESCAPE`` and one more byte. One
    search finds every ``_ESCAPE`` when there are few (usually none); past
    ``_ESCAPES_CHECKED`` of them, one search per escape from there."""
    at = find(raw, _ESCAPE)
    for _ in range(_ESCAPES_CHECKED):
        if at == -1:
            return False
        if raw.startswith(escapes, at):
            return True
        at = find(raw, _ESCAPE, at + 1)
    return at != -1 and any(find(raw, escape, at) != -1 for escape in escapes)


def lacks_key(raw: bytes, key: str) -> bool:
    """True only when no object anywhere in the document ``json.loads`` reads from
    ``raw`` can have the member ``key``, and ``raw`` looks like one object (a brace
    first and last). False says nothing: the caller parses.

    Why it is sound. ``json.loads`` decodes the bytes in the encoding
    ``json.detect_encoding`` names, and an object it reads ends with ``}`` (then
    whitespace). In UTF-16/32 every ASCII character has a zero byte, so such a body
    begins with a zero or a byte-order mark (big-endian, or any mark) or ends with a
    zero (little-endian): it never has a brace at both ends, and is parsed instead.
    What remains is UTF-8, with or without a byte-order mark. A body that is not valid
    UTF-8 is refused by ``json.loads`` (vLLM answers 400); in valid UTF-8 a byte below
    0x80 stands only for its own ASCII character (overlong forms are invalid), so a
    character of the key written as itself is its own byte in ``raw``. A JSON string
    spells a character either as itself or as an escape; the two-character escapes
    stand for ``"`` ``\\`` ``/`` and control characters, none of which the key holds
    (``_spellings`` refuses such keys), so any other spelling uses ``\\u00XY`` (a
    surrogate pair stands for a character beyond ASCII), whose bytes ``\\u00X`` are in
    ``raw``. Hence a member named ``key``, at any depth and however many times
    (duplicate keys), puts one of ``_spellings(key)`` in ``raw``; absent all of them,
    the document holds no such member whatever else it holds. Whether ``raw`` is valid
    JSON is not decided here: vLLM refuses a body it cannot read (400).
    tests/core/test_parity_property.py checks the property on generated bodies: removing
    any clause (the braces, the key as written, any escape) makes it fail."""
    counted = spelled(raw, (key,))
    return counted is not None and counted[key] == 0


# How far ``spelled`` counts: none, one, or more.
SPELLED_MOST: Final = 2


def spelled(raw: bytes, keys: Iterable[str]) -> dict[str, int] | None:
    """For each of ``keys``, how many times ``raw`` writes it as itself between two
    quotes, up to ``SPELLED_MOST``: no fewer than the members so named in the document
    ``json.loads`` reads from ``raw``, at any depth, duplicates counted. None when that
    cannot be told from the bytes (``raw`` is not braced, or holds an escape that may
    spell a character of a key).

    Why it is sound: as in ``lacks_key``, every member named ``key`` in a braced UTF-8
    body spells it as written or with an escape; a member written as itself is the
    string token ``"key"``, its quotes unescaped, and distinct tokens share no byte, so
    without any escape of the key's characters their number is at most the number of
    occurrences of ``"key"`` in ``raw``. Quoted, a key that is part of another name
    (``tokens`` in ``max_tokens``) or of prose is not counted."""
    if not _braced(raw):
        return None
    counts: dict[str, int] = {}
    escapes: set[bytes] = set()
    for key in keys:
        written, spellings = _spellings(key)
        escapes.update(spellings)
        counts[key] = occurrences(raw, b'"' + written + b'"', SPELLED_MOST)
    return None if _holds_any(raw, tuple(sorted(escapes))) else counts


def _braced(raw: bytes) -> bool:
    """Whether ``raw``, after an optional UTF-8 byte-order mark and whitespace, starts
    with a brace and ends with one (``lacks_key`` says why that rules out UTF-16/32)."""
    start = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    head = raw[start : start + _EDGE].lstrip(_WHITESPACE)
    tail = raw[-_EDGE:].rstrip(_WHITESPACE)
    return head.startswith(b"{") and tail.endswith(b"}")


_REFUSED: Final = object()


def holds(document: Any, test: Callable[[Any], bool]) -> bool:
    """Whether any value in ``document`` (members and items, at any depth, walked
    without recursion) passes ``test``."""
    pending = [document]
    while pending:
        value = pending.pop()
        if test(value):
            return True
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return False


def _is_float(value: Any) -> bool:
    return isinstance(value, float)


def _orjson_loads(raw: bytes, shape: Shape) -> Any:
    """orjson's reading of ``raw``, or ``_REFUSED`` where json.loads must decide."""
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _REFUSED
    if shape.long_digits and holds(document, _is_float):
        return _REFUSED  # a float may be an integer literal orjson could not hold
    return document


# Where the ids of a request are lifted out of its bytes (``_lifted``), and from what
# length of their array on: below it a list is parsed as fast.
_IDS_MEMBER: Final = b'"' + IDS_KEY.encode() + b'"'
_AFTER_MEMBER: Final = re.compile(rb"[ \t\n\r]*:[ \t\n\r]*\[")
LIFT_MIN_BYTES = 16 * 1024


def _lifted(raw: bytes, shape: Shape) -> Parsed | None:
    """The document ``json.loads`` reads from ``raw``, with the array of
    ``kv_transfer_params.prompt_token_ids`` read by ``ids.Ids.read`` and held as
    ``ids.Ids`` instead of a list; None when that is not shown (the caller parses
    the whole body).

    Why it is sound. ``raw`` holds no run of 19 digits (``shape``; otherwise None).
    The first ``"prompt_token_ids"`` in ``raw``, when ``:`` and ``[`` follow it, gives
    a span ``S`` from that ``[`` to the first ``]`` after it, which ``ids.Ids.read`` accepts
    only when it is one whole JSON array of integers, each of at most 18 digits
    (ids.py). ``S`` is
    replaced by ``"N"``, where ``N`` is 128 random bits in hex, drawn for this body;
    orjson reads the result ``M``, whose runs of digits are those of ``raw`` outside
    ``S`` (brackets bound ``S``). Suppose ``M``'s document has ``N`` as the value of
    ``kv_transfer_params.prompt_token_ids``. Only a string token spells ``N``, and
    the only one in ``M`` is the one put there, unless the client wrote ``N`` itself,
    which it can only guess (2**-128). So a parser reading ``M`` expects a value at the
    start of ``S``, reads ``"N"`` there as the value of the member that survives
    (duplicate keys: the last wins, at both levels) and goes on as after any other
    value. Reading ``raw``, it reaches the same point in the same state (the bytes
    before it are the same), reads the array ``S`` as that value and goes on the same
    way through the same bytes. The document of ``raw`` is therefore the document of
    ``M`` with ``S``'s list in place of ``N``, and json.loads reads it too: orjson read
    ``M`` and no integer of ``raw`` exceeds 64 bits (module docstring). In any other
    case the whole body is parsed as usual. ``S`` and ``M`` are copies of parts of
    ``raw``, held within the charge for its rewrite (``memory``)."""
    if shape.long_digits or len(raw) < LIFT_MIN_BYTES:  # no array that long fits
        return None
    at = find(raw, _IDS_MEMBER)
    member = _AFTER_MEMBER.match(raw, at + len(_IDS_MEMBER)) if at != -1 else None
    if member is None:
        return None
    start = member.end() - 1
    end = find(raw, b"]", start)
    if end - start < LIFT_MIN_BYTES:  # no "]" (end is -1) or a short array
        return None
    # No run of digits in ``raw`` is longer than ids.MAX_DIGITS (``shape``).
    lifted = ids.Ids.read(raw[start : end + 1], runs_checked=True)
    if lifted is None:
        return None
    nonce = secrets.token_hex(16)
    document = _orjson_loads(
        b"".join((raw[:start], b'"', nonce.encode(), b'"', raw[end + 1 :])), shape
    )
    params = document.get(KV_KEY) if isinstance(document, dict) else None
    if not isinstance(params, dict) or params.get(IDS_KEY) != nonce:
        return None
    params[IDS_KEY] = lifted
    return Parsed(document, True, len(raw), shape.values)


def parse(raw: bytes, shape: Shape | None = None, *, lift_ids: bool = False) -> Parsed | None:
    """The document ``json.loads`` reads from ``raw`` (``shape``: ``scan(raw)``), when
    orjson reads it exactly; None when only ``parse_slow`` can (module docstring).
    ``lift_ids``: a long array of ``kv_transfer_params.prompt_token_ids`` may be held
    as ``ids.Ids`` (``_lifted``). Raises ``BadRequest`` for a document that is not an
    object."""
    shape = shape if shape is not None else scan(raw)
    if lift_ids:
        lifted = _lifted(raw, shape)
        if lifted is not None:
            return lifted
    document = _orjson_loads(raw, shape)
    if document is _REFUSED:
        return None
    return _object(document, True, len(raw), shape)


def parse_slow(raw: bytes, shape: Shape | None = None) -> Parsed:
    """The document ``json.loads`` reads from ``raw``; raises ``BadRequest`` when it
    reads none, or not an object."""
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BadRequest(f"request body is not valid JSON: {exc}", reason="body_not_json") from exc
    return _object(document, False, len(raw), shape if shape is not None else scan(raw))


def _object(document: Any, orjson_safe: bool, size: int, shape: Shape) -> Parsed:
    if not isinstance(document, dict):
        raise BadRequest("request body must be a JSON object", reason="body_not_object")
    return Parsed(document, orjson_safe, size, shape.values)


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
            "request body is nested too deeply to be forwarded", reason="body_too_deep"
        ) from exc
