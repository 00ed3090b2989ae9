"""The ext_proc service's one method, ``Process``, with protobuf messages on both sides: for
the clients and stand-in processors outside the package (the naive floor, the tests).

The package serves ``Process`` itself on bytes (``ext_proc.edge.service.add_to_server``) and
ships no generated gRPC code; this is what that code gave everyone else, on grpc's generic
API: the same method path (from ``service.SERVICE_NAME``, so one source names the service) and
the generated (de)serializers, ``ProcessingRequest.FromString`` in and
``ProcessingResponse.SerializeToString`` out, so a processor served here pays exactly what
one built on the generated servicer pays. Both work with grpc's sync and asyncio channels
and servers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.edge import service

METHOD = f"/{service.SERVICE_NAME}/Process"


class Stub:
    """A client of ``Process``: ``Stub(channel).Process(requests)`` streams
    ``pb.ProcessingRequest``s and yields ``pb.ProcessingResponse``s (a call of the channel's
    kind, sync or asyncio)."""

    def __init__(self, channel: grpc.Channel | grpc.aio.Channel) -> None:
        self.Process: Any = channel.stream_stream(
            METHOD,
            request_serializer=pb.ProcessingRequest.SerializeToString,
            response_deserializer=pb.ProcessingResponse.FromString,
        )


def add_to_server(process: Callable[..., Any], server: grpc.Server | grpc.aio.Server) -> None:
    """Serve ``process(requests, context)`` as ``Process``: it is handed
    ``pb.ProcessingRequest``s and gives back ``pb.ProcessingResponse``s (a generator for a
    sync server, an async generator for an asyncio one)."""
    service.add_to_server(
        process,
        server,
        deserializer=pb.ProcessingRequest.FromString,
        serializer=pb.ProcessingResponse.SerializeToString,
    )
