"""Closed-loop HTTP/1.1 load with wrk: a POST body from a file, results as JSON.

wrk keeps ``concurrency`` keep-alive connections busy for a fixed duration and records
every request's latency in its histogram; the Lua ``done`` hook prints the summary as
one JSON line. wrk counts any status >= 400 under ``errors.status`` (``non_2xx`` here).

A proven body (``spliced_script``) is built anew for every request by the script's
``request()``: the bytes before the proof, the next proof of a pool (bench/proofs.py),
the bytes after it; every arrangement of the cell runs the same script. wrk calls
``request()`` before it starts a request's clock, so the latency covers the same span as
a fixed body's. Each run is given the pool's first index it may use and how many each
wrk thread takes (``Slice``); thread ``t`` takes ``[first + t * per_thread, ...)``,
so no proof is sent twice in a run, and runs given disjoint slices never share one.
A thread that uses up its slice starts it again (a replay, which the service answers
``proof_replayed``) and counts it; ``run`` then fails. (wrk builds one request of its
first thread before the run, to check the script: that thread's first proof is never
sent.)
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_MARK = "BENCH_RESULT "
_PROOFS = "BENCH_PROOFS "
# The summary as one JSON line (wrk's ``done`` hook, or called from a script's own).
_SUMMARY = """\
function summarize(summary, latency, requests)
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
_SCRIPT = (
    """\
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open([[%(body)s]], "rb"))
wrk.body = f:read("*a")
f:close()

"""
    + _SUMMARY
    + """
done = summarize
"""
)
# A body per request: prefix .. proof .. suffix, the proofs from the thread's slice of
# the pool file (fixed-width records). Script arguments: the slice's first index and
# the proofs per thread.
_SPLICED = (
    """\
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local function slurp(path)
  local f = assert(io.open(path, "rb"))
  local data = f:read("*a")
  f:close()
  return data
end
local prefix = slurp([[%(prefix)s]])
local suffix = slurp([[%(suffix)s]])
local width = %(width)d
local threads = {}
local count = 0
local pool, before = "", ""
per_thread, used, wrapped = 0, 0, 0

function setup(thread)
  thread:set("number", count)
  count = count + 1
  table.insert(threads, thread)
end

function init(args)
  per_thread = assert(tonumber(args[2]))
  local first = assert(tonumber(args[1])) + number * per_thread
  local f = assert(io.open([[%(pool)s]], "rb"))
  assert(f:seek("set", first * width))
  pool = f:read(per_thread * width) or ""
  f:close()
  assert(#pool == per_thread * width, "the proof pool ends before this thread's slice")
  -- The request line and headers (Content-Length included) once: each request is then
  -- one concatenation of the prefix, its proof and the suffix.
  local length = #prefix + width + #suffix
  local whole = wrk.format(nil, nil, nil, string.rep(" ", length))
  before = string.sub(whole, 1, #whole - length) .. prefix
end

function request()
  if used == per_thread then
    used = 0
    wrapped = wrapped + 1
  end
  local at = used * width
  used = used + 1
  return before .. string.sub(pool, at + 1, at + width) .. suffix
end

"""
    + _SUMMARY
    + """
function done(summary, latency, requests)
  local sent, over = 0, 0
  for _, thread in ipairs(threads) do
    local wraps = thread:get("wrapped")
    sent = sent + thread:get("used") + wraps * thread:get("per_thread")
    over = over + wraps
  end
  io.write(string.format('%(proofs)s{"proofs":%%d,"wrapped":%%d}\\n', sent, over))
  summarize(summary, latency, requests)
end
"""
)


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


@dataclass(frozen=True)
class Slice:
    """The proofs one wrk run may send: from ``first``, ``per_thread`` per wrk thread."""

    first: int
    per_thread: int

    def args(self) -> list[str]:
        return [str(self.first), str(self.per_thread)]


def script(workdir: Path, body: Path) -> Path:
    path = workdir / f"{body.stem}.lua"
    path.write_text(_SCRIPT % {"body": body, "mark": _MARK})
    return path


def spliced_script(
    workdir: Path, name: str, *, prefix: Path, suffix: Path, pool: Path, width: int
) -> Path:
    """A script sending ``prefix`` + a proof of ``pool`` (``width`` bytes each, a
    different one per request) + ``suffix``; each run takes a ``Slice``."""
    path = workdir / f"{name}.lua"
    values = {"prefix": prefix, "suffix": suffix, "pool": pool, "width": width}
    path.write_text(_SPLICED % {**values, "mark": _MARK, "proofs": _PROOFS})
    return path


def wrk_threads(threads: int, concurrency: int) -> int:
    """The threads wrk runs with (never more than connections)."""
    return min(threads, concurrency)


def run(
    wrk: str,
    url: str,
    lua: Path,
    *,
    concurrency: int,
    seconds: int,
    threads: int = 1,
    proofs: Slice | None = None,
) -> Measurement:
    """One wrk run; ``proofs``: the slice of the pool a spliced script sends from
    (fails when a thread used its slice up: a proof would have been sent twice)."""
    duration = max(1, seconds)  # wrk takes whole seconds
    args = [
        wrk,
        f"--threads={wrk_threads(threads, concurrency)}",
        f"--connections={concurrency}",
        f"--duration={duration}s",
        "--timeout=10s",
        f"--script={lua}",
        url,
    ]
    if proofs is not None:
        args += ["--", *proofs.args()]
    done = subprocess.run(args, capture_output=True, text=True, timeout=duration + 60, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith(_MARK)), None)
    if done.returncode != 0 or line is None:
        raise LoadError(f"wrk failed ({done.returncode}): {done.stdout}{done.stderr}")
    if proofs is not None:
        sent = next((x for x in done.stdout.splitlines() if x.startswith(_PROOFS)), None)
        if sent is None:
            raise LoadError(f"wrk sent no proof count: {done.stdout}{done.stderr}")
        count = json.loads(sent.removeprefix(_PROOFS))
        if count["wrapped"]:
            raise LoadError(
                f"the proof pool ran out: a wrk thread sent more than its {proofs.per_thread} "
                f"proofs ({count['proofs']} in all), so proofs were sent again; "
                "raise bench/run.py's PEAK_RPS for this body size"
            )
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
