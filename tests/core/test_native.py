"""The compiled parts: each C source is a listed part, built by the project's install."""

from __future__ import annotations

from pathlib import Path

import pytest

from ext_proc.core import native

pytestmark = pytest.mark.unit

PACKAGE = Path(native.__file__).parents[1]


def _sources() -> set[str]:
    return {
        ".".join(source.relative_to(PACKAGE).with_suffix("").parts)
        for source in PACKAGE.rglob("_*.c")
    }


def test_every_c_source_is_a_listed_part() -> None:
    assert _sources() <= set(native.PARTS)


@pytest.mark.parametrize("part", sorted(_sources()))
def test_each_part_with_a_source_is_built_and_runs_compiled(part: str) -> None:
    assert native.module(part) is not None, f"{part}: not built (make, or pip install -e .)"
    assert native.implementations()[part] == "compiled"


def test_the_environment_asks_for_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.ENVIRONMENT, "0")
    assert set(native.implementations().values()) == {"python"}


def test_an_unknown_part_is_an_error() -> None:
    with pytest.raises(ValueError, match="not one of"):
        native.module("core._nothing")
