"""The PNG plots of a run: latency against body size, throughput against concurrency."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from bench.results_model import BODY_ORDER, DECISION_ORDER, LABEL, Record, Results


def _ordered(records: Iterable[Record]) -> list[Record]:
    """By body size and then concurrency."""
    return sorted(records, key=lambda r: (r.body_bytes, r.concurrency))


def _legend(fig: Figure) -> None:
    """One legend for the figure, below the panels, without duplicates."""
    seen: dict[str, Any] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncols=4)


def plot_latency(results: Results, path: Path) -> Path:
    """p50 (solid) and p99 (dashed) against body size at the lowest concurrency."""
    cells = results.cells
    lowest = min(r.concurrency for r in cells)
    decisions = sorted({r.decision for r in cells}, key=DECISION_ORDER.__getitem__)
    fig = Figure(figsize=(5 * len(decisions), 4.8), layout="constrained")
    axes = fig.subplots(1, len(decisions), squeeze=False)[0]
    for ax, decision in zip(axes, decisions, strict=True):
        for i, name in enumerate(results.names):
            rows = _ordered(
                r
                for r in cells
                if (r.arrangement, r.decision, r.concurrency) == (name, decision, lowest)
            )
            if not rows:
                continue
            sizes = [r.body_bytes / 1024 for r in rows]
            color = f"C{i}"
            ax.plot(sizes, [r.p50_ms for r in rows], "o-", color=color, label=f"{name} p50")
            ax.plot(
                sizes,
                [r.p99_ms for r in rows],
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


def plot_throughput(results: Results, path: Path) -> Path:
    """Requests per second against concurrency, one panel per measured body/decision."""
    cells = results.cells
    panels = sorted(
        {(r.body, r.decision) for r in cells},
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
        for i, name in enumerate(results.names):
            rows = _ordered(
                r for r in cells if (r.arrangement, r.body, r.decision) == (name, size, decision)
            )
            if rows:
                levels.update(r.concurrency for r in rows)
                ax.plot(
                    [r.concurrency for r in rows],
                    [r.rps for r in rows],
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
