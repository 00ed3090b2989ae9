"""Point the shipped Envoy configuration at local ports and upstreams.

Only addresses change: listeners' and clusters' socket addresses. Everything that makes
the gateway fail closed stays exactly as shipped in ``envoy/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ext_proc.core.address import HostPort

# The checkout this folder sits in: the stack runs from a repository, never a wheel.
REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "envoy" / "envoy.yaml"
CERT_DIR = "/etc/ext-proc/tls/"


def _socket(address: HostPort | Path) -> dict[str, Any]:
    if isinstance(address, Path):
        return {"pipe": {"path": str(address)}}
    return {"socket_address": {"address": address.host, "port_value": address.port}}


def _relocate_certs(node: Any, cert_dir: Path) -> Any:
    """Point every certificate path under /etc/ext-proc/tls/ at ``cert_dir``."""
    if isinstance(node, dict):
        return {k: _relocate_certs(v, cert_dir) for k, v in node.items()}
    if isinstance(node, list):
        return [_relocate_certs(v, cert_dir) for v in node]
    if isinstance(node, str) and node.startswith(CERT_DIR):
        return str(cert_dir / node.removeprefix(CERT_DIR))
    return node


class MissingCluster(ValueError):
    """An address was given for a cluster that the configuration does not have."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no cluster {name!r}")
        self.name = name


def render(
    *,
    gateway: HostPort,
    admin: HostPort,
    processor: HostPort | Path,
    aggregated: HostPort,
    disaggregated: HostPort,
    prefill: HostPort | None = None,
    source: Path = SHIPPED,
    cert_dir: Path | None = None,
    others: Mapping[str, HostPort] | None = None,
) -> dict[str, Any]:
    """The config at ``source`` with new addresses (a Path processor: a Unix socket).

    ``prefill`` (the prefill leg of the P/D hand-off) defaults to the decode upstream:
    one vLLM server can serve both legs. A config without one of the three upstream
    clusters (a variant without the hand-off, or with upstreams of its own) is rendered
    without it; ``others`` gives the addresses of further clusters by name, each of
    which the config must have (``MissingCluster`` names the first it lacks).
    """
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    if cert_dir is not None:
        config = _relocate_certs(config, cert_dir)
    config["admin"]["address"] = _socket(admin)
    (listener,) = config["static_resources"]["listeners"]
    listener["address"] = _socket(gateway)
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    for name in others or {}:
        if name not in clusters:
            raise MissingCluster(name)
    addresses: tuple[tuple[str, HostPort | Path], ...] = (
        ("ext_proc", processor),
        ("aggregated", aggregated),
        ("disaggregated", disaggregated),
        ("prefill", prefill or disaggregated),
        *(others or {}).items(),
    )
    for name, address in addresses:
        if name != "ext_proc" and name not in clusters:
            continue
        (endpoints,) = clusters[name]["load_assignment"]["endpoints"]
        (lb_endpoint,) = endpoints["lb_endpoints"]
        lb_endpoint["endpoint"]["address"] = _socket(address)
    return config


def write(config: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
