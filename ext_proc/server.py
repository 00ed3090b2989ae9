"""Process lifecycle: start the gRPC server, report health, drain on a signal.

Start: listen → start → health SERVING. First SIGTERM/SIGINT: health NOT_SERVING at
once → the drain window (``drain_seconds``: Envoy's health checks see NOT_SERVING and
stop sending new streams, which are still served meanwhile) → stop accepting and let
in-flight streams finish within ``shutdown_grace_seconds`` → exit 0. A second signal
at any point cancels what is left and exits 1.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from ext_proc._pb import external_processor_pb2 as pb
from ext_proc._pb import external_processor_pb2_grpc as pb_grpc
from ext_proc.config import Config
from ext_proc.metrics import Metrics
from ext_proc.service import ExternalProcessor

log = logging.getLogger("ext_proc.server")
GC_THRESHOLD = 20_000  # CPython's default is 700
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ExternalProcessor"].full_name


async def _set_health(servicer: health.aio.HealthServicer, status: int) -> None:
    for name in ("", SERVICE_NAME):
        await servicer.set(name, status)


@dataclass
class Running:
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    processor: ExternalProcessor
    port: int


def _credentials(config: Config) -> grpc.ServerCredentials | None:
    if config.tls is None:
        return None
    tls = config.tls
    client_ca = Path(tls.client_ca_file).read_bytes() if tls.client_ca_file else None
    return grpc.ssl_server_credentials(
        [(Path(tls.key_file).read_bytes(), Path(tls.cert_file).read_bytes())],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


async def build(config: Config, *, reuse_port: bool = False) -> Running:
    """A started server with health SERVING, and the port it bound (0 for a socket file)."""
    limit = config.grpc_message_limit
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            # Answers are bounded by the processor itself (a rewrite of an accepted body);
            # Envoy's own max_receive_message_length is the limit that matters.
            ("grpc.max_send_message_length", -1),
            # Several workers share one port only when asked; otherwise a second server on
            # the same port must fail instead of silently splitting the traffic.
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ]
    )
    processor = ExternalProcessor(config, metrics=Metrics())
    pb_grpc.add_ExternalProcessorServicer_to_server(processor, server)
    health_servicer = health.aio.HealthServicer()
    await _set_health(health_servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    credentials = _credentials(config)
    if credentials is None:
        port = server.add_insecure_port(config.listen)
    else:
        port = server.add_secure_port(config.listen, credentials)
    if port == 0 and not config.listen.startswith("unix:"):
        raise OSError(f"cannot listen on {config.listen}")
    await server.start()
    await _set_health(health_servicer, health_pb2.HealthCheckResponse.SERVING)
    return Running(server, health_servicer, processor, port)


def start_metrics(config: Config, running: Running) -> None:
    if not config.metrics_listen:
        return
    host, _, port = config.metrics_listen.rpartition(":")
    start_http_server(int(port), host, registry=running.processor.metrics.registry)


def loop_factory(config: Config) -> Callable[[], asyncio.AbstractEventLoop]:
    if config.event_loop == "uvloop":
        import uvloop  # noqa: PLC0415 - only when chosen

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(config: Config, *, worker: bool = False) -> int:
    """Serve on the configured event loop until signalled; the exit status."""
    with asyncio.Runner(loop_factory=loop_factory(config)) as runner:
        return runner.run(serve(config, worker=worker))


async def serve(config: Config, *, worker: bool = False) -> int:
    """Serve until signalled; the exit status (0 drained, 1 forced).

    A ``worker`` runs under the supervisor, which owns the metrics endpoint.
    """
    stop = asyncio.Event()
    force = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        # Handlers only set flags; the sequence below does the work.
        (force if stop.is_set() else stop).set()

    # A worker leaves SIGINT to its supervisor, which forwards SIGTERM.
    for sig in (signal.SIGTERM,) if worker else (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    running = await build(config, reuse_port=config.workers > 1)
    # Everything alive now lives as long as the process: keep it out of every
    # collection. Parsing a large body allocates many containers at once; a higher
    # first threshold avoids a cascade of young collections per request. That is safe
    # only while a finished request leaves no reference cycle holding its body
    # (tests/test_service.py checks the refusal paths, where kept tracebacks did).
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 20)
    if not worker:
        start_metrics(config, running)
    log.info(
        "serving",
        extra={"listen": config.listen, "port": running.port, "event_loop": config.event_loop},
    )
    await stop.wait()
    log.info(
        "draining",
        extra={
            "drain_seconds": config.drain_seconds,
            "grace_seconds": config.shutdown_grace_seconds,
        },
    )
    await running.health.enter_graceful_shutdown()
    forced = asyncio.ensure_future(force.wait())
    try:
        await asyncio.wait({forced}, timeout=config.drain_seconds)
        if not force.is_set():
            stopping = asyncio.ensure_future(running.server.stop(config.shutdown_grace_seconds))
            await asyncio.wait({stopping, forced}, return_when=asyncio.FIRST_COMPLETED)
        if force.is_set():
            log.warning("forced stop")
            await running.server.stop(None)
            return 1
    finally:
        forced.cancel()
    log.info("stopped")
    return 0
