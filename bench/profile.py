"""``python -m bench profile``: sample the service with py-spy while wrk loads it.

For each scenario (body, decision, concurrency) the service runs behind the real Envoy
in front of nginx; wrk loads it for the profile window plus a margin while ``py-spy
record`` samples the processor process. profile.txt lists the functions with the most
samples, as a share of the samples and as CPU milliseconds per request (samples / rate
/ requests served in the window). Without ``--native``, time spent inside grpc's Cython
extension shows up in the Python frame that called into it (``Handle._run`` for its
event-loop callbacks, ``Thread.run`` for its poller thread).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench import bodies, cpu, load, stack, tools
from bench import run as matrix

DEFAULT_SCENARIOS = (
    ("2k", "strip", 8),
    ("1m", "honor", 1),
    ("1m", "honor-proven", 1),
    ("1m", "deny", 1),
)
_IDLE = re.compile(r"(^|\.)select \(selectors\.py|epoll_wait|^poll \(")
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


@dataclass
class Profile:
    samples: int  # attributable: not waiting in select/poll
    waiting: int
    self_samples: Counter[str]
    total_samples: Counter[str]
    self_by_file: Counter[str]
    by_process: Counter[str]


def parse(raw: str) -> Profile:
    """Collapsed stacks (``frame;frame;... count``) -> self and inclusive counts.

    Stacks ending in a selector's ``select`` (the event loop or the metrics server
    waiting) are counted apart: py-spy sees a thread that is runnable on a busy host as
    active, so they are not the service's work.
    """
    profile = Profile(0, 0, Counter(), Counter(), Counter(), Counter())
    for line in raw.splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack_text.split(";")
        if frames[0].startswith("process "):
            profile.by_process[frames[0]] += count
            frames = frames[1:] or frames
        if _IDLE.search(frames[-1]):
            profile.waiting += count
            continue
        profile.samples += count
        profile.self_samples[frames[-1]] += count
        for frame in set(frames):
            profile.total_samples[frame] += count
        match = _FRAME.match(frames[-1])
        profile.self_by_file[match["file"] if match else frames[-1]] += count
    return profile


def _table(title: str, counts: Counter[str], samples: int, per_sample: float, top: int) -> str:
    lines = [title, f"  {'share':>6} {'ms/req':>8}  where"]
    for name, count in counts.most_common(top):
        share = 100 * count / samples if samples else 0.0
        lines.append(f"  {share:5.1f}% {count * per_sample:8.3f}  {name}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Window:
    """What the profiled process did while py-spy sampled it."""

    requests: int
    cpu_seconds: float
    result: load.Measurement

    @property
    def cpu_ms_per_request(self) -> float:
        return 1000 * self.cpu_seconds / self.requests if self.requests else 0.0


def _section(label: str, window: Window, profile: Profile, top: int) -> str:
    # Each attributable sample stands for an equal share of the measured CPU time.
    per_sample = window.cpu_ms_per_request / profile.samples if profile.samples else 0.0
    result = window.result
    head = "\n".join(
        [
            f"== {label}",
            f"load: {result.rps:.0f} req/s, p50 {result.p50_ms:.2f} ms, p99 "
            f"{result.p99_ms:.2f} ms (wrk, under the profiler)",
            f"processor CPU in the window: {window.cpu_ms_per_request:.3f} ms per request "
            f"({window.cpu_seconds:.2f} s user+system over {window.requests} requests)",
            f"py-spy: {profile.samples} samples attributed, {profile.waiting} waiting in "
            "select() left out; ms/req = share x CPU per request",
        ]
    )
    tables = [
        ("top functions by self time", profile.self_samples),
        ("top functions by inclusive time", profile.total_samples),
        ("self time by file", profile.self_by_file),
    ]
    if len(profile.by_process) > 1:
        tables.append(("samples by process", profile.by_process))
    parts = [_table(title, counts, profile.samples, per_sample, top) for title, counts in tables]
    return "\n\n".join([head, *parts])


def _record(spy: str, pid: int, raw: Path, *, seconds: int, rate: int, native: bool) -> None:
    args = [spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", str(rate)]
    args += ["--format", "raw", "--function", "--subprocesses", "--output", str(raw)]
    if native:
        args.append("--native")
    for _ in range(3):  # attaching right after start-up occasionally fails; try again
        done = subprocess.run(args, capture_output=True, text=True, check=False)
        if done.returncode == 0 and raw.exists():
            return
    raise tools.ToolError(f"py-spy failed: {done.stdout}{done.stderr}")


def _completed(running: stack.Running) -> int:
    stats = running.stats()
    return sum(stats.get(f"http.gateway.downstream_rq_{c}xx", 0) for c in (2, 4, 5))


def _profile_one(
    bench: stack.BenchStack,
    name: str,
    scenario: tuple[str, str, int],
    out: Path,
    *,
    seconds: int,
    rate: int,
    native: bool,
    top: int,
) -> str:
    size, decision, concurrency = scenario
    wrk = tools.ensure_system_tools()["wrk"]
    body = bodies.build(size, decision)
    slices: tuple[load.Slice | None, load.Slice | None] = (None, None)
    if body.proof_at is None:
        data = bench.workdir / f"body-{size}-{decision}.json"
        data.write_bytes(body.data)
        lua, probe = load.script(bench.workdir, data), body.data
    else:  # a proof per request, as in bench/run.py: the warm-up's, then the window's
        cell = matrix.Cell(size, decision, concurrency)
        proven = matrix._proven(bench.workdir, _plan(seconds, cell), cell, body)
        lua, probe, slices = proven.lua, proven.probe, proven.layout.slices(0)
    running = bench.running[name]
    stack.probe(running.gateway, body.path, probe)
    url = running.url(body.path)
    load.run(wrk, url, lua, concurrency=concurrency, seconds=2, proofs=slices[0])
    raw = out / f"profile-{size}-{decision}-c{concurrency}.collapsed.txt"
    with ThreadPoolExecutor(max_workers=1) as pool:
        # The load outlasts the profile window on both sides.
        loading = pool.submit(
            load.run,
            wrk,
            url,
            lua,
            concurrency=concurrency,
            seconds=seconds + 2,
            proofs=slices[1],
        )
        time.sleep(1)
        pid = bench.processor_pid(name)
        served, used = _completed(running), cpu.tree_seconds(pid)
        _record(tools.py_spy(), pid, raw, seconds=seconds, rate=rate, native=native)
        served, used = _completed(running) - served, cpu.tree_seconds(pid) - used
        window = Window(served, used, loading.result())
    label = f"{bodies.SIZES[size]} B {decision} on {body.path}, concurrency {concurrency}"
    print(f"bench: profiled {label}", file=sys.stderr, flush=True)
    return _section(label, window, parse(raw.read_text()), top)


def _plan(seconds: int, *cells: matrix.Cell) -> matrix.Plan:
    """The load of a profile as a bench plan: 2 s of warm-up, then the window and 2 s."""
    return matrix.Plan(cells, (1,), seconds + 2, 2, smoke=False)


def run(
    out: Path,
    *,
    scenarios: tuple[tuple[str, str, int], ...] = DEFAULT_SCENARIOS,
    seconds: int = 15,
    rate: int = 200,
    workers: int = 1,
    native: bool = False,
    top: int = 25,
) -> Path:
    paths = tools.ensure_system_tools()
    tools.py_spy()  # fail before starting anything when it is missing
    options = tools.serve_options()
    arrangement = stack.Arrangement("service", workers if "--workers" in options else 1)
    workdir = Path(tempfile.mkdtemp(prefix="ext_proc-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    cells = [matrix.Cell(*scenario) for scenario in scenarios]
    with stack.BenchStack(
        workdir,
        paths["nginx"],
        [arrangement],
        serve_options=options,
        record_slots=matrix.record_slots(_plan(seconds, *cells)),
    ) as bench:
        sections = [
            _profile_one(
                bench,
                arrangement.name,
                scenario,
                out,
                seconds=seconds,
                rate=rate,
                native=native,
                top=top,
            )
            for scenario in scenarios
        ]
    shutil.rmtree(workdir, ignore_errors=True)
    path = out / "profile.txt"
    header = (
        f"py-spy profile of `python -m ext_proc serve` ({arrangement.name}) behind Envoy, "
        f"{seconds} s per scenario at {rate} Hz{', native frames' if native else ''}.\n"
        "Collapsed stacks (for flame graphs) are beside this file.\n\n"
    )
    path.write_text(header + "\n\n".join(sections) + "\n")
    return path
