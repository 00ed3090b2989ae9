"""Builders for the ext_proc messages Envoy sends, shared by codec and gRPC tests."""

from __future__ import annotations

from google.protobuf import struct_pb2

from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.edge.attributes import attribute_keys

KEYS = attribute_keys()
FILTER = "envoy.filters.http.ext_proc"


def headers_request(
    attributes: dict[str, object],
    *,
    headers: tuple[tuple[str, bytes], ...] = (("content-type", b"application/json"),),
    eos: bool = False,
    filter_name: str = FILTER,
) -> pb.ProcessingRequest:
    """A BUFFERED-mode request-headers message with raw CEL ``attributes``."""
    request = pb.ProcessingRequest()
    for key, value in headers:
        request.request_headers.headers.headers.add(key=key, raw_value=value)
    request.request_headers.end_of_stream = eos
    request.protocol_config.request_body_mode = 2
    # Envoy sends a metadata_context on every message: empty, as the shipped filter
    # forwards no dynamic metadata.
    request.metadata_context.SetInParent()
    struct = struct_pb2.Struct()
    struct.update(attributes)
    request.attributes[filter_name].CopyFrom(struct)
    return request


def route_attributes(route: dict[str, object] | None) -> dict[str, object]:
    """The attributes Envoy sends for a route whose policy metadata is ``route``."""
    if not route:
        return {}
    return {**{KEYS.fields[k]: v for k, v in route.items()}, KEYS.size: len(route)}


def first_body_request(
    data: bytes, attributes: dict[str, object], *, filter_name: str = FILTER
) -> pb.ProcessingRequest:
    """The one message of a request when Envoy skips its headers (``envoy/envoy.yaml``):
    the whole BUFFERED body with the request's raw CEL ``attributes``."""
    request = pb.ProcessingRequest()
    request.request_body.body = data
    request.request_body.end_of_stream = True
    request.protocol_config.request_body_mode = 2
    # Envoy sends a metadata_context on every message: empty, as the shipped filter
    # forwards no dynamic metadata.
    request.metadata_context.SetInParent()
    struct = struct_pb2.Struct()
    struct.update(attributes)
    request.attributes[filter_name].CopyFrom(struct)
    return request
