"""bench.grpc_api over a real gRPC stream, with the naive floor as its processor: the
requests arrive as protobuf messages and the answers leave as them."""

from __future__ import annotations

import asyncio

import grpc

from bench import grpc_api, naive
from ext_proc._pb import external_processor_pb2 as pb


async def _answers(requests: list[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
    server = grpc.aio.server()
    grpc_api.add_to_server(naive.process, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            return [answer async for answer in grpc_api.Stub(channel).Process(iter(requests))]
    finally:
        await server.stop(None)


def test_the_naive_floor_continues_each_request_message_and_ignores_the_rest() -> None:
    requests = [
        pb.ProcessingRequest(request_headers=pb.HttpHeaders()),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}", end_of_stream=True)),
        pb.ProcessingRequest(response_headers=pb.HttpHeaders()),
        pb.ProcessingRequest(request_trailers=pb.HttpTrailers()),
    ]
    assert asyncio.run(_answers(requests)) == [
        pb.ProcessingResponse(request_headers=pb.HeadersResponse()),
        pb.ProcessingResponse(request_body=pb.BodyResponse()),
        pb.ProcessingResponse(request_trailers=pb.TrailersResponse()),
    ]
