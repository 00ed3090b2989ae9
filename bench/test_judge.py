"""The targets of bench/judge.py on synthetic results: no process is started.

Every check is judged on the arrangement marked default against the floor, as a ratio of
their figures; each case below sits just inside or just outside one threshold.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from bench import judge, results_model, synthetic
from bench.results_model import Key, TargetRow

DEFAULT, OTHER = synthetic.DEFAULT, synthetic.OTHER
_results = synthetic.targets_run


def _set(results: Any, key: Key, name: str, **figures: object) -> None:
    for record in results["cells"]:
        if (record["body"], record["decision"], record["concurrency"], record["arrangement"]) == (
            *key,
            name,
        ):
            record.update(figures)


def _drop(results: Any, key: Key, name: str | None = None) -> None:
    results["cells"] = [
        r
        for r in results["cells"]
        if (r["body"], r["decision"], r["concurrency"]) != key
        or (name is not None and r["arrangement"] != name)
    ]


def _judge(raw: Any) -> tuple[tuple[TargetRow, ...], dict[int, str]]:
    results = results_model.from_json(raw)
    results = replace(results, cells=judge.enrich(results.cells))
    rows = judge.target_rows(results)
    summary = judge.target_summary(results, rows)
    return rows, {s.target: s.status for s in summary}


def _rounds(**series: list[float]) -> list[dict[str, float]]:
    """Rounds as bench/run.py keeps them (req/s and p50 each), from the series given;
    a series not given is the floor's median in every round."""
    count = len(next(iter(series.values())))
    rps, p50 = series.get("rps", [5000.0] * count), series.get("p50_ms", [1.25] * count)
    return [{"rps": r, "p50_ms": p} for r, p in zip(rps, p50, strict=True)]


ALL_MET = {1: "met", 2: "met", 3: "met", 4: "met", 5: "met"}
# (target, cell, the default's figures there): just inside and just outside its limit.
EDGES = [
    (1, ("2k", "allow", 32), {"rps": 4100.0}, {"rps": 3900.0}),  # 0.82x / 0.78x >= 0.8x
    (
        1,
        ("2k", "allow", 32),
        {"processor_cpu_ms_per_req": 0.38},  # 1.27x <= 1.3x
        {"processor_cpu_ms_per_req": 0.40},  # 1.33x
    ),
    (
        1,
        ("2k", "allow", 32),
        {"envoy_cpu_ms_per_req": 0.226},  # 1.13x <= 1.15x
        {"envoy_cpu_ms_per_req": 0.234},  # 1.17x
    ),
    (2, ("2k", "strip", 32), {"rps": 3300.0}, {"rps": 3200.0}),  # 0.66x / 0.64x >= 0.65x
    (2, ("2k", "deny", 32), {"rps": 3300.0}, {"rps": 3200.0}),
    # Added p50 over direct's 0.25 ms; the floor adds 1.0 ms.
    (3, ("2k", "allow", 1), {"p50_ms": 1.38}, {"p50_ms": 1.42}),  # 1.13x / 1.17x <= 1.15x
    (4, ("1m", "allow", 1), {"p50_ms": 1.53}, {"p50_ms": 1.57}),  # 1.28x / 1.32x <= 1.3x
    (5, ("1m", "strip", 1), {"p50_ms": 1.83}, {"p50_ms": 1.87}),  # 1.58x / 1.62x <= 1.6x
    (5, ("1m", "honor", 1), {"p50_ms": 1.83}, {"p50_ms": 1.87}),
]


def test_every_target_is_met_at_the_floor_and_reads_only_its_cells() -> None:
    rows, status = _judge(_results())
    assert status == ALL_MET
    assert {r.status for r in rows} == {"met"}
    cells = {(body, decision, c) for body, decision, c in judge.TARGET_CELLS}
    assert cells == {
        ("2k", "allow", 32),
        ("2k", "strip", 32),
        ("2k", "deny", 32),
        ("2k", "allow", 1),
        ("1m", "allow", 1),
        ("1m", "strip", 1),
        ("1m", "honor", 1),
        ("1m", "honor-proven", 1),
    }


@pytest.mark.parametrize(
    ("target", "key", "inside", "outside"),
    EDGES,
    ids=[f"{t}-{'-'.join(map(str, key))}-{next(iter(a))}" for t, key, a, _ in EDGES],
)
def test_each_limit_is_met_inside_and_missed_outside(
    target: int, key: Key, inside: dict[str, float], outside: dict[str, float]
) -> None:
    results = _results()
    _set(results, key, DEFAULT, **inside)
    assert _judge(results)[1] == ALL_MET

    results = _results()
    _set(results, key, DEFAULT, **outside)
    rows, status = _judge(results)
    assert status == {**ALL_MET, target: "missed"}
    (missed,) = [r for r in rows if r.status == "missed"]
    assert missed.arrangement == DEFAULT
    assert missed.cell.startswith(judge._cell_name(key))


def test_a_row_shows_the_ratio_the_threshold_and_both_figures() -> None:
    results = _results()
    _set(results, ("2k", "allow", 32), DEFAULT, rps=3900.0)
    rows, _ = _judge(results)
    row = next(r for r in rows if r.target == 1 and r.measure == "req/s")
    assert row.value == 0.78
    assert row.threshold == ">= 0.80x floor"
    assert row.detail == "3900 vs floor 5000 req/s"
    assert row.status == "missed"


def test_a_row_shows_each_rounds_ratio_paired_by_round() -> None:
    results = _results()
    key = ("2k", "strip", 32)
    _set(results, key, DEFAULT, rounds=_rounds(rps=[3000.0, 3300.0]))
    _set(results, key, judge.FLOOR, rounds=_rounds(rps=[5000.0, 5500.0]))
    honor: Key = ("1m", "honor", 1)
    _set(results, honor, DEFAULT, rounds=_rounds(p50_ms=[2.25, 1.75]))
    _set(results, honor, judge.FLOOR, rounds=_rounds(p50_ms=[1.25, 1.5]))
    _set(results, honor, "direct", rounds=_rounds(p50_ms=[0.25, 0.5]))
    rows, _ = _judge(results)
    strip = next(r for r in rows if r.cell == "2 KiB strip c=32")
    assert strip.rounds == (0.6, 0.6)
    # Judged on the rounds' ratios, not on the medians' (1.0 here: the figures differ).
    assert (strip.value, strip.status) == (0.6, "missed")
    assert strip.detail == ("medians 5000 vs floor 5000 req/s; rounds 0.60x, 0.60x (0 of 2 met)")
    honored = next(r for r in rows if r.cell.startswith("1 MiB honor c=1"))
    assert honored.rounds == (2.0, 1.25)  # each round's added p50 over its own direct
    assert honored.value == 1.625
    assert (honored.rounds_met, honored.status) == (1, "missed")
    assert honored.detail.endswith("rounds 2.00x, 1.25x (1 of 2 met)")
    allow = next(r for r in rows if r.cell == "2 KiB allow c=1")
    assert allow.rounds == ()  # records without rounds: nothing to pair
    assert allow.rounds_met == 0
    assert "rounds" not in allow.detail


def test_a_target_without_its_cell_is_not_measured() -> None:
    results = _results(cells=tuple(k for k in judge.TARGET_CELLS if k != ("1m", "allow", 1)))
    rows, status = _judge(results)
    assert status == {**ALL_MET, 4: "not measured"}
    (row,) = [r for r in rows if r.target == 4]
    assert row.value is None
    assert row.status == "not measured"


@pytest.mark.parametrize("missing", ["direct", judge.FLOOR, DEFAULT])
def test_a_cell_without_the_floor_direct_or_the_default_is_not_measured(missing: str) -> None:
    results = _results()
    _drop(results, ("2k", "allow", 1), missing)
    _, status = _judge(results)
    assert status == {**ALL_MET, 3: "not measured"}


def test_a_missed_cell_outweighs_a_missing_one() -> None:
    results = _results()
    _drop(results, ("1m", "honor", 1))
    _set(results, ("1m", "strip", 1), DEFAULT, p50_ms=5.0)
    _, status = _judge(results)
    assert status == {**ALL_MET, 5: "missed"}


def test_a_floor_of_zero_leaves_the_ratio_undetermined() -> None:
    results = _results()
    _set(results, ("2k", "allow", 32), judge.FLOOR, processor_cpu_ms_per_req=0.0)
    _, status = _judge(results)
    assert status == {**ALL_MET, 1: "undetermined"}


def test_only_the_default_is_judged() -> None:
    rows, status = _judge(_results())
    assert status == ALL_MET  # OTHER misses everything and counts for nothing
    assert {r.arrangement for r in rows} == {DEFAULT}


def test_the_default_is_read_from_the_results() -> None:
    rows, status = _judge(_results(default=OTHER))
    assert {r.arrangement for r in rows} == {OTHER}
    assert set(status.values()) == {"missed"}


def test_without_a_single_default_nothing_is_measured() -> None:
    results = _results()
    results["arrangements"][-1]["default"] = True  # two marked
    _, status = _judge(results)
    assert set(status.values()) == {"not measured"}


def test_honor_proven_is_informational_and_only_when_measured() -> None:
    proven = ("1m", "honor-proven", 1)
    results = _results()
    _set(results, proven, DEFAULT, p50_ms=50.0)
    rows, status = _judge(results)
    assert status == ALL_MET
    (row,) = [r for r in rows if r.informational]
    assert (row.target, row.status) == (5, "missed")

    results = _results()
    _drop(results, proven)
    rows, status = _judge(results)
    assert status == ALL_MET
    assert not any(r.informational for r in rows)


def test_strict_cells_count_for_no_target() -> None:
    """The cost of a strict_body route is informational (bench/strictness.py): no
    target reads it, and `--cells targets` does not measure it."""
    assert not any(decision == "strict" for _, decision, _ in judge.TARGET_CELLS)
    results = _results()
    results["cells"] += [
        synthetic.record(body, "strict", c, name, **synthetic.FIGURES[synthetic.OTHER])
        for body, decision, c in judge.TARGET_CELLS
        if decision == "allow"
        for name in (synthetic.DEFAULT, judge.FLOOR, "direct")
    ]
    rows, status = _judge(results)
    assert status == ALL_MET  # a default far outside every limit in the strict cells
    assert not any("strict" in r.cell for r in rows)
