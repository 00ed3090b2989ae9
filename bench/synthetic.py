"""Synthetic results for the harness's unit tests: the dict bench/run.py builds, with
only the figures a test reads chosen (every other key a plausible constant)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench import ledger
from bench.judge import FLOOR, TARGET_CELLS
from bench.results_model import MIB, Key

BYTES = {"2k": 2048, "64k": 64 * 1024, "1m": MIB}
META: dict[str, Any] = {
    "started": "2026-01-01T00:00:00+00:00",
    "mode": "full",
    "cells": "matrix",
    "records": ["local"],
    "seconds_per_cell": 4,
    "warmup_seconds": 1,
    "rounds": 1,
    "wrk_threads": 1,
    "cpus": 2,
    "machine": "test",
    "python": "3.11",
    "envoy": "envoy",
    "nginx": "nginx",
    "wrk": "wrk",
    "service_workers_option": True,
}


def record(
    body: str, decision: str, concurrency: int, arrangement: str, **figures: object
) -> dict[str, Any]:
    """One cell record, answered as expected; ``figures`` set any of its keys."""
    return {
        "body": body,
        "body_bytes": BYTES[body],
        "decision": decision,
        "path": "/v1/chat/completions",
        "id_count": 0,
        "concurrency": concurrency,
        "arrangement": arrangement,
        "expected_status": 200,
        "probe_status": 200,
        "probe_reason": None,
        "ok": True,
        "rps": 1000.0,
        "p50_ms": 1.0,
        "p90_ms": 2.0,
        "p99_ms": 3.0,
        "mean_ms": 1.0,
        "requests": 4000,
        "seconds": 4.0,
        "non_2xx": 0,
        "socket_errors": 0,
        "max_ms": 10.0,
        **figures,
    }


def results(
    kinds: Mapping[str, str], cells: list[dict[str, Any]], default: str | None
) -> dict[str, Any]:
    """A run of the arrangements ``kinds`` (name: kind) measuring ``cells``."""
    return {
        "meta": dict(META),
        "notes": [],
        "arrangements": [
            {"name": name, "kind": kind, "workers": None, "default": name == default}
            for name, kind in kinds.items()
        ],
        "cells": cells,
        "envoy_stats": {},
    }


DEFAULT = "service-w1"
OTHER = "service-w1-2msg"
# direct, the floor and the default: each target's checks are exactly met-by-ratio 1.0.
FIGURES: dict[str, dict[str, float]] = {
    "direct": {"p50_ms": 0.25, "rps": 20000.0, "envoy_cpu_ms_per_req": 0.05},
    FLOOR: {
        "p50_ms": 1.25,
        "rps": 5000.0,
        "processor_cpu_ms_per_req": 0.3,
        "envoy_cpu_ms_per_req": 0.2,
    },
    DEFAULT: {
        "p50_ms": 1.25,
        "rps": 5000.0,
        "processor_cpu_ms_per_req": 0.3,
        "envoy_cpu_ms_per_req": 0.2,
    },
    # A service column far outside every target: judging it would miss them all.
    OTHER: {
        "p50_ms": 90.0,
        "rps": 10.0,
        "processor_cpu_ms_per_req": 9.0,
        "envoy_cpu_ms_per_req": 9.0,
    },
}
KINDS = {"direct": "direct", FLOOR: "naive", DEFAULT: "service", OTHER: "service"}


def targets_run(default: str = DEFAULT, cells: tuple[Key, ...] = TARGET_CELLS) -> dict[str, Any]:
    """Every cell the targets read (or ``cells``), each with direct, the floor, the
    default and OTHER: every check exactly at a ratio of 1.0."""
    records = [
        record(body, decision, concurrency, name, **figures)
        for body, decision, concurrency in cells
        for name, figures in FIGURES.items()
    ]
    return results(KINDS, records, default)


def records_run() -> dict[str, Any]:
    """direct, the default and its Redis twin, each in honor and honor-proven at 1 MiB
    c=1, the default's processor CPU per request equal to its p50."""

    def cell(decision: str, name: str, p50: float) -> dict[str, Any]:
        return record("1m", decision, 1, name, p50_ms=p50, rps=100.0, processor_cpu_ms_per_req=p50)

    cells = [
        cell("honor", "direct", 1.0),
        cell("honor", DEFAULT, 5.0),
        cell("honor", DEFAULT + "-redis", 5.0),
        cell("honor-proven", "direct", 1.0),
        cell("honor-proven", DEFAULT, 7.0),
        cell("honor-proven", DEFAULT + "-redis", 9.0),
    ]
    kinds = {"direct": "direct", DEFAULT: "service", DEFAULT + "-redis": "service"}
    return results(kinds, cells, None)


def strict_run() -> dict[str, Any]:
    """direct, the floor and the default in allow and strict at 2 KiB c=32: the
    default serves strict at 0.5x allow's req/s, twice its p50 and 1.5x its processor
    CPU, while the floor's req/s moved from 5000 to 4000 between the two cells."""
    figures = {
        ("allow", "direct"): {"p50_ms": 0.25, "rps": 20000.0},
        ("allow", FLOOR): {"p50_ms": 1.25, "rps": 5000.0, "processor_cpu_ms_per_req": 0.3},
        ("allow", DEFAULT): {"p50_ms": 1.25, "rps": 4000.0, "processor_cpu_ms_per_req": 0.4},
        ("strict", "direct"): {"p50_ms": 0.25, "rps": 20000.0},
        ("strict", FLOOR): {"p50_ms": 1.25, "rps": 4000.0, "processor_cpu_ms_per_req": 0.3},
        ("strict", DEFAULT): {"p50_ms": 2.5, "rps": 2000.0, "processor_cpu_ms_per_req": 0.6},
    }
    cells = [
        record("2k", decision, 32, name, **values) for (decision, name), values in figures.items()
    ]
    kinds = {"direct": "direct", FLOOR: "naive", DEFAULT: "service"}
    return results(kinds, cells, DEFAULT)


def ledger_run() -> dict[str, Any]:
    """Every rung of both ladders in 2 KiB allow c=32: each processor rung costs 0.01 ms
    of processor CPU more than the one before (the floor 0.3 ms), each Envoy rung 0.01
    ms of Envoy CPU more (Envoy direct without routes or log 0.1 ms); every rung of the
    processor's ladder leaves Envoy at the floor's 0.15 ms and serves 5000 req/s."""
    cells = []
    kinds: dict[str, str] = {}
    envoy_rungs = ("direct-bare", "direct-routes", "direct", "direct-header_step")
    for step, name in enumerate(envoy_rungs):
        kinds[name] = "direct"
        cpu = {"envoy_cpu_ms_per_req": round(0.1 + 0.01 * step, 4)}
        cells.append(record("2k", "allow", 32, name, rps=20000.0, **cpu))
    kinds[FLOOR + "-ext_proc"] = "naive"
    cells.append(
        record(
            "2k",
            "allow",
            32,
            FLOOR + "-ext_proc",
            rps=5000.0,
            processor_cpu_ms_per_req=0.3,
            envoy_cpu_ms_per_req=0.14,
        )
    )
    rungs = (FLOOR, *(f"ledger-{r}" for r in ledger.RUNGS), DEFAULT)
    for step, name in enumerate(rungs):
        kinds[name] = "naive" if name == FLOOR else "service" if name == DEFAULT else "ledger"
        cpu = {
            "processor_cpu_ms_per_req": round(0.3 + 0.01 * step, 4),
            "envoy_cpu_ms_per_req": 0.15,
        }
        cells.append(record("2k", "allow", 32, name, rps=5000.0, **cpu))
    return results(kinds, cells, DEFAULT)


# The compiled ladder's service rungs below the default, by name.
COMPILED = tuple(f"{DEFAULT}-native-{s}" for s in ("none", "scan", "scan-wire"))


def compiled_run() -> dict[str, Any]:
    """The compiled ladder in 1 MiB strip c=1: Envoy direct at a p50 of 1 ms, the floor
    at 2 ms, the service with no compiled part at 10 ms and 1 ms less at each rung up to
    the default (7 ms); the processor's CPU per request is its p50 less a millisecond."""
    cells = [
        record("1m", "strip", 1, "direct", p50_ms=1.0, rps=900.0, envoy_cpu_ms_per_req=0.5),
        record("1m", "strip", 1, FLOOR, p50_ms=2.0, rps=400.0, processor_cpu_ms_per_req=1.0),
    ]
    for step, name in enumerate((*COMPILED, DEFAULT)):
        p50 = 10.0 - step
        cpu = {"processor_cpu_ms_per_req": p50 - 1, "envoy_cpu_ms_per_req": 0.5}
        cells.append(record("1m", "strip", 1, name, p50_ms=p50, rps=100.0, **cpu))
    kinds = {"direct": "direct", FLOOR: "naive", **dict.fromkeys((*COMPILED, DEFAULT), "service")}
    raw = results(kinds, cells, DEFAULT)
    raw["meta"]["cells"] = "compiled"
    return raw
