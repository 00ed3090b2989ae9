"""How bench/run.py folds an arrangement's rounds into one record (no process)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import __main__ as cli
from bench import run


def _round(rps: float, p50: float, processor: float, requests: int) -> dict[str, Any]:
    return {
        "requests": requests,
        "seconds": 4.0,
        "rps": rps,
        "p50_ms": p50,
        "p90_ms": p50 * 2,
        "p99_ms": p50 * 3,
        "mean_ms": p50,
        "max_ms": p50 * 10,
        "non_2xx": 1,
        "socket_errors": 0,
        "processor_cpu_ms_per_req": processor,
        "envoy_cpu_ms_per_req": processor / 2,
    }


def test_rounds_fold_into_medians_totals_and_the_largest_latency() -> None:
    rounds = [_round(100, 3.0, 0.5, 400), _round(300, 1.0, 0.1, 1200), _round(200, 2.0, 0.3, 800)]
    combined = run.combine(rounds)
    assert (combined["rps"], combined["p50_ms"], combined["p99_ms"]) == (200, 2.0, 6.0)
    assert combined["processor_cpu_ms_per_req"] == 0.3
    assert combined["envoy_cpu_ms_per_req"] == 0.15
    assert (combined["requests"], combined["seconds"], combined["non_2xx"]) == (2400, 12.0, 3)
    assert combined["max_ms"] == 30.0
    assert [r["rps"] for r in combined["rounds"]] == [100, 300, 200]
    assert combined["rounds"][0] == {
        "rps": 100,
        "p50_ms": 3.0,
        "processor_cpu_ms_per_req": 0.5,
        "envoy_cpu_ms_per_req": 0.25,
    }


def test_one_round_is_its_own_record() -> None:
    (only,) = rounds = [_round(100, 3.0, 0.5, 400)]
    combined = run.combine(rounds)
    assert {k: combined[k] for k in only if k != "seconds"} == {
        k: v for k, v in only.items() if k != "seconds"
    }


def test_envoy_concurrency_is_one_unless_given() -> None:
    def plan(*argv: str) -> run.Plan:
        return cli._plan(cli._parser().parse_args(["--smoke", *argv]))

    assert plan().envoy_concurrency == 1
    assert plan("--envoy-concurrency", "2").envoy_concurrency == 2
    assert run.envoy_note(plan("--envoy-concurrency", "2")) == (
        "Each Envoy ran 2 worker threads (--concurrency 2)."
    )


def test_envoy_concurrency_below_one_is_refused() -> None:
    with pytest.raises(SystemExit):
        cli._plan(cli._parser().parse_args(["--smoke", "--envoy-concurrency", "0"]))


def test_the_compiled_selection_plans_its_cells_and_skips_the_two_message_naive() -> None:
    plan = cli._plan(cli._parser().parse_args(["--cells", "compiled"]))
    assert plan.selection == "compiled"
    assert [(c.body, c.decision, c.concurrency) for c in plan.cells] == [
        ("2k", "allow", 32),
        ("2k", "strip", 32),
        ("2k", "deny", 32),
        ("1m", "allow", 1),
        ("1m", "strip", 1),
        ("1m", "honor", 1),
    ]
    assert not plan.naive
    assert (plan.seconds, plan.warmup, plan.rounds) == (4, 1, 3)
    with pytest.raises(SystemExit):
        cli._plan(cli._parser().parse_args(["--cells", "compiled", "--bodies", "2k"]))


def test_the_compiled_ladder_runs_direct_the_floor_then_one_compiled_part_more() -> None:
    chosen = run.compiled_arrangements()
    assert [a.name for a in chosen] == [
        "direct",
        "naive-1msg",
        "service-w1-native-none",
        "service-w1-native-scan",
        "service-w1-native-scan-wire",
        "service-w1",
    ]
    assert [a.native for a in chosen[2:]] == ["0", "core._scan", "core._scan,edge._wire", ""]
    # One default (the targets judge it), every part compiled: EXT_PROC_NATIVE untouched.
    assert [a.name for a in chosen if a.default] == ["service-w1"]
    assert chosen[-1].environment() is None
    assert all(a.kind == "service" and a.workers == 1 for a in chosen[2:])


def test_the_implementations_note_names_each_services_parts() -> None:
    served = {
        "service-w1-native-scan": {"core._scan": "compiled", "edge._wire": "python"},
        "service-w1": {"core._scan": "compiled", "edge._wire": "compiled"},
    }
    assert run.implementations_note(served) == (
        "Compiled parts, as each service's serving log line stated: "
        "service-w1-native-scan: core._scan compiled, edge._wire python; "
        "service-w1: every part compiled"
    )
    assert "No service" in run.implementations_note({})
