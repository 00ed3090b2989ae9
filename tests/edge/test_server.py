"""The server's phases on a real grpc.aio server on port 0, stopped by real signals; a
taken address through the real command line."""

import asyncio
import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import grpc_api
from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.core import native
from ext_proc.core.config import Config
from ext_proc.edge.metrics import STREAM_ERROR_KINDS
from ext_proc.edge.redis_record import RecordState, RedisRecord
from ext_proc.edge.server import QUIET_SECONDS, RECORD_SERVICE, Server, listen
from ext_proc.version import version
from tests.messages import headers_request, route_attributes

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(autouse=True)
def gc_settings() -> Iterator[None]:
    """Start-up freezes the heap and raises the threshold: undo it for the next tests."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def config(**overrides: object) -> Config:
    settings = {"listen": "127.0.0.1:0", "metrics_listen": "127.0.0.1:0", "event_loop": "asyncio"}
    return Config.load(environ={}, **{**settings, **overrides})


async def health(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=2
        )
        return int(reply.status)


async def one_stream(port: int) -> grpc.StatusCode:
    """A complete header-only request on a new stream; its final status."""
    request = headers_request(route_attributes({"action": "strip"}), eos=True)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = grpc_api.Stub(channel).Process(iter([request]))
        replies = [reply async for reply in call]
        assert [r.WhichOneof("response") for r in replies] == ["request_headers"]
        return await call.code()


async def started(server: Server) -> int:
    """The gRPC port, once start-up has finished (the metrics endpoint comes last)."""
    while server.running is None or server.metrics is None:
        await asyncio.sleep(0.01)
    return server.running.port


async def until(port: int, status: int) -> None:
    while await health(port) != status:
        await asyncio.sleep(0.02)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_health_is_not_serving_until_the_server_says_so():
    async def scenario() -> list[int]:
        running = await listen(config())
        try:
            before = await health(running.port)
            await running.serving()
            return [before, await health(running.port)]
        finally:
            await running.server.stop(None)

    assert run(scenario()) == [NOT_SERVING, SERVING]


def test_sigterm_drains_serving_new_streams_then_stops_with_0(caplog):
    caplog.set_level("INFO", "ext_proc.server")

    async def scenario() -> tuple[int, list[int], grpc.StatusCode]:
        server = Server(config(drain_seconds=0.6, shutdown_grace_seconds=5))
        main = asyncio.ensure_future(server.main())
        port = await started(server)
        statuses = [await health(port)]
        os.kill(os.getpid(), signal.SIGTERM)
        await until(port, NOT_SERVING)
        statuses.append(NOT_SERVING)
        served = await one_stream(port)  # still inside the drain window
        assert not main.done()
        return await main, statuses, served

    status, statuses, served = run(scenario())
    assert status == 0
    assert statuses == [SERVING, NOT_SERVING]
    assert served == grpc.StatusCode.OK
    messages = [r.getMessage() for r in caplog.records if r.name == "ext_proc.server"]
    assert messages == ["serving", "draining", "stopped"]
    (draining,) = [r for r in caplog.records if r.getMessage() == "draining"]
    assert (draining.drain_seconds, draining.grace_seconds) == (0.6, 5)
    (serving,) = [r for r in caplog.records if r.getMessage() == "serving"]
    assert serving.version == version()
    # Which implementation runs each hot part is stated, whichever it is.
    assert serving.implementation == native.implementations()


def test_a_second_signal_forces_the_stop_with_1(caplog):
    caplog.set_level("INFO", "ext_proc.server")

    async def scenario() -> int:
        server = Server(config(drain_seconds=60, shutdown_grace_seconds=60))
        main = asyncio.ensure_future(server.main())
        port = await started(server)
        os.kill(os.getpid(), signal.SIGTERM)
        await until(port, NOT_SERVING)
        os.kill(os.getpid(), signal.SIGTERM)
        return await asyncio.wait_for(main, 5)  # not the 60 s drain window

    assert run(scenario()) == 1
    messages = [r.getMessage() for r in caplog.records if r.name == "ext_proc.server"]
    assert messages == ["serving", "draining", "forced stop"]


async def stream_status(port: int) -> grpc.StatusCode:
    """A complete header-only request on a new stream; its final status, an error's too."""
    try:
        return await one_stream(port)
    except grpc.aio.AioRpcError as exc:
        return exc.code()


def test_a_draining_server_accepts_new_streams_until_they_stop_coming(caplog):
    """No drain window: the streams begun after the signal are served, one after the
    other for twice the quiet time, and the server stops only once they stopped."""
    caplog.set_level("INFO", "ext_proc.server")

    async def scenario() -> tuple[int, list[grpc.StatusCode]]:
        server = Server(config(drain_seconds=0, shutdown_grace_seconds=60))
        main = asyncio.ensure_future(server.main())
        port = await started(server)
        os.kill(os.getpid(), signal.SIGTERM)
        await until(port, NOT_SERVING)
        loop = asyncio.get_running_loop()
        end = loop.time() + 2 * QUIET_SECONDS
        codes = []
        while loop.time() < end:
            codes.append(await stream_status(port))
        assert not main.done()
        return await main, codes

    status, codes = run(scenario())
    assert status == 0
    assert len(codes) > 1
    assert set(codes) == {grpc.StatusCode.OK}
    messages = [r.getMessage() for r in caplog.records if r.name == "ext_proc.server"]
    assert messages == ["serving", "draining", "stopped"]


def blocking_stream(port: int, codes: list[grpc.StatusCode]) -> None:
    """One complete header-only stream on a channel of its own, from another thread."""
    request = headers_request(route_attributes({"action": "strip"}), eos=True)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            list(grpc_api.Stub(channel).Process(iter([request]), timeout=20))
        except grpc.RpcError as exc:
            codes.append(exc.code())
        else:
            codes.append(grpc.StatusCode.OK)


def test_streams_received_while_the_loop_was_busy_are_served_not_cancelled():
    """gRPC holds the streams that arrive while the event loop is busy until grpc.aio
    asks for them, one at a time; a server shutdown cancels those it still holds. The
    signal comes while they wait: every one is served."""

    async def scenario() -> tuple[int, list[grpc.StatusCode]]:
        server = Server(config(drain_seconds=0, shutdown_grace_seconds=60))
        main = asyncio.ensure_future(server.main())
        port = await started(server)
        codes: list[grpc.StatusCode] = []
        clients = [threading.Thread(target=blocking_stream, args=(port, codes)) for _ in range(8)]
        for client in clients:
            client.start()
        time.sleep(1)  # the loop busy: the streams arrive and wait in gRPC
        os.kill(os.getpid(), signal.SIGTERM)
        status = await main
        for client in clients:
            await asyncio.to_thread(client.join)
        return status, codes

    status, codes = run(scenario())
    assert status == 0
    assert codes == [grpc.StatusCode.OK] * 8


def test_a_stream_still_open_when_the_grace_is_over_is_ended(caplog):
    """The stream waits for a body that never comes: the stop ends it, which the
    operator reads as one line, and no internal or protocol error is logged or counted."""
    caplog.set_level("INFO", "ext_proc")

    async def scenario() -> tuple[int, grpc.StatusCode, dict[str, float]]:
        server = Server(config(drain_seconds=0, shutdown_grace_seconds=0.5))
        main = asyncio.ensure_future(server.main())
        port = await started(server)
        never = asyncio.Event()

        async def requests() -> AsyncIterator[pb.ProcessingRequest]:
            yield headers_request(route_attributes({"action": "strip"}))  # a body to come
            await never.wait()

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = grpc_api.Stub(channel).Process(requests())
            assert server.running is not None
            while server.running.processor.open_streams == 0:
                await asyncio.sleep(0.01)
            os.kill(os.getpid(), signal.SIGTERM)
            status = await main
            with contextlib.suppress(grpc.aio.AioRpcError):
                assert [r.WhichOneof("response") async for r in call] == ["request_headers"]
            errors = server.running.processor.metrics.stream_errors
            counted = {kind: errors.labels(kind)._value.get() for kind in STREAM_ERROR_KINDS}
            return status, await call.code(), counted

    status, code, counted = run(scenario())
    assert status == 0
    assert code == grpc.StatusCode.UNAVAILABLE  # gRPC's "Cancelling all calls"
    messages = [r.getMessage() for r in caplog.records if r.name == "ext_proc.server"]
    assert messages == ["serving", "draining", "grace period over; ending open streams", "stopped"]
    (over,) = [r for r in caplog.records if r.getMessage().startswith("grace period over")]
    assert over.open_streams == 1
    decisions = [r for r in caplog.records if r.name == "ext_proc.decision"]
    assert [(r.levelname, r.getMessage()) for r in decisions] == [
        ("WARNING", "stream ended at shutdown")
    ]
    assert decisions[0].exc_info is None
    assert decisions[0].request_id == ""  # no x-request-id sent
    assert counted == {"protocol_violation": 0, "internal": 0, "cancelled": 0, "shutdown": 1}


def serve(*args: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXT_PROC_")}
    command = [sys.executable, "-m", "ext_proc", "serve", *args]
    return subprocess.run(
        command,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, **(environ or {})},
    )


@contextlib.contextmanager
def taken() -> Iterator[str]:
    """An address some other socket listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield f"127.0.0.1:{holder.getsockname()[1]}"


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    record = json.loads(line)
    assert record["level"] == "error"
    return str(record["message"])


def test_a_taken_listen_address_is_one_error_line_and_exit_2():
    with taken() as address:
        message = one_error_line(serve("--listen", address, "--metrics-listen", ""))
    assert message.startswith(f"cannot listen on {address}: ")
    assert "listen / --listen / EXT_PROC_LISTEN" in message


def test_a_taken_metrics_address_is_one_error_line_and_exit_2():
    with taken() as address:
        message = one_error_line(serve("--listen", "127.0.0.1:0", "--metrics-listen", address))
    assert message.startswith(f"cannot listen on {address} for metrics: ")
    assert "metrics_listen / --metrics-listen / EXT_PROC_METRICS_LISTEN" in message


async def record_health(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=RECORD_SERVICE), timeout=2
        )
        return int(reply.status)


def record_up(server: Server) -> float | None:
    assert server.running is not None
    registry = server.running.processor.metrics.registry
    return registry.get_sample_value("ext_proc_proof_record_up", {"store": "redis"})


def test_a_processor_whose_redis_does_not_answer_serves_and_says_the_record_is_down():
    """Its own health SERVING (the pod stays Ready, every route served), the record's
    NOT_SERVING and its gauge 0, the checks run again while it serves."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{holder.getsockname()[1]}/0"  # nothing listens
    settings = config(proof={"record": url, "record_timeout_seconds": 0.1})

    async def scenario() -> tuple[list[int], float | None, grpc.StatusCode, int]:
        server = Server(settings)
        main = asyncio.ensure_future(server.main())
        port = await started(server)
        record = server.running.processor.record if server.running else None
        assert isinstance(record, RedisRecord)
        while record.state is not RecordState.UNREACHABLE:  # the first check found it
            await asyncio.sleep(0.02)
        statuses = [await health(port), await record_health(port)]
        served = await one_stream(port)
        up = record_up(server)
        os.kill(os.getpid(), signal.SIGTERM)
        return statuses, up, served, await main

    statuses, up, served, status = run(scenario())
    assert statuses == [SERVING, NOT_SERVING]
    assert up == 0
    assert served == grpc.StatusCode.OK
    assert status == 0


def test_a_processor_keeping_its_own_record_says_the_record_serves():
    async def scenario() -> int:
        running = await listen(config())
        try:
            return await record_health(running.port)
        finally:
            await running.server.stop(None)

    assert run(scenario()) == SERVING
