"""The wire reader against upb: whatever bytes it is given, ``Decoder`` reads what the
decoded message reads as, and bytes upb refuses are refused (never passed)."""

from __future__ import annotations

import dataclasses

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.core import native
from ext_proc.core.events import Event, Unexpected
from ext_proc.edge import attributes, wire
from ext_proc.edge.codec import _PER_REQUEST_KEYS, Decoder
from tests.messages import KEYS, first_body_request, headers_request, route_attributes

ROUTE = route_attributes({"action": "strip"})
COMPILED = native.module("edge._wire")
# The readers compared with upb: the reference, and the compiled one where built.
READERS: list[wire.Reader] = [wire.read] if COMPILED is None else [wire.read, COMPILED.read]


def _read(data: bytes, reader: wire.Reader) -> Event | type[Exception]:
    try:
        return Decoder(KEYS, reader=reader)(data)
    except Exception as exc:  # compared by type
        return type(exc)


def _wire(data: bytes, reader: wire.Reader) -> wire.Request | None:
    try:
        return reader(data, _PER_REQUEST_KEYS)
    except wire.Unreadable:
        return None


def _reference(data: bytes) -> Event | type[Exception]:
    try:
        parsed = pb.ProcessingRequest.FromString(data)
    except DecodeError:
        return Unexpected("malformed")
    try:
        return Decoder(KEYS)(parsed)
    except Exception as exc:
        return type(exc)


def shown(found: object) -> str:
    """``repr`` of what a reader read, its body as bytes (a memoryview's repr is its
    address); the body is a view of the message, whichever reader read it."""
    if isinstance(found, wire.Request):
        assert type(found.body) is memoryview
    if not dataclasses.is_dataclass(found) or isinstance(found, type):
        return repr(found)
    values = (getattr(found, field.name) for field in dataclasses.fields(found))
    return repr((type(found), *(bytes(v) if isinstance(v, memoryview) else v for v in values)))


def _same(data: bytes) -> None:
    upb = _reference(data)
    for reader in READERS:
        mine = _read(data, reader)
        assert mine == upb or shown(mine) == shown(upb), (reader, data)  # repr: NaN numbers
    read = [_wire(data, reader) for reader in READERS]
    # The compiled reader reads what the reference reads, and refuses what it refuses.
    assert all(shown(found) == shown(read[0]) for found in read), data
    if read[0] is not None:
        pb.ProcessingRequest.FromString(data)  # what the readers read, upb reads


scalars = st.one_of(st.text(max_size=8), st.floats(), st.booleans(), st.none())
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
keys = st.sampled_from(
    [*KEYS.wanted, attributes.header("x-auth-tenant"), attributes.header("x-b"), "other", ""]
)
attrs = st.dictionaries(keys, values, max_size=6)


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    chosen = draw(attrs)
    if draw(st.booleans()):
        message = first_body_request(draw(st.binary(max_size=32)), {**ROUTE, **chosen})
    else:
        message = headers_request({**ROUTE, **chosen}, eos=draw(st.booleans()))
    if draw(st.booleans()):
        message.ClearField("protocol_config")
    if draw(st.booleans()):
        message.observability_mode = True
    return bytes(message.SerializeToString())


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(messages()))
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        action = draw(st.integers(0, 2))
        if action == 0:
            data[at] = draw(st.integers(0, 255))
        elif action == 1:
            del data[at:]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=3))
    return bytes(data)


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(messages())
def test_a_message_reads_as_upb_reads_it(data: bytes) -> None:
    _same(data)


@FUZZ
@given(mutated())
def test_mutated_bytes_read_as_upb_reads_them_or_are_refused(data: bytes) -> None:
    _same(data)


@FUZZ
@given(st.lists(messages(), min_size=2, max_size=3))
def test_concatenated_messages_merge_as_in_upb(parts: list[bytes]) -> None:
    _same(b"".join(parts))


@FUZZ
@given(st.binary(max_size=64))
def test_random_bytes_read_as_upb_reads_them_or_are_refused(data: bytes) -> None:
    _same(data)


@pytest.mark.parametrize(
    "data",
    [
        b"\x22\x05\x0a\x03abc",  # a request body
        b"\x22\x05\x0a\x03abc\x22\x02\x10\x01",  # twice: merged by upb
        b"\x22\x05\x0a\x03abc\x2a\x00",  # two members: the last replaces
        b"\x20\x01",  # a known number with another wire type: an unknown field
        b"\x22\x80",  # a truncated length
        b"\x50\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a ten-byte varint
        b"\x50\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # eleven bytes
        b"\x8a\x00\x00",  # a tag written in two bytes (field 1 of wire type 2)
        b"\x0b\x0c",  # a group
        b"\x00",  # field number 0
        b"\x42\x00",  # metadata_context
        b"\x4a\x06\x0a\x02\xc3\x28\x12\x00",  # an attributes group named in bad UTF-8
        b"\x12\x08\x0a\x06\x0a\x04\x0a\x02\xff\xfe",  # a header key in bad UTF-8
        b"\x5a\x0b\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # body mode -1
        b"\x5a\x02\x08\x07",  # an unknown body mode
    ],
)
def test_adversarial_bytes_read_as_upb_reads_them_or_are_refused(data: bytes) -> None:
    _same(data)


def _len(number: int, *parts: bytes) -> bytes:
    payload = b"".join(parts)
    return wire.field_head(number, len(payload)) + payload


def _attrs(*entries: bytes, name: bytes = b"f") -> bytes:
    """A first body message whose one attributes group holds ``entries``."""
    body = _len(4, _len(1, b"{}"), b"\x10\x01") + _len(11, b"\x08\x02")
    return body + _len(9, _len(1, name), _len(2, *entries))


def _entry(key: bytes, *value: bytes) -> bytes:
    return _len(1, _len(1, key), _len(2, *value))


ROUTE_NAME = attributes.ROUTE_NAME.encode()
REQUEST_ID = attributes.HEADERS["x-request-id"].encode()


@pytest.mark.parametrize(
    "data",
    [
        _attrs(_entry(ROUTE_NAME, _len(3, b"a")), _entry(ROUTE_NAME, _len(3, b"b"))),  # last wins
        _attrs(_len(1, _len(2, _len(3, b"no key")))),  # an entry without its key
        _attrs(_len(1, _len(1, ROUTE_NAME))),  # an entry without its value
        _attrs(_entry(ROUTE_NAME, _len(3, b"a"), b"\x11" + bytes(8))),  # two kinds: upb's
        _attrs(_entry(ROUTE_NAME, b"\x11\x00\x00\x00\x00\x00\x00\xf8\x7f")),  # NaN
        _attrs(_entry(ROUTE_NAME, b"\x11\x00\x00")),  # a truncated double
        _attrs(_entry(ROUTE_NAME, b"\x38\x01", _len(3, b"a"))),  # an unknown field in a Value
        _attrs(_entry(ROUTE_NAME, b"\x08\x00")),  # null
        _attrs(_entry(ROUTE_NAME, _len(6, _len(1, b"\x20\x01")))),  # a list
        _attrs(_entry(ROUTE_NAME, _len(5, _entry(b"k", _len(3, b"\xff"))))),  # bad UTF-8 deep down
        _attrs(_entry(REQUEST_ID, _len(3, b"1")), _entry(REQUEST_ID, b"\x20\x01")),  # id: a bool
        _attrs(_entry(ROUTE_NAME, _len(3, b"a")), name=b"\xff"),  # a group named in bad UTF-8
        _attrs(_entry(ROUTE_NAME, _len(3, b"a"))) + _len(9, _len(1, b"g")),  # two groups
        _attrs(_entry(ROUTE_NAME, _len(3, b"a"))) + _len(11, b"\x10\x02"),  # config twice
        _len(2, _len(1, _len(1, _len(1, b"k"), _len(2, b"\xff")))),  # a header value in bad UTF-8
        _len(2, _len(1, _len(1, _len(1, b"k"), _len(3, b"v"))), b"\x18\x01")
        + _len(11, b""),  # request headers, an empty protocol_config
    ],
)
def test_adversarial_attributes_read_as_upb_reads_them_or_are_refused(data: bytes) -> None:
    _same(data)


def test_nesting_past_the_readers_depth_is_left_to_upb() -> None:
    value = _len(3, b"leaf")
    for _ in range(wire.DEPTH + 2):
        value = _len(6, _len(1, value))
    data = _attrs(_entry(ROUTE_NAME, value))
    _same(data)
    assert all(_wire(data, reader) is None for reader in READERS)


@pytest.mark.parametrize("reader", READERS)
def test_the_body_is_the_message_s_bytes(reader: wire.Reader) -> None:
    message = first_body_request(b'{"prompt":"x"}', ROUTE).SerializeToString()
    body = reader(message, frozenset()).body
    assert bytes(body) == b'{"prompt":"x"}'
    # A read-only view of the message's own bytes, not a copy: the body's span of them.
    assert body.obj is message
    assert body.readonly
    assert body.contiguous
    headers = reader(headers_request(ROUTE).SerializeToString(), frozenset()).body
    assert type(headers) is memoryview
    assert not len(headers)


@pytest.mark.parametrize("reader", READERS)
def test_the_memo_key_leaves_out_the_per_request_attributes(reader: wire.Reader) -> None:
    def remainder(request_id: str) -> bytes:
        values = {**ROUTE, attributes.HEADERS["x-request-id"]: request_id}
        return reader(
            first_body_request(b"{}", values).SerializeToString(), _PER_REQUEST_KEYS
        ).remainder

    assert remainder("a") == remainder("b") != b""


def test_the_compiled_reader_is_built() -> None:
    """Where the package was built (setup.py), the compiled reader is the one served."""
    if COMPILED is None:
        pytest.skip("ext_proc.edge._wire not built (or EXT_PROC_NATIVE=0)")
    assert Decoder(KEYS)._read is COMPILED.read


@pytest.mark.parametrize("builder", ["headers", "body"])
def test_the_messages_envoy_sends_are_read_by_the_readers_not_left_to_upb(builder: str) -> None:
    # Envoy sends a metadata_context on every message (empty: the shipped filter
    # forwards no dynamic metadata); a reader that left it to upb would parse every
    # message twice over.
    if builder == "headers":
        message = headers_request(ROUTE)
    else:
        message = first_body_request(b'{"a": 1}', ROUTE)
    assert message.HasField("metadata_context")
    data = message.SerializeToString()
    _same(data)
    for reader in READERS:
        assert _wire(data, reader) is not None, reader


def test_a_metadata_context_that_holds_anything_is_left_to_upb() -> None:
    message = first_body_request(b"{}", ROUTE)
    message.metadata_context.filter_metadata["ns"].update({"k": "v"})
    data = message.SerializeToString()
    _same(data)
    for reader in READERS:
        assert _wire(data, reader) is None, reader
