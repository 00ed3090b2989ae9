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
literal too large for 64 bits becomes a float in orjson. So orjson is used only when
the body has no run of 19 or more digits (every integer literal then fits in 64 bits);
anything orjson refuses (NaN, Infinity, huge exponents, BOMs, UTF-16/32, lone
surrogates, invalid UTF-8, deep nesting) goes to ``json.loads``, which decides. A
document orjson read holds no NaN, no infinity, no oversized integer and no lone
surrogate, so orjson also writes it back exactly, except that orjson writes at most 254
levels of nesting though it reads 1024; any other document, and any document orjson
refuses to write, is written by ``json.dumps``, which writes every value ``json.loads``
can read back as the same value. tests/test_parity_property.py checks the property on
generated bodies.

Every document ``parse`` returns is written back or refused: a document too deep even
for ``json.dumps`` (Python's recursion limit, about 1000 levels) is a 400
(``body_too_deep``), never an unhandled exception.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from ext_proc.errors import BadRequest, UnsupportedMediaType

Document = dict[str, Any]
# An integer literal of 19+ digits may not fit in 64 bits: orjson would read a float.
# Found as 19 zeros after mapping every digit to "0" and everything else to " " (ten
# times faster than a regular expression, which retries at every digit).
_DIGITS_AS_ZEROS: Final = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_LONG_RUN: Final = b"0" * 19


@dataclass(frozen=True, slots=True)
class Parsed:
    document: Document
    # True when orjson read the body (see the module docstring): orjson can then also
    # write the document back exactly.
    orjson_safe: bool


def media_type(value: bytes) -> str:
    return value.split(b";", 1)[0].strip().decode("latin-1").lower()


def check_headers(content_types: list[bytes], content_encodings: list[bytes]) -> None:
    """Refuse bodies the service cannot read the way vLLM reads them.

    Only ``application/json`` is inspected, because vLLM's JSON routes refuse every
    other media type; anything else on a protected route is refused here too, so no
    body slips by under another label. A compressed body cannot be inspected.
    """
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


_REFUSED: Final = object()


def _orjson_loads(raw: bytes) -> Any:
    """orjson's reading of ``raw``, or ``_REFUSED`` where json.loads must decide."""
    if raw.translate(_DIGITS_AS_ZEROS).find(_LONG_RUN) != -1:
        return _REFUSED
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _REFUSED


def parse(raw: bytes) -> Parsed:
    document = _orjson_loads(raw)
    orjson_safe = document is not _REFUSED
    if not orjson_safe:
        try:
            document = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise BadRequest(
                f"request body is not valid JSON: {exc}", reason="body_not_json"
            ) from exc
    if not isinstance(document, dict):
        raise BadRequest("request body must be a JSON object", reason="body_not_object")
    return Parsed(document, orjson_safe)


def without(parsed: Parsed, container: str, keys: Iterable[str] | None) -> bytes:
    """Serialise the document with ``keys`` removed from the object under ``container``
    (``None``: the whole ``container`` removed).

    Every other key keeps its value and position; the document is not modified.
    """
    document = parsed.document
    if keys is None:
        return write(parsed, {k: v for k, v in document.items() if k != container})
    drop = frozenset(keys)
    inner = {k: v for k, v in document[container].items() if k not in drop}
    return write(parsed, {**document, container: inner})


def write(parsed: Parsed, document: Document) -> bytes:
    """Serialise ``document``, derived from ``parsed`` by adding or removing values
    orjson writes exactly, with the twin of the parser that read ``parsed``; raises
    ``BadRequest`` (``body_too_deep``) when no writer can nest that deep."""
    if parsed.orjson_safe:
        try:
            return orjson.dumps(document)
        except orjson.JSONEncodeError:
            # Only nesting beyond orjson's write limit: every value in a document orjson
            # read is one it can write. json.dumps writes it as json.loads reads it.
            pass
    return serialize(document)


def serialize(document: Document) -> bytes:
    """``json.dumps``: writes NaN, Infinity and integers of any size as ``json.loads``
    reads them; raises ``BadRequest`` (``body_too_deep``) past the recursion limit."""
    try:
        try:
            return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
        except UnicodeEncodeError:
            # A lone surrogate (legal in JSON escapes) cannot be UTF-8: escape everything.
            return json.dumps(document, separators=(",", ":")).encode()
    except RecursionError as exc:
        raise BadRequest(
            "request body is nested too deeply to be forwarded", reason="body_too_deep"
        ) from exc
