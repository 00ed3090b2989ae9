"""The shipped ``envoy/envoy.yaml`` and the helpers that edit it: what the checker's
tests start from."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ext_proc.tools.check_envoy import Report, check

SHIPPED_DIR = Path(__file__).resolve().parents[3] / "envoy"
SHIPPED_CONFIGS = sorted(SHIPPED_DIR.glob("*.yaml"))
SHIPPED = yaml.safe_load((SHIPPED_DIR / "envoy.yaml").read_text())

# Spelt out here, not taken from the checker: the tests are a third opinion.
EXT_PROC = "envoy.filters.http.ext_proc"
EXT_PROC_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
FILTER_CONFIG = "type.googleapis.com/envoy.config.route.v3.FilterConfig"
BUFFER = "envoy.filters.http.buffer"
BUFFER_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute"
# The places findings name.
HCM = "http_connection_manager[0]"
OURS = f"{HCM} filter {EXT_PROC}"
VHOST = f"{HCM} virtual_host vllm"


def at(name: str) -> str:
    """The place of the shipped virtual host's route ``name``."""
    return f"{HCM} route vllm/{name}"


def hcm(config: dict[str, Any]) -> dict[str, Any]:
    return config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]


def filter_names(config: dict[str, Any]) -> list[str]:
    return [f["name"] for f in hcm(config)["http_filters"]]


def ext_proc_index(config: dict[str, Any]) -> int:
    return filter_names(config).index(EXT_PROC)


def ext_proc(config: dict[str, Any]) -> dict[str, Any]:
    return hcm(config)["http_filters"][ext_proc_index(config)]["typed_config"]


def routes(config: dict[str, Any]) -> list[dict[str, Any]]:
    return hcm(config)["route_config"]["virtual_hosts"][0]["routes"]


def route(config: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [r for r in routes(config) if r["name"] == name]
    return found


def policy(config: dict[str, Any], name: str) -> dict[str, Any]:
    return route(config, name)["metadata"]["filter_metadata"]["ext_proc.token_policy"]


def mint_mode(config: dict[str, Any]) -> dict[str, Any]:
    per_filter = route(config, "prefill")["typed_per_filter_config"][EXT_PROC]
    return per_filter["overrides"]["processing_mode"]


def split(config: dict[str, Any], name: str, per_filter: dict[str, Any]) -> None:
    """Route ``name`` split over two weighted clusters of its cluster, the second with
    ``per_filter`` as its typed_per_filter_config."""
    entry = route(config, name)
    cluster = entry["route"].pop("cluster")
    entry["route"]["weighted_clusters"] = {
        "clusters": [
            {"name": cluster, "weight": 50},
            {"name": cluster, "weight": 50, "typed_per_filter_config": per_filter},
        ]
    }


def per_route(**config: Any) -> dict[str, Any]:
    return {EXT_PROC: {"@type": PER_ROUTE, **config}}


def mutated(
    change: Callable[[dict[str, Any]], object], declared: frozenset[str] = frozenset()
) -> Report:
    """The check of the shipped config after ``change``, ``declared`` filters trusted."""
    config = copy.deepcopy(SHIPPED)
    change(config)
    return check(config, declared=declared)


def found(report: Report, severity: str = "error") -> list[tuple[str, str]]:
    """The (code, place) of each finding of ``severity``, in order."""
    return [(f.code, f.place) for f in report.findings if f.severity == severity]


def clean(report: Report) -> bool:
    return report.findings == ()


def without(*names: str) -> Callable[[dict[str, Any]], None]:
    def change(config: dict[str, Any]) -> None:
        entries = routes(config)
        entries[:] = [r for r in entries if r.get("name") not in names]

    return change


def forwarding_first(match: Any, name: str = "edit") -> Callable[[dict[str, Any]], None]:
    """An edit: a forwarding route matched by ``match``, before the token endpoint 404s."""

    def change(config: dict[str, Any]) -> None:
        entry = copy.deepcopy(route(config, "default"))
        entry.update(name=name, match=match)
        routes(config).insert(0, entry)

    return change
