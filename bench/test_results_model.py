"""results.json read into the typed results and written back (no process)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import bodies, results_model
from bench.results_model import ABSENT

COMMITTED = Path(__file__).resolve().parent / "results" / "results.json"


def _committed() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(COMMITTED.read_text())
    return raw


def test_the_committed_results_load_and_dump_to_the_same_text() -> None:
    text = COMMITTED.read_text()
    assert results_model.dumps(results_model.load(COMMITTED)) == text


def test_fields_are_read_into_attributes() -> None:
    results = results_model.load(COMMITTED)
    assert results.default == "service-w1"
    assert results.names[:2] == ["direct", "naive-1msg"]
    first = results.cells[0]
    assert (first.key, first.arrangement) == (("2k", "allow", 1), "direct")
    assert first.cpu.processor is None  # direct has no processor
    assert first.rounds is not None
    raw = _committed()["cells"][0]
    assert [r.p50_ms for r in first.rounds] == [r["p50_ms"] for r in raw["rounds"]]
    assert first.relative is not None
    assert first.relative.added_p50_ms == 0.0
    assert first.reasons is None  # direct is no service: it decides nothing
    assert results.judged.target_summary[0].checks == 3
    assert results.judged.records == ()  # no Redis arrangement in this run
    assert results.meta.commit is not None  # the code measured is named


def test_results_from_before_reasons_were_kept_read_them_as_absent() -> None:
    raw = _committed()
    for cell in raw["cells"]:
        del cell["reasons"]
    assert all(cell.reasons is ABSENT for cell in results_model.from_json(raw).cells)


def test_a_raw_run_has_nothing_derived_and_keeps_its_nulls() -> None:
    raw = _committed()
    for key in ("targets", "target_summary", "slopes", "verification"):
        del raw[key]
    for key in ("records", "strict", "ledger"):  # derived too, where the run has them
        raw.pop(key, None)
    for cell in raw["cells"]:
        for key in ("added_p50_ms", "p50_x_direct", "rps_x_direct", "added_x_naive"):
            del cell[key]
        del cell["rps_x_naive"]
        cell["reasons"] = None
    raw["records"] = []  # a key only judged results have
    with pytest.raises(ValueError, match="unknown keys"):
        results_model.from_json(raw)
    del raw["records"]
    results = results_model.from_json(raw)
    assert results.derived is None
    assert all(r.relative is None and r.reasons is None for r in results.cells)
    assert results_model.to_json(results) == raw
    with pytest.raises(ValueError, match="not judged"):
        _ = results.judged


@pytest.mark.parametrize("where", ["meta", "cell", "round", "target"])
def test_an_unknown_key_is_refused_rather_than_dropped(where: str) -> None:
    raw = _committed()
    objects = {
        "meta": raw["meta"],
        "cell": raw["cells"][3],
        "round": raw["cells"][3]["rounds"][1],
        "target": raw["targets"][0],
    }
    objects[where]["surprise"] = 1
    with pytest.raises(ValueError, match="surprise"):
        results_model.from_json(raw)


def test_a_missing_key_is_refused() -> None:
    raw = _committed()
    del raw["cells"][0]["p99_ms"]
    with pytest.raises(ValueError, match="p99_ms"):
        results_model.from_json(raw)


def test_every_decision_has_a_place_in_the_matrix() -> None:
    assert tuple(results_model.DECISION_ORDER) == bodies.DECISIONS
