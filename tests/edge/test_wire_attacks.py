"""Outside review of the raw-bytes readers (``wire.read`` and ``_wire.c``) against upb:
inputs chosen to make a reader read a message differently from
``pb.ProcessingRequest.FromString``, or accept bytes upb refuses."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
from google.protobuf.message import DecodeError

from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.core import native
from ext_proc.core.events import Event, Unexpected
from ext_proc.edge import wire
from ext_proc.edge.codec import _PER_REQUEST_KEYS, Decoder
from tests.edge.test_wire import shown
from tests.messages import KEYS, first_body_request, headers_request, route_attributes

COMPILED = native.module("edge._wire")
READERS: list[wire.Reader] = [wire.read] if COMPILED is None else [wire.read, COMPILED.read]
ROUTE = route_attributes({"action": "strip"})


def _varint(value: int, pad: int = 0) -> bytes:
    """``value`` as a varint, padded with ``pad`` extra bytes (a non-canonical but
    well-formed encoding of the same value)."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    for _ in range(pad):
        out[-1] |= 0x80
        out.append(0)
    return bytes(out)


def _len(number: int, payload: bytes, pad: int = 0) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload), pad) + payload


def _upb(data: bytes) -> Event | type[Exception]:
    try:
        parsed = pb.ProcessingRequest.FromString(data)
    except DecodeError:
        return Unexpected("malformed")
    try:
        return Decoder(KEYS)(parsed)
    except Exception as exc:  # compared by type
        return type(exc)


def _decoded(data: bytes, reader: wire.Reader) -> Event | type[Exception]:
    try:
        return Decoder(KEYS, reader=reader)(data)
    except Exception as exc:
        return type(exc)


def _accepted(data: bytes, reader: wire.Reader) -> bool:
    try:
        reader(data, _PER_REQUEST_KEYS)
    except wire.Unreadable:
        return False
    return True


# A request body whose HttpBody length prefix is written in 6 to 10 bytes. upb reads a
# length as a 32-bit varint (at most 5 bytes) and refuses the message; both readers
# read a length as a 64-bit varint (up to 10 bytes) and accept it.
PADDED_LENGTHS = [
    pytest.param(
        _len(4, _len(1, b'{"kv_transfer_params": {}}') + b"\x10\x01", pad=pad),
        id=f"request_body-length-in-{1 + pad}-bytes",
    )
    for pad in (5, 9)
] + [
    pytest.param(_len(4, _len(1, b"{}", pad=9) + b"\x10\x01"), id="body-bytes-length-in-10-bytes"),
    pytest.param(
        _len(4, b"\x10\x01") + _varint(100 << 3 | 2) + _varint(3, 7) + b"abc",
        id="unknown-field-length-in-8-bytes",
    ),
    pytest.param(
        _len(2, _len(1, _len(1, _len(1, b"content-type") + _len(3, b"a/b", pad=6)))),
        id="header-raw-value-length-in-7-bytes",
    ),
]


@pytest.mark.parametrize("data", PADDED_LENGTHS)
def test_upb_refuses_a_length_longer_than_five_bytes(data: bytes) -> None:
    """The premise of finding 1: upb refuses these bytes."""
    with pytest.raises(DecodeError):
        pb.ProcessingRequest.FromString(data)


@pytest.mark.parametrize(
    "reader", READERS, ids=lambda r: "compiled" if r is not wire.read else "python"
)
@pytest.mark.parametrize("data", PADDED_LENGTHS)
def test_a_length_upb_refuses_is_refused(data: bytes, reader: wire.Reader) -> None:
    assert _decoded(data, reader) == _upb(data) == Unexpected("malformed")


@pytest.mark.parametrize(
    "reader", READERS, ids=lambda r: "compiled" if r is not wire.read else "python"
)
@pytest.mark.parametrize("pad", range(5))
def test_a_length_of_up_to_five_bytes_reads_as_upb_reads_it(reader: wire.Reader, pad: int) -> None:
    data = _len(4, _len(1, b"{}", pad=pad) + b"\x10\x01", pad=pad)
    assert _decoded(data, reader) == _upb(data)
    assert _accepted(data, reader)


@pytest.mark.parametrize(
    "reader", READERS, ids=lambda r: "compiled" if r is not wire.read else "python"
)
@pytest.mark.parametrize("pad", range(10))
def test_padded_scalar_varints_and_tags_read_as_upb_reads_them(
    reader: wire.Reader, pad: int
) -> None:
    """Checked, fine: upb accepts a scalar varint of up to 10 bytes and a tag of up to
    5; the readers agree (a longer tag is left to upb, which refuses it)."""
    body = _len(1, b"{}") + b"\x10" + _varint(1, pad)
    data = _varint(4 << 3 | 2, min(pad, 4)) + _varint(len(body)) + body
    assert _decoded(data, reader) == _upb(data)
    long_tag = _varint(4 << 3 | 2, pad) + _varint(len(body)) + body
    assert _decoded(long_tag, reader) == _upb(long_tag)


def _headers_then_body() -> bytes:
    headers = headers_request(ROUTE).SerializeToString()
    body = first_body_request(b'{"a": 1}', {}).SerializeToString()
    return headers + body


ONEOF_AND_MERGES = [
    pytest.param(_headers_then_body(), id="request_headers-then-request_body"),
    pytest.param(
        first_body_request(b'{"a": 1}', ROUTE).SerializeToString()
        + first_body_request(b'{"kv_transfer_params": {}}', {}).SerializeToString(),
        id="two-bodies-last-wins",
    ),
    pytest.param(
        headers_request(ROUTE).SerializeToString()
        + headers_request({}, headers=(("content-type", b"text/plain"),)).SerializeToString(),
        id="two-headers-messages-merge",
    ),
    pytest.param(
        first_body_request(b"{}", ROUTE).SerializeToString()
        + first_body_request(b"{}", route_attributes({"action": "honor"})).SerializeToString(),
        id="attributes-same-group-twice",
    ),
    pytest.param(
        first_body_request(b"{}", ROUTE).SerializeToString()
        + first_body_request(b"{}", {}, filter_name="other").SerializeToString(),
        id="attributes-two-groups",
    ),
    pytest.param(
        headers_request(ROUTE).SerializeToString() + b"\x50\x01",
        id="observability-mode-after-headers",
    ),
    pytest.param(
        headers_request(ROUTE).SerializeToString() + b"\x50\x01\x50\x00",
        id="observability-mode-set-then-cleared",
    ),
]


@pytest.mark.parametrize(
    "reader", READERS, ids=lambda r: "compiled" if r is not wire.read else "python"
)
@pytest.mark.parametrize("data", ONEOF_AND_MERGES)
def test_oneof_switches_and_merges_read_as_upb_reads_them(data: bytes, reader: wire.Reader) -> None:
    """Checked, fine: a second oneof member, a second attributes entry and repeated
    messages are left to upb (or merge as upb merges)."""
    assert _decoded(data, reader) == _upb(data)


@pytest.mark.parametrize(
    "reader", READERS, ids=lambda r: "compiled" if r is not wire.read else "python"
)
def test_a_huge_length_is_refused_without_reading_past_the_end(reader: wire.Reader) -> None:
    for size in (2**31 - 1, 2**32, 2**63, 2**64 - 1):
        data = _varint(4 << 3 | 2) + _varint(size) + b"\x0a"
        assert not _accepted(data, reader)
        assert _decoded(data, reader) == _upb(data) == Unexpected("malformed")


@pytest.mark.parametrize(
    "reader", READERS, ids=lambda r: "compiled" if r is not wire.read else "python"
)
def test_the_memo_never_answers_for_other_attributes(reader: wire.Reader) -> None:
    """One Decoder, warmed with a route; a message whose only differing attribute is a
    route field, a second copy of a per-request key, or a header attribute reads as upb
    reads it (not as the warmed entry)."""
    decoder = Decoder(KEYS, reader=reader)
    base = {**ROUTE, "request.headers['x-request-id']": "a"}
    variants = [
        base,
        {**base, **route_attributes({"action": "deny"})},
        {**base, "request.headers['x-request-id']": "b"},
        {**base, "request.headers['content-type']": "text/plain"},
        {**base, "request.path": "/tokenize"},
        {**base, "request.headers['x-request-id']": 1.0},
    ]
    for attrs in variants + variants[::-1]:
        data = first_body_request(b"{}", attrs).SerializeToString()
        assert decoder(data) == _upb(data)


@pytest.mark.skipif(COMPILED is None or sys.platform != "linux", reason="compiled, mprotect")
def test_the_compiled_reader_reads_nothing_past_the_end(
    at_a_guard_page: Callable[[bytes], memoryview],
) -> None:
    """Every prefix of real messages (each ends inside a varint, a length, a string, a
    double, a nested struct), read from bytes flush against an unreadable page."""
    assert COMPILED is not None
    struct = {**ROUTE, "n": 1.5, "l": [1, "x", {"a": [None, True]}], "request.path": "/v1/x"}
    messages = [
        first_body_request(b'{"a": 1}', struct).SerializeToString(),
        headers_request(struct).SerializeToString(),
        _len(4, b"\x10" + _varint(2**64 - 1)),
    ]
    for message in messages:
        for size in range(len(message) + 1):
            raw = message[:size]
            view = at_a_guard_page(raw)
            try:
                found: object = COMPILED.read(view, _PER_REQUEST_KEYS)
            except wire.Unreadable:
                found = None
            try:
                expected: object = wire.read(raw, _PER_REQUEST_KEYS)
            except wire.Unreadable:
                expected = None
            assert shown(found) == shown(expected)
