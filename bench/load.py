"""Closed-loop HTTP/1.1 load with wrk: a POST body from a file, results as JSON.

wrk keeps ``concurrency`` keep-alive connections busy for a fixed duration and records
every request's latency in its histogram; the Lua ``done`` hook prints the summary as
one JSON line. wrk counts any status >= 400 under ``errors.status`` (``non_2xx`` here).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_MARK = "BENCH_RESULT "
_SCRIPT = """\
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open([[%(body)s]], "rb"))
wrk.body = f:read("*a")
f:close()

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '%(mark)s{"requests":%%d,"duration_us":%%d,"bytes":%%d,"connect":%%d,"read":%%d,' ..
    '"write":%%d,"non_2xx":%%d,"timeout":%%d,"p50_us":%%d,"p90_us":%%d,"p99_us":%%d,' ..
    '"mean_us":%%.1f,"max_us":%%d}\\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.mean, latency.max))
end
"""


@dataclass(frozen=True)
class Measurement:
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    non_2xx: int
    socket_errors: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class LoadError(RuntimeError):
    pass


def script(workdir: Path, body: Path) -> Path:
    path = workdir / f"{body.stem}.lua"
    path.write_text(_SCRIPT % {"body": body, "mark": _MARK})
    return path


def run(
    wrk: str, url: str, lua: Path, *, concurrency: int, seconds: int, threads: int = 1
) -> Measurement:
    duration = max(1, seconds)  # wrk takes whole seconds
    args = [
        wrk,
        f"--threads={min(threads, concurrency)}",
        f"--connections={concurrency}",
        f"--duration={duration}s",
        "--timeout=10s",
        f"--script={lua}",
        url,
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=duration + 60, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith(_MARK)), None)
    if done.returncode != 0 or line is None:
        raise LoadError(f"wrk failed ({done.returncode}): {done.stdout}{done.stderr}")
    raw = json.loads(line.removeprefix(_MARK))
    elapsed = raw["duration_us"] / 1e6
    return Measurement(
        requests=raw["requests"],
        seconds=round(elapsed, 3),
        rps=round(raw["requests"] / elapsed, 1) if elapsed else 0.0,
        p50_ms=raw["p50_us"] / 1000,
        p90_ms=raw["p90_us"] / 1000,
        p99_ms=raw["p99_us"] / 1000,
        mean_ms=round(raw["mean_us"] / 1000, 3),
        max_ms=raw["max_us"] / 1000,
        non_2xx=raw["non_2xx"],
        socket_errors=raw["connect"] + raw["read"] + raw["write"] + raw["timeout"],
    )
