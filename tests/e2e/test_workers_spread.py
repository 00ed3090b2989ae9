"""``serve --workers 2`` behind the real Envoy: every worker serves streams.

Envoy multiplexes every ext_proc stream of one of its worker threads on one HTTP/2
connection per processor endpoint (more only past the cluster's max_concurrent_streams),
so workers sharing one port would split connections, and at a concurrency under that
limit one worker would serve every stream. Each worker serves a port of its own
(ext_proc/edge/supervisor.py) and the processor cluster lists them all
(``envoygen.processor_workers_fields``, as the e2e stack and the benchmark's
``service-wN``): a stream is a load-balancing pick among the workers, with one Envoy
worker thread or two.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import multiprocess

from tests.e2e.stack import Stack

WORKERS = 2
REQUESTS = 40
CONCURRENCY = 4  # under max_concurrent_streams: one connection per endpoint and thread


def sent_streams(host: dict[str, Any]) -> int:
    return next(int(s.get("value", 0)) for s in host["stats"] if s["name"] == "rq_total")


def worker_pids(supervisor: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if parent == supervisor and b"spawn_main" in command:
            found.append(int(entry.name))
    return found


def decisions_of(pid: int) -> int:
    """The decisions one worker counted, from its own file of the supervisor's metrics
    folder (named in the worker's environment)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    (folder,) = [
        v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"PROMETHEUS_MULTIPROC_DIR=")
    ]
    files = [str(p) for p in Path(folder).glob(f"counter_{pid}.db")]
    total = 0.0
    for family in multiprocess.MultiProcessCollector._read_metrics(files).values():
        total += sum(s.value for s in family.samples if s.name == "ext_proc_decisions_total")
    return int(total)


@pytest.mark.parametrize("envoy_concurrency", [1, 2])
def test_every_worker_serves_streams(tmp_path: Path, envoy_concurrency: int) -> None:
    stack = Stack(tmp_path, workers=WORKERS, envoy_concurrency=envoy_concurrency)
    with stack:
        stack.wait_for_workers()
        hosts = stack.processor_hosts
        pids = worker_pids(stack.children["processor"].pid)
        assert len(pids) == WORKERS

        def send(_: int) -> int:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            reply = httpx.post(stack.url + "/v1/chat/completions", json=body, timeout=20)
            return reply.status_code

        with ThreadPoolExecutor(CONCURRENCY) as pool:
            statuses = list(pool.map(send, range(REQUESTS)))
        assert statuses == [200] * REQUESTS
        by_port = {port: sent_streams(host) for port, host in hosts().items()}
        by_worker = {pid: decisions_of(pid) for pid in pids}
    # Envoy sent each worker's port streams, and each worker decided some of them.
    assert all(count >= 1 for count in by_port.values()), by_port
    assert all(count >= 1 for count in by_worker.values()), by_worker
    assert sum(by_worker.values()) == REQUESTS
