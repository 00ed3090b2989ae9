"""``python -m devstack code-figures``: the package's size by layer, its longest
functions, and what the stream machine's handlers write: the figures a restructuring
is judged by, computed from the source rather than counted by hand."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[1]
LONG: Final = 50  # lines: a function longer than this is listed as long


def _modules(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "_pb" not in p.parts)


def _layer(package: Path, path: Path) -> str:
    parts = path.relative_to(package).parts
    return f"ext_proc/{parts[0]}/" if len(parts) > 1 else "ext_proc/ (top level)"


def _functions(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            end = node.end_lineno or node.lineno
            yield end - node.lineno + 1, node.name


def _self_writes(stream: Path) -> set[str]:
    """Attributes of ``self`` assigned in ``Stream``'s methods other than ``__init__``."""
    written: set[str] = set()
    for cls in ast.parse(stream.read_text()).body:
        if not (isinstance(cls, ast.ClassDef) and cls.name == "Stream"):
            continue
        for method in cls.body:
            if isinstance(method, ast.FunctionDef) and method.name != "__init__":
                written.update(
                    node.attr
                    for node in ast.walk(method)
                    if isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                )
    return written


def report(root: Path = REPO) -> str:
    """The figures of the checkout at ``root``."""
    package = root / "ext_proc"
    modules = _modules(package)
    layers: dict[str, list[int]] = {}
    for path in modules:
        count = layers.setdefault(_layer(package, path), [0, 0])
        count[0] += 1
        count[1] += len(path.read_text().splitlines())
    lines = ["layer: modules, lines"]
    lines += [f"  {name}: {n}, {size}" for name, (n, size) in sorted(layers.items())]
    functions = sorted(
        (
            (size, f"{path.relative_to(root)}:{name}")
            for path in modules
            for size, name in _functions(path)
        ),
        reverse=True,
    )
    lines.append(f"functions over {LONG} lines: {sum(size > LONG for size, _ in functions)}")
    lines += [f"  {size:4d} {name}" for size, name in functions[:8]]
    # Wherever the layout puts it (an older checkout's flat package too).
    (stream,) = (path for path in modules if path.name == "stream.py")
    written = sorted(_self_writes(stream))
    lines.append(f"{stream.relative_to(package)}: {len(stream.read_text().splitlines())} lines")
    lines.append(f"attributes Stream's handlers write: {len(written)} ({', '.join(written)})")
    return "\n".join(lines)
