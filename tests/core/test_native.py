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


@pytest.mark.parametrize("value", ["1", "", " 1 "])
def test_one_or_empty_runs_every_part_compiled(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(native.ENVIRONMENT, value)
    assert native.chosen() == set(native.PARTS)


def test_unset_runs_every_part_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(native.ENVIRONMENT, raising=False)
    assert native.chosen() == set(native.PARTS)


@pytest.mark.parametrize("value", ["0", " 0\n"])
def test_zero_runs_no_part_compiled(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(native.ENVIRONMENT, value)
    assert native.chosen() == frozenset()


@pytest.mark.parametrize(
    "value", ["core._scan,edge._wire", " core._scan , edge._wire ", "edge._wire,core._scan"]
)
def test_a_list_runs_those_parts_compiled_and_the_others_reference(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(native.ENVIRONMENT, value)
    assert native.chosen() == {"core._scan", "edge._wire"}
    assert native.module("core._ids") is None
    assert native.module("core._shape") is None
    assert native.implementations() == {
        "core._scan": "compiled",
        "core._ids": "python",
        "core._shape": "python",
        "edge._wire": "compiled",
    }


def test_a_list_of_one_part(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.ENVIRONMENT, "core._shape")
    assert native.implementations() == {
        part: "compiled" if part == "core._shape" else "python" for part in native.PARTS
    }


@pytest.mark.parametrize(
    "value", ["core._nothing", "core._scan,_wire", "core._scan,", "core._scan,,edge._wire", "2"]
)
def test_an_unknown_name_in_the_environment_is_an_error_naming_the_parts(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(native.ENVIRONMENT, value)
    with pytest.raises(ValueError, match="not one of") as raised:
        native.chosen()
    assert all(part in str(raised.value) for part in native.PARTS)
    with pytest.raises(ValueError, match=native.ENVIRONMENT):
        native.module("core._scan")


def test_an_unknown_part_is_an_error() -> None:
    with pytest.raises(ValueError, match="not one of"):
        native.module("core._nothing")
