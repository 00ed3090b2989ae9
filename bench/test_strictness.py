"""The cost of a strict_body route (strict against allow), on synthetic results."""

from __future__ import annotations

from bench import judge, markdown, results_model, strictness, synthetic


def test_strict_against_allow_per_service_arrangement() -> None:
    results = judge.judge(results_model.from_json(synthetic.strict_run()))
    (row,) = strictness.rows(results, judge.FLOOR)  # the service only: not direct or naive
    assert results.judged.strict == (row,)
    assert (row.arrangement, row.body, row.concurrency) == (synthetic.DEFAULT, "2k", 32)
    assert (row.allow_rps, row.strict_rps, row.rps_ratio) == (4000.0, 2000.0, 0.5)
    assert row.p50_ratio == 2.0
    assert (row.allow_added_p50_ms, row.strict_added_p50_ms) == (1.0, 2.25)
    assert row.cpu_ratio == 1.5
    # The floor lost a fifth between the cells: over it, strict keeps 0.625x of allow.
    assert (row.floor_allow_rps, row.floor_strict_rps) == (5000.0, 4000.0)
    assert row.rps_ratio_over_floor == 0.625
    assert row.ok


def test_the_strict_section_shows_each_ratio_and_reads_back() -> None:
    results = judge.judge(results_model.from_json(synthetic.strict_run()))
    lines = markdown._strict_md(results)
    assert lines[0] == "## Strict bodies"
    assert lines[-2] == (
        "| 2,048 B | 32 | service-w1 | 4000 / 2000 | 0.50x | 1.250 / 2.500 | 2.00x | "
        "1.000 / 2.250 | 0.400 / 0.600 | 1.50x | 5000 / 4000 | 0.62x |"
    )
    again = results_model.from_json(results_model.to_json(results))
    assert again.judged.strict == results.judged.strict


def test_without_both_cells_there_is_no_strict_section() -> None:
    raw = synthetic.strict_run()
    raw["cells"] = [c for c in raw["cells"] if c["decision"] != "strict"]
    results = judge.judge(results_model.from_json(raw))
    assert results.judged.strict == ()
    assert markdown._strict_md(results) == []
