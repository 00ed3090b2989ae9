"""HTTP routes read from syntax: every route a FastAPI server declares, with or without a
body, and the model its handler reads a body into.

Invariants:

- A route is declared by a decorator ``X.post/put/patch/delete/get/api_route(PATH, ...)``
  on a function at any depth (routes declared inside a factory function count), or by
  a call ``X.add_api_route(PATH, HANDLER, methods=[...])`` whose handler is a function
  of the same module. ``api_route`` and ``add_api_route`` without ``methods`` are GET.
- PATH is a string constant, or ``os.environ.get(NAME, DEFAULT)``/``os.getenv`` (the
  default path is recorded). A route whose path is anything else is not recorded:
  vLLM's scale-out factory re-registers other routers' routes in a loop
  (``route.path``), and those are recorded where they are declared. A router made by
  ``APIRouter(prefix=...)`` at module level prefixes its routes.
- Every route is recorded, whatever its method: one that acts or discloses on a bodiless
  GET must be classified as much as one that reads a body (``model.takes_body`` tells
  them apart). A route's root is its handler's body model: the first parameter whose
  annotation refers to models of the wheel (``Request`` and other packages' types are
  skipped): that model, or the type alias naming a union of models (vLLM's
  ``TokenizeRequest``); else the model a handler that calls ``.json()`` builds with
  ``M(**body)`` or ``M.model_validate``; else None: the handler reads the body some
  other way (vLLM's ``/invocations`` tries a list of models it is handed at run time),
  as form fields, or not at all.
- A method and path declared twice keeps the root of the first declaration that has one,
  modules and lines in order."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from devstack.inventory.pysource import Alias, Class, Module, Package, Symbol
from devstack.inventory.schema import Schema

_VERBS: Final = frozenset({"get", "post", "put", "patch", "delete", "head", "options"})
Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Root:
    """A route's body model: one model class, or an alias of a union of them."""

    name: str
    members: tuple[Class, ...]
    alias: Alias | None = None


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    root: Root | None

    @property
    def endpoint(self) -> str:
        return f"{self.method} {self.path}"


def routes(package: Package, schema: Schema, prefixes: tuple[str, ...]) -> dict[str, Root | None]:
    """Every route the modules under ``prefixes`` declare: "METHOD /path" -> root."""
    found: dict[str, Root | None] = {}
    for name in package.names(*prefixes, containing="route"):
        module = package.module(name)
        assert module is not None
        for route in _declared(module, schema):
            if found.get(route.endpoint) is None:
                found[route.endpoint] = route.root
    return found


def _declared(module: Module, schema: Schema) -> Iterator[Route]:
    functions = list(module.functions())
    by_name = {function.name: function for function in reversed(functions)}
    for function in functions:
        for decorator in function.decorator_list:
            declared = _decorator(module, decorator)
            if declared is not None:
                path, methods = declared
                root = body_root(module, function, schema)
                yield from (Route(method, path, root) for method in methods)
    for node in ast.walk(module.tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_api_route"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Name)
        ):
            continue
        added = _path(node.args[0])
        handler = by_name.get(node.args[1].id)
        if added is None or handler is None:
            continue
        root = body_root(module, handler, schema)
        prefix = _prefix(module, node.func.value)
        for method in _methods(node, default="GET"):
            yield Route(method, prefix + added, root)


def _decorator(module: Module, decorator: ast.expr) -> tuple[str, list[str]] | None:
    if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)):
        return None
    verb = decorator.func.attr
    if verb not in _VERBS and verb != "api_route":
        return None
    target = decorator.args[0] if decorator.args else _keyword(decorator, "path")
    path = None if target is None else _path(target)
    if path is None:
        return None
    methods = [verb.upper()] if verb in _VERBS else _methods(decorator, default="GET")
    return _prefix(module, decorator.func.value) + path, methods


def _path(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    # os.environ.get("NAME", "/default") and os.getenv("NAME", "/default")
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("get", "getenv")
        and len(node.args) == 2
    ):
        return _path(node.args[1])
    return None


def _methods(call: ast.Call, default: str) -> list[str]:
    methods = _keyword(call, "methods")
    if not isinstance(methods, ast.List | ast.Tuple | ast.Set):
        return [default]
    return sorted(
        {
            item.value.upper()
            for item in methods.elts
            if isinstance(item, ast.Constant) and isinstance(item.value, str)
        }
    )


def _prefix(module: Module, router: ast.expr) -> str:
    """The ``prefix`` of ``router = APIRouter(prefix="/x")`` at module level, or ""."""
    if not isinstance(router, ast.Name):
        return ""
    statement = module.bindings.get(router.id)
    if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Call):
        prefix = _keyword(statement.value, "prefix")
        if isinstance(prefix, ast.Constant) and isinstance(prefix.value, str):
            return prefix.value
    return ""


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def body_root(module: Module, function: Function, schema: Schema) -> Root | None:
    """The model the handler ``function`` reads its body into, if any."""
    arguments = function.args
    for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
        if argument.annotation is None or argument.arg == "self":
            continue
        annotation = _annotated(argument.annotation)
        members = tuple(
            sorted(
                {
                    ref.target
                    for ref in schema.references(module, annotation)
                    if isinstance(ref.target, Class) and not ref.steps
                },
                key=lambda cls: cls.qualname,
            )
        )
        if not members:
            continue
        symbol = schema.package.resolve(module, annotation)
        if isinstance(symbol, Alias):
            return Root(symbol.name, members, symbol)
        if len(members) == 1:
            return Root(members[0].name, members)
        return Root(" | ".join(cls.name for cls in members), members)
    return _built(module, function, schema)


_BUILDERS: Final = frozenset({"model_validate", "model_validate_json", "parse_obj"})


def _built(module: Module, function: Function, schema: Schema) -> Root | None:
    """The model a handler builds from the body it reads itself: ``M(**body)`` or
    ``M.model_validate(body)`` in a handler that calls ``.json()`` (vLLM 0.27's
    ``/generative_scoring``), M found by the handler's own imports or the module's."""
    calls = [node for node in ast.walk(function) if isinstance(node, ast.Call)]
    if not any(isinstance(c.func, ast.Attribute) and c.func.attr == "json" for c in calls):
        return None
    for call in calls:
        target = call.func
        if isinstance(target, ast.Attribute) and target.attr in _BUILDERS:
            target = target.value
        elif not any(keyword.arg is None for keyword in call.keywords):
            continue
        symbol = _local(module, function, target, schema)
        if isinstance(symbol, Class) and schema.kind(symbol) not in (None, "enum"):
            return Root(symbol.name, (symbol,))
    return None


def _local(module: Module, function: Function, node: ast.expr, schema: Schema) -> Symbol:
    """What ``node`` names in ``function``: an import inside it, else the module's."""
    if isinstance(node, ast.Name):
        for statement in ast.walk(function):
            if isinstance(statement, ast.ImportFrom):
                for alias in statement.names:
                    if (alias.asname or alias.name) == node.id:
                        return schema.package.find(f"{module.base(statement)}.{alias.name}")
    return schema.package.resolve(module, node)


def _annotated(node: ast.expr) -> ast.expr:
    """``X`` of ``Annotated[X, Body()]`` (and of ``Annotated[X, ...]`` written as a
    string), so that an alias ``X`` still names the root."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value.strip(), mode="eval").body
        except SyntaxError:
            return node
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name | ast.Attribute)
        and (node.value.id if isinstance(node.value, ast.Name) else node.value.attr) == "Annotated"
        and isinstance(node.slice, ast.Tuple)
    ):
        return node.slice.elts[0]
    return node
