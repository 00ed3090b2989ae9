"""The servicer's work budgets (tests/edge/budgets.py): every hot path, measured in a
fresh process, within the budget tests/edge/budgets.json commits; and the check itself
failing on a path given a second parse or one more copy of the body, so that it cannot
pass whatever a path does."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from ext_proc.core import inspection, reading
from tests.edge import budgets


@pytest.fixture(scope="module")
def measured() -> dict[str, budgets.Counts]:
    # A fresh process: what earlier tests imported, cached or configured does not count.
    done = subprocess.run(
        [sys.executable, "-m", "tests.edge.budgets", "--json"],
        cwd=budgets.ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return {name: budgets.Counts(**counts) for name, counts in json.loads(done.stdout).items()}


def test_the_budgets_name_every_path_and_where_they_were_measured() -> None:
    committed = budgets.load()
    assert set(committed["paths"]) == set(budgets.PATHS)
    assert set(committed["measured_with"]) == set(budgets.environment())
    for name in budgets.MEMORY_PATHS:
        assert {"peak_bodies", "allocated_bodies"} <= set(committed["paths"][name])


@pytest.mark.parametrize("name", budgets.PATHS)
def test_each_path_is_within_its_budget(name: str, measured: dict[str, budgets.Counts]) -> None:
    committed = budgets.load()
    problems = budgets.out_of_budget(name, measured[name], committed["paths"][name])
    if problems:
        now, then = budgets.environment(), committed["measured_with"]
        changed = {k: f"{then[k]} -> {now[k]}" for k in now if now[k] != then.get(k)}
        problems.append(f"measured with {then}; changed since: {changed or 'nothing'}")
        problems.append("docs/testing.md#work-budgets says how to raise a budget honestly")
    assert not problems, "\n".join(problems)


def _injected(name: str, patch: Callable[[], None]) -> tuple[budgets.Counts, budgets.Counts]:
    """Path ``name`` measured in this process, then measured again once ``patch`` is
    applied."""
    baseline = budgets.measure(name)
    patch()
    return baseline, budgets.measure(name)


def _problems(name: str, baseline: budgets.Counts, broken: budgets.Counts) -> list[str]:
    """What the check says of ``broken``: against ``baseline`` as the budget (this
    process's own measurement, so that nothing but the patch differs), and the same
    again against the committed budget."""
    against_baseline = budgets.out_of_budget(name, broken, baseline.budget())
    against_committed = budgets.out_of_budget(name, broken, budgets.load()["paths"][name])
    print("\n".join(against_committed))
    assert set(against_baseline) <= set(against_committed)
    return against_baseline


def test_a_second_parse_breaks_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    parse = reading._orjson_loads

    def twice(raw: bytes, shape: Any) -> Any:
        parse(raw, shape)
        return parse(raw, shape)

    baseline, broken = _injected(
        "strip-2k", lambda: monkeypatch.setattr(reading, "_orjson_loads", twice)
    )
    # Two more calls are within the calls' margin; the parse is not.
    assert _problems("strip-2k", baseline, broken) == [
        "strip-2k: bulk orjson.loads 2, budget 1 (exact)"
    ]


def test_a_copy_of_the_body_made_and_dropped_breaks_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inspect = inspection.inspect

    def copying(raw: bytes, *args: Any) -> Any:
        # Dropped at once: it never raises the peak, and calls no C function.
        bytearray(raw)
        return inspect(raw, *args)

    baseline, broken = _injected(
        "honor-1m", lambda: monkeypatch.setattr(inspection, "inspect", copying)
    )
    assert baseline.allocated_bodies is not None
    assert broken.allocated_bodies == pytest.approx(baseline.allocated_bodies + 1, abs=0.02)
    assert broken.peak_bodies == baseline.peak_bodies
    (problem,) = _problems("honor-1m", baseline, broken)
    assert problem.startswith("honor-1m: allocated_bodies")
