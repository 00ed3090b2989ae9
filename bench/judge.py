"""Judging a run: each record against direct and naive in its cell, the targets, slopes.

Added latency of an arrangement in a cell is ``p50(x) - p50(direct)`` in the same cell
(same body, route and concurrency). The targets are judged only on the shipped default
arrangement (the one the results mark ``default``) against the floor ``naive-1msg`` (the
naive processor behind the same one-message config) measured in the same run, as ratios
of the default's figure to the floor's:

1. 2 KiB allow, c=32: requests/s >= 0.8x the floor's, processor CPU per request
   <= 1.3x, Envoy CPU per request <= 1.15x;
2. 2 KiB strip and deny, c=32: requests/s >= 0.65x the floor's;
3. 2 KiB allow, c=1: added p50 <= 1.15x the floor's added p50;
4. 1 MiB allow (long prompt, no ids), c=1: added p50 <= 1.3x the floor's;
5. 1 MiB strip and 1 MiB honor (128k ids, ``trust_any_caller``), c=1: added p50
   <= 1.6x the floor's; ``honor-proven`` is reported beside them, informational.

A target whose cells were not all measured in the run is "not measured" unless a
measured one missed. The cost of verifying proofs (``honor-proven`` minus ``honor``) is
bench/verification.py; the cost of a ``strict_body`` route (``strict`` against
``allow``), informational, no target reading it, is bench/strictness.py.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from bench import ladder, strictness, verification
from bench.results_model import (
    DECISION_ORDER,
    LABEL,
    MIB,
    Derived,
    Key,
    Record,
    Relative,
    Results,
    Round,
    Slope,
    TargetRow,
    TargetSummary,
    by_cell,
    order,
)

FLOOR = "naive-1msg"
HONORED = {"honor": "128k ids honored on /pd-any/v1/", "honor-proven": "128k proven ids on /pd/v1/"}


def judge(results: Results) -> Results:
    """The results with every derived figure, replacing any they were read with."""
    enriched = replace(results, cells=enrich(results.cells))
    targets = target_rows(enriched)
    derived = Derived(
        targets=targets,
        target_summary=target_summary(enriched, targets),
        slopes=slopes(enriched),
        verification=verification.rows(enriched),
        records=verification.record_rows(enriched),
        strict=strictness.rows(enriched, FLOOR),
        ledger=ladder.rows(enriched, FLOOR),
    )
    return replace(enriched, derived=derived)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return round(a / b, 3)


def enrich(records: Sequence[Record]) -> tuple[Record, ...]:
    """Each record with its latency over direct and its ratios to direct and naive."""
    cells = by_cell(records)
    return tuple(replace(r, relative=_relative(r, cells[r.key])) for r in records)


def _relative(record: Record, group: dict[str, Record]) -> Relative:
    direct, naive = group.get("direct"), group.get("naive")
    naive_added = naive.p50_ms - direct.p50_ms if naive and direct else None
    added = record.p50_ms - direct.p50_ms if direct else None
    return Relative(
        added_p50_ms=None if added is None else round(added, 3),
        p50_x_direct=_ratio(record.p50_ms, None if direct is None else float(direct.p50_ms)),
        rps_x_direct=_ratio(record.rps, None if direct is None else float(direct.rps)),
        added_x_naive=_ratio(added, naive_added),
        rps_x_naive=_ratio(record.rps, None if naive is None else float(naive.rps)),
    )


Figures = Record | Round


@dataclass(frozen=True)
class Measure:
    """A figure of a cell's record, judged as the default's value over the floor's."""

    label: str
    of: Callable[[Figures], float | None]  # the figure of a record or of one of its rounds
    unit: str
    digits: int
    at_least: bool  # met when the ratio is >= the limit; otherwise when it is <= it

    def met(self, ratio: float, limit: float) -> bool:
        return ratio >= limit if self.at_least else ratio <= limit

    def threshold(self, limit: float) -> str:
        return f"{'>=' if self.at_least else '<='} {limit:.2f}x floor"


def _added_p50(figures: Figures) -> float | None:
    """A record's; a round's is over direct's in the same round (``_round_ratios``)."""
    if isinstance(figures, Round) or figures.relative is None:
        return None
    return figures.relative.added_p50_ms


THROUGHPUT = Measure("req/s", lambda f: f.rps, "req/s", 0, at_least=True)
PROCESSOR_CPU = Measure("processor CPU/req", lambda f: f.cpu.processor, "ms/req", 3, at_least=False)
ENVOY_CPU = Measure("Envoy CPU/req", lambda f: f.cpu.envoy, "ms/req", 3, at_least=False)
# p50 over direct's in the same cell (enrich); needs direct measured there.
ADDED_P50 = Measure("added p50", _added_p50, "ms", 3, at_least=False)


@dataclass(frozen=True)
class Target:
    number: int
    title: str
    cells: tuple[Key, ...]
    checks: tuple[tuple[Measure, float], ...]
    # Cells reported beside the target's own when measured, never counted in its status.
    informational: tuple[Key, ...] = ()


TARGETS = (
    Target(
        1,
        "2 KiB allow, c=32: req/s >= 0.8x floor's, processor CPU/req <= 1.3x, "
        "Envoy CPU/req <= 1.15x",
        (("2k", "allow", 32),),
        ((THROUGHPUT, 0.8), (PROCESSOR_CPU, 1.3), (ENVOY_CPU, 1.15)),
    ),
    Target(
        2,
        "2 KiB strip and deny, c=32: req/s >= 0.65x floor's",
        (("2k", "strip", 32), ("2k", "deny", 32)),
        ((THROUGHPUT, 0.65),),
    ),
    Target(
        3,
        "2 KiB allow, c=1: added p50 <= 1.15x floor's",
        (("2k", "allow", 1),),
        ((ADDED_P50, 1.15),),
    ),
    Target(
        4,
        "1 MiB allow (long prompt, no ids), c=1: added p50 <= 1.3x floor's",
        (("1m", "allow", 1),),
        ((ADDED_P50, 1.3),),
    ),
    Target(
        5,
        "1 MiB strip and 1 MiB honor (128k ids), c=1: added p50 <= 1.6x floor's",
        (("1m", "strip", 1), ("1m", "honor", 1)),
        ((ADDED_P50, 1.6),),
        informational=(("1m", "honor-proven", 1),),
    ),
)
# Every cell the targets read, in matrix order: what `python -m bench --cells targets` runs.
TARGET_CELLS: tuple[Key, ...] = tuple(
    sorted({key for t in TARGETS for key in (*t.cells, *t.informational)}, key=order)
)
STATUS_ORDER = ("missed", "not measured", "undetermined", "met")


def _cell_name(key: Key) -> str:
    body, decision, concurrency = key
    return f"{LABEL[body]} {decision} c={concurrency}"


def _target_cell(key: Key) -> str:
    body, decision, _ = key
    if decision in HONORED:
        return f"{_cell_name(key)} ({HONORED[decision]})"
    if body == "1m" and decision == "allow":
        return f"{_cell_name(key)} (long prompt, no ids)"
    return _cell_name(key)


def _num(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _check(
    number: int,
    key: Key,
    check: tuple[Measure, float],
    group: dict[str, Record],
    default: str | None,
    *,
    informational: bool = False,
) -> TargetRow:
    """One measure of one cell: the default's figure over the floor's, against a limit."""
    measure, limit = check
    mine = group.get(default) if default is not None else None
    floor = group.get(FLOOR)
    a = None if mine is None else measure.of(mine)
    b = None if floor is None else measure.of(floor)
    ratio = a / b if a is not None and b is not None and b > 0 else None
    per_round = _round_ratios(measure, mine, floor, group.get("direct"))
    if per_round:
        # Rounds pair figures measured seconds apart: the median of their ratios is
        # what a drift of the machine moves least.
        ratio = statistics.median(per_round)
    rounds_met = sum(measure.met(r, limit) for r in per_round)
    detail = _detail(measure, a, b, per_round, rounds_met)
    missing = _missing(measure, group, default)
    if missing:
        status, detail = "not measured", "not measured: " + ", ".join(missing)
    elif ratio is None:
        status = "undetermined"
    else:
        status = "met" if measure.met(ratio, limit) else "missed"
        if not (mine and floor and mine.ok and floor.ok):
            detail += " (unexpected answers)"
    return TargetRow(
        target=number,
        arrangement=default,
        floor=FLOOR,
        cell=_target_cell(key),
        measure=measure.label,
        value=None if ratio is None else round(ratio, 3),
        limit=limit,
        threshold=measure.threshold(limit),
        default_value=a,
        floor_value=b,
        unit=measure.unit,
        detail=detail,
        rounds=tuple(per_round),
        rounds_met=rounds_met,
        status=status,
        informational=informational,
    )


def _missing(measure: Measure, group: dict[str, Record], default: str | None) -> list[str]:
    """The arrangements a check needs that its cell lacks."""
    needed = {"the default arrangement" if default is None else default, FLOOR}
    if measure is ADDED_P50:
        needed.add("direct")
    return sorted(name for name in needed if name not in group)


def _detail(
    measure: Measure, a: float | None, b: float | None, per_round: list[float], rounds_met: int
) -> str:
    detail = f"{_num(a, measure.digits)} vs floor {_num(b, measure.digits)} {measure.unit}"
    if len(per_round) > 1:
        # How many rounds met the threshold: a check whose rounds split lies within
        # the machine's noise of it.
        detail = "medians " + detail
        detail += "; rounds " + ", ".join(f"{r:.2f}x" for r in per_round)
        detail += f" ({rounds_met} of {len(per_round)} met)"
    return detail


def _round_ratios(
    measure: Measure, mine: Record | None, floor: Record | None, direct: Record | None
) -> list[float]:
    """The default's figure over the floor's in each round (the arrangements' rounds
    are paired by their order); empty when a record has no rounds or they differ in
    number."""
    if mine is None or floor is None or mine.rounds is None or floor.rounds is None:
        return []
    if len(mine.rounds) != len(floor.rounds):
        return []
    a: list[float | None]
    b: list[float | None]
    if measure is ADDED_P50:
        added, floor_added = mine.added_rounds(direct), floor.added_rounds(direct)
        if added is None or floor_added is None:
            return []
        a, b = list(added), list(floor_added)
    else:
        a = [measure.of(r) for r in mine.rounds]
        b = [measure.of(r) for r in floor.rounds]
    return [
        round(x / y, 3)
        for x, y in zip(a, b, strict=True)
        if x is not None and y is not None and y > 0
    ]


def target_rows(results: Results) -> tuple[TargetRow, ...]:
    """Every check of every target on the default arrangement; no other is judged.
    Expects the records enriched (added p50)."""
    cells = by_cell(results.cells)
    default = results.default
    rows: list[TargetRow] = []
    for target in TARGETS:
        for key in target.cells:
            rows += [
                _check(target.number, key, check, cells.get(key, {}), default)
                for check in target.checks
            ]
        for key in target.informational:
            group = cells.get(key, {})
            if default is not None and default in group:
                rows += [
                    _check(target.number, key, check, group, default, informational=True)
                    for check in target.checks
                ]
    return tuple(rows)


def target_summary(results: Results, rows: Sequence[TargetRow]) -> tuple[TargetSummary, ...]:
    """One status per target: missed when any counted check missed, else not measured
    when any cell is missing, else undetermined when a ratio has no floor, else met."""
    summaries = []
    for target in TARGETS:
        counted = [r for r in rows if r.target == target.number and not r.informational]
        statuses = {r.status for r in counted}
        summaries.append(
            TargetSummary(
                target=target.number,
                title=target.title,
                arrangement=results.default,
                floor=FLOOR,
                status=next(s for s in STATUS_ORDER if s in statuses),
                checks_met=sum(r.status == "met" for r in counted),
                checks=len(counted),
            )
        )
    return tuple(summaries)


def _fit(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope; None without two distinct x values."""
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    num = sum((x - mean_x) * (y - mean_y) for x, y in points)
    den = sum((x - mean_x) ** 2 for x, _ in points)
    return num / den


def slopes(results: Results) -> tuple[Slope, ...]:
    """Added p50 per MiB of body, fitted over the body sizes measured. Expects the
    records enriched."""
    points: dict[tuple[str, str, int], list[tuple[float, float]]] = defaultdict(list)
    for record in results.cells:
        added = None if record.relative is None else record.relative.added_p50_ms
        if record.arrangement == "direct" or added is None:
            continue
        group = (record.arrangement, record.decision, record.concurrency)
        points[group].append((record.body_bytes / MIB, added))
    rows = []
    for (name, decision, concurrency), pts in sorted(
        points.items(), key=lambda item: (item[0][0], DECISION_ORDER[item[0][1]], item[0][2])
    ):
        slope = _fit(pts)
        rows.append(
            Slope(
                arrangement=name,
                decision=decision,
                concurrency=concurrency,
                ms_per_mib=None if slope is None else round(slope, 3),
                sizes=len(pts),
            )
        )
    return tuple(rows)
