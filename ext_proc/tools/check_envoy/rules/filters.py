"""This processor's ext_proc filters and their per-route overrides fail closed and send
an inspectable body; another service's ext_proc filter sees only decided requests; an
ext_proc per-route configuration names a filter of the chain."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from ext_proc.edge.attributes import HEADERS, attribute_keys
from ext_proc.tools.check_envoy.findings import Finding, error, warning
from ext_proc.tools.check_envoy.reader import (
    BUFFER,
    PER_ROUTE,
    Chain,
    Clusters,
    filter_levels,
    is_ext_proc,
    per_route,
    walk,
)

INSPECTABLE: Final = ("BUFFERED", "FULL_DUPLEX_STREAMED")


def processing_mode(place: str, mode: dict[str, Any], requested: set[str]) -> Iterator[Finding]:
    body = mode.get("request_body_mode", "NONE")
    if body not in INSPECTABLE:
        yield error(
            "body-not-inspected", place, f"request_body_mode {body} is not inspected; use BUFFERED"
        )
    if mode.get("request_header_mode", "SEND") == "SKIP":
        # One message per request: allowed with BUFFERED bodies when the headers the
        # processor checks come as attributes.
        missing = [key for key in HEADERS.values() if key not in requested]
        if body != "BUFFERED" or missing:
            yield error(
                "one-message-incomplete",
                place,
                "request_header_mode SKIP needs request_body_mode BUFFERED and "
                f"request_attributes {missing or list(HEADERS.values())}",
            )
    if body == "FULL_DUPLEX_STREAMED" and mode.get("request_trailer_mode") != "SEND":
        yield error(
            "streamed-without-trailers",
            place,
            "FULL_DUPLEX_STREAMED needs request_trailer_mode SEND",
        )


_FAIL_OPEN: Final = (
    ("failure_mode_allow", "failure-mode-allow", "failure_mode_allow must be false (fail closed)"),
    ("observability_mode", "observability-mode", "observability_mode cannot enforce anything"),
    (
        "allow_content_length_header",
        "content-length-allowed",
        "allow_content_length_header lets stale lengths through",
    ),
    (
        "disable_immediate_response",
        "refusals-dropped",
        "disable_immediate_response drops the processor's refusals (its 400, 413 and 415 in "
        "vLLM's error shape): Envoy closes the stream instead, and every refused request "
        "ends in a 500",
    ),
)


def filter_settings(place: str, entry: dict[str, Any], namespace: str) -> Iterator[Finding]:
    """One of this processor's ext_proc filters."""
    config = entry["typed_config"]
    for key, code, message in _FAIL_OPEN:
        if config.get(key, False):
            yield error(code, place, message)
    requested = set(config.get("request_attributes", []))
    yield from processing_mode(place, config.get("processing_mode", {}), requested)
    missing = [key for key in attribute_keys(namespace).all() if key not in requested]
    if missing:
        yield error("attributes-missing", place, f"request_attributes lacks {missing}")


def override(
    place: str, name: str, config: dict[str, Any], requested: set[str]
) -> Iterator[Finding]:
    """One ExtProcPerRoute, at any level: it must not make the filter fail open."""
    overrides = config.get("overrides", {})
    if overrides.get("failure_mode_allow"):
        yield error("override-fails-open", place, f"{name} overrides.failure_mode_allow fails open")
    if "processing_mode" in overrides:
        yield from processing_mode(
            f"{place} {name} overrides", overrides["processing_mode"], requested
        )


def other_filters(chain: Chain) -> Iterator[Finding]:
    """Another service's ext_proc filter must see only requests this processor has
    decided: after this processor's first filter and after any buffer filter that holds
    the request for it. One that fails open is reported as a warning."""
    filters, ours = chain.filters, chain.names
    first = next(i for i, f in enumerate(filters) if f.get("name") in ours)
    holds = [
        i
        for i, f in enumerate(filters)
        if i > first and f.get("typed_config", {}).get("@type") == BUFFER
    ]
    for position, entry in enumerate(filters):
        if not is_ext_proc(entry) or entry.get("name") in ours:
            continue
        name = entry.get("name")
        if position < first:
            yield error(
                "other-ext-proc-first",
                chain.place,
                f"ext_proc filter {name} runs before this processor's: it reads (and may "
                "change) requests before their kv_transfer_params are policed",
            )
        elif holds and position < holds[0]:
            yield error(
                "other-ext-proc-before-hold",
                chain.place,
                f"ext_proc filter {name} runs before the buffer filter that holds the "
                "request until this processor's decision: it sees undecided requests",
            )
        if entry["typed_config"].get("failure_mode_allow", False):
            yield warning(
                "other-ext-proc-fails-open",
                chain.place,
                f"ext_proc filter {name} fails open (failure_mode_allow): while its service "
                "is down, requests skip it",
            )


def per_route_names(chain: Chain) -> Iterator[Finding]:
    """Envoy hands a per-route filter configuration to the filter of the chain with that
    name, and to nothing else: an ext_proc one under another name (the filter's type, a
    misspelt name) is ignored. A route that disables or overrides an ext_proc filter that
    way still runs it as configured, and its requests fail at run time where the check
    said they pass."""
    names = {str(f.get("name")) for f in chain.filters}
    for node in walk(chain.manager.get("route_config", {})):
        configs = node.get("typed_per_filter_config")
        if not isinstance(configs, dict):
            continue
        for name in sorted(set(configs) - names):
            given = configs[name]
            inner = given.get("config") if isinstance(given, dict) else None
            if any(isinstance(c, dict) and c.get("@type") == PER_ROUTE for c in (given, inner)):
                yield error(
                    "per-route-name-unknown",
                    chain.place,
                    f"typed_per_filter_config {name!r} names no filter of the chain "
                    f"({', '.join(sorted(names))}): Envoy ignores it. Key it by the filter's name",
                )


def processor_cluster(
    place: str, entry: dict[str, Any], known: Clusters | None
) -> Iterator[Finding]:
    """The cluster this processor's filter reaches it through (``envoy_grpc``) is one
    the bootstrap lists: a missing one fails every request, and one from CDS is not
    seen here. A ``google_grpc`` target names no cluster; a document that is no
    bootstrap (``known`` None) lists none."""
    target = entry["typed_config"].get("grpc_service", {}).get("envoy_grpc")
    if known is None or not isinstance(target, dict):
        return
    name = target.get("cluster_name")
    if name in known.static:
        return
    if known.from_cds:
        yield error(
            "processor-cluster-unseen",
            place,
            f"grpc_service cluster {name!r} is not a static cluster; clusters come from CDS, "
            "which this check cannot see (list it in static_resources to check it)",
        )
        return
    yield error(
        "processor-cluster-missing",
        place,
        f"grpc_service cluster {name!r} is not among the static clusters; every request would fail",
    )


def override_services(chain: Chain) -> Iterator[Finding]:
    """An ``ExtProcPerRoute`` of this processor's filter that sets ``overrides.grpc_service``
    names the filter's own cluster (``envoy_grpc.cluster_name``): a route sent to another
    service (another processor, a canary with its own record) is decided by one this
    check does not see, and one proof could be honored once by each."""
    for place, configs in filter_levels(chain):
        for name, config in per_route(configs):
            service = config.get("overrides", {}).get("grpc_service")
            if name not in chain.configs or service is None:
                continue
            own = chain.configs[name].get("grpc_service", {}).get("envoy_grpc", {})
            given = service.get("envoy_grpc") if isinstance(service, dict) else None
            ours = own.get("cluster_name") if isinstance(own, dict) else None
            theirs = given.get("cluster_name") if isinstance(given, dict) else None
            if ours is not None and theirs == ours and "google_grpc" not in service:
                continue
            target = (
                f"cluster {theirs!r}" if theirs is not None else "a service other than a cluster"
            )
            yield error(
                "override-grpc-service",
                f"{place} {name}",
                f"overrides.grpc_service sends this route's requests to {target}, not to "
                f"the filter's own cluster {ours!r}: a processor this check does not see "
                "decides them. Remove the override, or name the filter's own cluster",
            )
