"""One benchmark run: start everything once, measure every cell side by side, report."""

from __future__ import annotations

import datetime as dt
import itertools
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import bodies, cpu, judge, ledger, load, proofs, report, results_model, stack, tools
from devstack import processes

SMOKE_CELLS = (
    ("2k", "allow", 1),
    ("2k", "strip", 1),
    ("2k", "deny", 1),
    ("2k", "strict", 1),
    ("2k", "allow", 32),
    ("1m", "honor", 1),
    ("1m", "honor-proven", 1),
)
# The cost ledger's cells: the fixed cost of a small request, alone and under load, and
# what a rewrite adds under load.
LEDGER_CELLS = (("2k", "allow", 1), ("2k", "allow", 32), ("2k", "strip", 32))
# The compiled ladder's cells: the small requests under load, where the per-request
# work shows in the CPU, and the large ones alone, where it shows in the latency.
COMPILED_CELLS = (
    ("2k", "allow", 32),
    ("2k", "strip", 32),
    ("2k", "deny", 32),
    ("1m", "allow", 1),
    ("1m", "strip", 1),
    ("1m", "honor", 1),
)
CONCURRENCY = (1, 8, 32)
WORKERS = (1, 2)
RECORDS = ("local", "redis")
# Requests per second no arrangement reaches with a body of this size, for sizing the
# pools of proofs (Envoy direct measured about 15,000 at 2 KiB c=32 and 1,000 at 1 MiB
# c=1 on a shared 2-core machine): a run that would exceed it fails (bench/load.py).
PEAK_RPS = {"2k": 50_000, "64k": 15_000, "1m": 5_000}


@dataclass(frozen=True)
class Cell:
    body: str
    decision: str
    concurrency: int


@dataclass(frozen=True)
class Plan:
    cells: tuple[Cell, ...]
    workers: tuple[int, ...]
    seconds: int  # per round
    warmup: int  # per round
    smoke: bool
    threads: int = 1
    # Each cell is measured in rounds, every arrangement once per round, and reported by
    # its medians: a drift of the shared machine then moves every arrangement alike.
    rounds: int = 1
    # Which cells: "matrix" (a product of sizes, decisions, concurrencies), "smoke",
    # "targets" (what bench/judge.py judges; the `naive` arrangement is then skipped,
    # no target reads it), "ledger" (the cost ledger's cells and rungs) or "compiled"
    # (the compiled ladder: each compiled part's gain).
    selection: str = "matrix"
    # The service's records of spent proofs measured: "local" (service-wN, its own
    # table) and/or "redis" (service-wN-redis).
    records: tuple[str, ...] = ("local",)
    # Each Envoy's worker threads (BenchStack.envoy_concurrency).
    envoy_concurrency: int = 1

    @property
    def naive(self) -> bool:
        return self.selection not in ("targets", "ledger", "compiled")


@dataclass(frozen=True)
class ProofPlan:
    """How a proven cell's pool of proofs is laid out: index 0 for the probes, then per
    round a slice for the warm-up run and one for the measured run, each ``threads``
    wrk threads of ``warmup`` / ``measure`` proofs. Every arrangement of the cell is given
    the same slices (each processor keeps its own record), so they send the same
    requests; no slice is given twice to one arrangement."""

    warmup: int  # proofs per wrk thread
    measure: int
    threads: int
    rounds: int

    @classmethod
    def of(cls, plan: Plan, cell: Cell) -> ProofPlan:
        threads = load.wrk_threads(plan.threads, cell.concurrency)

        def per_thread(seconds: int) -> int:
            # wrk stops after whole seconds; one more second of margin for its slack.
            return math.ceil(PEAK_RPS[cell.body] * (seconds + 1) / threads) if seconds else 0

        return cls(per_thread(plan.warmup), per_thread(max(1, plan.seconds)), threads, plan.rounds)

    @property
    def per_round(self) -> int:
        return (self.warmup + self.measure) * self.threads

    @property
    def count(self) -> int:
        """The pool's size."""
        return 1 + self.rounds * self.per_round

    def slices(self, round_number: int) -> tuple[load.Slice, load.Slice]:
        """The warm-up's and the measurement's slices of round ``round_number``."""
        first = 1 + round_number * self.per_round
        return (
            load.Slice(first, self.warmup),
            load.Slice(first + self.warmup * self.threads, self.measure),
        )


def record_slots(plan: Plan) -> int:
    """A table of spent proofs that holds every proof the plan's pools hold (each
    processor spends each proof once, and keeps it for the proofs' lifetime, longer
    than a run): at least the service's default."""
    needed = sum(ProofPlan.of(plan, c).count for c in plan.cells if c.decision == "honor-proven")
    slots = max(65536, needed)
    if slots > 1 << 24:
        raise ValueError(
            f"the proven cells need {needed} proofs, more than a table of spent proofs "
            "holds (16,777,216): run fewer rounds, shorter ones or fewer proven cells"
        )
    return slots


def full_cells(
    sizes: tuple[str, ...] = tuple(bodies.SIZES),
    decisions: tuple[str, ...] = bodies.DECISIONS,
    concurrency: tuple[int, ...] = CONCURRENCY,
) -> tuple[Cell, ...]:
    return tuple(Cell(*c) for c in itertools.product(sizes, decisions, concurrency))


def smoke_cells() -> tuple[Cell, ...]:
    return tuple(Cell(*c) for c in SMOKE_CELLS)


def target_cells() -> tuple[Cell, ...]:
    return tuple(Cell(*c) for c in judge.TARGET_CELLS)


def ledger_cells() -> tuple[Cell, ...]:
    return tuple(Cell(*c) for c in LEDGER_CELLS)


def ledger_arrangements() -> list[stack.Arrangement]:
    """The cost ledger's rungs (bench/ledger.py): Envoy's, from Envoy direct without
    the routes and the log to the floor, then the processor's, from the floor to the
    shipped default."""
    envoy = [stack.Arrangement("direct", rung=r) for r in stack.ENVOY_RUNGS[:2]]
    envoy.append(stack.Arrangement("direct"))
    envoy.append(stack.Arrangement("direct", rung="header_step"))
    envoy.append(stack.Arrangement("naive", rung="ext_proc"))
    envoy.append(stack.Arrangement("naive"))
    rungs = [stack.Arrangement("ledger", rung=r) for r in ledger.RUNGS]
    return [*envoy, *rungs, stack.Arrangement("service", 1)]


def compiled_cells() -> tuple[Cell, ...]:
    return tuple(Cell(*c) for c in COMPILED_CELLS)


def compiled_arrangements() -> list[stack.Arrangement]:
    """The compiled ladder: Envoy direct, the floor, then the service (one worker, the
    shipped config, its own record) with no part compiled, one part more at each rung,
    up to the shipped default, every part compiled."""
    rungs = [stack.Arrangement("service", 1, native=value) for value in stack.COMPILED_RUNGS]
    return [
        stack.Arrangement("direct"),
        stack.Arrangement("naive"),
        *rungs,
        stack.Arrangement("service", 1),
    ]


def arrangements(
    workers: tuple[int, ...],
    flag: bool,
    *,
    naive: bool = True,
    records: tuple[str, ...] = ("local",),
) -> tuple[list[stack.Arrangement], list[str]]:
    """direct, naive (two messages; unless told not to), the floor, one service column
    per worker count the service can run and record of spent proofs (``records``), and
    the service behind two messages."""
    chosen = [stack.Arrangement("direct")]
    if naive:
        chosen.append(stack.Arrangement("naive", config=stack.TWO_MESSAGES))
    # The floor of one message per request: the naive processor behind the default.
    chosen.append(stack.Arrangement("naive"))
    notes: list[str] = []
    for count in workers:
        if count != 1 and not flag:
            notes.append(
                f"service workers={count} skipped: `python -m ext_proc serve` has no "
                "--workers option yet (checked with --help); the service ran as one process."
            )
            continue
        chosen += [stack.Arrangement("service", count, record=r) for r in records]
    # Two gRPC messages per request (envoy/envoy-two-message.yaml), one worker.
    chosen.append(stack.Arrangement("service", 1, stack.TWO_MESSAGES))
    return chosen, notes


def implementations_note(served: dict[str, dict[str, str]]) -> str:
    """The run's note of which implementation each service ran for each compiled part,
    as its serving log line stated."""
    if not served:
        return "No service stated the implementations of its compiled parts."

    def parts(implementation: dict[str, str]) -> str:
        kinds = set(implementation.values())
        if len(kinds) == 1:
            return f"every part {kinds.pop()}"
        return ", ".join(f"{part} {kind}" for part, kind in implementation.items())

    return "Compiled parts, as each service's serving log line stated: " + "; ".join(
        f"{name}: {parts(implementation)}" for name, implementation in served.items()
    )


def envoy_note(plan: Plan) -> str:
    """The run's note of Envoy's worker threads (results.json's meta does not hold it)."""
    threads = plan.envoy_concurrency
    return (
        f"Each Envoy ran {threads} worker thread{'s' if threads != 1 else ''} "
        f"(--concurrency {threads})."
    )


def _log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _meta(plan: Plan, paths: dict[str, str], flag: bool) -> dict[str, Any]:
    return {
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "mode": "smoke" if plan.smoke else "full",
        "cells": plan.selection,
        "records": list(plan.records),
        "seconds_per_cell": plan.seconds,
        "warmup_seconds": plan.warmup,
        "rounds": plan.rounds,
        "wrk_threads": plan.threads,
        "cpus": os.cpu_count(),
        "machine": platform.platform(),
        "python": platform.python_version(),
        "envoy": tools.version([processes.envoy_binary(), "--version"]),
        "nginx": tools.version([paths["nginx"], "-v"]),
        "wrk": tools.version([paths["wrk"], "--version"]),
        "service_workers_option": flag,
        "cpu_model": tools.cpu_model(),
        "commit": tools.commit(Path(__file__).resolve().parents[1]),
        "packages": list(tools.packages()),
    }


def _pids(bench: stack.BenchStack, name: str) -> dict[str, int]:
    """The processes whose CPU time a measurement charges to its requests."""
    running = bench.running[name]
    pids = {"envoy": running.envoy_pid, "upstream": bench.upstream_pid}
    if running.processor is not None:
        pids["processor"] = running.processor.pid
    return pids


def _decided(before: Counter[str] | None, after: Counter[str] | None) -> str | None:
    """The reason of the one decision taken between two readings of the service's
    counts (None: not a service; several reasons joined when there were more)."""
    if before is None or after is None:
        return None
    return ",".join(sorted((after - before).elements())) or "no decision"


# Per round: the fields that take the median over the rounds, those that add up, and
# those kept round by round in the record (with the CPU fields) to show the spread.
_MEDIAN = ("rps", "p50_ms", "p90_ms", "p99_ms", "mean_ms")
_SUM = ("requests", "seconds", "non_2xx", "socket_errors")
_ROUND = ("rps", "p50_ms")


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One arrangement's measurements of one cell, a dict per round (``Measurement``
    fields and CPU per request), as one: medians, totals, the largest latency, and
    each round's figures under ``rounds``."""
    cpu_fields = sorted(k for k in rounds[0] if k.endswith("_cpu_ms_per_req"))
    combined: dict[str, Any] = {}
    for field in (*_MEDIAN, *cpu_fields):
        combined[field] = round(statistics.median(r[field] for r in rounds), 4)
    for field in _SUM:
        combined[field] = sum(r[field] for r in rounds)
    combined["max_ms"] = max(r["max_ms"] for r in rounds)
    combined["rounds"] = [{k: r[k] for k in (*_ROUND, *cpu_fields)} for r in rounds]
    return combined


def _round(
    bench: stack.BenchStack,
    plan: Plan,
    wrk: str,
    name: str,
    *,
    url: str,
    lua: Path,
    concurrency: int,
    slices: tuple[load.Slice, load.Slice] | None = None,
) -> dict[str, Any]:
    """One arrangement under load for one round: its measurement, CPU per request and
    the reasons of the service's decisions over the round (warm-up included).
    ``slices``: the proofs of a spliced script's warm-up and measurement."""
    warmup, measured = slices if slices is not None else (None, None)
    running = bench.running[name]
    decided = running.decisions()
    if plan.warmup:
        load.run(
            wrk,
            url,
            lua,
            concurrency=concurrency,
            seconds=plan.warmup,
            threads=plan.threads,
            proofs=warmup,
        )
    pids = _pids(bench, name)
    before = {role: cpu.tree_seconds(pid) for role, pid in pids.items()}
    result = load.run(
        wrk,
        url,
        lua,
        concurrency=concurrency,
        seconds=plan.seconds,
        threads=plan.threads,
        proofs=measured,
    )
    used = {role: cpu.tree_seconds(pid) - before[role] for role, pid in pids.items()}
    after = running.decisions()
    return {
        **result.as_dict(),
        **{
            f"{role}_cpu_ms_per_req": round(1000 * seconds / max(result.requests, 1), 4)
            for role, seconds in used.items()
        },
        "reasons": None if decided is None or after is None else dict(after - decided),
    }


@dataclass(frozen=True)
class Proven:
    """A proven cell's script and the layout of its pool."""

    lua: Path
    layout: ProofPlan
    probe: bytes  # the body the probes send (the pool's first proof)


def _proven(workdir: Path, plan: Plan, cell: Cell, body: bodies.Body) -> Proven:
    """Mint the cell's pool (just before it runs: each pool lives ``proofs.LIFETIME``)
    and write its files and script."""
    layout = ProofPlan.of(plan, cell)
    pool = proofs.mint_pool(body.data, layout.count)
    stem = f"proven-{cell.body}-c{cell.concurrency}"
    files = {}
    for part, data in (("prefix", body.prefix), ("suffix", body.suffix), ("pool", pool)):
        files[part] = workdir / f"{stem}.{part}"
        files[part].write_bytes(data)
    lua = load.spliced_script(
        workdir,
        stem,
        prefix=files["prefix"],
        suffix=files["suffix"],
        pool=files["pool"],
        width=proofs.WIDTH,
    )
    return Proven(lua, layout, body.with_proof(pool[: proofs.WIDTH]))


def _measure(
    bench: stack.BenchStack,
    plan: Plan,
    wrk: str,
    scripts: dict[tuple[str, str], Path],
    names: list[str],
) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for number, cell in enumerate(plan.cells):
        body = bodies.build(cell.body, cell.decision)
        proven = _proven(bench.workdir, plan, cell, body) if body.proof_at is not None else None
        lua = scripts[cell.body, cell.decision] if proven is None else proven.lua
        probe = body.data if proven is None else proven.probe
        probes = {}
        for name in names:
            running = bench.running[name]
            before_probe = running.decisions()
            status = stack.probe(running.gateway, body.path, probe)
            probes[name] = status, _decided(before_probe, running.decisions())
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for turn in range(number, number + plan.rounds):
            slices = None if proven is None else proven.layout.slices(turn - number)
            # Rotate the order so no arrangement always runs first after a change of body.
            start = turn % len(names)
            for name in names[start:] + names[:start]:
                url = bench.running[name].url(body.path)
                rounds[name].append(
                    _round(
                        bench,
                        plan,
                        wrk,
                        name,
                        url=url,
                        lua=lua,
                        concurrency=cell.concurrency,
                        slices=slices,
                    )
                )
        for name in names:
            expected = body.expected_status(bench.running[name].arrangement.polices)
            status, decided = probes[name]
            result = combine(rounds[name])
            reasons = _reasons(rounds[name])
            requests, non_2xx = result["requests"], result["non_2xx"]
            wrong = requests - non_2xx if expected >= 400 else non_2xx
            ok = status == expected and wrong == 0 and result["socket_errors"] == 0
            ok = ok and decided in (None, body.expected_reason)
            # Every decision of every round for the reason the body intends: a proof
            # sent twice would be proof_replayed, a full record proof_record_full.
            ok = ok and (reasons is None or set(reasons) <= {body.expected_reason})
            records.append(
                {
                    "body": cell.body,
                    "body_bytes": bodies.SIZES[cell.body],
                    "decision": cell.decision,
                    "path": body.path,
                    "id_count": body.id_count,
                    "concurrency": cell.concurrency,
                    "arrangement": name,
                    "expected_status": expected,
                    "probe_status": status,
                    "probe_reason": decided,
                    "reasons": reasons,
                    "ok": ok,
                    **result,
                }
            )
            _log(
                f"{cell.body:>3} {cell.decision:<12} c={cell.concurrency:<2} {name:<16} "
                f"p50 {result['p50_ms']:8.3f} ms  p99 {result['p99_ms']:8.3f} ms  "
                f"{result['rps']:9.1f} req/s{'' if ok else '  (unexpected answers)'}"
                + ("" if reasons is None else f"  {reasons}")
            )
    return records


def _reasons(rounds: list[dict[str, Any]]) -> dict[str, int] | None:
    """The decisions of all rounds by reason (None: not a service)."""
    if any(r["reasons"] is None for r in rounds):
        return None
    total: Counter[str] = Counter()
    for r in rounds:
        total.update(r["reasons"])
    return dict(sorted(total.items()))


def run(plan: Plan, out: Path) -> Path:
    paths = tools.ensure_system_tools()
    if "redis" in plan.records:
        paths.update(tools.ensure_tools(tools.REDIS_TOOLS))
    options = tools.serve_options()
    flag = "--workers" in options
    notes: list[str] = []
    if plan.selection == "ledger":
        chosen = ledger_arrangements()
    elif plan.selection == "compiled":
        chosen = compiled_arrangements()
    else:
        chosen, notes = arrangements(plan.workers, flag, naive=plan.naive, records=plan.records)
    notes.append(envoy_note(plan))
    slots = record_slots(plan)
    meta = _meta(plan, paths, flag)
    meta["record_slots"] = slots
    meta["proof_lifetime_seconds"] = proofs.LIFETIME
    if "redis-server" in paths:
        meta["redis"] = tools.version([paths["redis-server"], "--version"])
    workdir = Path(tempfile.mkdtemp(prefix="ext_proc-bench-"))
    scripts: dict[tuple[str, str], Path] = {}
    for size, decision in sorted({(c.body, c.decision) for c in plan.cells}):
        if decision == "honor-proven":
            continue  # a script per cell, its pool minted when the cell runs
        path = workdir / f"body-{size}-{decision}.json"
        path.write_bytes(bodies.build(size, decision).data)
        scripts[size, decision] = load.script(workdir, path)
    names = [a.name for a in chosen]
    _log(
        f"{len(plan.cells)} cells x {names}, {plan.rounds} round(s) of {plan.seconds} s each; "
        f"logs in {workdir}"
    )
    with stack.BenchStack(
        workdir,
        paths["nginx"],
        chosen,
        serve_options=options,
        redis=paths.get("redis-server"),
        record_slots=slots,
        envoy_concurrency=plan.envoy_concurrency,
    ) as bench:
        records = _measure(bench, plan, paths["wrk"], scripts, names)
        envoy_stats = {name: bench.running[name].stats() for name in names}
        notes.append(implementations_note(bench.implementations))
    results = {
        "meta": meta,
        "notes": notes,
        "arrangements": [
            {"name": a.name, "kind": a.kind, "workers": a.workers, "default": a.default}
            for a in chosen
        ],
        "cells": records,
        "envoy_stats": envoy_stats,
    }
    written = report.write(results_model.from_json(results), out)
    shutil.rmtree(workdir, ignore_errors=True)
    _log(f"wrote {', '.join(str(p) for p in written)}")
    return out / "results.md"
