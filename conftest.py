"""Test tiers are opt-in: every test carries exactly one tier marker (the markers
pyproject.toml registers are the tiers), and a test that carries none fails collection
instead of running in some tier by default. The tier directories' conftests mark their
tests (tests/e2e: e2e, tests/hostile: hostile, tests/faults: faults, tests/conformance:
vllm, tests/pd: pd, tests/sglang: sglang), a test may name its tier itself
(bench/test_smoke.py: bench), and every other test under tests/ (the layers' mirrors,
at any depth) or in bench/ that names none is ``unit``: `make unit` runs ``-m unit``."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
UNIT = "unit"
# Directories whose tests have a tier of their own (their conftest marks it).
TIER_DIRECTORIES = tuple(
    ROOT / "tests" / name for name in ("e2e", "hostile", "faults", "conformance", "pd", "sglang")
)


def _unit_by_default(path: Path) -> bool:
    if path.parent == ROOT / "bench":
        return True
    return path.is_relative_to(ROOT / "tests") and not any(
        path.is_relative_to(tier) for tier in TIER_DIRECTORIES
    )


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
        if not named and _unit_by_default(item.path):
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
