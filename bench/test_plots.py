"""The PNG plots, drawn from synthetic and committed runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import judge, plots, results_model, synthetic
from bench.results_model import Results

RESULTS = Path(__file__).resolve().parent / "results"
PNG = b"\x89PNG\r\n\x1a\n"


def _runs() -> dict[str, Results]:
    return {
        "committed": results_model.load(RESULTS / "results.json"),
        "targets": judge.judge(results_model.from_json(synthetic.targets_run())),
    }


@pytest.mark.parametrize("run", ["committed", "targets"])
def test_each_plot_is_a_png(run: str, tmp_path: Path) -> None:
    results = _runs()[run]
    for draw in (plots.plot_latency, plots.plot_throughput):
        path = draw(results, tmp_path / f"{draw.__name__}.png")
        assert path.read_bytes().startswith(PNG)
