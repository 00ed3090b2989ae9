"""Point the shipped Envoy configuration at local ports and upstreams.

Only addresses change: listeners' and clusters' socket addresses. Everything that makes
the gateway fail closed stays exactly as shipped in ``envoy/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "envoy" / "envoy.yaml"


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Address:
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected host:port, got {text!r}")
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def _socket(address: Address) -> dict[str, Any]:
    return {"socket_address": {"address": address.host, "port_value": address.port}}


def render(
    *,
    gateway: Address,
    admin: Address,
    processor: Address,
    aggregated: Address,
    disaggregated: Address,
    source: Path = SHIPPED,
) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    config["admin"]["address"] = _socket(admin)
    (listener,) = config["static_resources"]["listeners"]
    listener["address"] = _socket(gateway)
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    for name, address in (
        ("ext_proc", processor),
        ("aggregated", aggregated),
        ("disaggregated", disaggregated),
    ):
        (endpoints,) = clusters[name]["load_assignment"]["endpoints"]
        (lb_endpoint,) = endpoints["lb_endpoints"]
        lb_endpoint["endpoint"]["address"] = _socket(address)
    return config


def write(config: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
