"""bench/report.py: every output file of a run, from the committed run's measurements."""

from __future__ import annotations

import json
from pathlib import Path

from bench import judge, markdown, report, results_model

RESULTS = Path(__file__).resolve().parent / "results"


def test_the_committed_run_is_written_again_as_committed(tmp_path: Path) -> None:
    results = results_model.load(RESULTS / "results.json")
    paths = report.write(results, tmp_path)
    names = ["results.json", "results.md", "latency_vs_body.png", "throughput_vs_concurrency.png"]
    assert [p.name for p in paths] == names
    written = json.loads((tmp_path / "results.json").read_text())
    committed = json.loads((RESULTS / "results.json").read_text())
    # The same derivation from the same measurements. Judging always writes the record
    # and strict rows, which a committed run from before them has no key for (none
    # here: it measured no Redis and no strict cell).
    assert written == {"records": [], "strict": [], **committed}
    assert (tmp_path / "results.md").read_text() == markdown.render(judge.judge(results))
