"""Process lifecycle: start the gRPC server, report health, drain on a signal.

Order on start: listen → start → health SERVING. On the first SIGTERM/SIGINT: health
NOT_SERVING → stop accepting and let in-flight streams finish within the grace period
→ exit. A second signal cancels the grace period.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ext_proc._pb import external_processor_pb2 as pb
from ext_proc._pb import external_processor_pb2_grpc as pb_grpc
from ext_proc.config import Config
from ext_proc.service import ExternalProcessor

log = logging.getLogger("ext_proc.server")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ExternalProcessor"].full_name


async def _set_health(servicer: health.aio.HealthServicer, status: int) -> None:
    for name in ("", SERVICE_NAME):
        await servicer.set(name, status)


async def build(config: Config) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """A started server with health SERVING, and the port it bound."""
    limit = config.grpc_message_limit
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            # Answers are bounded by the processor itself (a rewrite of an accepted body);
            # Envoy's own max_receive_message_length is the limit that matters.
            ("grpc.max_send_message_length", -1),
        ]
    )
    pb_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(config), server)
    health_servicer = health.aio.HealthServicer()
    await _set_health(health_servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(config.listen)
    if port == 0:
        raise OSError(f"cannot listen on {config.listen}")
    await server.start()
    await _set_health(health_servicer, health_pb2.HealthCheckResponse.SERVING)
    return server, health_servicer, port


async def serve(config: Config) -> None:
    stop = asyncio.Event()
    force = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        # Handlers only set flags; the sequence below does the work.
        (force if stop.is_set() else stop).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    server, health_servicer, port = await build(config)
    log.info("serving", extra={"listen": config.listen, "port": port})
    await stop.wait()
    log.info("draining", extra={"grace_seconds": config.shutdown_grace_seconds})
    await health_servicer.enter_graceful_shutdown()
    stopping = asyncio.ensure_future(server.stop(config.shutdown_grace_seconds))
    forced = asyncio.ensure_future(force.wait())
    await asyncio.wait({stopping, forced}, return_when=asyncio.FIRST_COMPLETED)
    if not stopping.done():
        await server.stop(None)
    forced.cancel()
    log.info("stopped")
