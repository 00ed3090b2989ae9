"""Process lifecycle: one ``Server`` whose life runs in named phases.

``startup``: bind the gRPC address → start → health SERVING → freeze the heap → the
metrics endpoint → log "serving" → with a Redis record, its checks every
``PROBE_SECONDS``. ``serve``: wait for the first SIGTERM/SIGINT.
``drain``: health NOT_SERVING at once, then the drain window (``drain_seconds``: Envoy's
health checks see NOT_SERVING and stop sending new streams, which are still served
meanwhile). ``settle``: still accepting and serving every stream, until no stream is
open and none has begun for ``QUIET_SECONDS`` (Envoy has moved away) or
``shutdown_grace_seconds`` have passed. ``stop``: stop accepting; what is still open
then is ended → exit 0. A second signal at any point cancels what is left and exits 1.
An address that cannot be bound ends start-up with one error line and exit status 2.
Signal handlers only set flags; the phases do the work.

Why accepting lasts until idle: gRPC's server shutdown (the first thing
``grpc.aio.Server.stop`` does, whatever its grace) stops listening, sends GOAWAY and
cancels every call it has received but not yet handed to the servicer; the grace covers
only calls already handed over. grpc.aio asks for one call at a time between the event
loop's other work, so under load the calls of the last milliseconds are still waiting
in gRPC's queue, and streams Envoy sent before it read the GOAWAY are refused: each is a
failed request (Envoy's 500) that no grace would save. Stopping only once Envoy has
stopped opening streams leaves nothing waiting to be cancelled.

Readiness is the gRPC health service: ``""`` and the ExternalProcessor's name say
whether this process serves (every route: one that needs no record of spent proofs is
served whatever the record's state); ``RECORD_SERVICE`` says whether the record of
spent proofs can be consulted (SERVING, or NOT_SERVING while a Redis record cannot be
reached or cannot keep the record: then no proof is honored, its decode legs
recompute). A pod stays Ready through a Redis outage; ``ext_proc_proof_record_up`` and
``RECORD_SERVICE`` state what is degraded.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.core import native
from ext_proc.core.address import UNIX_PREFIX, HostPort
from ext_proc.core.config import Config, ConfigError
from ext_proc.core.replay import Record
from ext_proc.edge import allocator, logs, service, tracing
from ext_proc.edge.metrics import Endpoint, Metrics, serve_metrics
from ext_proc.edge.record import LocalRecord, table_path
from ext_proc.edge.redis_record import PROBE_SECONDS, RecordState, RedisRecord
from ext_proc.edge.service import ExternalProcessor
from ext_proc.edge.supervisor import STOP_WORKER
from ext_proc.version import version

log = logging.getLogger("ext_proc.server")
GC_THRESHOLD = 20_000  # CPython's default is 700
# How often the in-flight gauges are read: a request costs no gauge update.
SAMPLE_SECONDS = 1.0
# Draining, a server that saw no stream open or begin for this long is no longer sent
# any: a gateway still sending here opens streams milliseconds apart under load.
QUIET_SECONDS = 0.5
# How often a settling server looks at its streams.
SETTLE_POLL_SECONDS = 0.05
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ExternalProcessor"].full_name
# The health service name whose status is the record of spent proofs' (not the pod's).
RECORD_SERVICE = "ext_proc.ProofRecord"


async def _set_health(servicer: health.aio.HealthServicer, status: int) -> None:
    for name in ("", SERVICE_NAME):
        await servicer.set(name, status)


@dataclass
class Running:
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    processor: ExternalProcessor
    port: int

    async def serving(self) -> None:
        await _set_health(self.health, health_pb2.HealthCheckResponse.SERVING)


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


def _cannot_listen(listen: str, reason: object) -> ConfigError:
    return ConfigError(
        f"cannot listen on {listen}: {reason} (setting: listen / --listen / EXT_PROC_LISTEN)"
    )


def check_free(listen: str) -> None:
    """Raise ``ConfigError`` when no address ``listen`` resolves to can be bound.

    gRPC reports a taken port only as a core log line and a bare ``RuntimeError``; the
    same bind (SO_REUSEADDR) tried first names the cause.
    """
    if listen.startswith(UNIX_PREFIX):
        return
    address = HostPort.parse(listen, allow_zero=True)
    if address.port == 0:
        return
    error: OSError | None = None
    try:
        found = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise _cannot_listen(listen, exc.strerror or exc) from None
    for family, kind, proto, _, sockaddr in found:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                error = exc
            else:
                return
    raise _cannot_listen(listen, error.strerror if error else "no address") from None


def open_record(config: Config, metrics: Metrics, shared: Path | None = None) -> Record:
    """The record of spent proofs: Redis when configured, else the table in ``shared``
    (a worker's, made by the supervisor), else one of this process's own."""
    proof = config.proof
    if proof.record:
        errors = metrics.record_errors.labels("redis")
        up = metrics.record_up.labels("redis")
        up.set(0)  # until a consultation finds it able to keep the record
        return RedisRecord(
            proof.record,
            proof.record_timeout_seconds,
            on_error=errors.inc,
            terms=proof.terms,
            password_file=proof.record_password_file,
            on_state=lambda state: up.set(1 if state is RecordState.UP else 0),
        )
    if shared is not None:
        return LocalRecord.open(shared, terms=proof.terms)
    return LocalRecord.alone(table_path(config.listen), proof.record_slots, terms=proof.terms)


async def listen(config: Config, *, record_file: Path | None = None) -> Running:
    """A started server whose health is still NOT_SERVING, and the port it bound.
    ``record_file``: the table of spent proofs shared with the other workers.

    Raises ``ConfigError`` when ``config.listen`` cannot be bound.
    """
    check_free(config.listen)
    limit = config.grpc_message_limit
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            # Answers are bounded by the processor itself (a rewrite of an accepted body);
            # Envoy's own max_receive_message_length is the limit that matters.
            ("grpc.max_send_message_length", -1),
            # gRPC shares a port by default: a second server on the same port must fail
            # instead of silently splitting the traffic (each worker has its own port).
            ("grpc.so_reuseport", 0),
        ]
    )
    metrics = Metrics()
    record = open_record(config, metrics, record_file)
    spans = tracing.start(config.tracing)
    processor = ExternalProcessor(config, metrics=metrics, record=record, spans=spans)
    service.add_to_server(processor.Process, server)
    health_servicer = health.aio.HealthServicer()
    await _set_health(health_servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
    # A table this process keeps itself is always there; a Redis once it answers.
    await health_servicer.set(RECORD_SERVICE, _record_status(record))
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    credentials = _credentials(config)
    try:
        if credentials is None:
            port = server.add_insecure_port(config.listen)
        else:
            port = server.add_secure_port(config.listen, credentials)
    except RuntimeError:  # taken between the check and the bind
        port = 0
    if port == 0 and not config.listen.startswith(UNIX_PREFIX):
        raise _cannot_listen(config.listen, "the address cannot be bound")
    await server.start()
    return Running(server, health_servicer, processor, port)


def _record_status(record: Record) -> int:
    """The record's health status: SERVING while it can be consulted."""
    down = isinstance(record, RedisRecord) and record.state is not RecordState.UP
    status: int = (
        health_pb2.HealthCheckResponse.NOT_SERVING
        if down
        else health_pb2.HealthCheckResponse.SERVING
    )
    return status


async def watch_record(running: Running, every: float = PROBE_SECONDS) -> None:
    """With a Redis record: its start-up checks now and every ``every`` seconds until
    cancelled, each finding reported as ``RECORD_SERVICE``'s health (the metric and
    the log follow the record's state themselves). The processor serves throughout:
    a Redis that went away, or was away at start-up, costs honored proofs only."""
    record = running.processor.record
    if not isinstance(record, RedisRecord):
        return
    while True:
        await record.probe()
        await running.health.set(RECORD_SERVICE, _record_status(record))
        await asyncio.sleep(every)


async def build(config: Config) -> Running:
    """A started server with health SERVING, and the port it bound (0 for a socket file)."""
    running = await listen(config)
    await running.serving()
    return running


async def until_idle(processor: ExternalProcessor, grace: float) -> bool:
    """True once no stream has been open or begun for ``QUIET_SECONDS``; False when
    ``grace`` seconds pass first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    begun, quiet_since = -1, loop.time()
    while (now := loop.time()) < deadline:
        if processor.open_streams or processor.streams_begun != begun:
            begun, quiet_since = processor.streams_begun, now
        elif now - quiet_since >= QUIET_SECONDS:
            return True
        await asyncio.sleep(min(SETTLE_POLL_SECONDS, deadline - now))
    return False


def loop_factory(config: Config) -> Callable[[], asyncio.AbstractEventLoop]:
    if config.event_loop == "uvloop":
        import uvloop  # noqa: PLC0415 - only when chosen

        return uvloop.new_event_loop
    return asyncio.new_event_loop


class Server:
    """One process's gRPC server, from start-up to exit.

    A ``worker`` runs under the supervisor, which owns the metrics endpoint and SIGINT.
    """

    def __init__(
        self, config: Config, *, worker: bool = False, record_file: Path | None = None
    ) -> None:
        self.config = config
        self.worker = worker
        self.record_file = record_file
        self.stopping = asyncio.Event()
        self.forced = asyncio.Event()
        self.running: Running | None = None
        self.metrics: Endpoint | None = None
        self.sampler: asyncio.Task[None] | None = None
        self.watcher: asyncio.Task[None] | None = None

    def on_signal(self) -> None:
        # Handlers only set flags; the phases do the work.
        (self.forced if self.stopping.is_set() else self.stopping).set()

    async def main(self) -> int:
        """Every phase in order; the exit status (0 drained, 1 forced, 2 cannot listen)."""
        loop = asyncio.get_running_loop()
        # A worker leaves SIGTERM and SIGINT to its supervisor, which sends STOP_WORKER.
        signals = (STOP_WORKER,) if self.worker else (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            loop.add_signal_handler(sig, self.on_signal)
        try:
            try:
                await self.startup()
            except ConfigError as exc:
                log.error(str(exc))  # noqa: TRY400 - one line naming the setting, no traceback
                return 2  # as for any other invalid configuration
            await self.serve()
            if not await self.drain() or not await self.settle() or not await self.stop():
                log.warning("forced stop")  # _close cancels the streams left
                return 1
            log.info("stopped")
            return 0
        finally:
            await self._close()
            for sig in signals:
                loop.remove_signal_handler(sig)

    @property
    def _server(self) -> grpc.aio.Server:
        assert self.running is not None, "started"
        return self.running.server

    async def startup(self) -> None:
        config = self.config
        self.running = await listen(config, record_file=self.record_file)
        await self.running.serving()
        # Everything alive now lives as long as the process: keep it out of every
        # collection. Parsing a large body allocates many containers at once; a higher
        # first threshold avoids a cascade of young collections per request. That is safe
        # only while a finished request leaves no reference cycle holding its body:
        # refusals are values and no exception outlives its handler (tests/edge/test_service.py
        # checks the refusal paths).
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD, 20, 20)
        if not allocator.keep_freed_memory(config.inflight_budget_bytes):
            log.info("allocator not tuned: large bodies fault their memory in anew")
        if not self.worker and config.metrics_address is not None:
            registry = self.running.processor.metrics.registry
            self.metrics = serve_metrics(config.metrics_address, registry)
        self.sampler = asyncio.ensure_future(self._sample(self.running.processor))
        self.watcher = asyncio.ensure_future(watch_record(self.running))
        log.info(
            "serving",
            extra={
                "version": version(),
                "listen": config.listen,
                "port": self.running.port,
                "event_loop": config.event_loop,
                # 0: mint routes sign nothing and no proof verifies (not an error:
                # routes without mint or honor need no key).
                "proof_keys": len(config.proof.keys),
                "tracing": config.tracing.endpoint if config.tracing.enabled else "off",
                # Which runs each hot part: its compiled module or the Python reference.
                "implementation": native.implementations(),
            },
        )

    @staticmethod
    async def _sample(processor: ExternalProcessor) -> None:
        """Every ``SAMPLE_SECONDS``: the in-flight gauges are sampled and the batched
        log lines written."""
        while True:
            processor.sample_metrics()
            logs.flush()
            await asyncio.sleep(SAMPLE_SECONDS)

    async def serve(self) -> None:
        await self.stopping.wait()

    async def drain(self) -> bool:
        """Health NOT_SERVING, new streams still served for the window; False if forced."""
        assert self.running is not None, "started"
        log.info(
            "draining",
            extra={
                "drain_seconds": self.config.drain_seconds,
                "grace_seconds": self.config.shutdown_grace_seconds,
            },
        )
        await self.running.health.enter_graceful_shutdown()
        window = asyncio.ensure_future(asyncio.sleep(self.config.drain_seconds))
        try:
            return not await self._forced_before(window)
        finally:
            window.cancel()

    async def settle(self) -> bool:
        """Serve on, accepting, until idle or the grace is over; False if forced."""
        assert self.running is not None, "started"
        idle = asyncio.ensure_future(
            until_idle(self.running.processor, self.config.shutdown_grace_seconds)
        )
        try:
            if await self._forced_before(idle):
                return False
        finally:
            idle.cancel()
        if not idle.result() and self.running.processor.open_streams:
            log.warning(
                "grace period over; ending open streams",
                extra={"open_streams": self.running.processor.open_streams},
            )
        return True

    async def stop(self) -> bool:
        """Stop accepting; what is still open is ended. False if forced."""
        # Idle: nothing is open. Otherwise the grace is over. A stream begun this instant
        # is ended either way: the gateway is still sending here, and nothing stays.
        # Not cancelled when forced: the forced stop in _close runs alongside and ends it.
        self._ending()
        ended = asyncio.ensure_future(self._server.stop(0))
        return not await self._forced_before(ended)

    def _ending(self) -> None:
        """From here every stream still open is ended by the stop, and logged so."""
        assert self.running is not None, "started"
        self.running.processor.stopping = True

    async def _forced_before(self, phase: asyncio.Future[Any]) -> bool:
        """Wait for ``phase`` unless a second signal comes first; True when it did."""
        forced: asyncio.Future[Any] = asyncio.ensure_future(self.forced.wait())
        try:
            await asyncio.wait({phase, forced}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            forced.cancel()
        return self.forced.is_set()

    async def _close(self) -> None:
        """On every exit path: nothing left listening (idempotent after a clean stop)."""
        for task in (self.sampler, self.watcher):
            if task is not None:
                task.cancel()
        if self.running is not None:
            self._ending()
            await self.running.server.stop(None)
            await self.running.processor.record.close()
            spans = self.running.processor.spans
            if spans is not None:
                await asyncio.to_thread(spans.shutdown)  # the spans still queued exported
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.close)
        logs.flush()


def run(config: Config, *, worker: bool = False, record_file: Path | None = None) -> int:
    """Serve on the configured event loop until signalled; the exit status."""
    with asyncio.Runner(loop_factory=loop_factory(config)) as runner:
        return runner.run(Server(config, worker=worker, record_file=record_file).main())
