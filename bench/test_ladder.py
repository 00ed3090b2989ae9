"""The cost ledger's rows and section, on synthetic results."""

from __future__ import annotations

import pytest

from bench import judge, ladder, ledger, markdown, results_model, stack, synthetic


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


def test_the_compiled_ladder_compiles_one_part_more_at_each_rung() -> None:
    results = judge.judge(results_model.from_json(synthetic.compiled_run()))
    rows = results.judged.ledger
    assert rows is not None
    assert {r.ladder for r in rows} == {"compiled"}  # no ledger rung: no other ladder
    assert [r.arrangement for r in rows] == [
        "direct",
        judge.FLOOR,
        *synthetic.COMPILED,
        synthetic.DEFAULT,
    ]
    assert [r.p50_ms for r in rows] == [1.0, 2.0, 10.0, 9.0, 8.0, 7.0]
    assert [r.added_p50_ms for r in rows] == [0.0, 1.0, 9.0, 8.0, 7.0, 6.0]
    assert [r.processor_added_ms for r in rows[3:]] == [-1.0, -1.0, -1.0]
    assert rows[-1].processor_x_floor == 6.0
    assert rows[2].adds == stack.COMPILED_ADDS["0"]
    assert "shipped default" in rows[-1].adds


def test_without_direct_a_rung_has_no_added_p50() -> None:
    raw = synthetic.compiled_run()
    raw["cells"] = [c for c in raw["cells"] if c["arrangement"] != "direct"]
    rows = judge.judge(results_model.from_json(raw)).judged.ledger
    assert rows is not None
    assert [r.p50_ms for r in rows] == [2.0, 10.0, 9.0, 8.0, 7.0]
    assert all(r.added_p50_ms is None for r in rows)


def test_the_compiled_section_shows_latency_and_describes_the_ladder() -> None:
    results = judge.judge(results_model.from_json(synthetic.compiled_run()))
    lines = markdown._ledger_md(results)
    assert lines[0] == "## Cost ledger"
    assert "The compiled ladder runs from" in lines[2]
    assert "Envoy's ladder" not in lines[2]  # only the ladders measured are described
    assert "### 1,048,576 B strip, c=1" in lines
    (scan,) = [line for line in lines if "`service-w1-native-scan`" in line]
    # p50, added p50, its difference to the rung before, then the CPU columns.
    assert "| 9.000 | 8.000 | -1.000 | 8.000 | -1.000 |" in scan
    again = results_model.from_json(results_model.to_json(results))
    assert again.judged.ledger == results.judged.ledger
    assert "(full, the compiled ladder)" in markdown.render(results)
    assert "`service-wN-native-*`" in markdown.render(results)


def test_the_ledger_section_describes_only_its_own_ladders() -> None:
    results = judge.judge(results_model.from_json(synthetic.ledger_run()))
    lines = markdown._ledger_md(results)
    assert "Envoy's ladder runs from" in lines[2]
    assert "compiled ladder" not in lines[2]
    assert all(r.ladder != "compiled" for r in results.judged.ledger or ())
    assert "`service-wN-native-*`" not in markdown.render(results)


def test_ledger_rows_from_before_latency_was_kept_read_and_write_back_without_it() -> None:
    raw = results_model.to_json(judge.judge(results_model.from_json(synthetic.ledger_run())))
    for row in raw["ledger"]:
        del row["p50_ms"], row["added_p50_ms"]
    results = results_model.from_json(raw)
    assert all(r.p50_ms is None for r in results.judged.ledger or ())
    assert results_model.to_json(results) == raw
    assert any("| n/a | n/a | n/a |" in line for line in markdown._ledger_md(results))
