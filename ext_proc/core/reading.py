"""Request body bytes to the document vLLM reads.

vLLM parses the raw body bytes with ``json.loads`` (encoding detection, duplicate keys:
last wins, NaN/Infinity accepted) and then validates with pydantic. The document the
policy judges must be the one ``json.loads`` returns for the same bytes; a rewrite
(``writing``) writes that document back.

Fast path (orjson, several times faster on large bodies). Why it is sound: orjson
accepts strict RFC 8259 JSON in UTF-8 only, a subset of what ``json.loads`` accepts, and
on that subset both build the same document (same strings, same duplicate-key rule:
last wins, correctly rounded floats, exact integers) with one exception: an integer
literal too large for 64 bits becomes a float in orjson. So orjson's reading is kept
only when the body has no run of 19 or more digits (every integer literal then fits in
64 bits) or the document it read holds no float at all (no literal overflowed: a run
inside a string, say a 19-digit id in a prompt, is harmless); anything orjson refuses
(NaN, Infinity, huge exponents, BOMs, UTF-16/32, lone surrogates, invalid UTF-8, deep
nesting) goes to ``json.loads``, which decides. tests/core/test_parity_property.py
checks the property on generated bodies.

Bounded work: the caller limits a body's size and its number of values (``Shape``,
counted before parsing) and parsing runs on the event loop, so those limits bound the
CPU one body can take. ``json.loads`` costs several times orjson's per value, so this
module never runs it on its own: ``parse`` returns None where only ``json.loads`` can
read a body, and the caller decides whether it may (``memory.slow_allowed``), charges
what it costs, and calls ``parse_slow`` (``admission``).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

import orjson

from ext_proc.core import ids, native
from ext_proc.core.bytescan import count, find, has_run, translate
from ext_proc.core.errors import BadRequest
from ext_proc.core.events import Body
from ext_proc.core.reasons import Reason
from ext_proc.core.vllm_request import IDS_KEY, KV_KEY

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
# The compiled scan (ext_proc/core/_shape.c: one pass, the same answers as
# ``_scanned``), None where the reference runs (``native``; the tests swap it).
_NATIVE: ModuleType | None = native.module("core._shape")


def scan(raw: Body, max_values: int | None = None) -> Shape:
    """The body's shape. With ``max_values``, scanning stops at the first block past it
    (``values`` then exceeds ``max_values`` but counts only that far): a body refused
    for its number of values costs at most a block more than the limit allows."""
    if _NATIVE is not None:
        # A limit below 0 stops as 0 does (after the first block), one above the most
        # values the bytes can hold never stops: the same answers, as a C integer.
        most = -1 if max_values is None else max(0, min(max_values, len(raw) + 1))
        values, long_digits = _NATIVE.shape(raw, most)
        return Shape(values, long_digits)
    return _scanned(raw, max_values)


def _scanned(raw: Body, max_values: int | None = None) -> Shape:
    """``scan``'s reference: the bytes mapped to classes a block at a time (``_CLASSES``),
    their separators counted and their runs of digits looked for."""
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
    # True when orjson read the body (module docstring): orjson can then also write the
    # document back exactly (``writing``).
    orjson_safe: bool
    # The size of the body it was read from and its number of values (``Shape``): what
    # writing it back with json.dumps costs.
    size: int = 0
    values: int = 0
    # Where the array of ids read by ``ids.Ids.read`` lies in the body (``_lifted``),
    # from its ``[`` to past its ``]``: a whole array of integers (no quote, brace,
    # bracket or backslash inside), the value of kv_transfer_params.prompt_token_ids.
    lifted: tuple[int, int] | None = None


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


def _orjson_loads(raw: Body, shape: Shape) -> Any:
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


def _lifted(raw: Body, shape: Shape, ids_bound: int | None = None) -> Parsed | None:
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
    case the whole body is parsed as usual. ``S`` is a view of ``raw`` (copied only when
    its text is asked for) and ``M`` a copy of parts of it, held within the charge for
    its rewrite (``memory``). ``ids_bound``: the
    bound the ids will be checked against (``ids.Ids.read``: checked in the same pass)."""
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
    # No run of digits in ``raw`` is longer than ids.MAX_DIGITS (``shape``). The ids and
    # the parts around them are read from views of ``raw``: no copy of the ids is made,
    # one of the text around them (joined).
    view = memoryview(raw)
    lifted = ids.Ids.read(view[start : end + 1], runs_checked=True, bound=ids_bound)
    if lifted is None:
        return None
    nonce = secrets.token_hex(16)
    document = _orjson_loads(
        b"".join((view[:start], b'"', nonce.encode(), b'"', view[end + 1 :])), shape
    )
    params = document.get(KV_KEY) if isinstance(document, dict) else None
    if not isinstance(params, dict) or params.get(IDS_KEY) != nonce:
        return None
    params[IDS_KEY] = lifted
    return Parsed(document, True, len(raw), shape.values, (start, end + 1))


def parse(
    raw: Body,
    shape: Shape | None = None,
    *,
    lift_ids: bool = False,
    ids_bound: int | None = None,
) -> Parsed | None:
    """The document ``json.loads`` reads from ``raw`` (``shape``: ``scan(raw)``), when
    orjson reads it exactly; None when only ``parse_slow`` can (module docstring).
    ``lift_ids``: a long array of ``kv_transfer_params.prompt_token_ids`` may be held
    as ``ids.Ids`` (``_lifted``), its ids checked against ``ids_bound`` (the route's, when
    the caller knows it) in the pass that reads them. Raises ``BadRequest`` for a
    document that is not an object."""
    shape = shape if shape is not None else scan(raw)
    if lift_ids and len(raw) >= LIFT_MIN_BYTES:  # below it, no array that long fits
        lifted = _lifted(raw, shape, ids_bound)
        if lifted is not None:
            return lifted
    document = _orjson_loads(raw, shape)
    if document is _REFUSED:
        return None
    return _object(document, True, len(raw), shape)


def parse_slow(raw: Body, shape: Shape | None = None) -> Parsed:
    """The document ``json.loads`` reads from ``raw``; raises ``BadRequest`` when it
    reads none, or not an object."""
    try:
        # json.loads reads str, bytes or bytearray: a view is copied here, on this
        # rare path, into the body's copy memory.COPIES counts (events.Body).
        document = json.loads(raw if isinstance(raw, bytes) else bytes(raw))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BadRequest(
            f"request body is not valid JSON: {exc}", reason=Reason.BODY_NOT_JSON
        ) from exc
    return _object(document, False, len(raw), shape if shape is not None else scan(raw))


def _object(document: Any, orjson_safe: bool, size: int, shape: Shape) -> Parsed:
    if not isinstance(document, dict):
        raise BadRequest("request body must be a JSON object", reason=Reason.BODY_NOT_OBJECT)
    return Parsed(document, orjson_safe, size, shape.values)
