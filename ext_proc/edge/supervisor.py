"""``--workers N``: N processes serving consecutive TCP ports, kept alive by a supervisor.

Worker i serves the configured port plus i (``worker_listen``), on its own socket: Envoy
lists every port as an endpoint of the processor cluster (``envoygen``'s
``processor_workers``) and picks one per stream, and health-checks each worker by
itself. One port shared through SO_REUSEPORT would spread connections instead, and
Envoy multiplexes every stream of one of its worker threads on a single connection
(more only past ``max_concurrent_streams``): one worker would serve them all.

The supervisor knows nothing about ext_proc: it starts workers (each a full
``server.Server`` with ``workers: 1`` on its own port, ``worker_config``), restarts one
that dies,
serves the aggregated Prometheus metrics, makes the table of spent proofs they share
(``record``), and forwards stop signals: the first SIGTERM
or SIGINT starts every worker's drain, a second one forces them all. A worker ignores
SIGTERM and SIGINT and stops on its supervisor's word only (``STOP_WORKER``): a SIGTERM
sent to the whole process group (``kill -- -PGID``, systemd's control-group kill) reaches
every worker too, which would take the supervisor's forwarded one as a second signal and
force its stop.

Its loop never sleeps through work: it waits for a worker to exit, a signal, or the
next scheduled restart, whichever comes first. A dead worker is restarted
``backoff`` seconds later (a deadline, not a sleep), so a stop signal or another
worker's death is handled meanwhile. A worker that dies within ``QUICK_SECONDS`` of its
start counts as a start-up failure; after ``give_up_after`` of them in a row in one
slot (its port is taken, its certificate unreadable: restarting cannot help) the
supervisor logs "worker keeps failing at start-up; giving up", drains the other
workers and exits 1. The metrics folder is removed on every exit path.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Final

from prometheus_client import multiprocess

from ext_proc.core.address import UNIX_PREFIX, HostPort
from ext_proc.core.config import Config, ConfigError
from ext_proc.edge import logs, metrics, record

log = logging.getLogger("ext_proc.supervisor")
RESTART_BACKOFF_SECONDS: Final = 1.0
QUICK_SECONDS: Final = 10.0
GIVE_UP_AFTER: Final = 5
# The longest the loop waits without looking: a safety net, every event wakes it.
TICK_SECONDS: Final = 1.0
MULTIPROC_DIR: Final = "PROMETHEUS_MULTIPROC_DIR"
_PR_SET_PDEATHSIG: Final = 1  # linux/prctl.h
STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
# What a supervisor sends a worker to stop it: the first drains, a second forces.
STOP_WORKER: Final = signal.SIGUSR1
# A worker stopped while still starting up: it held no streams.
CLEAN_EXITS: Final = (0, -signal.SIGTERM, -STOP_WORKER)


def worker_listen(listen: str, slot: int) -> str:
    """The address worker ``slot`` serves: the configured port plus ``slot``; port 0 (any
    free port) stays 0, each worker its own. Not checked against the last port:
    ``worker_ports`` is."""
    address = HostPort.parse(listen, allow_zero=True)
    if address.port == 0:
        return listen
    return str(HostPort(address.host, address.port + slot))


def worker_ports(listen: str, workers: int) -> list[str]:
    """Every worker's address, in slot order; ``ConfigError`` when the last port would
    pass 65535."""
    if listen.startswith(UNIX_PREFIX):
        return [listen]  # one process only (the configuration refuses more)
    last = HostPort.parse(listen, allow_zero=True).port + workers - 1
    if workers > 1 and last > 65535:
        first = last - workers + 1
        raise ConfigError(
            f"workers: {workers} from port {first} need ports up to {last} "
            "(setting: listen / --listen / EXT_PROC_LISTEN, workers / --workers)"
        )
    return [worker_listen(listen, slot) for slot in range(workers)]


def worker_config(config: Config, slot: int) -> Config:
    """Worker ``slot``'s own configuration: its port, and one process on it, so it binds
    the port without SO_REUSEPORT and a second server there fails instead of sharing it."""
    return config.model_copy(update={"listen": worker_listen(config.listen, slot), "workers": 1})


def _die_with(supervisor: int) -> None:
    """The kernel kills this worker when its supervisor dies (Linux's
    PR_SET_PDEATHSIG), and a supervisor already gone ends it now. A worker outliving
    its supervisor would keep serving the port with the old table of spent proofs
    beside a restarted processor's new one: a proof could be honored in each."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != supervisor:  # it died before the line above
        os._exit(1)


def _worker(config: Config, record_file: Path | None, supervisor: int) -> None:
    # Ctrl-C or a SIGTERM to the whole process group reaches every worker too; only the
    # supervisor reacts to them and it sends STOP_WORKER, so a worker never sees one
    # signal twice.
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    _die_with(supervisor)
    logs.configure(config.log_level)
    from ext_proc.edge.server import run  # noqa: PLC0415 - imported in the child only

    raise SystemExit(run(config, worker=True, record_file=record_file))


@dataclass
class Worker:
    """One slot: its current process, when that started, and a pending restart."""

    slot: int
    process: BaseProcess | None = None
    started: float = 0.0
    restart_at: float | None = None
    quick_failures: int = 0

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    @property
    def died(self) -> bool:
        """Exited, and not yet handled (no restart scheduled)."""
        return self.process is not None and not self.alive and self.restart_at is None

    def terminate(self) -> None:
        """``STOP_WORKER``: the first one drains, a second one forces."""
        if self.process is not None and self.process.pid is not None and self.alive:
            os.kill(self.process.pid, STOP_WORKER)


class Supervisor:
    def __init__(
        self,
        config: Config,
        *,
        backoff: float = RESTART_BACKOFF_SECONDS,
        give_up_after: int = GIVE_UP_AFTER,
    ) -> None:
        self.config = config
        self.backoff = backoff
        self.give_up_after = give_up_after
        self.context = multiprocessing.get_context("spawn")
        self.workers = [Worker(slot) for slot in range(config.workers)]
        self.directory: str | None = None
        # The table of spent proofs every worker maps (None: Redis keeps them).
        self.record_file: Path | None = None
        self.signals: list[int] = []
        self.forwarded = 0
        self.stopping = False
        self.gave_up = False

    def run(self) -> int:
        """Supervise until stopped; the exit status. Cleans up on every path."""
        cleanup = contextlib.ExitStack()
        try:
            wake = self._catch_signals(cleanup)
            # Every worker's port free now: a taken one would make its worker fail at
            # every start.
            from ext_proc.edge.server import check_free  # noqa: PLC0415 - grpc in workers only

            try:
                for address in worker_ports(self.config.listen, len(self.workers)):
                    check_free(address)
            except ConfigError as exc:
                log.error(str(exc))  # noqa: TRY400 - one line naming the setting, no traceback
                return 2
            self.directory = _metrics_folder(cleanup)
            if not self.config.proof.record:
                try:
                    # Port 0: a table no later process finds; in this supervisor's folder.
                    self.record_file = record.table_path(self.config.listen) or (
                        Path(self.directory) / "spent-proofs"
                    )
                    lock = record.begin(
                        self.record_file,
                        self.config.proof.record_slots,
                        terms=self.config.proof.terms,
                    )
                except ConfigError as exc:
                    log.error(str(exc))  # noqa: TRY400 - one line naming the file, no traceback
                    return 2
                # Held while the workers map the table: no other processor replaces it.
                cleanup.callback(os.close, lock)
            if self.config.metrics_address is not None:
                registry = metrics.aggregate(self.directory)
                try:
                    endpoint = metrics.serve_metrics(self.config.metrics_address, registry)
                except ConfigError as exc:
                    log.error(str(exc))  # noqa: TRY400 - one line naming the setting, no traceback
                    return 2  # as for any other invalid configuration
                cleanup.callback(endpoint.close)
            # Only after an unexpected error can a worker still run then; it drains.
            cleanup.callback(self._terminate_all)
            for worker in self.workers:
                self._start(worker)
            while (status := self._step(time.monotonic())) is None:
                self._wait(wake)
            return status
        finally:
            cleanup.close()

    def _catch_signals(self, cleanup: contextlib.ExitStack) -> socket.socket:
        """Stop signals set a flag and wake the loop through the returned socket."""
        reader, writer = socket.socketpair()
        for end in (reader, writer):
            cleanup.callback(end.close)
            end.setblocking(False)
        cleanup.callback(signal.set_wakeup_fd, signal.set_wakeup_fd(writer.fileno()))
        for sig in STOP_SIGNALS:
            previous = signal.signal(sig, self._on_signal)
            cleanup.callback(signal.signal, sig, signal.SIG_DFL if previous is None else previous)
        return reader

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)  # a flag: the loop does the work

    def _start(self, worker: Worker) -> None:
        process = self.context.Process(
            target=_worker,
            args=(worker_config(self.config, worker.slot), self.record_file, os.getpid()),
            name=f"worker-{worker.slot}",
        )
        process.start()
        worker.process, worker.started, worker.restart_at = process, time.monotonic(), None
        listen = worker_listen(self.config.listen, worker.slot)
        log.info(
            "worker started", extra={"slot": worker.slot, "pid": process.pid, "listen": listen}
        )

    def _step(self, now: float) -> int | None:
        """Handle what is due; the exit status once every worker has stopped."""
        if len(self.signals) > self.forwarded:
            self.forwarded = len(self.signals)
            self._stop_all()
        for worker in self.workers:
            if self.stopping:
                break
            if worker.died:
                self._died(worker, now)
            elif worker.restart_at is not None and now >= worker.restart_at:
                self._start(worker)
        if self.stopping and not any(worker.alive for worker in self.workers):
            return self._stopped()
        return None

    def _died(self, worker: Worker, now: float) -> None:
        process = worker.process
        assert process is not None, "died"
        if process.pid is not None and self.directory is not None:
            multiprocess.mark_process_dead(process.pid, self.directory)  # type: ignore[no-untyped-call]
        quick = now - worker.started < QUICK_SECONDS
        worker.quick_failures = worker.quick_failures + 1 if quick else 0
        fields = {"slot": worker.slot, "pid": process.pid, "exitcode": process.exitcode}
        if worker.quick_failures >= self.give_up_after:
            log.error(
                "worker keeps failing at start-up; giving up",
                extra={**fields, "failures": worker.quick_failures},
            )
            self.gave_up = True
            worker.process = None  # reported here; nothing left to stop or count
            self._stop_all()
            return
        log.error("worker died; restarting", extra={**fields, "restart_in_seconds": self.backoff})
        worker.restart_at = now + self.backoff

    def _terminate_all(self) -> None:
        for worker in self.workers:
            worker.terminate()

    def _stop_all(self) -> None:
        self.stopping = True
        for worker in self.workers:
            if worker.restart_at is not None:
                # Dead and waiting for its restart: nothing to stop, nothing to report.
                worker.process, worker.restart_at = None, None
            worker.terminate()

    def _stopped(self) -> int:
        codes = [w.process.exitcode for w in self.workers if w.process is not None]
        log.info("stopped", extra={"exit_codes": codes})
        if self.gave_up:
            return 1
        return 0 if all(code in CLEAN_EXITS for code in codes) else 1

    def _wait(self, wake: socket.socket) -> None:
        """Sleep until a worker exits, a signal arrives, or the next restart is due."""
        timeout = TICK_SECONDS
        due = [w.restart_at for w in self.workers if w.restart_at is not None]
        if due:
            timeout = max(0.0, min(timeout, min(due) - time.monotonic()))
        sentinels = [w.process.sentinel for w in self.workers if w.alive and w.process]
        if wake in wait([*sentinels, wake], timeout):
            with contextlib.suppress(BlockingIOError):
                while wake.recv(64):
                    pass


def _metrics_folder(cleanup: contextlib.ExitStack) -> str:
    """A fresh folder for the workers' metric files, named in their environment."""
    directory = tempfile.mkdtemp(prefix="ext_proc-metrics-")
    cleanup.callback(shutil.rmtree, directory, ignore_errors=True)
    previous = os.environ.get(MULTIPROC_DIR)
    cleanup.callback(_restore_environ, MULTIPROC_DIR, previous)
    # Read by prometheus_client when a worker first imports it (spawned, so fresh).
    os.environ[MULTIPROC_DIR] = directory
    return directory


def _restore_environ(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def run(config: Config) -> int:
    """Supervise ``config.workers`` workers until stopped; the exit status."""
    return Supervisor(config).run()
