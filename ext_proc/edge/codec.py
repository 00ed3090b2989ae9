"""Translation between ext_proc protobuf messages and the core's events and answers.

The only module besides the servicer that touches generated protobuf code. It makes no
decisions; its one state is ``Decoder``'s memo of what a route's attributes read as.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final, cast

from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError

from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.core import native, tenants
from ext_proc.core.events import (
    Answer,
    BodyMode,
    ContinueBody,
    ContinueHeaders,
    ContinueResponseBody,
    ContinueResponseHeaders,
    ContinueTrailers,
    Event,
    Outcome,
    Peer,
    Reject,
    RequestBody,
    RequestHeaders,
    RequestTrailers,
    ResponseBody,
    ResponseHeaders,
    RouteMetadata,
    Step,
    StreamedBody,
    Unexpected,
)
from ext_proc.core.route_policy import Scalar
from ext_proc.edge import attributes, peer, wire
from ext_proc.edge.attributes import AttributeKeys

_SCALARS: Final = frozenset({"string_value", "number_value", "bool_value"})
# The attributes whose values are new with every request, by key, with their header
# names: kept out of ``Decoder``'s memo.
_PER_REQUEST: Final = tuple(
    (attributes.READ_HEADERS[name], name) for name in attributes.PER_REQUEST
)
# Distinct preambles remembered (routes x header variants seen), and the largest
# attributes remembered: header values are the client's, up to Envoy's header limit, so
# only small ones are kept and the memo stays within a few MiB.
PREAMBLE_MEMO: Final = 1024
PREAMBLE_MEMO_BYTES: Final = 2048
# Distinct decisions whose dynamic metadata is remembered (``Encoder``), and responses
# without bytes shared.
METADATA_MEMO: Final = 4096


def _scalar(value: struct_pb2.Value) -> Scalar:
    kind = value.WhichOneof("kind")
    if kind in _SCALARS:
        scalar: Scalar = getattr(value, kind)
        return scalar
    # A list or struct cannot be a policy field; show it as text so the error names it.
    return "<null>" if kind == "null_value" else f"<{kind}>"


def _attributes(request: pb.ProcessingRequest, keys: AttributeKeys) -> dict[str, Scalar]:
    """The attributes this codec reads, by key. They are grouped under the ext_proc
    filter's configured name; any name will do."""
    found: dict[str, Scalar] = {}
    groups = request.attributes
    # Lookups by key run in C; protobuf's items() and values() views iterate in Python.
    for name in groups:
        fields = groups[name].fields
        for key in keys.wanted:
            if key in fields:
                found[key] = _scalar(fields[key])
    return found


def _route_metadata(found: dict[str, Scalar], keys: AttributeKeys) -> RouteMetadata:
    values = {name: found[key] for name, key in keys.fields.items() if key in found}
    size: float | None = None
    if keys.size in found:
        size_value = found[keys.size]
        size = size_value if isinstance(size_value, float) else float("inf")
    route_name = str(found.get(attributes.ROUTE_NAME, ""))
    return RouteMetadata(values, size, route_name)


def _header_bytes(value: str) -> bytes:
    """A header's value from its attribute: the UTF-8 of the string Envoy's CEL made of
    the header's bytes, which are those bytes, as the headers message carries them; so
    both arrangements read one header alike, and no two values collide."""
    return value.encode()


def _headers_from_attributes(
    request: pb.ProcessingRequest, found: dict[str, Scalar]
) -> tuple[tuple[str, bytes], ...]:
    """The checked headers, then any other header the filter requests as an attribute
    (a route's tenant header)."""
    checked = [
        (name, _header_bytes(value))
        for name, key in attributes.READ_HEADERS.items()
        if isinstance(value := found.get(key), str)
    ]
    others: dict[str, bytes] = {}
    groups = request.attributes
    for group in groups:
        fields = groups[group].fields
        for key in fields:
            matched = attributes.HEADER_ATTRIBUTE.fullmatch(key)
            if matched is None or key in found:
                continue
            value = _scalar(fields[key])
            if isinstance(value, str) and fields[key].WhichOneof("kind") == "string_value":
                others[matched.group(1)] = _header_bytes(value)
    return (*checked, *sorted(others.items()))


def _peer(found: dict[str, Scalar]) -> Peer:
    """The downstream certificate's identities (``peer.identify``)."""
    return peer.identify(*(found.get(attributes.PEER[name]) for name in _PEER_ATTRIBUTES))


_PEER_ATTRIBUTES: Final = ("mtls", "validated", "certificate", "subject")


def _path(found: dict[str, Scalar]) -> str:
    value = found.get(attributes.PATH)
    return value if isinstance(value, str) else ""


def _response_body_mode(request: pb.ProcessingRequest) -> BodyMode | None:
    """The response body mode Envoy declared with the request's first message; None
    when it declared none, or one this codec does not know."""
    if not request.HasField("protocol_config"):
        return None
    try:
        return BodyMode(request.protocol_config.response_body_mode)
    except ValueError:
        return None


def _preamble(request: pb.ProcessingRequest, keys: AttributeKeys) -> RequestHeaders | None:
    """The request's headers and route rebuilt from CEL attributes, on the first message
    of a request whose headers message Envoy skipped; None on any other message."""
    if not request.HasField("protocol_config"):  # only on the first message of a request
        return None
    found = _attributes(request, keys)
    return RequestHeaders(
        headers=_headers_from_attributes(request, found),
        end_of_stream=False,
        body_mode=BodyMode(request.protocol_config.request_body_mode),
        route=_route_metadata(found, keys),
        peer=_peer(found),
        path=_path(found),
        response_body_mode=_response_body_mode(request),
    )


_Preamble = Callable[[pb.ProcessingRequest], RequestHeaders | None]


def decode(request: pb.ProcessingRequest, keys: AttributeKeys) -> Event:
    return _decode(request, functools.partial(_preamble, keys=keys), keys)


def _decode(request: pb.ProcessingRequest, preamble: _Preamble, keys: AttributeKeys) -> Event:
    if request.observability_mode:
        # Envoy does not wait for answers in observability mode: nothing could be denied
        # or stripped, so the stream is refused rather than silently failing open.
        return Unexpected("observability_mode")
    kind = request.WhichOneof("request")
    if kind == "request_body":
        body = request.request_body
        return RequestBody(body.body, body.end_of_stream, preamble(request))
    if kind == "request_headers":
        message = request.request_headers
        found = _attributes(request, keys)
        return RequestHeaders(
            headers=tuple((h.key, h.raw_value) for h in message.headers.headers),
            end_of_stream=message.end_of_stream,
            body_mode=BodyMode(request.protocol_config.request_body_mode),
            route=_route_metadata(found, keys),
            peer=_peer(found),
            path=_path(found),
            response_body_mode=_response_body_mode(request),
        )
    if kind == "request_trailers":
        return RequestTrailers(preamble(request))
    if kind == "response_headers":
        message = request.response_headers
        return ResponseHeaders(
            tuple((h.key, h.raw_value) for h in message.headers.headers), message.end_of_stream
        )
    if kind == "response_body":
        return ResponseBody(request.response_body.body, request.response_body.end_of_stream)
    return Unexpected(kind or "empty")


def _wire_scalar(value: wire.Value) -> Scalar:
    """``_scalar`` of a value the wire reader read."""
    kind, scalar = value
    if kind in _SCALARS:
        assert scalar is not None
        return scalar
    return "<null>" if kind == "null_value" else f"<{kind}>"


def _wire_preamble(
    fields: dict[str, wire.Value], config: tuple[int, int], keys: AttributeKeys
) -> RequestHeaders:
    """``_preamble`` of the fields and protocol_config the wire reader read."""
    found = {key: _wire_scalar(fields[key]) for key in keys.wanted if key in fields}
    others: dict[str, bytes] = {}
    for key, (kind, value) in fields.items():
        matched = attributes.HEADER_ATTRIBUTE.fullmatch(key)
        if matched is not None and key not in found and kind == "string_value":
            assert isinstance(value, str)
            others[matched.group(1)] = _header_bytes(value)
    checked = [
        (name, _header_bytes(value))
        for name, key in attributes.READ_HEADERS.items()
        if isinstance(value := found.get(key), str)
    ]
    try:
        response_mode: BodyMode | None = BodyMode(config[1])
    except ValueError:
        response_mode = None
    return RequestHeaders(
        headers=(*checked, *sorted(others.items())),
        end_of_stream=False,
        body_mode=BodyMode(config[0]),
        route=_route_metadata(found, keys),
        peer=_peer(found),
        path=_path(found),
        response_body_mode=response_mode,
    )


# The per-request attributes' keys as the wire carries them, left out of the memo's key.
_PER_REQUEST_KEYS: Final = frozenset(attribute.encode() for attribute, _ in _PER_REQUEST)


def compiled_reader() -> wire.Reader | None:
    """``_wire.c``'s reader where built; None otherwise: the pure-Python ``wire.read``
    is the reference the compiled one is tested against, and costs more Python calls
    per message than upb's parse, so without the compiled reader upb parses."""
    compiled = native.module("edge._wire")
    return None if compiled is None else cast("wire.Reader", compiled.read)


class Decoder:
    """``decode`` of a message's bytes, with a bounded memo of preambles, for one
    servicer.

    The bytes are read by ``reader`` (``wire.read`` or its compiled twin; by default the
    compiled one where built, else upb); what it cannot read exactly as upb does, upb
    parses (``left_to_upb`` is called: the service counts it), and bytes upb refuses
    are an ``Unexpected``
    event (a protocol error: the stream ends with an error status). A decoded message
    (``ProcessingRequest``) is decoded as ``decode`` does, through the same memo.

    Every request of a route carries the same attributes but for its ids and trace
    context (``attributes.PER_REQUEST``), and making a preamble of them costs several
    times what the rest of an allowed request does. The memo is keyed by the body modes,
    the attributes group's name and the bytes of its entries as sent, those of the
    per-request attributes left out: equal bytes read as equal fields, so what it
    returns is what ``decode`` would have read; the per-request ones are added back to
    the headers, last, in the order ``decode`` places them.
    Keys are client-influenced (the content-type header), so the memo is emptied when
    full and attributes over ``PREAMBLE_MEMO_BYTES`` are never kept: a miss costs only
    the uncached reading.
    """

    def __init__(
        self,
        keys: AttributeKeys,
        size: int = PREAMBLE_MEMO,
        reader: wire.Reader | None = None,
        left_to_upb: Callable[[], object] | None = None,
    ) -> None:
        self._keys = keys
        self._size = size
        self._memo: dict[tuple[object, ...], RequestHeaders] = {}
        self._read = reader if reader is not None else compiled_reader()
        # Called for each message the reader left to upb (counted: a second parse).
        self._left_to_upb = left_to_upb

    def __call__(self, request: bytes | pb.ProcessingRequest) -> Event:
        if isinstance(request, pb.ProcessingRequest):
            return _decode(request, self._message_preamble, self._keys)
        if self._read is None:
            return self._parsed(request)
        try:
            message = self._read(request, _PER_REQUEST_KEYS)
        except wire.Unreadable:
            if self._left_to_upb is not None:
                self._left_to_upb()
            return self._parsed(request)
        return self._event(message)

    def _parsed(self, data: bytes) -> Event:
        """``data`` parsed by upb and decoded; bytes upb refuses are ``Unexpected``."""
        try:
            parsed = pb.ProcessingRequest.FromString(data)
        except DecodeError:
            return Unexpected("malformed")
        return _decode(parsed, self._message_preamble, self._keys)

    def _event(self, message: wire.Request) -> Event:
        """``_decode`` of what the wire reader read."""
        if message.observability_mode:
            return Unexpected("observability_mode")
        kind = message.kind
        if kind == "request_body":
            return RequestBody(message.body, message.end_of_stream, self._wire_preamble(message))
        if kind == "request_headers":
            config = message.config or (0, 0)
            preamble = _wire_preamble(message.fields, config, self._keys)
            return RequestHeaders(
                headers=message.headers,
                end_of_stream=message.end_of_stream,
                body_mode=preamble.body_mode,
                route=preamble.route,
                peer=preamble.peer,
                path=preamble.path,
                response_body_mode=preamble.response_body_mode if message.config else None,
            )
        if kind == "request_trailers":
            return RequestTrailers(self._wire_preamble(message))
        if kind == "response_headers":
            return ResponseHeaders(message.headers, message.end_of_stream)
        if kind == "response_body":
            return ResponseBody(message.body, message.end_of_stream)
        return Unexpected(kind or "empty")

    def _wire_preamble(self, message: wire.Request) -> RequestHeaders | None:
        config = message.config
        if config is None:  # only on the first message of a request
            return None
        fields = message.fields
        key = (config, message.group, message.remainder)
        cached = self._memo.get(key)
        if cached is None:
            kept = {k: v for k, v in fields.items() if k.encode() not in _PER_REQUEST_KEYS}
            cached = _wire_preamble(kept, config, self._keys)
            if len(message.remainder) + len(message.group or "") <= PREAMBLE_MEMO_BYTES:
                self._remember(key, cached)
        added = [
            (header, _header_bytes(value))
            for attribute, header in _PER_REQUEST
            if (found := fields.get(attribute)) is not None
            and found[0] == "string_value"
            and isinstance(value := found[1], str)
        ]
        return _with_headers(cached, added)

    def _remember(self, key: tuple[object, ...], preamble: RequestHeaders) -> None:
        if len(self._memo) >= self._size:
            self._memo.clear()
        self._memo[key] = preamble

    def _message_preamble(self, request: pb.ProcessingRequest) -> RequestHeaders | None:
        """The preamble of a decoded message. Taking the per-request attributes out
        changes ``request``: a message is decoded once."""
        if not request.HasField("protocol_config"):
            return None
        taken: dict[str, str | None] = {}
        config = request.protocol_config
        parts: list[object] = [config.request_body_mode, config.response_body_mode]
        size = 0
        groups = request.attributes
        for name in groups:
            struct = groups[name]
            fields = struct.fields
            for attribute, header in _PER_REQUEST:
                if attribute in fields:
                    found = fields[attribute]
                    # As _attributes reads it: the last group's value, a string or nothing.
                    taken[header] = (
                        found.string_value if found.WhichOneof("kind") == "string_value" else None
                    )
                    del fields[attribute]
            serialized = struct.SerializeToString(deterministic=True)
            size += len(name) + len(serialized)
            parts += (name, serialized)
        key = ("message", *parts)
        cached = self._memo.get(key)
        if cached is None:
            cached = _preamble(request, self._keys)
            assert cached is not None
            if size <= PREAMBLE_MEMO_BYTES:
                self._remember(key, cached)
        added = [
            (header, _header_bytes(value))
            for header in attributes.PER_REQUEST
            if header in taken and (value := taken[header]) is not None
        ]
        return _with_headers(cached, added)


def _with_headers(cached: RequestHeaders, added: list[tuple[str, bytes]]) -> RequestHeaders:
    """``cached`` with the per-request headers ``added`` after its own."""
    if not added:
        return cached
    return RequestHeaders(
        (*cached.headers, *added),
        cached.end_of_stream,
        cached.body_mode,
        cached.route,
        cached.peer,
        cached.path,
        cached.response_body_mode,
    )


def decision_metadata(
    namespace: str, outcome: Outcome, into: struct_pb2.Struct | None = None
) -> struct_pb2.Struct:
    """What the policy did, as Envoy dynamic metadata under ``namespace`` (for access
    logs and later filters), written into ``into`` (a response's ``dynamic_metadata``)
    or a new Struct; a response outcome's keys start with ``response_``. Never the ids
    themselves. The authenticated tenant's partition id, under ``tenants.METADATA_KEY``
    whatever the phase, for a rate limit to key on; absent when the request named no
    tenant, so no client ever writes it (nothing else writes this namespace)."""
    struct = struct_pb2.Struct() if into is None else into
    # Field by field: Struct.update walks Python dicts in pure Python, 5x slower.
    fields = struct.fields[namespace].struct_value.fields
    prefix = "" if outcome.phase == "request" else f"{outcome.phase}_"
    decision = outcome.decision
    fields[prefix + "action"].string_value = decision.action
    fields[prefix + "reason"].string_value = decision.reason
    fields[prefix + "id_count"].number_value = decision.id_count
    fields[prefix + "mode"].string_value = outcome.mode
    if outcome.partition is not None:
        fields[tenants.METADATA_KEY].string_value = outcome.partition
    return struct


def _set(mutation: pb.HeaderMutation, key: str, value: bytes) -> None:
    option = mutation.set_headers.add()
    option.header.key = key
    # Envoy reads raw_value; a header set through `value` alone arrives empty.
    option.header.raw_value = value
    option.append_action = option.OVERWRITE_IF_EXISTS_OR_ADD


def _continue_body(
    common: pb.CommonResponse, replacement: bytes | None, length_header: bool = True
) -> None:
    common.SetInParent()
    if replacement is not None:
        common.status = common.CONTINUE_AND_REPLACE
        common.body_mutation.body = replacement
        if length_header:
            # Buffered mode with headers already seen (request or response): Envoy
            # forwards the original content-length unless told otherwise, and answers
            # 500 on the mismatch.
            _set(common.header_mutation, "content-length", str(len(replacement)).encode())


def encode(answer: Answer) -> pb.ProcessingResponse:
    response = pb.ProcessingResponse()
    if isinstance(answer, ContinueHeaders):
        common = response.request_headers.response
        common.SetInParent()
        if answer.removed:
            common.header_mutation.remove_headers.extend(answer.removed)
        for key, value in answer.written:
            _set(common.header_mutation, key, value)
    elif isinstance(answer, ContinueBody):
        _continue_body(response.request_body.response, answer.replacement, answer.length_header)
    elif isinstance(answer, StreamedBody):
        streamed = response.request_body.response.body_mutation.streamed_response
        streamed.body = answer.chunk
        streamed.end_of_stream = answer.end_of_stream
    elif isinstance(answer, ContinueTrailers):
        response.request_trailers.SetInParent()
    elif isinstance(answer, ContinueResponseHeaders):
        response.response_headers.SetInParent()
    elif isinstance(answer, ContinueResponseBody):
        _continue_body(response.response_body.response, answer.replacement)
    elif isinstance(answer, Reject):
        immediate = response.immediate_response
        immediate.status.code = answer.status  # type: ignore[assignment]
        immediate.body = answer.body
        immediate.details = answer.details
        _set(immediate.headers, "content-type", b"application/json")
        for key, value in answer.headers:
            _set(immediate.headers, key, value)
    else:  # pragma: no cover - Answer is a closed union
        raise TypeError(f"not an answer: {answer!r}")
    return response


# Answers that carry no bytes of their own once their replacement is None (a headers
# answer: once it writes no header), each as built without arguments.
_PLAIN: Final = (
    ContinueHeaders,
    ContinueBody,
    ContinueTrailers,
    ContinueResponseHeaders,
    ContinueResponseBody,
)
_BYTELESS: Final[dict[type, Answer]] = {kind: kind() for kind in _PLAIN}


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (the wire's tag, length, payload)."""
    return _head(number, len(payload)) + payload


def _head(number: int, size: int) -> bytes:
    """``wire.field_head(number, size)`` in one call for the answers' fields (numbers
    below 16: a one-byte tag) of a size below 2**14 (a varint of one or two bytes);
    ``wire.field_head`` writes any other."""
    if number < 16:
        tag = number << 3 | 2
        if size < 0x80:
            return bytes((tag, size))
        if size < 0x4000:
            return bytes((tag, size & 0x7F | 0x80, size >> 7))
    return wire.field_head(number, size)


def _spliced(
    answer: ContinueBody | ContinueResponseBody | StreamedBody, tail: bytes = b""
) -> bytes | None:
    """The serialized response of an answer that carries a body, as ``encode`` makes
    it, then ``tail`` (the response's later fields), written around the body so the body
    is copied once, into the answer; None for one that carries none. Fields in number
    order, as upb writes them."""
    if isinstance(answer, StreamedBody):
        chunk = answer.chunk
        # StreamedBodyResponse: body and end_of_stream, each written when not empty.
        head = _head(1, len(chunk)) if chunk else b""
        eos = b"\x10\x01" if answer.end_of_stream else b""
        return _nest((3, 1, 3, 3), [head, chunk, eos], tail)
    replacement = answer.replacement
    if replacement is None:
        return None
    length_header = answer.length_header if isinstance(answer, ContinueBody) else True
    common = b"\x08\x01"  # status CONTINUE_AND_REPLACE
    if length_header:
        common += _field(2, _length_mutation(len(replacement)))
    # BodyMutation.body is a oneof member: written even when empty.
    body = _head(1, len(replacement))
    common += _head(3, len(body) + len(replacement)) + body
    number = 3 if isinstance(answer, ContinueBody) else 4
    return _nest((number, 1), [common, replacement], tail)


def _length_mutation(size: int) -> bytes:
    """``_set(mutation, "content-length", ...)``'s HeaderMutation, serialized: one
    HeaderValueOption of the header (key, raw_value) and OVERWRITE_IF_EXISTS_OR_ADD."""
    header = _CONTENT_LENGTH_KEY + _field(3, str(size).encode())
    return _field(1, _field(1, header) + _OVERWRITE)


_CONTENT_LENGTH_KEY: Final = b"\x0a\x0econtent-length"  # HeaderValue.key
_OVERWRITE: Final = b"\x18\x02"  # append_action OVERWRITE_IF_EXISTS_OR_ADD


def _nest(numbers: tuple[int, ...], parts: list[bytes], tail: bytes) -> bytes:
    """``parts`` as the payload of field ``numbers[-1]`` inside ... inside field
    ``numbers[0]``, then ``tail``: the heads are written, then everything joined once."""
    size = sum(map(len, parts))
    heads: list[bytes] = []
    for number in reversed(numbers):
        head = _head(number, size)
        heads.append(head)
        size += len(head)
    heads.reverse()
    return b"".join((*heads, *parts, tail))


class Encoder:
    """A step's answers as the bytes of their ``ProcessingResponse``, for one
    servicer. Every answer of a step that settled a phase carries the decision as
    dynamic metadata (``decision_metadata``): with a streamed body, the withheld
    headers' answer and each piece, so whichever of them Envoy continues the filter
    chain on, the filters after this one (a rate limit keyed on the tenant's partition)
    find it; and the shipped access log prints it for every request, an allow without
    ids included (the one outcome that writes no decision log line).

    An answer without a body of its own (an empty continue, a refusal) is one of few
    per decision: its bytes are built once per (answer, decision) and shared. An answer
    with a body is its prebuilt head, the body, and the decision's prebuilt metadata
    field (``dynamic_metadata`` is field 8, after every answer's: the order upb writes).
    """

    def __init__(self, namespace: str) -> None:
        self._namespace = namespace
        self._shared: dict[tuple[object, ...], bytes] = {}
        self._structs: dict[tuple[object, ...], bytes] = {}

    def __call__(self, step: Step) -> list[bytes]:
        answers, outcome = step.answers, step.outcome
        if not answers:
            return []
        return [self._encoded(answer, outcome) for answer in answers]

    def _encoded(self, answer: Answer, outcome: Outcome | None) -> bytes:
        if isinstance(answer, (ContinueBody, ContinueResponseBody, StreamedBody)):
            tail = b"" if outcome is None else self._metadata(outcome)
            spliced = _spliced(answer, tail)
            if spliced is not None:
                return spliced
        key: tuple[object, ...] = (answer,) if outcome is None else (answer, *_decided(outcome))
        shared = self._shared.get(key)
        if shared is None:
            shared = encode(answer).SerializeToString()
            if outcome is not None:
                shared += self._metadata(outcome)
            if len(self._shared) >= METADATA_MEMO:
                self._shared.clear()
            self._shared[key] = shared
        return shared

    def _metadata(self, outcome: Outcome) -> bytes:
        """``decision_metadata`` for ``outcome`` as the response's field 8, built once
        per distinct decision (the id count is the client's: the memo is emptied when
        full)."""
        key = _decided(outcome)
        field = self._structs.get(key)
        if field is None:
            if len(self._structs) >= METADATA_MEMO:
                self._structs.clear()
            struct = decision_metadata(self._namespace, outcome)
            field = self._structs[key] = _field(8, struct.SerializeToString())
        return field


def _decided(outcome: Outcome) -> tuple[object, ...]:
    """What ``decision_metadata`` says of ``outcome`` (its mode by the flag it is
    named from)."""
    decision = outcome.decision
    return (
        outcome.phase,
        decision.action,
        decision.reason,
        decision.id_count,
        outcome.audit,
        outcome.partition,
    )
