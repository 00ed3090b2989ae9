"""Translation between ext_proc protobuf messages and the core's events and answers.

The only module besides the servicer that touches generated protobuf code. It holds no
state and makes no decisions.
"""

from __future__ import annotations

from google.protobuf import struct_pb2

from ext_proc import attributes
from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.attributes import AttributeKeys
from ext_proc.events import (
    Answer,
    BodyMode,
    ContinueBody,
    ContinueHeaders,
    ContinueTrailers,
    Event,
    Outcome,
    Reject,
    RequestBody,
    RequestHeaders,
    RequestTrailers,
    RouteMetadata,
    StreamedBody,
    Unexpected,
)
from ext_proc.route_policy import Scalar


def _scalar(value: struct_pb2.Value) -> Scalar:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return str(value.string_value)
    if kind == "number_value":
        return float(value.number_value)
    if kind == "bool_value":
        return bool(value.bool_value)
    # A list or struct cannot be a policy field; show it as text so the error names it.
    return "<null>" if kind == "null_value" else f"<{kind}>"


def _route_metadata(request: pb.ProcessingRequest, keys: AttributeKeys) -> RouteMetadata:
    values: dict[str, Scalar] = {}
    size: float | None = None
    route_name = ""
    # Attributes are grouped under the ext_proc filter's configured name; any name will do.
    for group in request.attributes.values():
        fields = group.fields
        for field_name, key in keys.fields.items():
            if key in fields:
                values[field_name] = _scalar(fields[key])
        if keys.size in fields:
            size_value = _scalar(fields[keys.size])
            size = size_value if isinstance(size_value, float) else float("inf")
        if attributes.ROUTE_NAME in fields:
            route_name = str(_scalar(fields[attributes.ROUTE_NAME]))
    return RouteMetadata(values, size, route_name)


def _headers_from_attributes(request: pb.ProcessingRequest) -> tuple[tuple[str, bytes], ...]:
    found: list[tuple[str, bytes]] = []
    for group in request.attributes.values():
        for name, key in attributes.HEADERS.items():
            if key in group.fields:
                value = _scalar(group.fields[key])
                if isinstance(value, str):
                    found.append((name, value.encode("latin-1", "replace")))
    return tuple(found)


def decode(request: pb.ProcessingRequest, keys: AttributeKeys) -> Event:
    if request.observability_mode:
        # Envoy does not wait for answers in observability mode: nothing could be denied
        # or stripped, so the stream is refused rather than silently failing open.
        return Unexpected("observability_mode")
    kind = request.WhichOneof("request")
    if kind == "request_headers":
        message = request.request_headers
        return RequestHeaders(
            headers=tuple((h.key, h.raw_value) for h in message.headers.headers),
            end_of_stream=message.end_of_stream,
            body_mode=BodyMode(request.protocol_config.request_body_mode),
            route=_route_metadata(request, keys),
        )
    if kind == "request_body":
        body = request.request_body
        preamble = None
        if request.HasField("protocol_config"):  # only on the first message of a request
            preamble = RequestHeaders(
                headers=_headers_from_attributes(request),
                end_of_stream=False,
                body_mode=BodyMode(request.protocol_config.request_body_mode),
                route=_route_metadata(request, keys),
            )
        return RequestBody(body.body, body.end_of_stream, preamble)
    if kind == "request_trailers":
        return RequestTrailers()
    return Unexpected(kind or "empty")


def decision_metadata(namespace: str, outcome: Outcome) -> struct_pb2.Struct:
    """What the policy did, as Envoy dynamic metadata under ``namespace`` (for access
    logs and later filters). Never the ids themselves."""
    struct = struct_pb2.Struct()
    # Field by field: Struct.update walks Python dicts in pure Python, 5x slower.
    fields = struct.fields[namespace].struct_value.fields
    decision = outcome.decision
    fields["action"].string_value = decision.action
    fields["reason"].string_value = decision.reason
    fields["id_count"].number_value = decision.id_count
    fields["mode"].string_value = outcome.mode
    return struct


def _set(mutation: pb.HeaderMutation, key: str, value: bytes) -> None:
    option = mutation.set_headers.add()
    option.header.key = key
    # Envoy reads raw_value; a header set through `value` alone arrives empty.
    option.header.raw_value = value
    option.append_action = option.OVERWRITE_IF_EXISTS_OR_ADD


def encode(answer: Answer) -> pb.ProcessingResponse:
    response = pb.ProcessingResponse()
    if isinstance(answer, ContinueHeaders):
        response.request_headers.SetInParent()
    elif isinstance(answer, ContinueBody):
        common = response.request_body.response
        common.SetInParent()
        if answer.replacement is not None:
            common.status = common.CONTINUE_AND_REPLACE
            common.body_mutation.body = answer.replacement
            # Buffered mode with headers already seen: Envoy forwards the original
            # content-length unless told otherwise, and answers 500 on the mismatch.
            _set(common.header_mutation, "content-length", str(len(answer.replacement)).encode())
    elif isinstance(answer, StreamedBody):
        streamed = response.request_body.response.body_mutation.streamed_response
        streamed.body = answer.chunk
        streamed.end_of_stream = answer.end_of_stream
    elif isinstance(answer, ContinueTrailers):
        response.request_trailers.SetInParent()
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
