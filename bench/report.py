"""Raw measurements -> results.json, results.md (tables, targets, slopes) and PNG plots.

Added latency of an arrangement in a cell is ``p50(x) - p50(direct)`` in the same cell
(same body, route and concurrency). The targets are judged only on the shipped default
arrangement (the one ``results["arrangements"]`` marks ``"default": true``) against the
floor ``naive-1msg`` (the naive processor behind the same one-message config) measured in
the same run, as ratios of the default's figure to the floor's:

1. 2 KiB allow, c=32: requests/s >= 0.8x the floor's, processor CPU per request
   <= 1.3x, Envoy CPU per request <= 1.15x;
2. 2 KiB strip and deny, c=32: requests/s >= 0.65x the floor's;
3. 2 KiB allow, c=1: added p50 <= 1.15x the floor's added p50;
4. 1 MiB allow (long prompt, no ids), c=1: added p50 <= 1.3x the floor's;
5. 1 MiB strip and 1 MiB honor (128k ids, ``trust_any_caller``), c=1: added p50
   <= 1.6x the floor's; ``honor-proven`` is reported beside them, informational.

A target whose cells were not all measured in the run is "not measured" unless a
measured one missed. The cost of verifying proofs (``honor-proven`` minus ``honor``) is
bench/verification.py.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from bench import verification

MIB = 1024 * 1024
FLOOR = "naive-1msg"
BODY_ORDER = {"2k": 0, "64k": 1, "1m": 2}
DECISION_ORDER = {"allow": 0, "strip": 1, "deny": 2, "honor": 3, "honor-proven": 4}
HONORED = {"honor": "128k ids honored on /pd-any/v1/", "honor-proven": "128k proven ids on /pd/v1/"}
LABEL = {"2k": "2 KiB", "64k": "64 KiB", "1m": "1 MiB"}

Record = dict[str, Any]
Key = tuple[str, str, int]


def _key(record: Record) -> Key:
    return record["body"], record["decision"], record["concurrency"]


def _order(key: Key) -> tuple[int, int, int]:
    return BODY_ORDER[key[0]], DECISION_ORDER[key[1]], key[2]


def by_cell(records: list[Record]) -> dict[Key, dict[str, Record]]:
    cells: dict[Key, dict[str, Record]] = defaultdict(dict)
    for record in records:
        cells[_key(record)][record["arrangement"]] = record
    return dict(sorted(cells.items(), key=lambda item: _order(item[0])))


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return round(a / b, 3)


def _get(record: Record | None, field: str) -> float | None:
    return None if record is None else float(record[field])


def enrich(records: list[Record]) -> None:
    """Add each record's latency over direct and its ratios to direct and naive."""
    for group in by_cell(records).values():
        direct, naive = group.get("direct"), group.get("naive")
        naive_added = naive["p50_ms"] - direct["p50_ms"] if naive and direct else None
        for record in group.values():
            added = record["p50_ms"] - direct["p50_ms"] if direct else None
            record["added_p50_ms"] = None if added is None else round(added, 3)
            record["p50_x_direct"] = _ratio(record["p50_ms"], _get(direct, "p50_ms"))
            record["rps_x_direct"] = _ratio(record["rps"], _get(direct, "rps"))
            record["added_x_naive"] = _ratio(added, naive_added)
            record["rps_x_naive"] = _ratio(record["rps"], _get(naive, "rps"))


@dataclass(frozen=True)
class Measure:
    """A figure of a cell's record, judged as the default's value over the floor's."""

    label: str
    field: str
    unit: str
    digits: int
    at_least: bool  # met when the ratio is >= the limit; otherwise when it is <= it

    def met(self, ratio: float, limit: float) -> bool:
        return ratio >= limit if self.at_least else ratio <= limit

    def threshold(self, limit: float) -> str:
        return f"{'>=' if self.at_least else '<='} {limit:.2f}x floor"


THROUGHPUT = Measure("req/s", "rps", "req/s", 0, at_least=True)
PROCESSOR_CPU = Measure(
    "processor CPU/req", "processor_cpu_ms_per_req", "ms/req", 3, at_least=False
)
ENVOY_CPU = Measure("Envoy CPU/req", "envoy_cpu_ms_per_req", "ms/req", 3, at_least=False)
# p50 over direct's in the same cell (enrich); needs direct measured there.
ADDED_P50 = Measure("added p50", "added_p50_ms", "ms", 3, at_least=False)


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
    sorted({key for t in TARGETS for key in (*t.cells, *t.informational)}, key=_order)
)
STATUS_ORDER = ("missed", "not measured", "undetermined", "met")


def default_arrangement(results: dict[str, Any]) -> str | None:
    """The arrangement marked ``"default": true``; None unless exactly one is."""
    marked = [a["name"] for a in results["arrangements"] if a.get("default")]
    return marked[0] if len(marked) == 1 else None


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


def _check(
    number: int,
    key: Key,
    check: tuple[Measure, float],
    group: dict[str, Record],
    default: str | None,
    *,
    informational: bool = False,
) -> Record:
    """One measure of one cell: the default's figure over the floor's, against a limit."""
    measure, limit = check
    needed = {"the default arrangement" if default is None else default, FLOOR}
    if measure is ADDED_P50:
        needed.add("direct")
    missing = sorted(name for name in needed if name not in group)
    mine = group.get(default) if default is not None else None
    floor = group.get(FLOOR)
    a = None if mine is None else mine.get(measure.field)
    b = None if floor is None else floor.get(measure.field)
    ratio = a / b if a is not None and b is not None and b > 0 else None
    per_round = _round_ratios(measure, mine, floor, group.get("direct"))
    if per_round:
        # Rounds pair figures measured seconds apart: the median of their ratios is
        # what a drift of the machine moves least.
        ratio = statistics.median(per_round)
    digits = measure.digits
    detail = f"{_num(a, digits)} vs floor {_num(b, digits)} {measure.unit}"
    rounds_met = sum(measure.met(r, limit) for r in per_round)
    if len(per_round) > 1:
        # How many rounds met the threshold: a check whose rounds split lies within
        # the machine's noise of it.
        detail = "medians " + detail
        detail += "; rounds " + ", ".join(f"{r:.2f}x" for r in per_round)
        detail += f" ({rounds_met} of {len(per_round)} met)"
    if missing:
        status, detail = "not measured", "not measured: " + ", ".join(missing)
    elif ratio is None:
        status = "undetermined"
    else:
        status = "met" if measure.met(ratio, limit) else "missed"
        if not (mine and floor and mine["ok"] and floor["ok"]):
            detail += " (unexpected answers)"
    return {
        "target": number,
        "arrangement": default,
        "floor": FLOOR,
        "cell": _target_cell(key),
        "measure": measure.label,
        "value": None if ratio is None else round(ratio, 3),
        "limit": limit,
        "threshold": measure.threshold(limit),
        "default_value": a,
        "floor_value": b,
        "unit": measure.unit,
        "detail": detail,
        "rounds": per_round,
        "rounds_met": rounds_met,
        "status": status,
        "informational": informational,
    }


def _round_ratios(
    measure: Measure, mine: Record | None, floor: Record | None, direct: Record | None
) -> list[float]:
    """The default's figure over the floor's in each round (the arrangements' rounds
    are paired by their order); empty when a record has no rounds or they differ in
    number."""
    if mine is None or floor is None or "rounds" not in mine or "rounds" not in floor:
        return []
    if len(mine["rounds"]) != len(floor["rounds"]):
        return []
    if measure is ADDED_P50:
        if direct is None or "rounds" not in direct:
            return []
        if len(direct["rounds"]) != len(mine["rounds"]):
            return []
        base = [r["p50_ms"] for r in direct["rounds"]]
        a = [r["p50_ms"] - d for r, d in zip(mine["rounds"], base, strict=True)]
        b = [r["p50_ms"] - d for r, d in zip(floor["rounds"], base, strict=True)]
    else:
        a = [r.get(measure.field) for r in mine["rounds"]]
        b = [r.get(measure.field) for r in floor["rounds"]]
    return [
        round(x / y, 3)
        for x, y in zip(a, b, strict=True)
        if x is not None and y is not None and y > 0
    ]


def target_rows(results: dict[str, Any]) -> list[Record]:
    """Every check of every target on the default arrangement; no other is judged.
    Expects the records enriched (added p50)."""
    cells = by_cell(results["cells"])
    default = default_arrangement(results)
    rows = []
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
    return rows


def target_summary(results: dict[str, Any], rows: list[Record]) -> list[Record]:
    """One status per target: missed when any counted check missed, else not measured
    when any cell is missing, else undetermined when a ratio has no floor, else met."""
    summaries = []
    for target in TARGETS:
        counted = [r for r in rows if r["target"] == target.number and not r["informational"]]
        statuses = {r["status"] for r in counted}
        summaries.append(
            {
                "target": target.number,
                "title": target.title,
                "arrangement": default_arrangement(results),
                "floor": FLOOR,
                "status": next(s for s in STATUS_ORDER if s in statuses),
                "checks_met": sum(r["status"] == "met" for r in counted),
                "checks": len(counted),
            }
        )
    return summaries


def _fit(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope; None without two distinct x values."""
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    num = sum((x - mean_x) * (y - mean_y) for x, y in points)
    den = sum((x - mean_x) ** 2 for x, _ in points)
    return num / den


def slopes(results: dict[str, Any]) -> list[Record]:
    """Added p50 per MiB of body, fitted over the body sizes measured."""
    points: dict[tuple[str, str, int], list[tuple[float, float]]] = defaultdict(list)
    for record in results["cells"]:
        if record["arrangement"] == "direct" or record["added_p50_ms"] is None:
            continue
        group = (record["arrangement"], record["decision"], record["concurrency"])
        points[group].append((record["body_bytes"] / MIB, record["added_p50_ms"]))
    rows = []
    for (name, decision, concurrency), pts in sorted(
        points.items(), key=lambda item: (item[0][0], DECISION_ORDER[item[0][1]], item[0][2])
    ):
        slope = _fit(pts)
        rows.append(
            {
                "arrangement": name,
                "decision": decision,
                "concurrency": concurrency,
                "ms_per_mib": None if slope is None else round(slope, 3),
                "sizes": len(pts),
            }
        )
    return rows


def _num(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def _arrangement_notes(results: dict[str, Any]) -> list[str]:
    """One line per kind of arrangement the run measured; the default is named."""
    names = _names(results)
    default = default_arrangement(results)
    notes = {
        "direct": "`direct`: the shipped config with the ext_proc filter removed;",
        "naive": "`naive`: `bench/naive.py`, a grpc.aio processor answering headers and body "
        "with empty continue responses, no parsing, behind `envoy/envoy-two-message.yaml` "
        "(two gRPC messages per request);",
        FLOOR: f"`{FLOOR}`: the naive processor behind `envoy/envoy.yaml`: the floor, what "
        "one grpc.aio round trip per request costs with no work at all, against which the "
        "targets are judged (it polices nothing; its deny cells are forwarded);",
        "service-wN": "`service-wN`: `python -m ext_proc serve` (N workers) behind "
        "`envoy/envoy.yaml` (headers skipped: one gRPC message per request);",
        "service-w1-2msg": "`service-w1-2msg`: the same behind `envoy/envoy-two-message.yaml` "
        "(headers, then body: two gRPC messages per request);",
        "service-wN-redis": "`service-wN-redis`: `service-wN` keeping its spent proofs in a "
        "`redis-server` on loopback (`proof.record: redis://...`) instead of its own table;",
    }
    if any(re.fullmatch(r"service-w\d+", name) for name in names):
        names.append("service-wN")
    if any(re.fullmatch(r"service-w\d+-redis", name) for name in names):
        names.append("service-wN-redis")
    lines = [text for key, text in notes.items() if key in names]
    if default is not None:
        lines.append(f"`{default}` is the shipped default arrangement, the one judged.")
    return lines


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    only = ", the targets' cells" if meta.get("cells") == "targets" else ""
    lines = [
        f"# ext_proc benchmark ({meta['mode']}{only})",
        "",
        f"Started {meta['started']} on {meta['cpus']} CPUs ({meta['machine']}); "
        f"Python {meta['python']}; {meta['envoy']}; {meta['nginx']}; {meta['wrk']}.",
        f"Each cell: {meta.get('rounds', 1)} round(s), each arrangement once per round: "
        f"{meta['seconds_per_cell']} s of closed-loop HTTP/1.1 keep-alive load from wrk "
        f"({meta['wrk_threads']} thread) after {meta['warmup_seconds']} s of warm-up, "
        "arrangements one after another in an order that rotates from round to round. "
        "Each figure is the median over the rounds; the targets also show each round's "
        "ratio (the arrangements of one round ran within seconds of each other).",
        "",
        "Arrangements, each behind its own Envoy (`--concurrency 1`, rendered from "
        "`envoy/envoy.yaml` or the arrangement's config) in front of one nginx answering a "
        "small JSON 200 after reading the whole body:",
        "",
        *(f"- {text}" for text in _arrangement_notes(results)),
        "",
        "Bodies (ids: 200 at 2 KiB, 8000 at 64 KiB, 131072 at 1 MiB): `allow` = chat request "
        "without ids on `/v1/`; `strip` = ids on `/v1/` (removed, body rewritten); `deny` = "
        "ids with a `true` on `/pd-any/v1/` (400 from the service); `honor` = valid ids on "
        "`/pd-any/v1/` (`trust_any_caller`: validated, forwarded unchanged); `honor-proven` = "
        "valid ids and the gateway's proof on `/pd/v1/` (verified, spent in the record of "
        "spent proofs, validated, the proof removed), a different proof in every request "
        "(a pool minted for the cell, spliced in by wrk's script in every arrangement). "
        "Direct and naive forward every body.",
        "",
    ]
    connections = {
        name: stats.get("cluster.ext_proc.upstream_cx_total")
        for name, stats in results["envoy_stats"].items()
        if name != "direct"
    }
    notes = [*results["notes"]]
    notes.append(
        "Envoy -> processor HTTP/2 connections opened during the run: "
        + ", ".join(f"{name} {count}" for name, count in connections.items())
        + "."
    )
    for arrangement in results["arrangements"]:
        opened = connections.get(arrangement["name"])
        workers = arrangement["workers"] or 1
        if arrangement["kind"] == "service" and opened is not None and opened < workers:
            notes.append(
                f"{arrangement['name']}: Envoy opened {opened} connection(s) to {workers} "
                "workers; SO_REUSEPORT spreads connections, not streams, so at most "
                f"{opened} worker(s) served requests."
            )
    bad = [r for r in results["cells"] if not r["ok"]]
    if bad:
        notes.append(
            f"{len(bad)} measurement(s) saw unexpected statuses or socket errors "
            "(marked `!` below)."
        )
    lines += ["Notes:", "", *(f"- {note}" for note in notes), ""]
    lines += _targets_md(results)
    lines += verification.markdown(results)
    lines += verification.record_markdown(results)
    lines += _slopes_md(results)
    lines += _cells_md(results)
    return "\n".join(lines) + "\n"


def _status(status: str) -> str:
    return "**missed**" if status == "missed" else status


def _targets_md(results: dict[str, Any]) -> list[str]:
    default = default_arrangement(results)
    judged = "no single arrangement marked default" if default is None else f"`{default}`"
    lines = [
        "## Targets",
        "",
        f"Judged only on the shipped default arrangement ({judged}) against the floor "
        f"`{FLOOR}` measured in the same run: each value is the default's figure over the "
        "floor's, measured in rounds: the median of the rounds' ratios (the figures "
        "shown are the medians of each). Added p50 = p50 minus `direct`'s p50 in the "
        "same cell (and round). A target is met "
        "when every check of it is and missed when any is; it is not measured when a "
        "cell it needs was not measured in this run (`python -m bench --cells targets` "
        "measures them all). Informational rows count for nothing.",
        "",
        "| # | target | status | checks met |",
        "|---|---|---|---|",
    ]
    for s in results["target_summary"]:
        lines.append(
            f"| {s['target']} | {s['title']} | {_status(s['status'])} | "
            f"{s['checks_met']}/{s['checks']} |"
        )
    lines += [
        "",
        f"| # | cell | measure | value | threshold | {default or 'default'} vs floor | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["targets"]:
        status = _status(row["status"])
        if row["informational"]:
            status += " (informational)"
        lines.append(
            f"| {row['target']} | {row['cell']} | {row['measure']} | "
            f"{_num(row['value'], 2, 'x')} | {row['threshold']} | {row['detail']} | {status} |"
        )
    return [*lines, ""]


def _slopes_md(results: dict[str, Any]) -> list[str]:
    concurrencies = sorted({r["concurrency"] for r in results["slopes"]})
    lines = [
        "## Added p50 latency per MiB of body",
        "",
        "Least-squares slope of `p50(x) - p50(direct)` over the body sizes measured, "
        "ms per MiB (1,048,576 bytes).",
        "",
        "| arrangement | decision | " + " | ".join(f"c={c}" for c in concurrencies) + " |",
        "|---|---|" + "---|" * len(concurrencies),
    ]
    table: dict[tuple[str, str], dict[int, float | None]] = defaultdict(dict)
    for row in results["slopes"]:
        table[row["arrangement"], row["decision"]][row["concurrency"]] = row["ms_per_mib"]
    for (name, decision), values in table.items():
        cols = " | ".join(_num(values.get(c), 2) for c in concurrencies)
        lines.append(f"| {name} | {decision} | {cols} |")
    return [*lines, ""]


def _cells_md(results: dict[str, Any]) -> list[str]:
    lines = [
        "## All cells",
        "",
        "`+p50` = p50 minus direct's p50 in the same cell; `+p50 / naive` = that added "
        "latency over naive's added latency; CPU columns = CPU time (user + system, from "
        "/proc) of the processor (all its processes) and of Envoy during the measurement, "
        "per request; `!` = unexpected statuses or socket errors.",
        "",
        "| body | decision | c | arrangement | p50 ms | p99 ms | req/s | +p50 ms | "
        "p50 / direct | req/s / direct | +p50 / naive | req/s / naive | "
        "processor CPU ms/req | Envoy CPU ms/req |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {a["name"]: i for i, a in enumerate(results["arrangements"])}
    for (body, decision, concurrency), group in by_cell(results["cells"]).items():
        for name in sorted(group, key=order.__getitem__):
            r = group[name]
            mark = "" if r["ok"] else " !"
            lines.append(
                f"| {LABEL[body]} | {decision} | {concurrency} | {name}{mark} | "
                f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['rps']:.0f} | "
                f"{_num(r['added_p50_ms'], 3)} | {_num(r['p50_x_direct'], 2, 'x')} | "
                f"{_num(r['rps_x_direct'], 2, 'x')} | {_num(r['added_x_naive'], 2, 'x')} | "
                f"{_num(r['rps_x_naive'], 2, 'x')} | "
                f"{_num(r.get('processor_cpu_ms_per_req'), 3)} | "
                f"{_num(r.get('envoy_cpu_ms_per_req'), 3)} |"
            )
    return [*lines, ""]


def _names(results: dict[str, Any]) -> list[str]:
    return [a["name"] for a in results["arrangements"]]


def _select(cells: list[Record], **match: object) -> list[Record]:
    """The records matching every field, by body size and then concurrency."""
    rows = [r for r in cells if all(r[k] == v for k, v in match.items())]
    return sorted(rows, key=lambda r: (r["body_bytes"], r["concurrency"]))


def _legend(fig: Figure) -> None:
    """One legend for the figure, below the panels, without duplicates."""
    seen: dict[str, Any] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncols=4)


def plot_latency(results: dict[str, Any], path: Path) -> Path:
    """p50 (solid) and p99 (dashed) against body size at the lowest concurrency."""
    cells = results["cells"]
    lowest = min(r["concurrency"] for r in cells)
    decisions = sorted({r["decision"] for r in cells}, key=DECISION_ORDER.__getitem__)
    fig = Figure(figsize=(5 * len(decisions), 4.8), layout="constrained")
    axes = fig.subplots(1, len(decisions), squeeze=False)[0]
    for ax, decision in zip(axes, decisions, strict=True):
        for i, name in enumerate(_names(results)):
            rows = _select(cells, arrangement=name, decision=decision, concurrency=lowest)
            if not rows:
                continue
            sizes = [r["body_bytes"] / 1024 for r in rows]
            color = f"C{i}"
            ax.plot(sizes, [r["p50_ms"] for r in rows], "o-", color=color, label=f"{name} p50")
            ax.plot(
                sizes,
                [r["p99_ms"] for r in rows],
                "x--",
                color=color,
                alpha=0.5,
                label=f"{name} p99",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("body size (KiB)")
        ax.set_ylabel("latency (ms)")
        ax.set_title(f"{decision}, concurrency {lowest}")
        ax.grid(visible=True, which="both", alpha=0.3)
    _legend(fig)
    fig.savefig(path, dpi=110)
    return path


def plot_throughput(results: dict[str, Any], path: Path) -> Path:
    """Requests per second against concurrency, one panel per measured body/decision."""
    cells = results["cells"]
    panels = sorted(
        {(r["body"], r["decision"]) for r in cells},
        key=lambda p: (BODY_ORDER[p[0]], DECISION_ORDER[p[1]]),
    )
    columns = min(3, len(panels))
    rows_needed = -(-len(panels) // columns)
    fig = Figure(figsize=(4.5 * columns, 3.4 * rows_needed + 0.6), layout="constrained")
    grid = fig.subplots(rows_needed, columns, squeeze=False).flatten()
    for ax in grid[len(panels) :]:
        ax.set_visible(False)
    for ax, (size, decision) in zip(grid, panels, strict=False):
        levels: set[int] = set()
        for i, name in enumerate(_names(results)):
            rows = _select(cells, arrangement=name, body=size, decision=decision)
            if rows:
                levels.update(r["concurrency"] for r in rows)
                ax.plot(
                    [r["concurrency"] for r in rows],
                    [r["rps"] for r in rows],
                    "o-",
                    color=f"C{i}",
                    label=name,
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sorted(levels), [str(c) for c in sorted(levels)])
        ax.set_xlabel("concurrency")
        ax.set_ylabel("requests/s")
        ax.set_title(f"{LABEL[size]} {decision}")
        ax.grid(visible=True, which="both", alpha=0.3)
    _legend(fig)
    fig.savefig(path, dpi=110)
    return path


def write(results: dict[str, Any], out: Path) -> list[Path]:
    """Derive ratios, targets and slopes; write every output file into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    enrich(results["cells"])
    results["targets"] = target_rows(results)
    results["target_summary"] = target_summary(results, results["targets"])
    results["slopes"] = slopes(results)
    results["verification"] = verification.rows(results)
    results["records"] = verification.record_rows(results)
    paths = [out / "results.json", out / "results.md"]
    paths[0].write_text(json.dumps(results, indent=2) + "\n")
    paths[1].write_text(markdown(results))
    paths.append(plot_latency(results, out / "latency_vs_body.png"))
    paths.append(plot_throughput(results, out / "throughput_vs_concurrency.png"))
    return paths
