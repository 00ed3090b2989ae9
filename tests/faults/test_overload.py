"""Overload: slow clients send 16 MiB bodies through the real Envoy faster than the
in-flight budget admits them. The excess is refused 503 with ``retry-after``, every body
let through reaches the upstream whole and inspected, and the processor's peak resident
memory (VmHWM) stays within the memory model (ext_proc/core/memory.py): its stated
baseline, and the bound the chart's memory limit is sized from."""

from __future__ import annotations

import base64
import json
import random
import socket
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

from ext_proc.core import memory
from ext_proc.core.config import Config
from tests.faults.harness import FORGED, ID_HEADER, STRIP, faults_stack

DEFAULTS = Config.load(listen="127.0.0.1:0")
SIZE = DEFAULTS.max_body_bytes - 4096  # within the body limit and Envoy's buffer
UPLOADERS = memory.QUEUED  # as many bodies at once as the chart's limit is sized for
CHUNKS = 16
SECONDS = (1.0, 4.0)  # how long each client takes to send its body, at random


def body(rid: str) -> bytes:
    """A chat request of SIZE bytes carrying a client's own ``kv_transfer_params``: it is
    parsed, and the parameters removed, so the rewritten body is written and sent too."""
    head = json.dumps(
        {
            "model": "tiny",
            "kv_transfer_params": {"remote_host": f"{FORGED}{rid}", "do_remote_prefill": True},
            "messages": [{"role": "user", "content": "x"}],
        }
    ).encode()
    prefix = head[: -len(b'"x"}]}')] + b'"'
    return prefix + b"y" * (SIZE - len(prefix) - 4) + b'"}]}'


def upload(address: tuple[str, int], rid: str, pace: float) -> tuple[str, bool]:
    """POST ``body(rid)`` in CHUNKS pieces ``pace`` seconds apart; the status and whether
    the answer carried ``retry-after``."""
    data = body(rid)
    step = -(-len(data) // CHUNKS)
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(
            f"POST {STRIP} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"{ID_HEADER}: {rid}\r\ncontent-length: {len(data)}\r\n"
            "connection: close\r\n\r\n".encode()
        )
        try:
            for start in range(0, len(data), step):
                sock.sendall(data[start : start + step])
                time.sleep(pace)
        except OSError:
            pass  # refused before the whole body was sent: its answer is waiting
        head = b""
        while b"\r\n\r\n" not in head:
            got = sock.recv(65536)
            if not got:
                return "reset", False
            head += got
    lines = head.split(b"\r\n\r\n")[0].decode().lower().split("\r\n")
    return lines[0].split()[1], any(line.startswith("retry-after:") for line in lines)


def arrivals(upstream: str) -> list[tuple[str, bytes]]:
    """Each request the stand-in recorded: its id and its body (up to ~24 bodies of
    16 MiB: a long read)."""
    url = f"http://{upstream}/__stub__/requests"
    with urllib.request.urlopen(url, timeout=120) as reply:
        recorded = json.loads(reply.read())
    return [
        (dict(r["headers"]).get(ID_HEADER, ""), base64.b64decode(r["body_b64"])) for r in recorded
    ]


def test_slow_16mib_bodies_beyond_the_budget_are_refused_within_the_memory_model(
    tmp_path: Path,
) -> None:
    outcomes: dict[str, tuple[str, bool]] = {}
    with faults_stack(tmp_path) as stack:
        before = stack.processor_memory_kib()["VmRSS"] << 10
        stack.clear()
        stack.reset_processor_peak()
        pace = random.Random(0)
        address = (stack.gateway.host, stack.gateway.port)

        def client(rid: str, seconds: float) -> None:
            outcomes[rid] = upload(address, rid, seconds / CHUNKS)

        threads = [
            threading.Thread(target=client, args=(f"big-{n}", pace.uniform(*SECONDS)))
            for n in range(UPLOADERS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        peak = stack.processor_memory_kib()["VmHWM"] << 10
        incomplete = stack.incomplete_count()
        recorded = arrivals(str(stack.upstream))
    statuses = Counter(status for status, _ in outcomes.values())
    retry_after = Counter(status for status, told in outcomes.values() if told)
    bound = memory.resident_bound(before, DEFAULTS.inflight_budget_bytes, SIZE, memory.QUEUED)
    arrived = Counter(rid for rid, _ in recorded)
    limit = memory.pod_limit(DEFAULTS.inflight_budget_bytes, DEFAULTS.max_body_bytes)
    print(
        f"\n{UPLOADERS} clients, 16 MiB bodies each over {SECONDS[0]:.0f}-{SECONDS[1]:.0f} s: "
        f"{dict(statuses)}, retry-after on {dict(retry_after)}; {len(recorded)} arrivals; "
        f"processor RSS before {before // memory.MiB} MiB (model {memory.BASELINE // memory.MiB}),"
        f" peak {peak // memory.MiB} MiB (model {bound // memory.MiB} MiB, pod limit "
        f"{limit // memory.MiB} MiB)"
    )
    assert len(outcomes) == UPLOADERS
    # The overload happened: some bodies passed, the excess was refused, told to retry.
    assert set(statuses) <= {"200", "503"}, statuses
    assert statuses["200"] > 0, statuses
    assert statuses["503"] > 0, statuses
    assert retry_after["503"] == statuses["503"], (statuses, retry_after)
    # Nothing half-forwarded, refused or twice: exactly the bodies let through arrived,
    # each once, whole, without the client's parameters.
    assert incomplete == 0
    passed = {rid for rid, (status, _) in outcomes.items() if status == "200"}
    assert set(arrived) == passed, arrived
    assert set(arrived.values()) == {1}, arrived
    for rid, received in recorded:
        assert FORGED.encode() not in received
        sent = json.loads(body(rid))
        del sent["kv_transfer_params"]
        assert json.loads(received) == sent
    # Memory: the stated baseline, and the bound the chart's limit is sized from.
    assert before <= memory.BASELINE, before
    assert peak <= bound, (peak, bound)
