"""String constants a server's code reads, found by the shape of the read: request header
names, chat content-part types and ``kv_transfer_params`` keys.

A constant is a string literal, or a name bound at module level (here or through an
import of the wheel) to one or to a display of them; bytes count as ASCII text.

Headers (every name lower-cased; a name must be an HTTP token):
- ``H.get(C)``, ``H.getlist(C)``, ``H[C]`` read and ``C in H``, where H's last name or
  attribute ends in ``headers`` (``raw_request.headers``, ``Headers(scope=scope)``) and
  no name in it mentions a response (``response.headers`` is what a server writes);
- FastAPI's ``Header(alias=C)``, and a handler parameter declared with ``Header()`` and
  no alias (its name with ``-`` for ``_``, as FastAPI converts it);
- in a module that reads headers by a name rather than a constant (a loop), each
  module-level name containing ``HEADER`` bound to a constant or to a display of them (a
  dict's keys): vLLM's ``TRACE_HEADERS``, SGLang's ``_HEADER_OVERRIDES``. A module that
  only sends headers (a client's ``EXA_INTEGRATION_HEADER``) adds none.

Part types: the keys of a module-level dict display bound to a name ending in
``PARSER_MAP`` (vLLM's ``MM_PARSER_MAP``), the constants a name ``part_type`` is
compared with (``==``, ``!=``, ``in``), and the ``Literal`` values of the ``type``
field of each model in a union alias of content parts (SGLang's
``ChatCompletionMessageContentPart``).

Connector keys: ``P.get(C)``, ``P.pop(C)``, ``P[C]`` read and ``C in P``, where P's last
name or attribute contains ``params`` (in the connector modules) or
``kv_transfer_params`` (anywhere else in the wheel: the keys vLLM's own code reads, such
as the renderer's ``prompt_token_ids``), or P is a local name the same function binds
to an expression mentioning that word (``kv = getattr(request, "kv_transfer_params")``)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import Final

from devstack.inventory.pysource import Alias, Class, Module, Package, constant, strings
from devstack.inventory.schema import Schema

_TOKEN: Final = re.compile(r"[a-z0-9][a-z0-9!#$%&'*+.^_`|~-]*")
_RESPONSE: Final = re.compile(r"resp", re.IGNORECASE)
Read = tuple[ast.expr, ast.expr]  # (the container read, the key read from it)


def _name(node: ast.expr) -> str:
    """The last name of a receiver: ``raw_request.headers`` -> "headers",
    ``Headers(scope=s)`` -> "Headers", ``self.kv_transfer_params`` -> "kv_transfer_params"."""
    if isinstance(node, ast.Call):
        return _name(node.func)
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _names(node: ast.expr) -> Iterator[str]:
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            yield child.id
        elif isinstance(child, ast.Attribute):
            yield child.attr


def keyed_reads(scope: Module | ast.AST) -> Iterator[Read]:
    """Every ``R.get(K)``, ``R.getlist(K)``, ``R.pop(K)``, ``R[K]`` read and ``K in R``
    in a module or below a node."""
    for node in ast.walk(scope.tree if isinstance(scope, Module) else scope):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "getlist", "pop")
            and node.args
        ):
            yield node.func.value, node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            yield node.value, node.slice
        elif isinstance(node, ast.Compare):
            left = node.left
            for op, right in zip(node.ops, node.comparators, strict=True):
                if isinstance(op, ast.In | ast.NotIn):
                    yield right, left
                left = right


# --- headers ----------------------------------------------------------------------------


def headers(package: Package, prefixes: tuple[str, ...]) -> set[str]:
    """Every request header name the modules under ``prefixes`` read."""
    found: set[str] = set()
    for name in package.names(*prefixes, containing="eader"):
        module = package.module(name)
        assert module is not None
        variable = False  # a header read by a name, not by a constant
        for container, key in keyed_reads(module):
            if _name(container).lower().endswith("headers") and not any(
                _RESPONSE.search(part) for part in _names(container)
            ):
                read = constant(package, module, key)
                found.update(read)
                variable = variable or not read
        found.update(_header_parameters(module))
        if variable:
            found.update(_header_constants(module))
    return {header.lower() for header in found if _TOKEN.fullmatch(header.lower())}


def _header_parameters(module: Module) -> Iterator[str]:
    for function in module.functions():
        arguments = function.args
        named = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
        defaults = [None] * (len(named) - len(arguments.defaults) - len(arguments.kw_defaults))
        for argument, default in zip(
            named, [*defaults, *arguments.defaults, *arguments.kw_defaults], strict=True
        ):
            for node in (default, argument.annotation):
                for call in ast.walk(node) if node is not None else ():
                    if isinstance(call, ast.Call) and _name(call.func) == "Header":
                        alias = next((k.value for k in call.keywords if k.arg == "alias"), None)
                        yield from (strings(alias) if alias else [argument.arg.replace("_", "-")])


def _header_constants(module: Module) -> Iterator[str]:
    for name, statement in module.bindings.items():
        if "HEADER" in name and isinstance(statement, ast.Assign | ast.AnnAssign):
            yield from strings(statement.value)


# --- content-part types -----------------------------------------------------------------


def part_types(
    package: Package, schema: Schema, modules: tuple[str, ...], unions: tuple[str, ...]
) -> set[str]:
    """The content-part types the ``modules`` map or compare, and the ``type`` literals of
    the members of the union aliases ``unions`` (dotted names)."""
    found: set[str] = set()
    for name in package.names(*modules):
        module = package.module(name)
        assert module is not None
        for binding, statement in module.bindings.items():
            if (
                binding.endswith("PARSER_MAP")
                and isinstance(statement, ast.Assign | ast.AnnAssign)
                and isinstance(statement.value, ast.Dict)
            ):
                found.update(strings(statement.value))
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Compare) and _name(node.left) == "part_type":
                for right in node.comparators:
                    found.update(constant(package, module, right))
    for dotted in unions:
        found.update(_union_literals(package, schema, dotted))
    return found


def _union_literals(package: Package, schema: Schema, dotted: str) -> Iterator[str]:
    alias = package.find(dotted)
    module = package.module(alias.module) if isinstance(alias, Alias) else None
    if not isinstance(alias, Alias) or module is None:
        return
    for reference in schema.references(module, alias.value):
        if isinstance(reference.target, Class) and not reference.steps:
            yield from _type_literals(schema, reference.target)


def _type_literals(schema: Schema, cls: Class) -> Iterator[str]:
    field = schema.fields(cls).get("type")
    if field is None:
        return
    for node in ast.walk(field[1]):
        if isinstance(node, ast.Subscript) and _name(node.value) == "Literal":
            yield from strings(node.slice)


# --- connector keys ---------------------------------------------------------------------


def connector_keys(package: Package, connectors: tuple[str, ...], everywhere: str) -> set[str]:
    """The keys read from parameters in the ``connectors`` modules, and from names
    containing ``kv_transfer_params`` in the rest of the wheel under ``everywhere``."""
    found: set[str] = set()
    for name in package.names(everywhere, containing="params"):
        inside = any(name == p or name.startswith(p + ".") for p in connectors)
        needle = "params" if inside else "kv_transfer_params"
        if needle not in package.texts[name][0]:
            continue
        module = package.module(name)
        assert module is not None
        for container, key in keyed_reads(module):
            if needle in _name(container):
                found.update(constant(package, module, key))
        for function in module.functions():
            aliases = _aliases(function, needle)
            for container, key in keyed_reads(function):
                if isinstance(container, ast.Name) and container.id in aliases:
                    found.update(constant(package, module, key))
    return found


def _aliases(function: ast.AST, needle: str) -> set[str]:
    """The local names ``function`` binds to the parameters themselves: ``kv =
    getattr(request, "kv_transfer_params", None)``, ``p = request.kv_transfer_params or
    {}``, ``p = extra.get("kv_transfer_params")`` (not to a member of them)."""
    found: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr) and node.value:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if _is_parameters(node.value, needle):
                found.update(t.id for t in targets if isinstance(t, ast.Name))
    return found


def _is_parameters(node: ast.expr, needle: str) -> bool:
    if isinstance(node, ast.BoolOp):
        return any(_is_parameters(value, needle) for value in node.values)
    if isinstance(node, ast.Name | ast.Attribute):
        return needle in _name(node)
    if isinstance(node, ast.Call) and node.args:
        function = _name(node.func)
        if function == "getattr" and len(node.args) > 1:
            return any(needle in text for text in strings(node.args[1]))
        if function == "get":
            return any(needle in text for text in strings(node.args[0]))
    return False
