"""Request models read from syntax: which classes of a wheel are models, their fields, and
the models, other packages' types or open members each field's annotation refers to.

Invariants (each one a heuristic stated as what it guarantees):

- A model is a class of the wheel deriving, through bases the wheel defines (followed
  by name), from pydantic's ``BaseModel``/``RootModel``, ``TypedDict`` or msgspec's
  ``Struct``, or decorated ``@dataclass`` (any module's). vLLM's ``OpenAIBaseModel`` is
  one because it derives from ``BaseModel``. A class deriving from another package's
  class (SGLang's ``ResponseOutputMessage`` from openai's) is a model of its own fields,
  and a reference to it refers to that ``ext:`` class too.
- A model's fields are its class-level annotated names and those of its bases in the
  wheel (the most derived annotation wins), less ``ClassVar``s, pydantic's private
  ``_names`` and dataclass fields declared ``init=False``; a pydantic field declared
  with a string ``alias`` or ``validation_alias`` is named by it (the key a body holds).
- A field's references come from its annotation through ``Optional``, ``Union``, ``|``,
  ``Annotated`` (its first argument), ``Required``/``NotRequired``/``ReadOnly``/``Final``,
  string forward references and the wheel's own type aliases; a list, tuple, set or
  other iterable adds ``list:``, a mapping's value ``dict:`` (a mapping of scalars is
  ``*``: its keys are the body's to choose). ``Literal`` and scalars (builtins, the
  standard library's values, pydantic's constrained types, enums) add nothing. ``*``
  stands for what a body may fill freely: ``Any``, ``object``, a bare ``dict``/``list``,
  pydantic's ``Json``, a ``TypeVar`` (one with a ``bound`` refers to the bound), a
  recursive alias, a class of the wheel that is not a model, and a name nothing binds;
  a type of another package is
  ``ext:`` its dotted name as imported."""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Literal

from devstack.inventory.model import DICT, EXT, LIST, OPEN
from devstack.inventory.pysource import Alias, Class, External, Module, Package, Symbol

_TYPING: Final = frozenset({"typing", "typing_extensions", "collections.abc", "collections"})
_UNION: Final = frozenset({"Optional", "Union"})
_FIRST: Final = frozenset({"Annotated", "Required", "NotRequired", "ReadOnly", "Final", "InitVar"})
_ITEMS: Final = frozenset(
    {
        "list", "List", "Sequence", "MutableSequence", "Iterable", "Iterator",
        "AsyncIterable", "AsyncIterator", "Collection", "Generator", "set", "Set",
        "frozenset", "FrozenSet", "AbstractSet", "MutableSet", "deque", "Deque",
        "tuple", "Tuple",
    }
)  # fmt: skip
_MAPPINGS: Final = frozenset(
    {"dict", "Dict", "Mapping", "MutableMapping", "OrderedDict", "defaultdict", "DefaultDict"}
)
_ANYTHING: Final = frozenset({"Any", "object"})
# Other packages whose types are values, not members a body nests (pydantic's Json* aside).
_SCALAR_MODULES: Final = frozenset(
    {"builtins", "datetime", "uuid", "decimal", "pathlib", "enum", "ipaddress", "re", "types"}
    | {"numbers", "fractions", "annotated_types", "pydantic", "pydantic_core", "typing"}
    | {"typing_extensions", "collections", "msgspec", "abc"}
)
_BUILTINS: Final = frozenset(dir(builtins))
Kind = Literal["pydantic", "typeddict", "struct", "dataclass", "enum", "extends"]
_MODEL_BASES: Final[dict[tuple[str, str], Kind]] = {
    ("pydantic", "BaseModel"): "pydantic",
    ("pydantic", "RootModel"): "pydantic",
    ("typing", "TypedDict"): "typeddict",
    ("typing_extensions", "TypedDict"): "typeddict",
    ("msgspec", "Struct"): "struct",
}

Target = Class | str  # a model of the wheel, or "*" / "ext:dotted"


@dataclass(frozen=True)
class Reference:
    """What a field refers to: ``steps`` is its ``list:``/``dict:`` prefix."""

    steps: str
    target: Target


class Schema:
    """The models of one wheel, computed on demand and remembered."""

    def __init__(self, package: Package) -> None:
        self.package = package
        self._kinds: dict[str, Kind | None] = {}

    # --- classes --------------------------------------------------------------------------

    def kind(self, cls: Class, seen: frozenset[str] = frozenset()) -> Kind | None:
        """What sort of model ``cls`` is (or an enum); None for any other class."""
        if cls.qualname not in self._kinds:
            self._kinds[cls.qualname] = self._kind(cls, seen | {cls.qualname})
        return self._kinds[cls.qualname]

    def _kind(self, cls: Class, seen: frozenset[str]) -> Kind | None:
        for decorator in cls.node.decorator_list:
            function = decorator.func if isinstance(decorator, ast.Call) else decorator
            if _last(function) == "dataclass":
                return "dataclass"
        for symbol in self._bases(cls):
            if isinstance(symbol, Class) and symbol.qualname not in seen:
                found = self.kind(symbol, seen)
                if found is not None:
                    return found
            elif isinstance(symbol, External):
                found = _external_kind(symbol)
                if found is not None:
                    return found
        return "extends" if self.extended(cls) else None

    def _bases(self, cls: Class) -> Iterator[Symbol]:
        module = self._module(cls)
        for base in cls.node.bases:
            yield self.package.resolve(module, _generic(base))

    def extended(self, cls: Class) -> list[str]:
        """The classes of other packages (not the standard library's) ``cls`` derives
        from directly: openai's ``EasyInputMessageParam`` under SGLang's own."""
        return [
            symbol.dotted
            for symbol in self._bases(cls)
            if isinstance(symbol, External) and not _scalar(symbol)
        ]

    def fields(
        self, cls: Class, seen: frozenset[str] = frozenset()
    ) -> dict[str, tuple[Module, ast.expr]]:
        """Each field's JSON name and its annotation (with the module it is read in),
        inherited ones first."""
        module = self._module(cls)
        found: dict[str, tuple[Module, ast.expr]] = {}
        for base in cls.node.bases:
            symbol = self.package.resolve(module, _generic(base))
            if isinstance(symbol, Class) and symbol.qualname not in seen:
                found.update(self.fields(symbol, seen | {cls.qualname}))
        private = self.kind(cls) == "pydantic"
        for statement in cls.node.body:
            if not isinstance(statement, ast.AnnAssign) or not isinstance(
                statement.target, ast.Name
            ):
                continue
            name = statement.target.id
            if (private and name.startswith("_")) or self._class_var(module, statement):
                continue
            if _keyword(statement.value, "init") is False:
                continue
            alias = _keyword(statement.value, "alias") or _keyword(
                statement.value, "validation_alias"
            )
            found[alias if isinstance(alias, str) else name] = (module, statement.annotation)
        return found

    def _class_var(self, module: Module, statement: ast.AnnAssign) -> bool:
        annotation = _generic(statement.annotation)
        symbol = self.package.resolve(module, annotation)
        return isinstance(symbol, External) and symbol.name == "ClassVar"

    def _module(self, cls: Class) -> Module:
        module = self.package.module(cls.module)
        assert module is not None  # a Class comes from a parsed module
        return module

    # --- annotations ----------------------------------------------------------------------

    def references(self, module: Module, node: ast.expr) -> set[Reference]:
        """What the annotation ``node`` (read in ``module``) refers to."""
        return set(self._refs(module, node, "", frozenset()))

    def _refs(
        self, module: Module, node: ast.expr, steps: str, seen: frozenset[str]
    ) -> Iterator[Reference]:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                yield from self._forward(module, node.value, steps, seen)
            return  # None, Ellipsis
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            yield from self._refs(module, node.left, steps, seen)
            yield from self._refs(module, node.right, steps, seen)
        elif isinstance(node, ast.Subscript):
            yield from self._subscript(module, node, steps, seen)
        elif isinstance(node, ast.Name | ast.Attribute):
            yield from self._symbol(self.package.resolve(module, node), node, steps, seen)
        else:
            yield Reference("", OPEN)

    def _forward(
        self, module: Module, text: str, steps: str, seen: frozenset[str]
    ) -> Iterator[Reference]:
        try:
            parsed = ast.parse(text.strip(), mode="eval").body
        except SyntaxError:
            yield Reference("", OPEN)
            return
        yield from self._refs(module, parsed, steps, seen)

    def _subscript(
        self, module: Module, node: ast.Subscript, steps: str, seen: frozenset[str]
    ) -> Iterator[Reference]:
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        symbol = self.package.resolve(module, node.value)
        name = _typing_name(symbol, node.value)
        if name is None:
            # A generic class or alias of the wheel, or another package's: its arguments
            # are type parameters, not members.
            yield from self._symbol(symbol, node.value, steps, seen)
        elif name in _UNION:
            for arg in args:
                yield from self._refs(module, arg, steps, seen)
        elif name in _FIRST:
            yield from self._refs(module, args[0], steps, seen)
        elif name in _ITEMS:
            for arg in args:
                yield from self._refs(module, arg, steps + LIST, seen)
        elif name in _MAPPINGS:
            # A mapping of values that are not models has keys a body chooses: open.
            values = list(self._refs(module, args[-1], steps + DICT, seen))
            yield from values or [Reference("", OPEN)]
        elif name in _ANYTHING:
            yield Reference("", OPEN)
        # Literal, type[...], Callable[...] and other typing forms hold no members.

    def _symbol(
        self, symbol: Symbol, node: ast.expr, steps: str, seen: frozenset[str]
    ) -> Iterator[Reference]:
        if isinstance(symbol, Class):
            kind = self.kind(symbol)
            if kind == "enum":
                return
            yield Reference(steps, symbol) if kind is not None else Reference("", OPEN)
            # Its fields are its own; the ones it inherits are the other package's type's.
            for dotted in self.extended(symbol) if kind == "extends" else ():
                yield Reference(steps, EXT + dotted)
        elif isinstance(symbol, Alias):
            yield from self._alias(symbol, steps, seen)
        else:
            name = _typing_name(symbol, node)
            if name in _ANYTHING or name in _ITEMS or name in _MAPPINGS:
                yield Reference("", OPEN)  # bare: anything inside
            elif isinstance(symbol, External) and not _scalar(symbol):
                yield Reference(steps, EXT + symbol.dotted)
            elif symbol is None and name is None:
                yield Reference("", OPEN)  # bound by nothing this reader sees

    def _alias(self, alias: Alias, steps: str, seen: frozenset[str]) -> Iterator[Reference]:
        key = f"{alias.module}.{alias.name}"
        module = self.package.module(alias.module)
        if key in seen or module is None:
            yield Reference("", OPEN)  # a recursive alias nests without bound
            return
        value = alias.value
        if isinstance(value, ast.Call):
            yield from self._alias_call(module, value, steps, seen | {key})
        elif isinstance(value, ast.Constant | ast.BinOp | ast.Subscript | ast.Name | ast.Attribute):
            yield from self._refs(module, value, steps, seen | {key})
        else:
            yield Reference("", OPEN)

    def _alias_call(
        self, module: Module, call: ast.Call, steps: str, seen: frozenset[str]
    ) -> Iterator[Reference]:
        function = _last(call.func)
        bound = _keyword(call, "bound")
        if function == "TypeVar":
            if isinstance(bound, str):
                yield from self._forward(module, bound, steps, seen)
            elif isinstance(bound, ast.expr):
                yield from self._refs(module, bound, steps, seen)
            else:
                yield Reference("", OPEN)
        elif function in ("NewType", "TypeAliasType") and len(call.args) == 2:
            yield from self._refs(module, call.args[1], steps, seen)
        elif not (function or "").startswith("con"):  # pydantic's conint(), constr()...
            yield Reference("", OPEN)


def _external_kind(symbol: External) -> Kind | None:
    module, _, name = symbol.dotted.rpartition(".")
    if module.split(".", 1)[0] == "enum":
        return "enum"
    return _MODEL_BASES.get((module.split(".", 1)[0], name))


def _typing_name(symbol: Symbol, node: ast.expr) -> str | None:
    """The typing or builtin construct ``node`` names (``Optional``, ``list``), if any."""
    if isinstance(symbol, External):
        module, _, name = symbol.dotted.rpartition(".")
        return name if module in _TYPING or module == "builtins" else None
    if symbol is None and isinstance(node, ast.Name) and node.id in _BUILTINS:
        return node.id
    return None


def _scalar(symbol: External) -> bool:
    module, _, name = symbol.dotted.rpartition(".")
    return module.split(".", 1)[0] in _SCALAR_MODULES and "Json" not in name


def _generic(node: ast.expr) -> ast.expr:
    """``X`` of ``X[...]``."""
    return node.value if isinstance(node, ast.Subscript) else node


def _last(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _keyword(node: ast.expr | None, name: str) -> object:
    """The constant (or, if not constant, the expression) of keyword ``name`` of the
    call ``node``; None when there is no such keyword."""
    if not isinstance(node, ast.Call):
        return None
    for keyword in node.keywords:
        if keyword.arg == name:
            value = keyword.value
            return value.value if isinstance(value, ast.Constant) else value
    return None
