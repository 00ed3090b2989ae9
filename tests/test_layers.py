"""The package's layers: the core imports no gRPC, protobuf, edge or tool module; the
edge imports no tool. Checked on the source (every import statement, lazy ones too)
and on a fresh interpreter that imports the whole core."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ext_proc"
CORE_FORBIDDEN = (
    "grpc",
    "grpc_health",
    "google.protobuf",
    "ext_proc._pb",
    "ext_proc.edge",
    "ext_proc.tools",
)
EDGE_FORBIDDEN = ("ext_proc.tools",)


def _modules(layer: str) -> list[Path]:
    return sorted((PACKAGE / layer).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize(
    ("layer", "forbidden"), [("core", CORE_FORBIDDEN), ("edge", EDGE_FORBIDDEN)]
)
def test_a_layer_imports_nothing_above_it(layer: str, forbidden: tuple[str, ...]) -> None:
    modules = _modules(layer)
    assert len(modules) > 5
    found = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in modules
        for name in _imports(path)
        if _within(name, forbidden)
    }
    assert not found


def test_the_rule_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from ext_proc.edge import codec\n    import grpc\n")
    assert {n for n in _imports(module) if _within(n, CORE_FORBIDDEN)} == {
        "ext_proc.edge",
        "ext_proc.edge.codec",
        "grpc",
    }


def test_importing_the_core_loads_no_edge() -> None:
    names = ["ext_proc.core." + p.stem for p in _modules("core") if p.stem != "__init__"]
    probe = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        f"print('\\n'.join(m for m in sys.modules if m.startswith({CORE_FORBIDDEN!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == []
    assert len(names) > 5
