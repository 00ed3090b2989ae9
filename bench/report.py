"""Raw measurements -> results.json, results.md (tables, targets, slopes) and PNG plots.

Added latency of an arrangement in a cell is ``p50(x) - p50(direct)`` in the same cell
(same body, route and concurrency). The targets of issue 6:

1. concurrency 1, 2 KiB: the service's added p50 <= 60 % of the naive processor's;
2. concurrency 32: the service's throughput >= 1.6 x the naive processor's;
3. 1 MiB with 128k ids on the disaggregated route (honored): added p50 <= 10 ms, judged
   on the unproven honor (``honor``) and on the proven one (``honor-proven``).

The cost of verifying proofs (``honor-proven`` minus ``honor``) is bench/verification.py.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from bench import verification

MIB = 1024 * 1024
ADDED_SHARE = 0.6
THROUGHPUT_GAIN = 1.6
HONOR_1M_MS = 10.0
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


def _services(results: dict[str, Any]) -> list[str]:
    return [a["name"] for a in results["arrangements"] if a["kind"] == "service"]


def _judged(results: dict[str, Any]) -> list[str]:
    """The services, then every other naive arrangement (``naive-1msg``): a processor
    that does nothing, judged by the same targets to show what the transport allows."""
    others = [
        a["name"] for a in results["arrangements"] if a["kind"] == "naive" and a["name"] != "naive"
    ]
    return [*_services(results), *others]


def _cell_name(key: Key) -> str:
    body, decision, concurrency = key
    return f"{LABEL[body]} {decision} c={concurrency}"


def _target_rows(results: dict[str, Any]) -> list[Record]:
    cells = by_cell(results["cells"])
    rows: list[Record] = []
    for name in _judged(results):
        for key, group in cells.items():
            record, naive = group.get(name), group.get("naive")
            if record is None or naive is None or "direct" not in group:
                continue
            body, decision, concurrency = key
            if body == "2k" and concurrency == 1:
                share = record["added_x_naive"]
                rows.append(
                    {
                        "target": 1,
                        "arrangement": name,
                        "cell": _cell_name(key),
                        "value": share,
                        "detail": f"added {record['added_p50_ms']:.3f} ms vs naive "
                        f"{naive['added_p50_ms']:.3f} ms",
                        "threshold": f"<= {ADDED_SHARE:.2f}x naive's added p50",
                        "met": None if share is None else share <= ADDED_SHARE,
                    }
                )
            if concurrency == 32:
                gain = record["rps_x_naive"]
                rows.append(
                    {
                        "target": 2,
                        "arrangement": name,
                        "cell": _cell_name(key),
                        "value": gain,
                        "detail": f"{record['rps']:.0f} vs naive {naive['rps']:.0f} req/s",
                        "threshold": f">= {THROUGHPUT_GAIN:.1f}x naive's req/s",
                        "met": None if gain is None else gain >= THROUGHPUT_GAIN,
                    }
                )
            if body == "1m" and decision in HONORED and concurrency == 1:
                added = record["added_p50_ms"]
                rows.append(
                    {
                        "target": 3,
                        "arrangement": name,
                        "cell": f"{_cell_name(key)} ({HONORED[decision]})",
                        "value": added,
                        "detail": f"p50 {record['p50_ms']:.2f} ms vs direct "
                        f"{group['direct']['p50_ms']:.2f} ms",
                        "threshold": f"<= {HONOR_1M_MS:.0f} ms added p50",
                        "met": added <= HONOR_1M_MS,
                    }
                )
    return rows


def _summaries(results: dict[str, Any], rows: list[Record]) -> list[Record]:
    titles = {
        1: "c=1, 2 KiB: service's added p50 <= 60% of naive's",
        2: "c=32: service throughput >= 1.6x naive",
        3: "1 MiB, 128k ids honored (unproven and proven): added p50 <= 10 ms",
    }
    summaries = []
    for target, title in titles.items():
        for name in _judged(results):
            mine = [r for r in rows if r["target"] == target and r["arrangement"] == name]
            verdicts = [r["met"] for r in mine]
            if False in verdicts:
                status = "missed"
            elif verdicts and all(verdicts):
                status = "met"
            else:
                status = "not measured" if not verdicts else "undetermined"
            summaries.append(
                {
                    "target": target,
                    "title": title,
                    "arrangement": name,
                    "status": status,
                    "cells_met": sum(v is True for v in verdicts),
                    "cells": len(verdicts),
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


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "undetermined"}[met]


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        f"# ext_proc benchmark ({meta['mode']})",
        "",
        f"Started {meta['started']} on {meta['cpus']} CPUs ({meta['machine']}); "
        f"Python {meta['python']}; {meta['envoy']}; {meta['nginx']}; {meta['wrk']}.",
        f"Each cell: {meta['seconds_per_cell']} s of closed-loop HTTP/1.1 keep-alive load "
        f"from wrk ({meta['wrk_threads']} thread) after {meta['warmup_seconds']} s of "
        "warm-up, arrangements measured one after another in rotating order.",
        "",
        "Arrangements, each behind its own Envoy (`--concurrency 1`, rendered from "
        "`envoy/envoy.yaml`) in front of one nginx answering a small JSON 200 after reading "
        "the whole body:",
        "",
        "- `direct`: the shipped config with the ext_proc filter removed;",
        "- `naive`: `bench/naive.py`, a grpc.aio processor answering headers and body with "
        "empty continue responses, no parsing;",
        "- `service-wN`: `python -m ext_proc serve` (N workers) behind `envoy/envoy.yaml` "
        "(headers and body: two gRPC messages per request);",
        "- `service-w1-1msg`: the same behind `envoy/envoy-one-message.yaml` (headers "
        "skipped, one gRPC message per request);",
        "- `naive-1msg`: the naive processor behind `envoy/envoy-one-message.yaml`: a "
        "floor, what one grpc.aio round trip per request costs with no work at all. It is "
        "judged by the same targets (it polices nothing; its deny cells are forwarded).",
        "",
        "Bodies (ids: 200 at 2 KiB, 8000 at 64 KiB, 131072 at 1 MiB): `allow` = chat request "
        "without ids on `/v1/`; `strip` = ids on `/v1/` (removed, body rewritten); `deny` = "
        "ids with a `true` on `/pd-any/v1/` (400 from the service); `honor` = valid ids on "
        "`/pd-any/v1/` (`trust_any_caller`: validated, forwarded unchanged); `honor-proven` = "
        "valid ids and the gateway's proof on `/pd/v1/` (verified, validated, the proof "
        "removed). Direct and naive forward every body.",
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
    lines += _slopes_md(results)
    lines += _cells_md(results)
    return "\n".join(lines) + "\n"


def _targets_md(results: dict[str, Any]) -> list[str]:
    lines = [
        "## Targets",
        "",
        "| # | target | arrangement | status | cells met |",
        "|---|---|---|---|---|",
    ]
    default = {a["name"] for a in results["arrangements"] if a.get("default")}
    for s in results["target_summary"]:
        status = s["status"] if s["status"] != "missed" else "**missed**"
        name = s["arrangement"] + (" (shipped default)" if s["arrangement"] in default else "")
        lines.append(
            f"| {s['target']} | {s['title']} | {name} | {status} | {s['cells_met']}/{s['cells']} |"
        )
    lines += [
        "",
        "| # | arrangement | cell | value | threshold | detail | status |",
        "|---|---|---|---|---|---|---|",
    ]
    units = {1: "x", 2: "x", 3: " ms"}
    for row in results["targets"]:
        lines.append(
            f"| {row['target']} | {row['arrangement']} | {row['cell']} | "
            f"{_num(row['value'], 2, units[row['target']])} | {row['threshold']} | "
            f"{row['detail']} | {_verdict(row['met'])} |"
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
    results["targets"] = _target_rows(results)
    results["target_summary"] = _summaries(results, results["targets"])
    results["slopes"] = slopes(results)
    results["verification"] = verification.rows(results)
    paths = [out / "results.json", out / "results.md"]
    paths[0].write_text(json.dumps(results, indent=2) + "\n")
    paths[1].write_text(markdown(results))
    paths.append(plot_latency(results, out / "latency_vs_body.png"))
    paths.append(plot_throughput(results, out / "throughput_vs_concurrency.png"))
    return paths
