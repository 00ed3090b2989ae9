"""results.md from judged results."""

from __future__ import annotations

from bench import judge, markdown, results_model, synthetic


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
