"""results.md from judged results: synthetic ones, and the committed run."""

from __future__ import annotations

from pathlib import Path

from bench import judge, markdown, results_model, synthetic

RESULTS = Path(__file__).resolve().parent / "results"


def test_markdown_lists_each_target_once_and_marks_informational_rows() -> None:
    raw = synthetic.targets_run()
    raw["cells"] = [r for r in raw["cells"] if r["arrangement"] != synthetic.OTHER]
    results = judge.judge(results_model.from_json(raw))
    lines = markdown._targets_md(results)
    summary = [line for line in lines if line.startswith("| ") and line.count("|") == 5]
    assert [line.split(" | ")[0] for line in summary[1:]] == [f"| {n}" for n in range(1, 6)]
    assert sum("(informational)" in line for line in lines) == 1


def test_the_record_section_sets_local_and_redis_beside_honor() -> None:
    lines = markdown._records_md(judge.judge(results_model.from_json(synthetic.records_run())))
    assert lines[0] == "## Record of spent proofs: local table vs Redis"
    assert "| 1.50x | 2.00x | 1.33x | 2.000 |" in lines[-2]


def _key_lines(text: str) -> list[str]:
    """Headings and table rows: every figure and verdict results.md shows."""
    return [line for line in text.splitlines() if line.startswith(("#", "|"))]


def test_the_committed_run_renders_as_committed() -> None:
    """Judged again from its measurements, the committed run gives the committed
    verdicts, figures and tables (the prose around them may have moved on since)."""
    results = judge.judge(results_model.load(RESULTS / "results.json"))
    rendered = markdown.render(results)
    assert _key_lines(rendered) == _key_lines((RESULTS / "results.md").read_text())
    assert "- `service-w1` is the shipped default arrangement, the one judged." in rendered
    assert "- Envoy -> processor HTTP/2 connections opened during the run: " in rendered


def test_service_workers_are_described_as_an_endpoint_each() -> None:
    """Each worker of ``service-wN`` serves its own port, listed as an endpoint of
    Envoy's processor cluster: the notes say so, and no longer a shared port."""
    rendered = markdown.render(judge.judge(results_model.load(RESULTS / "results.json")))
    assert "SO_REUSEPORT" not in rendered
    assert "each worker serves its own port" in rendered
