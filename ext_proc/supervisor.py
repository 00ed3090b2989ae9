"""``--workers N``: N processes serving one TCP address, kept alive by a supervisor.

The supervisor knows nothing about ext_proc: it starts workers (each a full
``server.serve``, sharing the port through SO_REUSEPORT), restarts one that dies,
serves the aggregated Prometheus metrics, and forwards stop signals: the first SIGTERM
or SIGINT starts every worker's drain, a second one forces them all.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import tempfile
import time
from multiprocessing.process import BaseProcess
from types import FrameType

from ext_proc import logs
from ext_proc.config import Config

log = logging.getLogger("ext_proc.supervisor")
RESTART_BACKOFF_SECONDS = 1.0


def _worker(config: Config) -> None:
    # Ctrl-C reaches the whole process group; only the supervisor reacts to SIGINT and
    # it forwards a SIGTERM, so a worker never sees one signal twice.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logs.configure(config.log_level)
    from ext_proc.server import run  # noqa: PLC0415 - imported in the child only

    raise SystemExit(run(config, worker=True))


def _start_metrics(config: Config, directory: str) -> None:
    if not config.metrics_listen:
        return
    from prometheus_client import CollectorRegistry, start_http_server  # noqa: PLC0415
    from prometheus_client.multiprocess import MultiProcessCollector  # noqa: PLC0415

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    host, _, port = config.metrics_listen.rpartition(":")
    start_http_server(int(port), host, registry=registry)


def run(config: Config) -> int:
    """Supervise ``config.workers`` workers until stopped; the exit status."""
    directory = tempfile.mkdtemp(prefix="ext_proc-metrics-")
    # Read by prometheus_client when a worker first imports it (spawned, so fresh).
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    context = multiprocessing.get_context("spawn")
    signals: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signals.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def start(slot: int) -> BaseProcess:
        process = context.Process(target=_worker, args=(config,), name=f"worker-{slot}")
        process.start()
        log.info("worker started", extra={"slot": slot, "pid": process.pid})
        return process

    workers = {slot: start(slot) for slot in range(config.workers)}
    _start_metrics(config, directory)
    from prometheus_client import multiprocess  # noqa: PLC0415

    forwarded = 0
    while True:
        if len(signals) > forwarded:
            forwarded = len(signals)
            for process in workers.values():
                if process.pid is not None and process.is_alive():
                    os.kill(process.pid, signal.SIGTERM)
        if forwarded and not any(p.is_alive() for p in workers.values()):
            break
        for slot, process in list(workers.items()):
            if not forwarded and not process.is_alive():
                log.error(
                    "worker died; restarting",
                    extra={"slot": slot, "pid": process.pid, "exitcode": process.exitcode},
                )
                if process.pid is not None:
                    multiprocess.mark_process_dead(process.pid, directory)  # type: ignore[no-untyped-call]
                time.sleep(RESTART_BACKOFF_SECONDS)
                workers[slot] = start(slot)
        time.sleep(0.1)
    codes = [p.exitcode for p in workers.values()]
    log.info("stopped", extra={"exit_codes": codes})
    # -SIGTERM: a worker still starting up when the stop came, so it held no streams.
    return 0 if all(code in (0, -signal.SIGTERM) for code in codes) else 1
