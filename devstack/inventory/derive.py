"""The gateway's lists, derived from the inventory and its classification: the text of
``ext_proc/core/classified.py`` (what the processor and the config tools read) and of
docs/trust.md's carrier tables. ``python -m devstack classified`` writes both;
tests/test_generated.py fails when a committed copy differs.

Also what is not classified yet (``unclassified``): every name of the inventory the
classification must hold.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from devstack.inventory import classification as c
from devstack.inventory.model import Inventory, Source, paths, takes_body, untyped
from ext_proc.core import connector_keys
from ext_proc.core.vllm_request import CACHE_SALT

# A path as the processor walks it: member names, and "*" for every item of a list.
EVERY: Final = "*"
# The top-level transfer parameters: the policy's own (proofs, peers), never a carrier
# path, and nothing below them is one either.
POLICED_ROOT: Final = "kv_transfer_params"


@dataclass(frozen=True)
class Found:
    """Where the sources read one classified name: the paths, and which sources."""

    paths: frozenset[tuple[str, ...]]
    sources: frozenset[str]


def _body_paths(inventory: Inventory) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(source, path) for every body member the inventory holds: each endpoint's model
    paths, each stack's reads, and the classification's own reads."""
    for name, source in inventory.sources.items():
        for endpoint in source.endpoints:
            for path in paths(source, endpoint):
                yield name, tuple(path.split("."))
        for read in source.reads:
            yield name, tuple(read.split("."))
    for read in c.READS:
        yield "classification", tuple(read.split("."))


def leaf(path: tuple[str, ...]) -> str:
    """The name a path's member is classified by: its last step that is a name."""
    return next(step for step in reversed(path) if step != EVERY)


def carriers(inventory: Inventory, classes: Iterable[c.Class]) -> dict[str, Found]:
    """Per classified body name in ``classes``: where the sources read it (never the
    top-level ``kv_transfer_params`` nor anything below it)."""
    wanted = frozenset(classes)

    def kept(path: tuple[str, ...]) -> bool:
        entry = c.FIELDS.get(leaf(path))
        return path[0] != POLICED_ROOT and entry is not None and entry.cls in wanted

    return _gathered((source, path) for source, path in _body_paths(inventory) if kept(path))


def _gathered(found: Iterable[tuple[str, tuple[str, ...]]]) -> dict[str, Found]:
    """Per name (``leaf``) of the (source, path) pairs ``found``: its paths and sources."""
    named: dict[str, tuple[set[tuple[str, ...]], set[str]]] = {}
    for source, path in found:
        where, who = named.setdefault(leaf(path), (set(), set()))
        where.add(path)
        who.add(source)
    return {
        name: Found(frozenset(where), frozenset(who))
        for name, (where, who) in sorted(named.items())
    }


def _untyped_paths(inventory: Inventory) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(source, path) for every member a source types as any JSON: each endpoint's
    (the inventory's ``*`` references) and the classification's own for the stacks."""
    for name, source in inventory.sources.items():
        for endpoint in source.endpoints:
            for path in untyped(source, endpoint):
                yield name, tuple(path.split("."))
    for read in c.UNTYPED_READS:
        yield "classification", tuple(read.split("."))


def _whole(path: tuple[str, ...]) -> bool:
    """Whether ``path`` is at or below a member that goes whole: the top-level
    kv_transfer_params (the policy's own), a carrier (removed) or embeddings (refused)."""
    if path[0] == POLICED_ROOT:
        return True
    whole = c.CARRIERS | {c.Class.EMBEDDINGS}
    return any(
        entry is not None and entry.cls in whole
        for entry in (c.FIELDS.get(step) for step in path if step != EVERY)
    )


def untyped_members(inventory: Inventory) -> dict[str, Found]:
    """Per name judged ``Untyped.PARAMETERS``: where the sources type a member so named
    as any JSON (never at or below one that goes whole, ``_whole``)."""
    return _gathered(
        (source, path)
        for source, path in _untyped_paths(inventory)
        if not _whole(path) and c.UNTYPED.get(leaf(path)) is c.Untyped.PARAMETERS
    )


def _unjudged(inventory: Inventory) -> dict[str, str]:
    """Each untyped member's name the classification does not judge (``c.UNTYPED``),
    with the first source that types it so."""
    missing: dict[str, str] = {}
    for name, path in _untyped_paths(inventory):
        if not _whole(path) and leaf(path) not in c.UNTYPED:
            missing.setdefault(leaf(path), name)
    return missing


def unclassified(inventory: Inventory) -> dict[str, list[str]]:
    """Every name of the inventory the classification lacks, by kind, each with the
    first source (in the inventory's order) that reads it."""
    missing: dict[str, dict[str, str]] = {
        "field": {},
        "header": {},
        "part type": {},
        "endpoint": {},
        "connector key": {},
        "untyped member": _unjudged(inventory),
    }
    bounded = {key.name for key in connector_keys.KEYS}
    for name, source in inventory.sources.items():
        for _, path in _body_paths_of(name, source):
            if leaf(path) not in c.FIELDS:
                missing["field"].setdefault(leaf(path), name)
        for header in source.headers:
            if header not in c.HEADERS:
                missing["header"].setdefault(header, name)
        for part in source.part_types:
            if part not in c.PART_TYPES:
                missing["part type"].setdefault(part, name)
        for endpoint in source.endpoints:
            if _endpoint_path(endpoint) not in c.ENDPOINTS:
                missing["endpoint"].setdefault(endpoint, name)
        for key in source.connector_keys:
            if key not in bounded and key not in c.CONNECTOR_KEYS:
                missing["connector key"].setdefault(key, name)
    return {
        kind: [f"{item} ({source})" for item, source in sorted(names.items())]
        for kind, names in missing.items()
        if names
    }


def _body_paths_of(name: str, source: Source) -> Iterator[tuple[str, tuple[str, ...]]]:
    for endpoint in source.endpoints:
        for path in paths(source, endpoint):
            yield name, tuple(path.split("."))
    for read in source.reads:
        yield name, tuple(read.split("."))


def _endpoint_path(endpoint: str) -> str:
    """``POST /v1/chat/completions`` -> ``/v1/chat/completions``."""
    return endpoint.partition(" ")[2] or endpoint


def endpoints(classes: Iterable[c.Endpoint]) -> tuple[str, ...]:
    wanted = frozenset(classes)
    return tuple(sorted(path for path, cls in c.ENDPOINTS.items() if cls in wanted))


def salted(inventory: Inventory) -> tuple[str, ...]:
    """The client APIs whose every declaration with a body, in every source that
    declares one, has a root model with a top-level ``cache_salt``: what the gateway
    writes reaches the engine whichever of them serves the route."""
    declared: dict[str, bool] = {}
    for source in inventory.sources.values():
        for endpoint, root in source.endpoints.items():
            if not takes_body(endpoint, root):
                continue
            path = _endpoint_path(endpoint)
            carries = root is not None and CACHE_SALT in source.models.get(root, {})
            declared[path] = declared.get(path, True) and carries
    served = endpoints({c.Endpoint.SERVED})
    return tuple(path for path in served if declared.get(path, False))


def tenant_endpoints(inventory: Inventory) -> tuple[str, ...]:
    """What a route that names a tenant source serves: the client APIs that carry the
    gateway's salt to the engine (``salted``), those that run no prompt through a
    prefix cache (``classification.UNCACHED``) and the public reads."""
    public = endpoints({c.Endpoint.PUBLIC})
    return tuple(sorted({*salted(inventory), *c.UNCACHED, *public}))


def untenanted_endpoints(inventory: Inventory) -> tuple[str, ...]:
    """Every classified endpoint a route that names a tenant source does not serve."""
    return tuple(sorted(set(c.ENDPOINTS) - set(tenant_endpoints(inventory))))


def headers(inventory: Inventory, classes: Iterable[c.Class]) -> dict[str, frozenset[str]]:
    """Per classified header in ``classes``: the sources that read it (the
    classification's own when no source of the inventory does)."""
    wanted = frozenset(classes)
    read: dict[str, set[str]] = {}
    for name, source in inventory.sources.items():
        for header in source.headers:
            entry = c.HEADERS.get(header)
            if entry is not None and entry.cls in wanted:
                read.setdefault(header, set()).add(name)
    for header, entry in c.HEADERS.items():
        if entry.cls in wanted:
            read.setdefault(header, {"classification"})
    return {header: frozenset(who) for header, who in sorted(read.items())}


def part_types(classes: Iterable[c.Class]) -> tuple[str, ...]:
    wanted = frozenset(classes)
    return tuple(sorted(name for name, entry in c.PART_TYPES.items() if entry.cls in wanted))


def embedding_formats() -> tuple[str, ...]:
    """Every spelling of each of the classification's embedding formats."""
    spelled = (name for value in c.EMBEDDING_FORMATS for name in c.format_spellings(value))
    return tuple(sorted(set(spelled)))


def _sorted_paths(found: Mapping[str, Found]) -> list[tuple[str, ...]]:
    every = {path for item in found.values() for path in item.paths}
    return sorted(every, key=lambda path: (len(path), path))


def module(inventory: Inventory) -> str:
    """The text of ``ext_proc/core/classified.py``."""
    body = carriers(inventory, c.CARRIERS)
    embedded = carriers(inventory, {c.Class.EMBEDDINGS})
    searched = untyped_members(inventory)
    removed = [name for name in headers(inventory, c.CARRIERS) if name != c.RENEWED_HEADER]
    partition = {c.Class.PARTITION}
    lines = [
        '"""What the classification (devstack/inventory/classification.py) makes of the',
        "inventory of what the engines and stacks read (devstack/inventory/inventory.json):",
        "the lists the processor and the config tools take. Generated by `python -m devstack",
        'classified`; do not edit."""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Final",
        "",
        "# Every body member a source reads tokens, a peer, a request id or transfer",
        '# parameters from, by path ("*": every item of a list), but the top-level',
        "# kv_transfer_params (the policy's own).",
        "BODY_CARRIERS: Final[tuple[tuple[str, ...], ...]] = (",
        *(f"    {_tuple(path)}," for path in _sorted_paths(body)),
        ")",
        "# Every body member a source types as any JSON and a server reads named members",
        "# out of (classification.Untyped.PARAMETERS), by path: every carrier's name is",
        "# looked for at any depth below it.",
        "UNTYPED_MEMBERS: Final[tuple[tuple[str, ...], ...]] = (",
        *(f"    {_tuple(path)}," for path in _sorted_paths(searched)),
        ")",
        "# Every body member a source reads prompt embeddings from, by path.",
        "EMBEDDING_MEMBERS: Final[tuple[tuple[str, ...], ...]] = (",
        *(f"    {_tuple(path)}," for path in _sorted_paths(embedded)),
        ")",
        "# Chat content-part types that carry embeddings.",
        "EMBEDDING_PART_TYPES: Final[tuple[str, ...]] = (",
        *(f'    "{name}",' for name in part_types({c.Class.EMBEDDINGS})),
        ")",
        "# Media item formats that are embeddings or a processor's output, in every",
        "# spelling the engine takes for one (classification.format_spellings).",
        "EMBEDDING_FORMATS: Final[tuple[str, ...]] = (",
        *(f'    "{name}",' for name in embedding_formats()),
        ")",
        "# Request headers a component behind the gateway reads an address, a peer, tokens",
        "# or transfer parameters from: removed by the header step for every caller.",
        "HEADER_CARRIERS: Final[tuple[str, ...]] = (",
        *(f'    "{name}",' for name in removed),
        ")",
        "# Top-level body members an engine partitions its prefix cache by: written from",
        "# the tenant on a route that names a tenant source (ext_proc/core/tenants.py).",
        *_strings(
            "PARTITION_MEMBERS",
            [name for name, entry in sorted(c.FIELDS.items()) if entry.cls in partition],
        ),
        "# Request headers an engine or stack partitions its prefix cache by: removed by the",
        "# header step for every caller (a client's copy names any tenant it likes).",
        *_strings("PARTITION_HEADERS", list(headers(inventory, partition))),
        "# Endpoints whose prompt is token ids or embeddings, as their servers declare them.",
        "TOKEN_ENDPOINTS: Final[tuple[str, ...]] = (",
        *(f'    "{path}",' for path in endpoints({c.Endpoint.TOKEN_IN})),
        ")",
        "# Endpoints for administration, development and training, not for clients.",
        "INTERNAL_ENDPOINTS: Final[tuple[str, ...]] = (",
        *(f'    "{path}",' for path in endpoints({c.Endpoint.INTERNAL})),
        ")",
        "# Endpoints a route that names a tenant source serves: every engine's body for",
        "# them carries the cache_salt the gateway writes, or none runs a prompt through",
        "# a prefix cache (derive.tenant_endpoints).",
        *_strings("TENANT_ENDPOINTS", list(tenant_endpoints(inventory))),
        "# Every other endpoint the servers declare: a path that names one of these by a",
        "# name covering as many of its segments as any of TENANT_ENDPOINTS, or more, is",
        "# not served there (SGLang's /api/generate is not /generate behind a root path /api).",
        *_strings("UNTENANTED_ENDPOINTS", list(untenanted_endpoints(inventory))),
        "# Path prefixes a server hands every path it has no route for (a mount): a path",
        "# holding one is that mount's, whatever endpoint its tail names.",
        *_strings("MOUNTS", list(c.MOUNTS)),
        "",
    ]
    return "\n".join(lines)


def _strings(name: str, values: list[str]) -> list[str]:
    """The lines of a tuple of strings as ruff formats it (one item: one line)."""
    if len(values) == 1:
        return [f'{name}: Final[tuple[str, ...]] = ("{values[0]}",)']
    return [f"{name}: Final[tuple[str, ...]] = (", *(f'    "{v}",' for v in values), ")"]


def _tuple(path: tuple[str, ...]) -> str:
    inner = ", ".join(f'"{step}"' for step in path)
    return f"({inner},)" if len(path) == 1 else f"({inner})"


def catalog(inventory: Inventory) -> str:
    """The text of ``ext_proc/core/declared.json``: per engine and release whose sources
    declare request models, each endpoint's root model and every model reachable from
    one (what a ``strict_body`` route forwards; ``ext_proc.core.declared``). A route
    without a body declares none: it is not in the catalog."""
    engines: dict[str, object] = {}
    for name, source in inventory.sources.items():
        roots = {
            _endpoint_path(endpoint): model
            for endpoint, model in sorted(source.endpoints.items())
            if takes_body(endpoint, model)
        }
        if not any(roots.values()):
            continue
        reachable = _reachable(source, [model for model in roots.values() if model])
        engines[name] = {
            "endpoints": roots,
            "models": {model: source.models[model] for model in sorted(reachable)},
        }
    return json.dumps({"engines": engines}, indent=1, sort_keys=True) + "\n"


def _reachable(source: Source, roots: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        model = todo.pop()
        if model in seen or model not in source.models:
            continue
        seen.add(model)
        for refs in source.models[model].values():
            todo.extend(ref.partition(":")[2] if ":" in ref else ref for ref in refs)
    return seen
