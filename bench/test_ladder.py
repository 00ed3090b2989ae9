"""The cost ledger's rows and section, on synthetic results."""

from __future__ import annotations

import pytest

from bench import judge, ladder, ledger, markdown, results_model, synthetic


def test_each_rung_against_the_one_before_and_the_floor() -> None:
    results = judge.judge(results_model.from_json(synthetic.ledger_run()))
    rows = results.judged.ledger
    assert rows is not None
    envoy = [r for r in rows if r.ladder == "envoy"]
    processor = [r for r in rows if r.ladder == "processor"]
    assert [r.arrangement for r in envoy] == [
        "direct-bare",
        "direct-routes",
        "direct",
        "direct-header_step",
        "naive-1msg-ext_proc",
        "naive-1msg",
    ]
    assert [r.arrangement for r in processor] == [
        "naive-1msg",
        *(f"ledger-{r}" for r in ledger.RUNGS),
        "service-w1",
    ]
    # The first rung of a ladder adds nothing; every other its difference to the one before.
    assert envoy[0].envoy_added_ms is None
    assert [r.envoy_added_ms for r in envoy[1:]] == pytest.approx([0.01] * 5)
    assert processor[0].processor_added_ms is None
    assert [r.processor_added_ms for r in processor[1:]] == pytest.approx([0.01] * 8)
    assert processor[-1].processor_x_floor == pytest.approx(0.38 / 0.3, abs=1e-3)
    assert processor[-1].adds == ledger.ADDS["service"]
    assert envoy[0].rps_x_floor == 4.0
    assert envoy[0].processor_cpu_ms_per_req is None


def test_the_ledger_section_reads_back() -> None:
    results = judge.judge(results_model.from_json(synthetic.ledger_run()))
    lines = markdown._ledger_md(results)
    assert lines[0] == "## Cost ledger"
    assert "### 2,048 B allow, c=32" in lines
    assert any(line.startswith("| processor | `ledger-scan` | the carrier scan") for line in lines)
    again = results_model.from_json(results_model.to_json(results))
    assert again.judged.ledger == results.judged.ledger


def test_a_run_without_rungs_has_no_ledger() -> None:
    results = judge.judge(results_model.from_json(synthetic.targets_run()))
    assert results.judged.ledger is None
    assert markdown._ledger_md(results) == []
    assert ladder.rows(results, judge.FLOOR) is None
