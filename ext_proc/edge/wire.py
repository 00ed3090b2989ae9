"""The few fields of a ``ProcessingRequest`` the codec reads, read straight from the
message's bytes (protobuf's wire format), without building the protobuf message.

This is the reference reader; ``_wire.c`` is its compiled twin where built
(``ext_proc.core.native``). Both read only what they can read exactly as upb
(``pb.ProcessingRequest.FromString``) reads it, and raise ``Unreadable`` on anything
else: a repeated singular message (which upb merges), a field of a known number with
another wire type (which upb keeps as an unknown field), a group, a second attributes
group, a ``metadata_context`` that is not empty, a nesting deeper than ``DEPTH``. An
empty ``metadata_context`` (Envoy sends one on every message when the filter receives
no dynamic metadata) is skipped: upb reads it as an empty ``Metadata``, of which the
codec reads nothing. The codec then parses the
same bytes with upb, so what a message means never depends on which reader read it,
and bytes upb refuses are refused (tests/edge/test_wire.py fuzzes the readers against
upb). What the reader accepts, it checks as upb does: every varint and length within
the message, every string field (read or not) valid UTF-8, unknown fields of the
other wire types skipped whole.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ext_proc.core.route_policy import Scalar

# Wire types.
_VARINT: Final = 0
_I64: Final = 1
_LEN: Final = 2
_I32: Final = 5
_MASK64: Final = (1 << 64) - 1
# Nesting of Struct and ListValue values read before giving the message to upb (whose
# own limit is higher): an attribute's value is a scalar, nesting only says it is not.
DEPTH: Final = 16
# The oneof ``request``'s members, by field number.
KINDS: Final = {
    2: "request_headers",
    3: "response_headers",
    4: "request_body",
    5: "response_body",
    6: "request_trailers",
    7: "response_trailers",
}
_DOUBLE: Final = struct.Struct("<d")


class Unreadable(Exception):
    """The bytes hold something this reader does not read exactly as upb does."""


# An attribute's value: its ``Value.kind`` (None when unset) and the scalar of a
# string, number or bool (None otherwise).
Value = tuple[str | None, Scalar | None]


@dataclass(slots=True)
class Request:
    """What the codec reads of one message (each as the protobuf message holds it).
    Not frozen: a frozen dataclass sets each field through ``object.__setattr__``,
    which costs the compiled reader more than its reading; nothing changes one."""

    kind: str  # the oneof's member set, "" for none
    # request_body / response_body ``body``: a read-only view of its span of the
    # message's bytes (empty for the other members), not a copy; it keeps the message
    # alive (events.Body says why that is within the body's charge).
    body: memoryview
    end_of_stream: bool  # that member's ``end_of_stream`` (body or headers)
    headers: tuple[tuple[str, bytes], ...]  # request/response headers (key, raw_value)
    observability_mode: bool
    # protocol_config's (request_body_mode, response_body_mode); None when absent.
    config: tuple[int, int] | None
    group: str | None  # the one attributes group's name; None without attributes
    fields: dict[str, Value]  # that group's fields, by key
    # The group's entries as sent, without those of ``skip`` (see ``read``): equal
    # bytes read as equal fields.
    remainder: bytes


# ``read`` and its compiled twin.
Reader = Callable[[bytes, frozenset[bytes]], Request]


def varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` (at most ten bytes, truncated to 64 bits as upb does) and
    the position after it."""
    result = 0
    shift = 0
    while pos < end:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _MASK64, pos
        shift += 7
        if shift >= 70:
            break
    raise Unreadable("varint")


def tag(data: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """Field number, wire type and the position after the tag (at most five bytes)."""
    start = pos
    value, pos = varint(data, pos, end)
    if pos - start > 5 or value > 0xFFFFFFFF or value >> 3 == 0:
        raise Unreadable("tag")
    return value >> 3, value & 7, pos


def length(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """A length-delimited field's end and the position its content starts at. upb reads
    a length in at most five bytes (a longer one, padded, is refused)."""
    start = pos
    size, pos = varint(data, pos, end)
    if pos - start > 5 or size > end - pos:
        raise Unreadable("length")
    return pos + size, pos


def skip(data: bytes, wire: int, pos: int, end: int) -> int:
    """The position after an unknown field's value of wire type ``wire``."""
    if wire == _VARINT:
        return varint(data, pos, end)[1]
    if wire == _LEN:
        return length(data, pos, end)[0]
    size = 8 if wire == _I64 else 4 if wire == _I32 else 0
    if size == 0 or size > end - pos:
        raise Unreadable("wire type")  # a group, or wire types 6 and 7
    return pos + size


def text(data: bytes, start: int, stop: int) -> str:
    try:
        return data[start:stop].decode()
    except UnicodeDecodeError:
        raise Unreadable("utf-8") from None


def _expect(wire: int, wanted: int) -> None:
    if wire != wanted:
        raise Unreadable("wire type")


def _int32(value: int) -> int:
    """An enum's varint as upb keeps it: its low 32 bits, signed."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _header_value(data: bytes, pos: int, end: int) -> tuple[str, bytes]:
    key, raw = "", b""
    while pos < end:
        number, wire, pos = tag(data, pos, end)
        if number in (1, 2, 3):
            _expect(wire, _LEN)
            stop, pos = length(data, pos, end)
            if number == 1:
                key = text(data, pos, stop)
            elif number == 2:
                text(data, pos, stop)  # value: unused, checked as upb does
            else:
                raw = data[pos:stop]
            pos = stop
        else:
            pos = skip(data, wire, pos, end)
    return key, raw


def _header_map(data: bytes, pos: int, end: int, into: list[tuple[str, bytes]]) -> None:
    while pos < end:
        number, wire, pos = tag(data, pos, end)
        if number == 1:
            _expect(wire, _LEN)
            stop, pos = length(data, pos, end)
            into.append(_header_value(data, pos, stop))
            pos = stop
        else:
            pos = skip(data, wire, pos, end)


def _headers(data: bytes, pos: int, end: int) -> tuple[tuple[tuple[str, bytes], ...], bool]:
    """HttpHeaders (and HttpTrailers, whose field 1 is also a HeaderMap: its field 3
    is unknown to it and skipped whole, as upb does)."""
    found: list[tuple[str, bytes]] = []
    eos = False
    while pos < end:
        number, wire, pos = tag(data, pos, end)
        if number == 1:  # repeated occurrences merge: their headers add up
            _expect(wire, _LEN)
            stop, pos = length(data, pos, end)
            _header_map(data, pos, stop, found)
            pos = stop
        elif number == 2:
            raise Unreadable("deprecated headers attributes")
        elif number == 3:
            _expect(wire, _VARINT)
            value, pos = varint(data, pos, end)
            eos = value != 0
        else:
            pos = skip(data, wire, pos, end)
    return tuple(found), eos


def _trailers(data: bytes, pos: int, end: int) -> None:
    while pos < end:
        number, wire, pos = tag(data, pos, end)
        if number == 1:
            _expect(wire, _LEN)
            stop, pos = length(data, pos, end)
            _header_map(data, pos, stop, [])
            pos = stop
        else:
            pos = skip(data, wire, pos, end)


def _body(data: bytes, pos: int, end: int) -> tuple[int, int, bool]:
    """The span of the body's ``body`` (last wins, as upb reads it) and its
    end_of_stream."""
    start = stop_at = 0
    eos = False
    while pos < end:
        number, wire, pos = tag(data, pos, end)
        if number == 1:
            _expect(wire, _LEN)
            stop, pos = length(data, pos, end)
            start, stop_at = pos, stop
            pos = stop
        elif number in (2, 3, 4):
            _expect(wire, _VARINT)
            value, pos = varint(data, pos, end)
            if number == 2:
                eos = value != 0
        else:
            pos = skip(data, wire, pos, end)
    return start, stop_at, eos


def _config(data: bytes, pos: int, end: int) -> tuple[int, int]:
    modes = [0, 0]
    while pos < end:
        number, wire, pos = tag(data, pos, end)
        if number in (1, 2, 3):
            _expect(wire, _VARINT)
            value, pos = varint(data, pos, end)
            if number != 3:
                modes[number - 1] = _int32(value)
        else:
            pos = skip(data, wire, pos, end)
    return modes[0], modes[1]


def _value(data: bytes, pos: int, end: int, depth: int) -> Value:
    """A ``google.protobuf.Value``: one member of its oneof, or none."""
    found: Value = (None, None)
    seen = False
    while pos < end:
        number, wire, pos = tag(data, pos, end)
        if 1 <= number <= 6:
            if seen:  # a second member replaces or merges: left to upb
                raise Unreadable("value set twice")
            seen = True
        if number in (1, 4):
            _expect(wire, _VARINT)
            value, pos = varint(data, pos, end)
            found = ("null_value", None) if number == 1 else ("bool_value", value != 0)
        elif number == 2:
            _expect(wire, _I64)
            if end - pos < 8:
                raise Unreadable("double")
            found = ("number_value", _DOUBLE.unpack_from(data, pos)[0])
            pos += 8
        elif number in (3, 5, 6):
            _expect(wire, _LEN)
            stop, pos = length(data, pos, end)
            if number == 3:
                found = ("string_value", text(data, pos, stop))
            elif number == 5:
                _struct(data, pos, stop, depth + 1, None)
                found = ("struct_value", None)
            else:
                _list(data, pos, stop, depth + 1)
                found = ("list_value", None)
            pos = stop
        else:
            pos = skip(data, wire, pos, end)
    return found


def _list(data: bytes, pos: int, end: int, depth: int) -> None:
    if depth > DEPTH:
        raise Unreadable("depth")
    while pos < end:
        number, wire, pos = tag(data, pos, end)
        if number == 1:
            _expect(wire, _LEN)
            stop, pos = length(data, pos, end)
            _value(data, pos, stop, depth)
            pos = stop
        else:
            pos = skip(data, wire, pos, end)


def _entry(data: bytes, pos: int, end: int) -> tuple[str, int, int]:
    """A map entry's key and the span of its value (empty when absent)."""
    key: str | None = None
    value: tuple[int, int] | None = None
    while pos < end:
        number, wire, pos = tag(data, pos, end)
        if number in (1, 2):
            _expect(wire, _LEN)
            stop, pos = length(data, pos, end)
            if number == 1:
                if key is not None:
                    raise Unreadable("map key twice")
                key = text(data, pos, stop)
            else:
                if value is not None:  # a message value twice merges: left to upb
                    raise Unreadable("map value twice")
                value = (pos, stop)
            pos = stop
        else:
            pos = skip(data, wire, pos, end)
    start, stop = value if value is not None else (end, end)
    return key or "", start, stop


def _struct(
    data: bytes,
    pos: int,
    end: int,
    depth: int,
    kept: tuple[dict[str, Value], list[bytes], frozenset[bytes]] | None,
) -> None:
    """A ``google.protobuf.Struct``; with ``kept``, its fields go into ``kept[0]`` (a
    key seen again replaces its value, as in any map) and the entries whose key's bytes
    are not in ``kept[2]`` into ``kept[1]``."""
    if depth > DEPTH:
        raise Unreadable("depth")
    while pos < end:
        begin = pos
        number, wire, pos = tag(data, pos, end)
        if number != 1:
            pos = skip(data, wire, pos, end)
            continue
        _expect(wire, _LEN)
        stop, pos = length(data, pos, end)
        key, start, value_end = _entry(data, pos, stop)
        value = _value(data, start, value_end, depth)
        if kept is not None:
            fields, remainder, skipped = kept
            fields[key] = value
            if key.encode() not in skipped:
                remainder.append(data[begin:stop])
        pos = stop


def _attributes(
    data: bytes, pos: int, end: int, skipped: frozenset[bytes]
) -> tuple[str, dict[str, Value], bytes]:
    name, start, stop = _entry(data, pos, end)
    fields: dict[str, Value] = {}
    remainder: list[bytes] = []
    _struct(data, start, stop, 0, (fields, remainder, skipped))  # nothing when absent
    return name, fields, b"".join(remainder)


def read(data: bytes, skipped: frozenset[bytes] = frozenset()) -> Request:  # noqa: PLR0912 - a branch a field
    """The fields the codec reads of the serialized ``ProcessingRequest`` ``data``;
    ``skipped``: the attribute keys (as UTF-8) left out of ``Request.remainder``.

    Raises ``Unreadable``: upb must read these bytes (and may refuse them).
    """
    end = len(data)
    pos = 0
    kind = ""
    body_start = body_stop = 0
    eos = False
    headers: tuple[tuple[str, bytes], ...] = ()
    observability = False
    config: tuple[int, int] | None = None
    group: str | None = None
    fields: dict[str, Value] = {}
    remainder = b""
    while pos < end:
        number, wire, pos = tag(data, pos, end)
        if number == 10:
            _expect(wire, _VARINT)
            value, pos = varint(data, pos, end)
            observability = value != 0
            continue
        if number not in KINDS and number not in (8, 9, 11):
            pos = skip(data, wire, pos, end)
            continue
        _expect(wire, _LEN)
        stop, pos = length(data, pos, end)
        if number in KINDS:
            if kind:  # a second member replaces the first, or merges with it: left to upb
                raise Unreadable("request set twice")
            kind = KINDS[number]
            if number in (2, 3):
                headers, eos = _headers(data, pos, stop)
            elif number in (4, 5):
                body_start, body_stop, eos = _body(data, pos, stop)
            else:
                _trailers(data, pos, stop)
        elif number == 9:
            if group is not None:
                raise Unreadable("attributes of two groups")
            group, fields, remainder = _attributes(data, pos, stop, skipped)
        elif number == 11:
            if config is not None:
                raise Unreadable("protocol_config twice")
            config = _config(data, pos, stop)
        elif stop != pos:  # metadata_context: skipped when empty (module docstring)
            raise Unreadable("metadata_context")
        pos = stop
    # A view, not a copy: ``data`` is bytes, immutable, so the view reads what upb would
    # have copied out; every message gets one, so both readers return the same type.
    body = memoryview(data)[body_start:body_stop]
    return Request(kind, body, eos, headers, observability, config, group, fields, remainder)


def encode_varint(value: int) -> bytes:
    """``value`` (0 to 2**64 - 1) as a varint."""
    if value < 0x80:
        return _ONE_BYTE[value]
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# The varints of one byte, made once: answers write a few per message.
_ONE_BYTE: Final = tuple(bytes((value,)) for value in range(0x80))


def field_head(number: int, size: int) -> bytes:
    """The tag and length of a length-delimited field ``number`` of ``size`` bytes."""
    return encode_varint(number << 3 | _LEN) + encode_varint(size)
