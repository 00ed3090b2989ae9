"""Translation between ext_proc protobuf messages and the core's events and answers.

The only module besides the servicer that touches generated protobuf code. It makes no
decisions; its one state is ``Decoder``'s memo of what a route's attributes read as.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final

from google.protobuf import struct_pb2

from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.core import tenants
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
from ext_proc.edge import attributes, peer
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
    return (*checked, *others.items())


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


class Decoder:
    """``decode`` with a bounded memo of preambles, for one servicer.

    Every request of a route carries the same attributes but for its ids and trace
    context (``attributes.PER_REQUEST``), and reading them field by field costs several
    times what the rest of an allowed request does. The memo is keyed by the exact bytes
    of the attributes (map entries in sorted order) with those taken out, so what it
    returns is what ``decode`` would have read; they are added back to the headers,
    last, in the order ``decode`` places them. Taking them out changes ``request``: a
    message is decoded once.
    Keys are client-influenced (the content-type header), so the memo is emptied when
    full and attributes over ``PREAMBLE_MEMO_BYTES`` are never kept: a miss costs only
    the uncached reading.
    """

    def __init__(self, keys: AttributeKeys, size: int = PREAMBLE_MEMO) -> None:
        self._keys = keys
        self._size = size
        self._memo: dict[tuple[object, ...], RequestHeaders] = {}

    def __call__(self, request: pb.ProcessingRequest) -> Event:
        return _decode(request, self._preamble, self._keys)

    def _preamble(self, request: pb.ProcessingRequest) -> RequestHeaders | None:
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
        key = tuple(parts)
        cached = self._memo.get(key)
        if cached is None:
            cached = _preamble(request, self._keys)
            assert cached is not None
            if size <= PREAMBLE_MEMO_BYTES:
                if len(self._memo) >= self._size:
                    self._memo.clear()
                self._memo[key] = cached
        if not taken:
            return cached
        added = [
            (header, _header_bytes(value))
            for header in attributes.PER_REQUEST
            if header in taken and (value := taken[header]) is not None
        ]
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


class Encoder:
    """A step's answers as protobuf, for one servicer. Every answer of a step that
    settled a phase carries the decision as dynamic metadata (``decision_metadata``):
    with a streamed body, the withheld headers' answer and each piece, so whichever of
    them Envoy continues the filter chain on, the filters after this one (a rate limit
    keyed on the tenant's partition) find it.

    An answer that carries no bytes, with an outcome without ids, is one of few (answer
    kind x phase x action x reason x mode): each is built once and shared, since gRPC
    only reads a message it sends."""

    def __init__(self, namespace: str) -> None:
        self._namespace = namespace
        self._shared: dict[tuple[object, ...], pb.ProcessingResponse] = {}
        self._structs: dict[tuple[object, ...], struct_pb2.Struct] = {}

    def __call__(self, step: Step) -> list[pb.ProcessingResponse]:
        answers, outcome = step.answers, step.outcome
        if not answers:
            return []
        return [self._encoded(answer, outcome) for answer in answers]

    def _encoded(self, answer: Answer, outcome: Outcome | None) -> pb.ProcessingResponse:
        key: tuple[object, ...] | None = None
        empty = _BYTELESS.get(type(answer))
        if empty is not None and answer == empty:
            if outcome is None:
                key = (answer,)
            elif outcome.decision.id_count == 0 and outcome.partition is None:
                decision = outcome.decision
                key = (answer, outcome.phase, decision.action, decision.reason, outcome.mode)
        if key is not None and (shared := self._shared.get(key)) is not None:
            return shared
        response = encode(answer)
        if outcome is not None:
            response.dynamic_metadata.CopyFrom(self._metadata(outcome))
        if key is not None:
            if len(self._shared) >= METADATA_MEMO:
                self._shared.clear()
            self._shared[key] = response
        return response

    def _metadata(self, outcome: Outcome) -> struct_pb2.Struct:
        """``decision_metadata`` for ``outcome``, built once per distinct decision
        (the id count is the client's: the memo is emptied when full)."""
        decision = outcome.decision
        key = (
            outcome.phase,
            decision.action,
            decision.reason,
            decision.id_count,
            outcome.mode,
            outcome.partition,
        )
        struct = self._structs.get(key)
        if struct is None:
            if len(self._structs) >= METADATA_MEMO:
                self._structs.clear()
            struct = self._structs[key] = decision_metadata(self._namespace, outcome)
        return struct
