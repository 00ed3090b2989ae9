"""A real prefill/decode pair: two vLLM CPU servers joined by vLLM's ``NixlConnector``
(UCX over TCP on the loopback), the prefill server the KV producer, the decode server
the consumer. Stdlib and ``tests.conformance.vllm_env``; nothing happens at import time.

* ``ensure_nixl()`` -- ``nixl`` installed into the vLLM environment, with the progress
  delay hook (``nixl_progress.py`` says why).
* ``run_pair()`` -- context manager: both servers started together, yields ``Pair``.
  With ``bidirectional=True`` both servers also get the connector's
  ``bidirectional_kv_xfer``: the decode server keeps a finished request's blocks (for
  ``decoder_kv_blocks_ttl``, 480 s) and answers with ``kv_transfer_params`` for the
  next turn, whose prefill request, sent with them verbatim, reads those tokens' KV
  back from the decode server (the roles stay producer and consumer: the prefill
  server reads with them as well).
* ``Pair.kv_counters()`` -- a server's own evidence of where a prompt's KV came from
  (``vllm:prompt_tokens_by_source_total``, ``vllm:nixl_bytes_transferred``): the
  decode server's, or with ``server="prefill"`` the prefill server's.

``python -m tests.pd.pair`` (from the checkout) runs a pair in the foreground on
``PREFILL_PORT`` (8100) and ``DECODE_PORT`` (8200) for ``make run`` to point at;
``PD_BIDIRECTIONAL=1`` runs it bidirectional (``run_pair(..., bidirectional=True)``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from devstack import processes
from tests.conformance import vllm_env

NIXL_REQUIREMENT = "nixl==1.5.1"
_HOOK = Path(__file__).with_name("nixl_progress.py")
_HOOK_MODULE = "ext_proc_nixl_progress"
# The UCX progress thread's poll timeout (rounded up to whole milliseconds by nixl).
PROGRESS_DELAY_US = 1000
# The name the pair also serves under: the name ``make run`` prints in its examples.
EXAMPLE_MODEL = "m"
_METRIC = re.compile(r"^(vllm:[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", re.M)


def _stamp_text() -> str:
    """What the stamp records: the requirement and the hook's content."""
    return f"{NIXL_REQUIREMENT}\n{_HOOK.read_text()}"


def ensure_nixl() -> Path:
    """The vLLM environment's python, with ``nixl`` and the progress hook installed."""
    py = vllm_env.ensure_venv()
    stamp = vllm_env.venv_dir() / ".ext-proc-nixl"
    with vllm_env.cache_lock():
        if stamp.exists() and stamp.read_text() == _stamp_text():
            return py
        vllm_env.run([py, "-m", "pip", "install", "--progress-bar", "off", NIXL_REQUIREMENT])
        site = Path(
            vllm_env.output([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        )
        shutil.copyfile(_HOOK, site / f"{_HOOK_MODULE}.py")
        (site / f"{_HOOK_MODULE}.pth").write_text(f"import {_HOOK_MODULE}\n")
        # The connector's imports, with the hook active, as the servers will run them.
        vllm_env.run(
            [
                py,
                "-c",
                "import nixl._api, vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector",
            ],
            env={**os.environ, "EXT_PROC_NIXL_PROGRESS_DELAY_US": str(PROGRESS_DELAY_US)},
        )
        stamp.write_text(_stamp_text())
    return py


def cpu_halves() -> tuple[set[int], set[int]] | None:
    """The CPUs of the prefill server and of the decode server: half each, so that
    neither engine waits for the other's (None on a single CPU)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


def pin(group: int, cpus: set[int]) -> int:
    """Every thread of every process in process group ``group`` bound to ``cpus``;
    returns how many threads. vLLM's NIXL worker on CPU binds its own thread to the last
    core of the NUMA node (``start_load_kv`` apart from the model's threads), whatever
    the server was told: two servers on one machine then share that core, and a prefill
    engine waits behind a decode engine polling for its blocks. Moving each server's
    threads to its own CPUs after start-up undoes that."""
    threads = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rpartition(")")[2].split()[2]) != group:
                continue
            for task in (entry / "task").iterdir():
                os.sched_setaffinity(int(task.name), cpus)
                threads += 1
        except (OSError, ValueError):
            continue  # a process or thread that ended meanwhile
    return threads


@dataclass(frozen=True)
class KvCounters:
    """Where a server's prompt tokens came from, and the bytes NIXL read."""

    external: float  # prompt tokens whose KV was read from the other server
    local: float  # prompt tokens computed on this server
    nixl_bytes: float  # bytes the NIXL connector transferred
    cached: float = 0.0  # prompt tokens found in this server's own prefix cache

    def __sub__(self, other: KvCounters) -> KvCounters:
        return KvCounters(
            self.external - other.external,
            self.local - other.local,
            self.nixl_bytes - other.nixl_bytes,
            self.cached - other.cached,
        )


@dataclass(frozen=True)
class Pair:
    prefill: str  # base URLs
    decode: str

    def kv_counters(self, server: Literal["decode", "prefill"] = "decode") -> KvCounters:
        url = self.decode if server == "decode" else self.prefill
        with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
            text = reply.read().decode()
        found = {"external": 0.0, "local": 0.0, "nixl_bytes": 0.0, "cached": 0.0}
        for name, labels, value in _METRIC.findall(text):
            if name == "vllm:prompt_tokens_by_source_total":
                if 'source="external_kv_transfer"' in labels:
                    found["external"] += float(value)
                elif 'source="local_compute"' in labels:
                    found["local"] += float(value)
                elif 'source="local_cache_hit"' in labels:
                    found["cached"] += float(value)
            elif name == "vllm:nixl_bytes_transferred_sum":
                found["nixl_bytes"] += float(value)
        return KvCounters(**found)


def _server(
    role: str, side_port: int, cpus: set[int] | None, *, bidirectional: bool = False
) -> tuple[list[str], dict[str, str]]:
    transfer: dict[str, object] = {
        "kv_connector": "NixlConnector",
        "kv_role": role,
        "kv_buffer_device": "cpu",
    }
    if bidirectional:
        transfer["kv_connector_extra_config"] = {"bidirectional_kv_xfer": True}
    args = [
        "--kv-transfer-config",
        json.dumps(transfer),
        "--served-model-name",
        vllm_env.SERVED_MODEL_NAME,
        EXAMPLE_MODEL,
    ]
    env = {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port),
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(cpus))) if cpus else "nobind",
        "EXT_PROC_NIXL_PROGRESS_DELAY_US": str(PROGRESS_DELAY_US),
    }
    return args, env


@contextlib.contextmanager
def run_pair(
    prefill_port: int, decode_port: int, *, timeout: float = 600.0, bidirectional: bool = False
) -> Iterator[Pair]:
    """Both servers, started together; stopped (their process groups) on exit.
    ``bidirectional``: the decode server keeps its blocks for the next turn's read-back."""
    ensure_nixl()
    halves = cpu_halves()
    prefill_cpus, decode_cpus = halves if halves else (None, None)
    prefill = _server(
        "kv_producer", processes.free_port(), prefill_cpus, bidirectional=bidirectional
    )
    decode = _server("kv_consumer", processes.free_port(), decode_cpus, bidirectional=bidirectional)
    servers = [(prefill_port, *prefill), (decode_port, *decode)]
    with vllm_env.run_servers(servers, timeout=timeout) as running:
        (prefill_url, prefill_group), (decode_url, decode_group) = running
        if prefill_cpus and decode_cpus:
            pin(prefill_group, prefill_cpus)
            pin(decode_group, decode_cpus)
        yield Pair(prefill_url, decode_url)


def main() -> int:
    prefill_port = int(os.environ.get("PREFILL_PORT", "8100"))
    decode_port = int(os.environ.get("DECODE_PORT", "8200"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    bidirectional = os.environ.get("PD_BIDIRECTIONAL", "") == "1"
    config = "ENVOY_CONFIG=envoy/envoy-turns.yaml " if bidirectional else ""
    with run_pair(prefill_port, decode_port, bidirectional=bidirectional) as pair:
        print(
            f"prefill server {pair.prefill}, decode server {pair.decode}; in another shell:\n"
            f"  {config}PREFILL_UPSTREAM=127.0.0.1:{prefill_port} "
            f"DISAGGREGATED_UPSTREAM=127.0.0.1:{decode_port} make run\n"
            f"and after a hand-off, the decode server's evidence that the KV cache moved:\n"
            f"  curl -s {pair.decode}/metrics | grep -E "
            "'prompt_tokens_by_source_total|nixl_bytes_transferred_sum'\n"
            "Ctrl-C stops both.",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
