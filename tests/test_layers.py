"""The package's layers: the core imports no gRPC, protobuf, edge or tool module; the
edge imports no tool. Checked on the source (every import statement, lazy ones too)
and on a fresh interpreter that imports the whole core. And the package (the wheel)
holds only what its commands run: every module is imported, at any depth, from
``python -m ext_proc``; a maintainer's tool lives outside it (devstack/)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ext_proc"
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


def _imports(path: Path, package: str = "") -> set[str]:
    """Every name an import statement of ``path`` may load (``from m import n``: ``m`` and
    ``m.n``); a relative import is resolved against ``package`` when given."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module if node.level == 0 else _relative(node, package)
            if module:
                names.add(module)
                names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _relative(node: ast.ImportFrom, package: str) -> str | None:
    if not package:
        return None
    parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def commanded(entry: str = "ext_proc.__main__") -> set[Path]:
    """The modules of the package that running ``entry`` may import: every import
    statement followed (lazy ones too), with the packages each module is in."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    seen: set[str] = set()
    pending = [entry]
    while pending:
        name = pending.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        path = modules[name]
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        parents = name.split(".")
        pending += [".".join(parents[:i]) for i in range(1, len(parents))]
        pending += _imports(path, package)
    return {modules[name] for name in seen}


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


def test_every_module_of_the_package_is_one_a_command_runs() -> None:
    # The wheel is built from ext_proc/ alone: a module no command imports (a maintainer's
    # generator, a reader of other projects' sources) would ship to production unused.
    unused = sorted(str(p.relative_to(ROOT)) for p in set(PACKAGE.rglob("*.py")) - commanded())
    assert not unused
    assert len(commanded()) > 50


def test_the_walk_follows_lazy_relative_and_package_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from .sibling import g\n    from .. import up\n")
    assert _imports(module, "ext_proc.tools") == {
        "ext_proc.tools.sibling",
        "ext_proc.tools.sibling.g",
        "ext_proc",
        "ext_proc.up",
    }
    reached = commanded("ext_proc.tools.check_envoy.rules")
    assert PACKAGE / "tools" / "check_envoy" / "rules" / "__init__.py" in reached
    assert PACKAGE / "tools" / "__init__.py" in reached
    assert PACKAGE / "edge" / "server.py" not in reached
