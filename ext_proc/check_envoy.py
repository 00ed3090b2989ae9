"""``check-envoy FILE``: check an Envoy configuration offline, before it protects anything.

For every HTTP connection manager that runs the ext_proc filter: the filter fails
closed, uses an inspectable body mode and requests every route-metadata attribute; every
route's policy metadata is valid (the same validation the processor applies at request
time); no route overrides the filter into failing open. Routes that disable the filter
are listed as warnings: their bodies are not inspected.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ext_proc.attributes import HEADERS, as_cel, attribute_keys
from ext_proc.errors import RoutePolicyError
from ext_proc.route_policy import DEFAULT_NAMESPACE, FIELDS, parse

EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
HCM = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
    "HttpConnectionManager"
)
INSPECTABLE = ("BUFFERED", "FULL_DUPLEX_STREAMED")


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    routes: int = 0


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every mapping in the document, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def _check_mode(where: str, mode: dict[str, Any], requested: set[str], report: Report) -> None:
    body = mode.get("request_body_mode", "NONE")
    if body not in INSPECTABLE:
        report.errors.append(f"{where}: request_body_mode {body} is not inspected; use BUFFERED")
    if mode.get("request_header_mode", "SEND") == "SKIP":
        # One message per request: allowed with BUFFERED bodies when the headers the
        # processor checks come as attributes.
        missing = [key for key in HEADERS.values() if key not in requested]
        if body != "BUFFERED" or missing:
            report.errors.append(
                f"{where}: request_header_mode SKIP needs request_body_mode BUFFERED and "
                f"request_attributes {missing or list(HEADERS.values())}"
            )
    if body == "FULL_DUPLEX_STREAMED" and mode.get("request_trailer_mode") != "SEND":
        report.errors.append(f"{where}: FULL_DUPLEX_STREAMED needs request_trailer_mode SEND")


def _check_filter(where: str, config: dict[str, Any], namespace: str, report: Report) -> None:
    if config.get("failure_mode_allow", False):
        report.errors.append(f"{where}: failure_mode_allow must be false (fail closed)")
    if config.get("observability_mode", False):
        report.errors.append(f"{where}: observability_mode cannot enforce anything")
    if config.get("allow_content_length_header", False):
        report.errors.append(f"{where}: allow_content_length_header lets stale lengths through")
    requested = set(config.get("request_attributes", []))
    _check_mode(where, config.get("processing_mode", {}), requested, report)
    missing = [key for key in attribute_keys(namespace).all() if key not in requested]
    if missing:
        report.errors.append(f"{where}: request_attributes lacks {missing}")


def _check_route(
    where: str, route: dict[str, Any], namespace: str, requested: set[str], report: Report
) -> None:
    report.routes += 1
    policy = route.get("metadata", {}).get("filter_metadata", {}).get(namespace)
    if policy is None:
        report.warnings.append(f"{where}: no '{namespace}' metadata (aggregated + strip)")
    elif not isinstance(policy, dict):
        report.errors.append(f"{where}: '{namespace}' metadata must be a mapping")
    else:
        try:
            parse({k: as_cel(v) for k, v in policy.items() if k in FIELDS}, len(policy), namespace)
        except RoutePolicyError as exc:
            report.errors.append(f"{where}: {exc.message}")
    for name, per_route in route.get("typed_per_filter_config", {}).items():
        if not isinstance(per_route, dict) or per_route.get("@type") != PER_ROUTE:
            continue
        if per_route.get("disabled"):
            report.warnings.append(f"{where}: {name} disabled; bodies are not inspected")
        overrides = per_route.get("overrides", {})
        if overrides.get("failure_mode_allow"):
            report.errors.append(f"{where}: overrides.failure_mode_allow fails open")
        if "processing_mode" in overrides:
            _check_mode(f"{where} overrides", overrides["processing_mode"], requested, report)


def check(config: Any, namespace: str = DEFAULT_NAMESPACE) -> Report:
    report = Report()
    managers = [n for n in _walk(config) if n.get("@type") == HCM]
    if not managers:
        report.errors.append("no HTTP connection manager found")
    for index, manager in enumerate(managers):
        filters = [f for f in manager.get("http_filters", []) if isinstance(f, dict)]
        ext_procs = [f for f in filters if f.get("typed_config", {}).get("@type") == EXT_PROC]
        where = f"http_connection_manager[{index}]"
        if not ext_procs:
            report.errors.append(f"{where}: no ext_proc filter; no request is inspected")
            continue
        requested = {
            attribute
            for ext_proc in ext_procs
            for attribute in ext_proc["typed_config"].get("request_attributes", [])
        }
        for ext_proc in ext_procs:
            _check_filter(
                f"{where} filter {ext_proc.get('name')}",
                ext_proc["typed_config"],
                namespace,
                report,
            )
        route_config = manager.get("route_config", {})
        for vhost in route_config.get("virtual_hosts", []):
            for position, route in enumerate(vhost.get("routes", [])):
                label = route.get("name") or f"#{position}"
                _check_route(
                    f"{where} route {vhost.get('name')}/{label}",
                    route,
                    namespace,
                    requested,
                    report,
                )
    return report


def main(path: Path, namespace: str | None = None) -> int:
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        print(f"{path}: cannot read: {exc}", file=sys.stderr)
        return 1
    report = check(config, namespace or DEFAULT_NAMESPACE)
    for warning in report.warnings:
        print(f"warning: {warning}")
    for error in report.errors:
        print(f"error: {error}")
    verdict = "FAILED" if report.errors else "OK"
    print(
        f"{path}: {verdict} ({report.routes} routes, {len(report.errors)} errors, "
        f"{len(report.warnings)} warnings)"
    )
    return 1 if report.errors else 0
