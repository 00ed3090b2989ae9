"""A run's output files: results.json, results.md and the PNG plots.

The measurements are judged (bench/judge.py), then written: the typed results as
results.json (bench/results_model.py), as markdown (bench/markdown.py) and as plots
(bench/plots.py).
"""

from __future__ import annotations

from pathlib import Path

from bench import judge, markdown, plots, results_model
from bench.results_model import Results


def write(results: Results, out: Path) -> list[Path]:
    """Derive ratios, targets and slopes; write every output file into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    judged = judge.judge(results)
    paths = [out / "results.json", out / "results.md"]
    paths[0].write_text(results_model.dumps(judged))
    paths[1].write_text(markdown.render(judged))
    paths.append(plots.plot_latency(judged, out / "latency_vs_body.png"))
    paths.append(plots.plot_throughput(judged, out / "throughput_vs_concurrency.png"))
    return paths
