"""Test tiers are opt-in: every test carries exactly one tier marker (the markers
pyproject.toml registers are the tiers), and a test that carries none fails collection
instead of running in some tier by default. The tier directories' conftests mark their
tests (tests/e2e: e2e, tests/hostile: hostile, tests/conformance: vllm, tests/pd: pd), a
test may name its tier itself (bench/test_smoke.py: bench), and the tests in
``UNIT_DIRECTORIES`` that name none are ``unit``: `make unit` runs ``-m unit``."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
# Directories whose own test files (not their subdirectories') are unit tests unless they
# name another tier.
UNIT_DIRECTORIES = frozenset(
    ROOT / name for name in ("tests", "tests/core", "tests/edge", "tests/tools", "bench")
)
UNIT = "unit"


def _tiers() -> frozenset[str]:
    # pyproject.toml's own markers, not the ones plugins add (parametrize, timeout, ...).
    with (ROOT / "pyproject.toml").open("rb") as file:
        markers = tomllib.load(file)["tool"]["pytest"]["ini_options"]["markers"]
    return frozenset(line.split(":", 1)[0] for line in markers)


# No tryfirst/trylast: conftest hooks run after the ones of conftests below them (which
# mark their tier) and before pytest's own selection by -m.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tiers = _tiers()
    wrong = []
    for item in items:
        named = {mark.name for mark in item.iter_markers()} & tiers
        if not named and item.path.parent in UNIT_DIRECTORIES:
            item.add_marker(UNIT)
            named = {UNIT}
        if len(named) != 1:
            wrong.append(f"{item.nodeid}: {', '.join(sorted(named)) or 'no tier'}")
    if wrong:
        raise pytest.UsageError(
            "every test needs exactly one tier marker ("
            + ", ".join(sorted(tiers))
            + "):\n  "
            + "\n  ".join(wrong)
        )
