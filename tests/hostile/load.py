"""Clients for the hostile tier: attackers in threads, legitimate requests timed."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

JSON = {"content-type": "application/json"}
MiB = 1 << 20


def legitimate_chat() -> bytes:
    """A 2 KiB chat request without ids."""
    text = "Summarise the following notes in two sentences. " * 40
    return b'{"model":"tiny","messages":[{"role":"user","content":"' + text.encode() + b'"}]}'


@dataclass
class Timed:
    statuses: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def summary(self) -> str:
        if not self.seconds:
            return "no requests"
        ordered = sorted(self.seconds)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        counts = {s: self.statuses.count(s) for s in sorted(set(self.statuses))}
        return (
            f"{len(ordered)} requests {counts}, p50 {statistics.median(ordered) * 1000:.0f} ms, "
            f"p99 {p99 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"
        )


def post(url: str, data: bytes, timeout: float = 60) -> tuple[int, bytes]:
    with httpx.Client(timeout=timeout) as client:
        reply = client.post(url, content=data, headers=JSON)
        return reply.status_code, reply.content


def timed_requests(url: str, data: bytes, seconds: float, out: Timed) -> None:
    """Send ``data`` one request after the other for ``seconds``."""
    end = time.monotonic() + seconds
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < end:
            started = time.perf_counter()
            reply = client.post(url, content=data, headers=JSON)
            out.seconds.append(time.perf_counter() - started)
            out.statuses.append(reply.status_code)


def attackers(count: int, attack: Callable[[threading.Event], None]) -> Callable[[], None]:
    """Start ``count`` threads running ``attack`` until the returned stop is called."""
    stop = threading.Event()
    threads = [threading.Thread(target=attack, args=(stop,), daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()

    def halt() -> None:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)

    return halt
