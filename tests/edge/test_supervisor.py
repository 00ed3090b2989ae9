"""The supervisor with real spawned workers, stopped by real signals, with short backoffs."""

import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ext_proc.core.config import Config, ConfigError
from ext_proc.edge.supervisor import (
    Supervisor,
    Worker,
    worker_config,
    worker_listen,
    worker_ports,
)
from tests.edge.test_server import one_error_line, serve, taken


@pytest.fixture(autouse=True)
def temp_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Where the supervisor makes its metrics folder; it must be empty afterwards."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield tmp_path
    assert list(tmp_path.glob("ext_proc-metrics-*")) == []


def config(**overrides: object) -> Config:
    settings = {
        "listen": "127.0.0.1:0",
        "workers": 2,
        "metrics_listen": "",
        "event_loop": "asyncio",
        "drain_seconds": 0,
        "shutdown_grace_seconds": 1,
    }
    return Config.load(environ={}, **{**settings, **overrides})


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


def pid(worker: Worker) -> int | None:
    process = worker.process
    return process.pid if process is not None and process.is_alive() else None


def supervise(supervisor: Supervisor, drive: Callable[[], None]) -> int:
    """``supervisor.run()`` here, ``drive`` beside it; a SIGTERM to this process ends it."""
    failures: list[BaseException] = []

    def driver() -> None:
        try:
            drive()
        except BaseException as exc:  # reported below, once the supervisor has stopped
            failures.append(exc)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=driver)
    thread.start()
    try:
        status = supervisor.run()
    finally:
        thread.join()
    if failures:
        raise failures[0]
    return status


def test_a_dead_worker_is_restarted_and_all_stop_together(caplog):
    caplog.set_level("INFO", "ext_proc.supervisor")
    supervisor = Supervisor(config(), backoff=0.1)
    victims: list[int] = []

    def drive() -> None:
        wait_for(lambda: all(pid(w) for w in supervisor.workers))
        victim = pid(supervisor.workers[0])
        assert victim is not None
        victims.append(victim)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: pid(supervisor.workers[0]) not in (None, victim))

    assert supervise(supervisor, drive) == 0
    assert not any(w.alive for w in supervisor.workers)
    (died,) = [r for r in caplog.records if r.getMessage() == "worker died; restarting"]
    assert (died.slot, died.pid, died.exitcode) == (0, victims[0], -signal.SIGKILL)
    started = [r.slot for r in caplog.records if r.getMessage() == "worker started"]
    assert sorted(started) == [0, 0, 1]
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ


def test_a_stop_signal_is_not_held_up_by_a_pending_restart():
    supervisor = Supervisor(config(), backoff=60)
    signalled: list[float] = []

    def drive() -> None:
        wait_for(lambda: all(pid(w) for w in supervisor.workers))
        victim = pid(supervisor.workers[0])
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: supervisor.workers[0].restart_at is not None)
        signalled.append(time.monotonic())

    assert supervise(supervisor, drive) == 0
    assert time.monotonic() - signalled[0] < 15  # the restart was due in 60 s
    assert supervisor.workers[0].process is None  # never restarted


def has_metrics(supervisor: Supervisor, worker: int | None) -> bool:
    """The worker has made its metrics: it is past installing its signal handlers."""
    folder = supervisor.directory
    return folder is not None and any(f"_{worker}." in f.name for f in Path(folder).iterdir())


def test_a_sigterm_to_the_whole_process_group_drains_every_worker(caplog):
    """Each worker gets the SIGTERM as well as the supervisor (``kill -- -PGID``):
    it waits for its supervisor's word, drains once and exits 0 (not forced). The
    supervisor's comes a little later, as it would to a worker draining streams."""
    caplog.set_level("INFO", "ext_proc.supervisor")
    supervisor = Supervisor(config(drain_seconds=2, shutdown_grace_seconds=30))

    def drive() -> None:
        wait_for(lambda: all(has_metrics(supervisor, pid(w)) for w in supervisor.workers))
        for worker in supervisor.workers:
            number = pid(worker)
            assert number is not None
            os.kill(number, signal.SIGTERM)
        time.sleep(0.2)  # two signals, not one: pending ones of a kind merge
        # supervise() signals the supervisor now

    assert supervise(supervisor, drive) == 0
    (stopped,) = [r for r in caplog.records if r.getMessage() == "stopped"]
    assert stopped.exit_codes == [0, 0]


def test_a_worker_failing_at_start_up_is_given_up_on_with_exit_1(caplog, tmp_path):
    caplog.set_level("INFO", "ext_proc.supervisor")
    missing = str(tmp_path / "missing.pem")  # each worker fails to read it (status 1)
    tls = {"cert_file": missing, "key_file": missing}
    status = Supervisor(config(tls=tls), backoff=0.05, give_up_after=2).run()
    assert status == 1
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("worker keeps failing at start-up; giving up") == 1
    assert messages[-1] == "stopped"
    (gave_up,) = [r for r in caplog.records if r.getMessage().endswith("giving up")]
    assert (gave_up.failures, gave_up.exitcode) == (2, 1)


def test_a_taken_metrics_address_is_one_error_line_and_exit_2(temp_folder):
    with taken() as address:
        done = serve(
            "--workers", "2", "--listen", "127.0.0.1:0", "--metrics-listen", address,
            environ={"TMPDIR": str(temp_folder)},
        )  # fmt: skip
    message = one_error_line(done)
    assert message.startswith(f"cannot listen on {address} for metrics: ")


def test_an_address_another_process_serves_is_refused_before_any_worker_starts(caplog):
    """Workers of another processor sharing the port (SO_REUSEPORT) would keep a table
    of spent proofs of their own: one bind without it tells."""
    caplog.set_level("INFO", "ext_proc.supervisor")
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        address = f"127.0.0.1:{other.getsockname()[1]}"
        supervisor = Supervisor(config(listen=address))
        assert supervisor.run() == 2
    assert all(worker.process is None for worker in supervisor.workers)
    assert any(r.getMessage().startswith(f"cannot listen on {address}") for r in caplog.records)


def test_each_worker_listens_on_its_own_port_from_the_configured_one():
    """Worker i serves port base + i, so Envoy lists each as an endpoint and spreads
    streams by its load balancer; SO_REUSEPORT would spread connections only."""
    assert [worker_listen("127.0.0.1:9000", slot) for slot in range(3)] == [
        "127.0.0.1:9000",
        "127.0.0.1:9001",
        "127.0.0.1:9002",
    ]
    assert worker_listen("[::1]:50051", 1) == "[::1]:50052"
    assert worker_listen("ext-proc.local:50051", 1) == "ext-proc.local:50052"
    # Any free port: each worker its own, none known beforehand.
    assert worker_listen("127.0.0.1:0", 1) == "127.0.0.1:0"


def test_a_worker_is_configured_as_one_process_on_its_own_port():
    """``workers: 1`` in a worker's own configuration: it binds its port without
    SO_REUSEPORT (ext_proc/edge/server.py sets it only for ``workers > 1``), so a second
    server on a worker's port fails instead of silently sharing it."""
    settings = config(listen="127.0.0.1:9000", workers=3)
    mine = worker_config(settings, 2)
    assert (mine.listen, mine.workers) == ("127.0.0.1:9002", 1)
    assert mine.model_copy(update={"listen": settings.listen, "workers": 3}) == settings


def test_the_workers_ports_must_all_exist():
    with pytest.raises(ConfigError, match="workers: 3 from port 65534 need ports up to 65536"):
        worker_ports("127.0.0.1:65534", 3)
    assert worker_ports("127.0.0.1:65534", 2) == ["127.0.0.1:65534", "127.0.0.1:65535"]


def test_ports_past_the_last_are_one_error_line_and_exit_2(
    caplog: pytest.LogCaptureFixture,
) -> None:
    supervisor = Supervisor(config(listen="127.0.0.1:65535"))
    assert supervisor.run() == 2
    assert all(worker.process is None for worker in supervisor.workers)
    assert any("need ports up to 65536" in r.getMessage() for r in caplog.records)


def free_pair() -> int:
    """A port whose next one is free too (each checked by binding it)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            base = int(first.getsockname()[1])
            if base == 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", base + 1))
                except OSError:
                    continue
                return base
    raise AssertionError("no two consecutive free ports")


def test_a_taken_port_of_a_later_worker_is_refused_before_any_worker_starts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = free_pair()
    with socket.socket() as other:
        other.bind(("127.0.0.1", base + 1))
        other.listen(1)
        supervisor = Supervisor(config(listen=f"127.0.0.1:{base}"))
        assert supervisor.run() == 2
    assert all(worker.process is None for worker in supervisor.workers)
    assert any(
        r.getMessage().startswith(f"cannot listen on 127.0.0.1:{base + 1}") for r in caplog.records
    )


def accepts(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_every_worker_serves_its_own_port():
    base = free_pair()
    supervisor = Supervisor(config(listen=f"127.0.0.1:{base}"))

    def drive() -> None:
        wait_for(lambda: accepts(base) and accepts(base + 1))

    assert supervise(supervisor, drive) == 0
    assert not accepts(base)
    assert not accepts(base + 1)
