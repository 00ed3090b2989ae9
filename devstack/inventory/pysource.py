"""A Python distribution's source as syntax trees, read from its wheel in memory: modules
by dotted name, and what a name used in one of them refers to. Nothing is imported,
executed or written to disk.

A name resolves the way the module's own imports say: to a class or a module-level
assignment of a module the wheel holds (following re-exports through other modules of
the wheel), to ``ext:``'s dotted name of something another distribution holds, or to
nothing (a builtin, or a name no statement binds). Only module-level bindings count:
the ones at the top, and inside top-level ``if`` (``TYPE_CHECKING``), ``try`` and
``with`` blocks; the last binding of a name wins (an assignment never replaces an import
or a class: the ``else`` of an ``if TYPE_CHECKING:``). Modules are parsed when first asked
for, so a reader pays only for what it reads."""

from __future__ import annotations

import ast
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Final

# Bindings at module level: these blocks do not open a scope.
_BLOCKS: Final = (ast.If, ast.Try, ast.With)


@dataclass(frozen=True)
class Class:
    """A class the wheel defines."""

    module: str
    node: ast.ClassDef

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.node.name}"


@dataclass(frozen=True)
class Alias:
    """A module-level assignment the wheel holds (``X = A | B``, ``X: TypeAlias = ...``)."""

    module: str
    name: str
    value: ast.expr


@dataclass(frozen=True)
class External:
    """Something another distribution (or the standard library) defines."""

    dotted: str

    @property
    def name(self) -> str:
        return self.dotted.rsplit(".", 1)[-1]


Symbol = Class | Alias | External | None


@dataclass
class Module:
    name: str
    tree: ast.Module
    package: bool  # an __init__.py: relative imports start from the module itself

    @cached_property
    def bindings(self) -> dict[str, ast.stmt]:
        """Each module-level name and the statement that binds it last, except that an
        assignment never replaces an import or a class (``if TYPE_CHECKING: from m
        import X`` / ``else: X = object`` binds the import)."""
        found: dict[str, ast.stmt] = {}
        for statement in _top_level(self.tree.body):
            for name in _bound(statement):
                kept = found.get(name)
                if isinstance(statement, ast.Assign | ast.AnnAssign) and isinstance(
                    kept, ast.Import | ast.ImportFrom | ast.ClassDef
                ):
                    continue
                found[name] = statement
        return found

    def imported(self, statement: ast.Import | ast.ImportFrom, name: str) -> str:
        """The dotted name ``name`` stands for in ``statement``."""
        for alias in statement.names:
            local = alias.asname or alias.name.split(".", 1)[0]
            if local != name:
                continue
            if isinstance(statement, ast.Import):
                return alias.name if alias.asname else local
            return f"{self.base(statement)}.{alias.name}"
        raise KeyError(name)

    def base(self, statement: ast.ImportFrom) -> str:
        """The module ``statement`` imports from."""
        if statement.level == 0:
            return statement.module or ""
        parts = self.name.split(".")
        keep = len(parts) - statement.level + (1 if self.package else 0)
        base = ".".join(parts[:keep])
        return f"{base}.{statement.module}" if statement.module else base

    def functions(self) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
        """Every function the module defines, at any depth (routes declared in a factory
        function count)."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield node


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for statement in body:
        if isinstance(statement, _BLOCKS):
            yield from _top_level(statement.body)
            if isinstance(statement, ast.If | ast.Try):
                yield from _top_level(statement.orelse)
            if isinstance(statement, ast.Try):
                for handler in statement.handlers:
                    yield from _top_level(handler.body)
                yield from _top_level(statement.finalbody)
        else:
            yield statement


def _bound(statement: ast.stmt) -> Iterator[str]:
    if isinstance(statement, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        yield statement.name
    elif isinstance(statement, ast.Import | ast.ImportFrom):
        for alias in statement.names:
            if alias.name != "*":
                yield alias.asname or alias.name.split(".", 1)[0]
    elif isinstance(statement, ast.Assign):
        for target in statement.targets:
            if isinstance(target, ast.Name):
                yield target.id
    elif (
        isinstance(statement, ast.AnnAssign)
        and isinstance(statement.target, ast.Name)
        and statement.value is not None
    ):
        yield statement.target.id


@dataclass
class Package:
    """Every Python module of one wheel, by dotted name (``a/b/__init__.py`` is ``a.b``)."""

    texts: Mapping[str, tuple[str, bool]]  # module -> (source text, is a package)
    unreadable: list[str] = field(default_factory=list)
    _parsed: dict[str, Module] = field(default_factory=dict)

    @classmethod
    def from_wheel(cls, path: Path) -> Package:
        texts: dict[str, tuple[str, bool]] = {}
        with zipfile.ZipFile(path) as wheel:
            for info in wheel.infolist():
                if not info.filename.endswith(".py") or ".data/" in info.filename:
                    continue
                parts = info.filename[: -len(".py")].split("/")
                package = parts[-1] == "__init__"
                name = ".".join(parts[:-1] if package else parts)
                texts[name] = (wheel.read(info).decode("utf-8", "replace"), package)
        return cls(texts)

    def names(self, *prefixes: str, containing: str = "") -> list[str]:
        """The modules at or below any of ``prefixes`` whose text contains ``containing``,
        sorted (a cheap filter before parsing)."""
        return sorted(
            name
            for name, (text, _) in self.texts.items()
            if any(name == p or name.startswith(p + ".") for p in prefixes) and containing in text
        )

    def module(self, name: str) -> Module | None:
        if name not in self._parsed:
            if name not in self.texts:
                return None
            text, package = self.texts[name]
            try:
                tree = ast.parse(text)
            except SyntaxError:
                # Syntax this interpreter cannot read (a newer Python's): the module
                # binds nothing here, and ``unreadable`` says so.
                tree = ast.Module(body=[], type_ignores=[])
                self.unreadable.append(name)
            self._parsed[name] = Module(name, tree, package)
        return self._parsed[name]

    def resolve(self, module: Module, node: ast.expr) -> Symbol:
        """What the name or dotted attribute ``node`` refers to in ``module``."""
        if isinstance(node, ast.Name):
            return self.lookup(module, node.id)
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted is None:
                return None
            head, _, rest = dotted.partition(".")
            statement = module.bindings.get(head)
            if isinstance(statement, ast.Import | ast.ImportFrom):
                return self.find(f"{module.imported(statement, head)}.{rest}")
        return None

    def lookup(self, module: Module, name: str, seen: frozenset[str] = frozenset()) -> Symbol:
        """What ``name`` is bound to at the top of ``module``."""
        statement = module.bindings.get(name)
        if statement is None:
            return self._starred(module, name, seen)
        if isinstance(statement, ast.ClassDef):
            return Class(module.name, statement)
        if isinstance(statement, ast.Import | ast.ImportFrom):
            return self.find(module.imported(statement, name), seen)
        if isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value is not None:
            return Alias(module.name, name, statement.value)
        return None

    def _starred(self, module: Module, name: str, seen: frozenset[str]) -> Symbol:
        # ``from .protocol import *``: the first such module of the wheel that binds it.
        for statement in _top_level(module.tree.body):
            if isinstance(statement, ast.ImportFrom) and statement.names[0].name == "*":
                source = self.module(module.base(statement))
                if source is not None and f"{source.name}.{name}" not in seen:
                    found = self.lookup(source, name, seen | {f"{source.name}.{name}"})
                    if found is not None:
                        return found
        return None

    def find(self, dotted: str, seen: frozenset[str] = frozenset()) -> Symbol:
        """The object ``dotted`` names: in the wheel when a module of the wheel binds it
        (a re-export is followed), otherwise ``External``."""
        if dotted in seen:
            return None  # an import cycle binds nothing
        owner, _, name = dotted.rpartition(".")
        module = self.module(owner) if owner else None
        if module is None:
            return External(dotted)
        return self.lookup(module, name, seen | {dotted})


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def strings(node: ast.expr | None) -> list[str]:
    """The string constants ``node`` is or holds (a tuple, list or set display, or a
    dict display's keys); [] for anything else. Bytes are decoded as ASCII."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            return [node.value]
        if isinstance(node.value, bytes):
            return [node.value.decode("ascii", "replace")]
        return []
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for item in node.elts for s in strings(item)]
    if isinstance(node, ast.Dict):
        return [s for key in node.keys if key is not None for s in strings(key)]
    return []


def constant(package: Package, module: Module, node: ast.expr) -> list[str]:
    """The strings ``node`` stands for: a constant, or a name bound at module level (here
    or through an import of the wheel) to a constant or a display of them."""
    if isinstance(node, ast.Name | ast.Attribute):
        symbol = package.resolve(module, node)
        return strings(symbol.value) if isinstance(symbol, Alias) else []
    return strings(node)
