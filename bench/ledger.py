"""The cost ledger's processors: the service's pieces added one at a time.

Each rung is a processor that does what the rung before it did and one piece more, so
that a benchmark run measuring every rung side by side (``python -m bench --cells
ledger``) says what each piece costs per request, in the processor's CPU and in Envoy's.
The first rung is the floor itself (``bench/naive.py``), the last the shipped service
(``python -m ext_proc serve``); the rungs between run the service's own code
(``ext_proc.edge`` and ``ext_proc.core``), never a copy of it:

- ``rw``: the floor answering through ``context.read()``/``context.write()`` (the
  service's API) instead of an async generator;
- ``uvloop``: the same on uvloop, the service's default event loop;
- ``decode``: each message decoded into the stream machine's event (``codec.Decoder``:
  the request attributes Envoy sends with the first message);
- ``scan``: the body's bytes counted for every carrier name (``spelling.spelled``, the
  pre-scan that lets a body without carriers through unparsed);
- ``machine``: the stream machine and the policy instead (``Stream.handle``: the scan,
  the route policy, the endpoint checks, and parsing and judging where the scan found a
  carrier), still answering with the floor's empty answer;
- ``encode``: the stream machine's own answers (``codec.Encoder``: a rewritten body,
  a local reply, the decision as dynamic metadata that Envoy merges and logs);
- ``servicer``: the service's servicer (``ExternalProcessor``: metrics, decision
  logs, the body timer, the in-flight budget and the record of spent proofs) behind the
  service's gRPC server with its health service (``server.listen``), without the
  process's tuning;
- the service itself adds the process: the heap frozen and the collector's threshold
  raised, the metrics endpoint, the in-flight gauges' sampler.

Every rung keeps freed memory as the floor and the service do (``allocator``). A rung
below ``encode`` answers a body the stream machine would rewrite or refuse with the
floor's empty answer: compare such cells from ``encode`` on only.

Run one with ``python -m bench.ledger --listen HOST:PORT --rung RUNG --config FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

import grpc
import uvloop

from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.core.budget import Budget
from ext_proc.core.config import Config
from ext_proc.core.events import Event, RequestBody, RequestHeaders, RequestTrailers
from ext_proc.core.proof import Trust
from ext_proc.core.spelling import spelled
from ext_proc.core.stream import Stream
from ext_proc.core.vllm_request import CARRIER_NAMES
from ext_proc.edge import allocator, logs, server, service
from ext_proc.edge.attributes import attribute_keys
from ext_proc.edge.codec import Decoder, Encoder
from ext_proc.edge.keys import KeyRing

# The processor rungs in order; each does the one before's work and its own piece.
RUNGS = ("rw", "uvloop", "decode", "scan", "machine", "encode", "servicer")
# What each rung adds to the one before it (the floor before the first, the last rung
# before the shipped service), for the report.
ADDS = {
    "rw": "the read/write API instead of an async generator",
    "uvloop": "uvloop instead of asyncio's loop",
    "decode": "decoding the message and its request attributes",
    "scan": "the carrier scan of the body's bytes",
    "machine": "the stream machine and the policy (the scan included)",
    "encode": "the machine's own answers, the decision metadata with them",
    "servicer": "the servicer (metrics, logs, timer, budget, record) and its server",
    "service": "the process (frozen heap, collector threshold, metrics endpoint, sampler)",
}
# The floor's empty answers, serialized: every rung is served as the service is, its
# messages and answers as bytes (``service.add_to_server``).
_EMPTY = {
    "request_headers": pb.ProcessingResponse(request_headers=pb.HeadersResponse()),
    "request_body": pb.ProcessingResponse(request_body=pb.BodyResponse()),
    "request_trailers": pb.ProcessingResponse(request_trailers=pb.TrailersResponse()),
}
_EMPTY_BYTES = {kind: response.SerializeToString() for kind, response in _EMPTY.items()}
_EMPTY_OF: dict[type[Event], bytes] = {
    RequestHeaders: _EMPTY_BYTES["request_headers"],
    RequestBody: _EMPTY_BYTES["request_body"],
    RequestTrailers: _EMPTY_BYTES["request_trailers"],
}


class Rung:
    """A rung below ``servicer``: one coroutine per stream, read and write through the
    call's context as the service does, the messages and answers as bytes; the rungs
    below ``decode`` parse a message with upb, as gRPC's deserializer did for them."""

    def __init__(self, rung: str, config: Config) -> None:
        self._upto = RUNGS.index(rung)
        self._config = config
        self._decode = Decoder(attribute_keys(config.route_metadata_namespace))
        self._encode = Encoder(config.route_metadata_namespace)
        self._budget = Budget(config.inflight_budget_bytes)
        self._trust = Trust(keys=KeyRing(config.proof.keys).current)

    def _reaches(self, rung: str) -> bool:
        return self._upto >= RUNGS.index(rung)

    async def Process(  # noqa: N802 - name fixed by the gRPC service
        self,
        request_iterator: object,
        context: service.Context,
    ) -> None:
        stream = None
        if self._reaches("machine"):
            stream = Stream(self._config, self._budget, self._trust)
        try:
            while True:
                request = await context.read()
                if request is grpc.aio.EOF:
                    return
                for answer in self._answers(request, stream):
                    await context.write(answer)
        finally:
            if stream is not None:
                stream.close()

    def _answers(self, request: bytes, stream: Stream | None) -> list[bytes]:
        if not self._reaches("decode"):
            return [_EMPTY_BYTES[pb.ProcessingRequest.FromString(request).WhichOneof("request")]]
        event = self._decode(request)
        empty = [_EMPTY_OF[type(event)]]
        if stream is None:
            if self._reaches("scan") and isinstance(event, RequestBody):
                spelled(event.chunk, CARRIER_NAMES)
            return empty
        step = stream.handle(event)
        if step.ask is not None:
            raise RuntimeError("a rung below the servicer has no record of spent proofs")
        self._budget.release(step.held)
        return self._encode(step) if self._reaches("encode") else empty


async def _serve(listen: str, rung: str, config: Config) -> None:
    allocator.keep_freed_memory(config.inflight_budget_bytes)
    if rung == "servicer":
        logs.configure(config.log_level)
        running = await server.listen(config)
        await running.serving()
        grpc_server = running.server
    else:
        grpc_server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", config.grpc_message_limit),
                ("grpc.max_send_message_length", -1),
            ]
        )
        service.add_to_server(Rung(rung, config).Process, grpc_server)
        if grpc_server.add_insecure_port(listen) == 0:
            raise OSError(f"cannot listen on {listen}")
        await grpc_server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await grpc_server.stop(1)


def loop_factory(rung: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """asyncio's loop for the first rung, uvloop from the second on."""
    return asyncio.new_event_loop if rung == "rw" else uvloop.new_event_loop


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger")
    parser.add_argument("--listen", required=True, help="host:port")
    parser.add_argument("--rung", required=True, choices=RUNGS)
    parser.add_argument("--config", required=True, type=Path, help="the service's config")
    args = parser.parse_args()
    config = Config.load(args.config, listen=args.listen)
    with asyncio.Runner(loop_factory=loop_factory(args.rung)) as runner:
        runner.run(_serve(args.listen, args.rung, config))


if __name__ == "__main__":
    main()
