"""The naive pass-through processor: the cheapest possible grpc.aio ext_proc service.

It answers the request headers, the buffered body and (if any) the trailers with empty
"continue" responses and never looks inside them: the floor that any Python processor
on grpc.aio pays for one Envoy round trip per message. Like the service, it keeps the
memory a request frees for the next one (``ext_proc.edge.allocator``): otherwise each of its
large buffers faults its pages in anew, and a 1 MiB request's CPU swings between about
1.2 and 3.5 ms with the state of glibc's heap, an artefact no processor has to pay. Run
it with ``python -m bench.naive --listen HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator

import grpc

from bench import grpc_api
from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.core.config import Config
from ext_proc.edge import allocator

_ANSWERS = {
    "request_headers": pb.ProcessingResponse(request_headers=pb.HeadersResponse()),
    "request_body": pb.ProcessingResponse(request_body=pb.BodyResponse()),
    "request_trailers": pb.ProcessingResponse(request_trailers=pb.TrailersResponse()),
}


async def process(
    request_iterator: AsyncIterator[pb.ProcessingRequest],
    context: grpc.aio.ServicerContext[pb.ProcessingRequest, pb.ProcessingResponse],
) -> AsyncIterator[pb.ProcessingResponse]:
    """``Process``, served with the generated (de)serializers as any processor built on the
    generated code is (``bench.grpc_api``): each message is parsed and each answer
    serialized, and nothing more."""
    async for request in request_iterator:
        answer = _ANSWERS.get(request.WhichOneof("request"))
        if answer is not None:
            yield answer


async def serve(listen: str) -> None:
    # As much as the service keeps by default: its in-flight budget.
    allocator.keep_freed_memory(Config.model_fields["inflight_budget_bytes"].default)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", -1),
        ]
    )
    grpc_api.add_to_server(process, server)
    if server.add_insecure_port(listen) == 0:
        raise OSError(f"cannot listen on {listen}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.naive")
    parser.add_argument("--listen", required=True, help="host:port")
    asyncio.run(serve(parser.parse_args().listen))


if __name__ == "__main__":
    main()
