"""Every generated file the repository commits, with the generator that writes it.

``python -m devstack generate`` (``make generate``) writes them all, in the order below
(the llm-d manifests copy Envoy configs, so those come first); ``python -m devstack
NAME`` writes one generator's files. tests/test_generated.py fails when a committed file
differs from its generator's output. Each generator lists its files without generating
them (``outputs``), so the test names every (generator, file) pair cheaply; the test
also holds that list equal to what ``files`` writes.

Not listed: ``devstack/inventory/inventory.json``, written by ``python -m
devstack.inventory refresh`` from the wheels of the vLLM and SGLang releases it
names (downloaded when missing: over a gigabyte the first time), so ``generate`` and the
unit tier stay offline; ``tests/conformance/test_inventory.py`` (the ``vllm`` tier) holds
it equal to its generator's output instead."""

from __future__ import annotations

import importlib.resources
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from grpc_tools import protoc

from devstack import (
    classified,
    connector_keys_docs,
    dashboard,
    envoy_fields,
    helm,
    ingress,
    llmd,
    memory_limit,
    module_map,
    monitoring,
    release,
    route_policy_docs,
)
from ext_proc.tools import envoygen
from ext_proc.tools.check_envoy import coverage

REPO: Final = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Generator:
    name: str
    summary: str
    outputs: Callable[[], tuple[Path, ...]]  # the committed files it owns
    files: Callable[[], dict[Path, str]]  # each file it writes and its text


# --- Envoy configs: envoy/NAME.yaml from envoy/inputs/NAME.yaml ---------------------------

_ENVOY = REPO / "envoy"


def _envoy_outputs() -> tuple[Path, ...]:
    return tuple(sorted(_ENVOY.glob("*.yaml")))


def _envoy_files() -> dict[Path, str]:
    files = {}
    for source in sorted((_ENVOY / "inputs").glob("*.yaml")):
        # The header names the input as the repository does, wherever this runs from.
        spec = envoygen.load_input(envoygen.read_input(source))
        files[_ENVOY / source.name] = envoygen.render(spec, source=_relative(source))
    return files


# --- protobuf bindings: ext_proc/_pb from protos/ -----------------------------------------

_PROTOS = REPO / "protos"
_PB = REPO / "ext_proc" / "_pb"


def _proto_outputs() -> tuple[Path, ...]:
    # Everything in ext_proc/_pb but its hand-written __init__.py: a stray file fails too.
    return tuple(sorted(p for p in _PB.iterdir() if p.is_file() and p.name != "__init__.py"))


def _protoc(*args: str) -> None:
    # grpc_tools' own copies of the well-known types (google/protobuf/*.proto), as
    # `python -m grpc_tools.protoc` adds them.
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    if protoc.main(["protoc", f"-I{_PROTOS}", f"-I{well_known}", *args]) != 0:
        raise RuntimeError(f"protoc {' '.join(args)} failed")


def _proto_files() -> dict[Path, str]:
    protos = [_relative(p, _PROTOS) for p in sorted((_PROTOS / "ext_proc" / "_pb").glob("*.proto"))]
    with tempfile.TemporaryDirectory() as out:
        # Messages only: the service serves Process on bytes (ext_proc.edge.service), so
        # no gRPC stub or servicer is generated into the package.
        _protoc(f"--python_out={out}", f"--pyi_out={out}", *protos)
        made = sorted((Path(out) / "ext_proc" / "_pb").iterdir())
        return {_PB / path.name: path.read_text() for path in made}


def _relative(path: Path, root: Path = REPO) -> str:
    return path.relative_to(root).as_posix()


GENERATORS: Final = (
    # First: the Envoy configs' header step and the processor's lists come from it.
    Generator(
        "classified",
        "ext_proc/core/classified.py, declared.json and docs/trust.md's carrier tables, "
        "from the inventory and its classification",
        lambda: classified.OUTPUTS,
        classified.files,
    ),
    Generator("envoy-configs", "envoy/*.yaml from envoy/inputs/", _envoy_outputs, _envoy_files),
    Generator(
        "envoy-fields",
        "check-envoy's table of the Envoy messages' fields it walks, from envoy-data-plane",
        lambda: (coverage.TABLE,),
        envoy_fields.files,
    ),
    Generator("protos", "ext_proc/_pb from protos/", _proto_outputs, _proto_files),
    Generator(
        "llm-d",
        "the generated parts of deploy/llm-d/",
        lambda: llmd.OUTPUTS,
        llmd.files,
    ),
    Generator(
        "image-references",
        "the processor's image name and tag in the Kubernetes and llm-d manifests, from "
        "pyproject.toml",
        lambda: release.MANIFESTS,
        release.manifests,
    ),
    Generator(
        "monitoring",
        "deploy/kubernetes/monitoring/prometheusrule.yaml from deploy/monitoring/rules.yaml",
        lambda: (monitoring.PROMETHEUS_RULE,),
        lambda: {monitoring.PROMETHEUS_RULE: monitoring.render()},
    ),
    # Before helm: deploy/kubernetes/deployment.yaml renders the limit it writes.
    Generator(
        "memory-limit",
        "the Helm chart's memory limit (values.yaml resources) from the memory model",
        lambda: (memory_limit.VALUES,),
        memory_limit.files,
    ),
    Generator(
        "helm",
        "the Helm chart's gateway and rule templates and values table, and deploy/kubernetes "
        "rendered from the chart",
        lambda: helm.OUTPUTS,
        helm.files,
    ),
    # After helm: the component's Redis is the deploy/kubernetes/redis.yaml it writes.
    Generator(
        "llm-d-redis",
        "deploy/llm-d/routing-sidecar/component/redis.yaml from deploy/kubernetes/redis.yaml",
        lambda: (llmd.COMPONENT_REDIS,),
        lambda: {llmd.COMPONENT_REDIS: llmd.component_redis()},
    ),
    Generator(
        "ingress",
        "deploy/ingress/ (an Ingress for Istio, its EnvoyFilter and NetworkPolicy)",
        lambda: ingress.OUTPUTS,
        ingress.files,
    ),
    Generator(
        "dashboard",
        "deploy/monitoring/dashboard.json (Grafana)",
        lambda: (dashboard.DASHBOARD,),
        lambda: {dashboard.DASHBOARD: dashboard.render()},
    ),
    Generator(
        "route-policy-docs",
        "the route policy field table in README.md and docs/trust.md",
        lambda: route_policy_docs.DOCUMENTS,
        route_policy_docs.files,
    ),
    Generator(
        "connector-keys-docs",
        "the connector key table in docs/trust.md",
        lambda: (connector_keys_docs.DOCUMENT,),
        connector_keys_docs.files,
    ),
    Generator(
        "module-map",
        "README.md's module map, from the package tree",
        lambda: (module_map.README,),
        lambda: {module_map.README: module_map.updated(module_map.README.read_text())},
    ),
)
BY_NAME: Final = {generator.name: generator for generator in GENERATORS}


def write(generator: Generator) -> list[Path]:
    """Write ``generator``'s files; the ones whose text changed."""
    changed = []
    for path, text in generator.files().items():
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(path)
    return changed
