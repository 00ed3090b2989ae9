"""What the deployment tests share: reading manifests, the Kubernetes schema check of
core objects, and the real `envoy --mode validate` of an assembled configuration."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from devstack import processes

# Kubernetes minor version the core objects are checked against (kubernetes-validate
# ships its schemas; grpc probes are GA since 1.27, PDB unhealthyPodEvictionPolicy 1.31).
KUBE_VERSION = "1.31.0"


def documents(path: Path) -> list[dict[str, Any]]:
    return parse(path.read_text())


def parse(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def envoy_validate(config: dict[str, Any], tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    result = subprocess.run(
        [processes.envoy_binary(), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{name}: envoy rejected it:\n{output[-3000:]}"
    assert "OK" in output
