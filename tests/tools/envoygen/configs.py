"""The generator's example input, and readers of the configs it writes: shared by the
tests of each envoygen module and by the tests of configs built from them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from ext_proc.tools import carrier_headers, envoygen

REPO = Path(__file__).resolve().parents[3]


EXAMPLE = REPO / "deploy" / "envoy-config.example.yaml"


INPUTS = REPO / "envoy" / "inputs"


def example() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def generate(data: dict[str, Any]) -> dict[str, Any]:
    return envoygen.to_dict(envoygen.build(envoygen.load_input(data)))


def hcm_of(config: dict[str, Any]) -> dict[str, Any]:
    (listener,) = config["static_resources"]["listeners"]
    (chain,) = listener["filter_chains"]
    (network_filter,) = chain["filters"]
    return network_filter["typed_config"]


def ext_proc_of(config: dict[str, Any]) -> dict[str, Any]:
    filters = hcm_of(config)["http_filters"]
    names = [f["name"] for f in filters if f["name"] != envoygen.BUFFER_FILTER]
    assert names == [carrier_headers.FILTER, envoygen.EXT_PROC_FILTER, envoygen.ROUTER_FILTER]
    return filters[1]["typed_config"]


# Shipped configs for one of llm-d's prefill/decode architectures rather than a gateway
# with the hand-off routes of deploy/envoy-config.example.yaml (/pd/prefill/v1/, /pd/v1/).
ARCHITECTURES = frozenset(
    {"envoy-coordinator.yaml", "envoy-pod-prefill.yaml", "envoy-pod-decode.yaml"}
)


def clusters_of(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in config["static_resources"]["clusters"]}


def filters_of(config: dict[str, Any]) -> list[dict[str, Any]]:
    filters: list[dict[str, Any]] = hcm_of(config)["http_filters"]
    return filters


def routes_of(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (vhost,) = hcm_of(config)["route_config"]["virtual_hosts"]
    return {r["name"]: r for r in vhost["routes"]}


def forwarding(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The routes that reach an upstream (not the token endpoints' direct responses)."""
    return {name: r for name, r in routes_of(config).items() if "route" in r}


def endpoint_of(cluster: dict[str, Any]) -> dict[str, Any]:
    (locality,) = cluster["load_assignment"]["endpoints"]
    (lb_endpoint,) = locality["lb_endpoints"]
    return lb_endpoint["endpoint"]


def mutate(change) -> dict[str, Any]:
    data = copy.deepcopy(example())
    change(data)
    return data


def set_at(path: str, value: Any):
    def change(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = data
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value

    return change


def routes_with(*extra: dict[str, Any]) -> dict[str, Any]:
    data = example()
    data["routes"][:0] = list(extra)
    return data


TLS = {"server_name": "ext-proc.local", "ca_file": "/etc/ext-proc/tls/ca.crt"}


LISTENER_TLS = {
    "cert_file": "/etc/ext-proc/tls/gateway.crt",
    "key_file": "/etc/ext-proc/tls/gateway.key",
    "client_ca_file": "/etc/ext-proc/tls/clients-ca.crt",
}
