"""The inventory's values and its one JSON form: what each model server (a source) declares
it reads, as the wheel reader and the stacks snapshot write it and the classification
reads it.

A source is one release of one program: its endpoints (every route its server declares,
with or without a body) with their root models, the request models reachable from them
(a field names the models its type refers to), the request headers, chat content-part
types and ``kv_transfer_params`` keys its code reads, and extra dotted body paths read
from untyped members. ``dumps`` writes every list
sorted and deduplicated and every object with sorted keys, so a regenerated file
differs from the committed one only where a source changed; ``loads`` refuses a
document of any other shape, naming where it is wrong.

A field's references (``Ref``) are strings: ``Name`` (a model of the same source),
``ext:module.Name`` (a type from another package), ``*`` (anything: ``Any``, an open
mapping), each ``Name`` or ``ext:`` reference prefixed by ``list:`` or ``dict:`` once per
list item or mapping value it sits in (``list:list:Name``); a scalar adds none."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

GENERATED_BY: Final = "python -m devstack.inventory refresh"
# The committed files: the whole inventory, and the stacks snapshot merged into it.
INVENTORY: Final = Path(__file__).with_name("inventory.json")
STACKS: Final = Path(__file__).with_name("stacks.json")
LIST: Final = "list:"
DICT: Final = "dict:"
EXT: Final = "ext:"
OPEN: Final = "*"
# A list item or a mapping value adds this step to a flattened path.
ITEM: Final = "*"
# The methods whose requests carry a body whatever the handler reads.
BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})

Ref = str
Fields = Mapping[str, tuple[Ref, ...]]  # a model: field name -> its references


class InventoryError(ValueError):
    """A document that is not an inventory (where and why in the message)."""


@dataclass(frozen=True)
class Source:
    """One release of one program. ``endpoints`` maps "METHOD /path" to its root model's
    name, or None when the body is read some other way or not at all (``takes_body``
    tells which); ``refresh`` is set on sources the stacks snapshot writes (the command
    that rebuilds them)."""

    engine: str
    release: str
    origin: str
    endpoints: Mapping[str, str | None] = field(default_factory=dict)
    models: Mapping[str, Fields] = field(default_factory=dict)
    headers: tuple[str, ...] = ()
    part_types: tuple[str, ...] = ()
    connector_keys: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    refresh: str | None = None

    @property
    def key(self) -> str:
        """The source's name in the inventory: "<engine> <release>"."""
        return f"{self.engine} {self.release}"


@dataclass(frozen=True)
class Inventory:
    sources: Mapping[str, Source]
    generated_by: str = GENERATED_BY


def inventory(sources: Iterable[Source]) -> Inventory:
    """The inventory of ``sources``, each under its key; a key given twice is an error."""
    by_key: dict[str, Source] = {}
    for source in sources:
        if source.key in by_key:
            raise InventoryError(f"source {source.key!r} given twice")
        by_key[source.key] = source
    return Inventory(by_key)


def takes_body(endpoint: str, root: str | None) -> bool:
    """Whether the endpoint "METHOD /path" with body model ``root`` takes a body: its
    method carries one, or its handler reads one into a model (a GET that does)."""
    return root is not None or endpoint.partition(" ")[0] in BODY_METHODS


# --- references -------------------------------------------------------------------------


def unwrap(ref: Ref) -> tuple[int, Ref]:
    """The number of list or mapping steps in front of ``ref``, and what they hold."""
    steps = 0
    while ref.startswith((LIST, DICT)):
        ref = ref.split(":", 1)[1]
        steps += 1
    return steps, ref


def paths(source: Source, endpoint: str) -> tuple[str, ...]:
    """Every dotted body path ``endpoint``'s root model declares, sorted.

    Each field is a path; a field's model reference adds that model's fields below it,
    with a ``*`` step per list item or mapping value (``messages.*.content``). Recursion
    stops at ``*``, ``ext:`` references, names that are not models of the source and at
    a model already on the path (a cycle). An endpoint without a model has no paths."""
    root = source.endpoints[endpoint]
    if root is None:
        return ()
    found: set[str] = set()
    _walk(source.models, root, (), (root,), found)
    return tuple(sorted(found))


def untyped(source: Source, endpoint: str) -> tuple[str, ...]:
    """Every dotted body path of ``endpoint`` whose member the source types as any JSON
    (a ``*`` reference, with a ``*`` step per list item or mapping value it sits in),
    sorted: below it the sources declare nothing, whatever a server reads there."""
    root = source.endpoints[endpoint]
    if root is None:
        return ()
    found: set[str] = set()
    _walk(source.models, root, (), (root,), set(), untyped=found)
    return tuple(sorted(found))


def _walk(
    models: Mapping[str, Fields],
    name: str,
    prefix: tuple[str, ...],
    chain: tuple[str, ...],
    found: set[str],
    *,
    untyped: set[str] | None = None,
) -> None:
    for field_name, refs in models.get(name, {}).items():
        path = (*prefix, field_name)
        found.add(".".join(path))
        for ref in refs:
            steps, target = unwrap(ref)
            below = (*path, *([ITEM] * steps))
            if target == OPEN and untyped is not None:
                untyped.add(".".join(below))
            elif target in models and target not in chain:
                _walk(models, target, below, (*chain, target), found, untyped=untyped)


def release_order(release: str) -> tuple[int, ...] | None:
    """A release's numbers ("0.32.0" -> (0, 32, 0)), for ordering the releases of one
    engine; None for a release that is not dotted numbers (a commit)."""
    if not re.fullmatch(r"\d+(\.\d+)*", release):
        return None
    return tuple(int(part) for part in release.split("."))


# --- JSON -------------------------------------------------------------------------------


def dumps(value: Inventory) -> str:
    """The committed text: ``json.dumps(indent=1, sort_keys=True)`` and a newline."""
    document = {
        "generated_by": value.generated_by,
        "sources": {key: _source_json(source) for key, source in value.sources.items()},
    }
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def _sorted(values: Iterable[str]) -> list[str]:
    return sorted(set(values))


def _source_json(source: Source) -> dict[str, Any]:
    document: dict[str, Any] = {
        "engine": source.engine,
        "release": source.release,
        "origin": source.origin,
        "endpoints": dict(source.endpoints),
        "models": {
            name: {field_name: _sorted(refs) for field_name, refs in fields.items()}
            for name, fields in source.models.items()
        },
        "headers": _sorted(source.headers),
        "part_types": _sorted(source.part_types),
        "connector_keys": _sorted(source.connector_keys),
    }
    # The optional members are written only when they say something.
    if source.reads:
        document["reads"] = _sorted(source.reads)
    if source.refresh is not None:
        document["refresh"] = source.refresh
    return document


def loads(text: str) -> Inventory:
    """The inventory ``text`` holds (``dumps``' form; any key order, lists unsorted)."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InventoryError(f"not JSON: {exc}") from None
    top = _object(document, "the document")
    sources = _object(top.get("sources"), "sources")
    generated_by = _string(top.get("generated_by"), "generated_by")
    loaded = {key: _source(_object(value, key), key) for key, value in sources.items()}
    for key, source in loaded.items():
        if source.key != key:
            raise InventoryError(f"{key}: engine and release name {source.key!r}")
    return Inventory(loaded, generated_by)


_REQUIRED: Final = frozenset({"engine", "release", "origin"})
_KNOWN: Final = _REQUIRED | {
    "endpoints",
    "models",
    "headers",
    "part_types",
    "connector_keys",
    "reads",
    "refresh",
}


def _source(document: Mapping[str, Any], where: str) -> Source:
    unknown = sorted(set(document) - _KNOWN)
    missing = sorted(_REQUIRED - set(document))
    if unknown or missing:
        raise InventoryError(f"{where}: unknown {unknown}, missing {missing}")
    endpoints = _object(document.get("endpoints", {}), f"{where}.endpoints")
    models = _object(document.get("models", {}), f"{where}.models")
    refresh = document.get("refresh")
    return Source(
        engine=_string(document["engine"], f"{where}.engine"),
        release=_string(document["release"], f"{where}.release"),
        origin=_string(document["origin"], f"{where}.origin"),
        endpoints={
            name: None if root is None else _string(root, f"{where}.endpoints.{name}")
            for name, root in endpoints.items()
        },
        models={
            name: {
                field_name: _strings(refs, f"{where}.models.{name}.{field_name}")
                for field_name, refs in _object(fields, f"{where}.models.{name}").items()
            }
            for name, fields in models.items()
        },
        headers=_strings(document.get("headers", []), f"{where}.headers"),
        part_types=_strings(document.get("part_types", []), f"{where}.part_types"),
        connector_keys=_strings(document.get("connector_keys", []), f"{where}.connector_keys"),
        reads=_strings(document.get("reads", []), f"{where}.reads"),
        refresh=None if refresh is None else _string(refresh, f"{where}.refresh"),
    )


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InventoryError(f"{where}: not an object")
    return value


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise InventoryError(f"{where}: not a string")
    return value


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InventoryError(f"{where}: not a list of strings")
    return tuple(sorted(set(value)))


def iter_fields(source: Source) -> Iterator[str]:
    """Every field's name (a path's last step) over all of ``source``'s endpoints."""
    for endpoint in source.endpoints:
        for path in paths(source, endpoint):
            yield path.rsplit(".", 1)[-1]
