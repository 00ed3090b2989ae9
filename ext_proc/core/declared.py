"""What an engine declares a request body may hold, endpoint by endpoint: the members of
its request models as its release's sources define them (``declared.json``, generated
from the inventory: devstack/inventory/derive.py), for a route's ``strict_body``.

A strict route forwards only declared members; anything else is what the next release
may read as a carrier, so it goes. A member is declared when its name is a field of the
model (or of any model of a union) its parent's type names. A member whose type is
open (any JSON, an untyped mapping, or a type from another package, such as the OpenAI
client's message TypedDicts) is declared with everything below it: the sources do not
say more, and the carriers below it are the classification's (``classified``).

The catalog is read on first use (a route naming an engine), never at import.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

# A type reference that opens everything below it; and the prefixes of a reference to
# a type from another package, and of one list item or mapping value (repeated for
# nested ones: ``list:list:Name``), as the inventory writes them.
OPEN: Final = "*"
EXTERNAL: Final = "ext:"
LIST: Final = "list:"
DICT: Final = "dict:"

# How deep below the body a member is checked: a model that refers to itself (a schema
# of schemas) would let a hostile body recurse without end; deeper members are
# reported as undeclared, which no request of a real client nests.
MAX_DEPTH: Final = 64

Path = tuple[str | int, ...]
Models = Mapping[str, Mapping[str, tuple[str, ...]]]


@dataclass(frozen=True, slots=True)
class Body:
    """One endpoint's declared body: its root model, among the engine's models."""

    root: str | None  # None: the server reads the body without a model (all open)
    models: Models


@functools.cache
def _catalog() -> Mapping[str, Any]:
    text = importlib.resources.files("ext_proc.core").joinpath("declared.json").read_text()
    catalog: Mapping[str, Any] = json.loads(text)
    return catalog


def engines() -> frozenset[str]:
    """Every engine and release the catalog holds (``vllm 0.32.0``)."""
    return frozenset(_catalog()["engines"])


def body(engine: str, endpoint: str) -> Body | None:
    """The body ``engine`` declares for the upstream ``endpoint`` (``vllm_request.
    endpoint``: decoded), matched as the server routes it behind any root path: the
    longest declared path the endpoint ends with at a segment boundary, without one
    trailing slash. None when the engine declares no such endpoint."""
    declared = _catalog()["engines"].get(engine)
    if declared is None:
        return None
    bare = endpoint.rstrip("/") or "/"
    best = None
    for path in declared["endpoints"]:
        if (bare == path or bare.endswith(path)) and (best is None or len(path) > len(best)):
            best = path
    if best is None:
        return None
    return Body(declared["endpoints"][best], _models(engine))


@functools.cache
def _models(engine: str) -> Models:
    models = _catalog()["engines"][engine]["models"]
    return {
        name: {key: tuple(refs) for key, refs in fields.items()} for name, fields in models.items()
    }


def undeclared(document: Mapping[str, Any], declared: Body, most: int) -> tuple[Path, ...]:
    """The paths of the members of ``document`` that ``declared`` does not declare, list
    items by index, in document order; at most ``most`` of them (the search stops)."""
    if declared.root is None:
        return ()
    search = _Search(declared.models, most)
    search.members(document, (declared.root,), ())
    return tuple(search.found)


def _open(refs: tuple[str, ...]) -> bool:
    return any(ref == OPEN or ref.startswith(EXTERNAL) for ref in refs)


class _Search:
    """The undeclared members found so far, up to ``most``."""

    def __init__(self, models: Models, most: int) -> None:
        self.models = models
        self.most = most
        self.found: list[Path] = []

    def members(self, value: Mapping[str, Any], names: tuple[str, ...], path: Path) -> None:
        """Check the members of the object ``value`` against the union of ``names``."""
        if len(path) > MAX_DEPTH:
            self.found.append(path)
            return
        fields = [self.models[name] for name in names if name in self.models]
        if len(fields) != len(names):
            return  # a model the catalog does not hold: nothing is known below it
        for key, item in value.items():
            if len(self.found) >= self.most:
                return
            if not any(key in field for field in fields):
                self.found.append((*path, key))
                continue
            refs = tuple(ref for field in fields for ref in field.get(key, ()))
            if not _open(refs):
                self.value(item, refs, (*path, key))

    def value(self, item: Any, refs: tuple[str, ...], path: Path) -> None:
        """Check a declared member's value against the types its references name: an
        object against the models, a list's items and a mapping's values against what
        one ``list:`` or ``dict:`` step holds."""
        if type(item) is dict:
            plain = tuple(ref for ref in refs if not ref.startswith((LIST, DICT)))
            if plain:
                self.members(item, plain, path)
                return
            inner = tuple(ref[len(DICT) :] for ref in refs if ref.startswith(DICT))
            if inner and not _open(inner):
                for key, value in item.items():
                    self.value(value, inner, (*path, key))
        elif type(item) is list:
            inner = tuple(ref[len(LIST) :] for ref in refs if ref.startswith(LIST))
            if inner and not _open(inner):
                for index, value in enumerate(item):
                    self.value(value, inner, (*path, index))
