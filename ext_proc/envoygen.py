"""Generate a fail-closed Envoy bootstrap from a short YAML description.

``python -m ext_proc envoy-config INPUT.yaml [-o OUT]`` reads a few lines::

    listener_port: 8080
    processor: ext-proc-token-policy-headless.llm-d.svc.cluster.local:50051
    body_mode: buffered              # buffered | streamed
    upstreams:
      aggregated: vllm.llm-d.svc.cluster.local:8000
      disaggregated: vllm-decode.llm-d.svc.cluster.local:8000
    routes:
    - prefix: /pd/v1/
      prefix_rewrite: /v1/
      upstream: disaggregated
      policy: {topology: disaggregated, action: honor, max_ids: 131072}
    - prefix: /
      upstream: aggregated
      policy: {topology: aggregated, action: strip}

and writes a whole Envoy bootstrap that behaves like ``envoy/envoy.yaml``: the ext_proc
filter with ``failure_mode_allow: false`` and every CEL attribute the processor reads
(``attributes.attribute_keys``), vLLM-shaped local replies, route policy metadata,
raised per-route body buffers, an HTTP/2 processor cluster with wide windows and gRPC
health checks, and a JSON access log.

The configuration is built from envoy-data-plane's typed message classes, so a
misspelt field or a wrong type is a Python error here rather than an Envoy start-up
failure, and only converted to a dict (proto3 JSON, snake_case) at the end. Importing
this module does no work beyond importing those classes.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import re
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from betterproto2 import Casing
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic import model_validator as _model_validator
from pydantic.warnings import PydanticDeprecatedSince212

from ext_proc.attributes import attribute_keys
from ext_proc.route_policy import DEFAULT_NAMESPACE, Action, Topology
from ext_proc.validation import problems

with warnings.catch_warnings():
    # envoy-data-plane 2.2 decorates classmethods with @model_validator(mode="after"),
    # which pydantic >= 2.12 reports as deprecated while the classes are created.
    warnings.simplefilter("ignore", PydanticDeprecatedSince212)
    from envoy_data_plane.envoy.config.accesslog import v3 as accesslog
    from envoy_data_plane.envoy.config.bootstrap import v3 as bootstrap
    from envoy_data_plane.envoy.config.cluster import v3 as cluster
    from envoy_data_plane.envoy.config.core import v3 as core
    from envoy_data_plane.envoy.config.endpoint import v3 as endpoint
    from envoy_data_plane.envoy.config.listener import v3 as listener
    from envoy_data_plane.envoy.config.route import v3 as route
    from envoy_data_plane.envoy.extensions.access_loggers.filters.cel import v3 as cel_filter
    from envoy_data_plane.envoy.extensions.access_loggers.stream import v3 as stream_log
    from envoy_data_plane.envoy.extensions.filters.http.ext_proc import v3 as ext_proc
    from envoy_data_plane.envoy.extensions.filters.http.router import v3 as router
    from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager import (
        v3 as hcm,
    )
    from envoy_data_plane.envoy.extensions.upstreams.http import v3 as upstream_http
    from envoy_data_plane.google import protobuf

MiB: Final = 1024 * 1024
PROCESSOR_CLUSTER: Final = "ext_proc"
# The gRPC service name the processor's health service reports (ext_proc/server.py).
PROCESSOR_SERVICE: Final = "envoy.service.ext_proc.v3.ExternalProcessor"
HCM_NAME: Final = "envoy.filters.network.http_connection_manager"
EXT_PROC_FILTER: Final = "envoy.filters.http.ext_proc"
ROUTER_FILTER: Final = "envoy.filters.http.router"
HTTP_OPTIONS: Final = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


class GeneratorError(Exception):
    """The generator input is invalid; the message names the field."""


# --- input ---------------------------------------------------------------------------


class HostPort(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> HostPort:
        host, sep, port = text.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected host:port with a port in 1..65535, got {text!r}")
        if not _is_ip(host) and not _HOST.fullmatch(host):
            raise ValueError(f"{host!r} is neither an IP address nor a DNS name")
        return cls(host=host, port=int(port))

    @property
    def is_ip(self) -> bool:
        return _is_ip(self.host)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _host_port(value: object) -> HostPort:
    if isinstance(value, HostPort):
        return value
    if not isinstance(value, str):
        raise ValueError("expected a 'host:port' string")  # noqa: TRY004 (pydantic wants ValueError)
    return HostPort.parse(value)


class PolicyInput(BaseModel):
    """The route's token policy; the same fields as ``route_policy.FIELDS``."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    topology: Topology = Topology.AGGREGATED
    action: Action | None = None
    vocab_size: int | None = Field(default=None, gt=0)
    max_ids: int | None = Field(default=None, gt=0)
    audit: bool | None = None

    @field_validator("topology", "action", mode="before")
    @classmethod
    def _enum_from_text(cls, value: object) -> object:
        # strict mode refuses plain strings for enums; YAML only has strings.
        if isinstance(value, str):
            for enum in (Topology, Action):
                if value in enum._value2member_map_:
                    return enum(value)
        return value

    def metadata(self) -> dict[str, Any]:
        """The route's ``filter_metadata`` entry (only the fields that are set)."""
        out: dict[str, Any] = {"topology": self.topology.value}
        if self.action is not None:
            out["action"] = self.action.value
        for name in ("vocab_size", "max_ids", "audit"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


class RouteInput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: str | None = Field(default=None, pattern=_NAME.pattern)
    prefix: str = Field(pattern=r"^/")
    prefix_rewrite: str | None = Field(default=None, pattern=r"^/")
    upstream: str
    policy: PolicyInput = PolicyInput()
    # Largest request body held for inspection on this route (413 beyond it).
    body_limit_bytes: int | None = Field(default=None, gt=0, le=1024 * MiB)


class GeneratorInput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    listener_address: str = "0.0.0.0"
    listener_port: int = Field(gt=0, lt=65536)
    admin_port: int = Field(default=9901, gt=0, lt=65536)
    processor: HostPort
    body_mode: Literal["buffered", "streamed"] = "buffered"
    # Per message, BUFFERED mode only (README: 16 MiB takes about 1 s on 2 cores).
    message_timeout_seconds: float = Field(default=5.0, gt=0, le=300)
    body_limit_bytes: int = Field(default=16 * MiB, gt=0, le=1024 * MiB)
    route_timeout_seconds: float = Field(default=600.0, gt=0)
    stream_idle_timeout_seconds: float = Field(default=300.0, gt=0)
    # Must equal the processor's route_metadata_namespace.
    namespace: str = Field(default=DEFAULT_NAMESPACE, min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    upstreams: dict[str, HostPort] = Field(min_length=1)
    routes: list[RouteInput] = Field(min_length=1)

    @field_validator("processor", mode="before")
    @classmethod
    def _processor(cls, value: object) -> HostPort:
        return _host_port(value)

    @field_validator("upstreams", mode="before")
    @classmethod
    def _upstreams(cls, value: object) -> object:
        if not isinstance(value, Mapping):
            return value
        out: dict[str, HostPort] = {}
        for name, address in value.items():
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise ValueError(f"upstream name {name!r}: letters, digits, '_', '.', '-'")
            if name == PROCESSOR_CLUSTER:
                raise ValueError(f"upstream name {name!r} is reserved for the processor")
            try:
                out[name] = _host_port(address)
            except ValueError as exc:
                raise ValueError(f"upstream {name!r}: {exc}") from None
        return out

    @field_validator("listener_address")
    @classmethod
    def _listener_address(cls, value: str) -> str:
        if not _is_ip(value):
            raise ValueError(f"expected an IP address to bind, got {value!r}")
        return value

    @_model_validator(mode="after")
    def _routes_consistent(self) -> GeneratorInput:
        names: set[str] = set()
        prefixes: set[str] = set()
        for index, entry in enumerate(self.routes):
            where = f"routes.{index}"
            if entry.upstream not in self.upstreams:
                raise ValueError(
                    f"{where}.upstream: {entry.upstream!r} is not one of the upstreams "
                    f"({', '.join(sorted(self.upstreams))})"
                )
            name = route_name(entry, index)
            if name in names:
                raise ValueError(f"{where}.name: {name!r} is used by an earlier route")
            if entry.prefix in prefixes:
                raise ValueError(
                    f"{where}.prefix: {entry.prefix!r} is matched by an earlier route, "
                    "so this route could never be reached"
                )
            names.add(name)
            prefixes.add(entry.prefix)
        return self


def route_name(entry: RouteInput, index: int) -> str:
    return entry.name or f"{entry.upstream}-{index}"


def load_input(data: object) -> GeneratorInput:
    """Validate the parsed YAML; ``GeneratorError`` names every bad field."""
    if not isinstance(data, Mapping):
        raise GeneratorError("invalid input: the document must be a mapping")
    try:
        return GeneratorInput.model_validate(dict(data))
    except ValidationError as exc:
        raise GeneratorError(f"invalid input: {problems(exc)}") from None


# --- output --------------------------------------------------------------------------


def _seconds(value: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=value)


def _socket(host: str, port: int) -> core.Address:
    return core.Address(socket_address=core.SocketAddress(address=host, port_value=port))


def _struct(value: Mapping[str, Any]) -> protobuf.Struct:
    struct: protobuf.Struct = protobuf.Struct.from_dict(dict(value))
    return struct


def _one_endpoint(name: str, address: HostPort) -> endpoint.ClusterLoadAssignment:
    return endpoint.ClusterLoadAssignment(
        cluster_name=name,
        endpoints=[
            endpoint.LocalityLbEndpoints(
                lb_endpoints=[
                    endpoint.LbEndpoint(
                        endpoint=endpoint.Endpoint(address=_socket(address.host, address.port))
                    )
                ]
            )
        ],
    )


def _discovery(address: HostPort) -> cluster.ClusterDiscoveryType:
    # A DNS name (a Kubernetes headless Service) resolves to every replica.
    return (
        cluster.ClusterDiscoveryType.STATIC
        if address.is_ip
        else cluster.ClusterDiscoveryType.STRICT_DNS
    )


def processor_cluster(address: HostPort) -> cluster.Cluster:
    options = upstream_http.HttpProtocolOptions(
        explicit_http_config=upstream_http.HttpProtocolOptionsExplicitHttpConfig(
            http2_protocol_options=core.Http2ProtocolOptions(
                # Room for a 16 MiB body in one gRPC message.
                initial_stream_window_size=32 * MiB,
                initial_connection_window_size=64 * MiB,
            )
        )
    )
    return cluster.Cluster(
        name=PROCESSOR_CLUSTER,
        type=_discovery(address),
        connect_timeout=_seconds(1),
        # NOT_SERVING from the first moment of a processor's drain moves new streams to
        # the other replicas.
        health_checks=[
            core.HealthCheck(
                timeout=_seconds(1),
                interval=_seconds(2),
                unhealthy_threshold=2,
                healthy_threshold=1,
                grpc_health_check=core.HealthCheckGrpcHealthCheck(service_name=PROCESSOR_SERVICE),
            )
        ],
        typed_extension_protocol_options={HTTP_OPTIONS: protobuf.Any.pack(options)},
        load_assignment=_one_endpoint(PROCESSOR_CLUSTER, address),
    )


def upstream_cluster(name: str, address: HostPort) -> cluster.Cluster:
    return cluster.Cluster(
        name=name,
        type=cluster.ClusterDiscoveryType.STRICT_DNS,
        connect_timeout=_seconds(2),
        load_assignment=_one_endpoint(name, address),
    )


def ext_proc_filter(spec: GeneratorInput) -> ext_proc.ExternalProcessor:
    body_mode = (
        ext_proc.ProcessingModeBodySendMode.BUFFERED
        if spec.body_mode == "buffered"
        else ext_proc.ProcessingModeBodySendMode.FULL_DUPLEX_STREAMED
    )
    return ext_proc.ExternalProcessor(
        grpc_service=core.GrpcService(
            envoy_grpc=core.GrpcServiceEnvoyGrpc(
                cluster_name=PROCESSOR_CLUSTER,
                # A rewritten 16 MiB body can grow when escapes are needed.
                max_receive_message_length=64 * MiB,
            )
        ),
        # Fail closed: processor down, slow or failing means a 5xx, nothing forwarded.
        failure_mode_allow=False,
        message_timeout=_seconds(spec.message_timeout_seconds),
        processing_mode=ext_proc.ProcessingMode(
            request_header_mode=ext_proc.ProcessingModeHeaderSendMode.SEND,
            request_body_mode=body_mode,
            request_trailer_mode=ext_proc.ProcessingModeHeaderSendMode.SEND,
            response_header_mode=ext_proc.ProcessingModeHeaderSendMode.SKIP,
            response_body_mode=ext_proc.ProcessingModeBodySendMode.NONE,
            response_trailer_mode=ext_proc.ProcessingModeHeaderSendMode.SKIP,
        ),
        request_attributes=list(attribute_keys(spec.namespace).all()),
        metadata_options=ext_proc.MetadataOptions(
            receiving_namespaces=ext_proc.MetadataOptionsMetadataNamespaces(
                untyped=[spec.namespace]
            )
        ),
    )


def access_log(namespace: str) -> accesslog.AccessLog:
    fields = {
        "time": "%START_TIME%",
        "request_id": "%REQ(X-REQUEST-ID)%",
        "method": "%REQ(:METHOD)%",
        "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
        "protocol": "%PROTOCOL%",
        "status": "%RESPONSE_CODE%",
        "details": "%RESPONSE_CODE_DETAILS%",
        "route": "%ROUTE_NAME%",
        "bytes_received": "%BYTES_RECEIVED%",
        "duration_ms": "%DURATION%",
    }
    for key in ("action", "reason", "id_count", "mode"):
        fields[f"policy_{key}"] = f"%DYNAMIC_METADATA({namespace}:{key})%"
    log = stream_log.StdoutAccessLog(
        log_format=core.SubstitutionFormatString(json_format=_struct(fields))
    )
    return accesslog.AccessLog(
        name="envoy.access_loggers.stdout", typed_config=protobuf.Any.pack(log)
    )


def _not_processor_denial() -> accesslog.AccessLogFilter:
    expression = cel_filter.ExpressionFilter(
        expression="!response.code_details.startsWith('token_policy_')"
    )
    return accesslog.AccessLogFilter(
        extension_filter=accesslog.ExtensionFilter(
            name="envoy.access_loggers.extension_filters.cel",
            typed_config=protobuf.Any.pack(expression),
        )
    )


def _status(code: int) -> accesslog.AccessLogFilter:
    return accesslog.AccessLogFilter(
        status_code_filter=accesslog.StatusCodeFilter(
            comparison=accesslog.ComparisonFilter(
                op=accesslog.ComparisonFilterOp.EQ,
                value=core.RuntimeUInt32(default_value=code, runtime_key=f"lr_{code}"),
            )
        )
    )


def _error_body(message: str, kind: str) -> core.SubstitutionFormatString:
    error = {"message": message, "type": kind, "param": None, "code": "%RESPONSE_CODE%"}
    return core.SubstitutionFormatString(
        json_format=_struct({"error": error}), content_type="application/json"
    )


def local_reply_config() -> hcm.LocalReplyConfig:
    """Envoy's own local replies in vLLM's error shape; processor denials untouched."""
    specific = (
        (413, "request body exceeds this route's buffer limit", "PayloadTooLargeError"),
        (
            504,
            "the gateway timed out (%RESPONSE_CODE_DETAILS%); the request was not processed",
            "GatewayTimeoutError",
        ),
        (408, "the request was not received in time", "RequestTimeoutError"),
    )
    mappers = [
        hcm.ResponseMapper(
            filter=accesslog.AccessLogFilter(
                and_filter=accesslog.AndFilter(filters=[_status(code), _not_processor_denial()])
            ),
            body_format_override=_error_body(message, kind),
        )
        for code, message, kind in specific
    ]
    mappers.append(
        hcm.ResponseMapper(
            filter=_not_processor_denial(),
            body_format_override=_error_body(
                "gateway error: %RESPONSE_CODE_DETAILS%", "GatewayError"
            ),
        )
    )
    return hcm.LocalReplyConfig(mappers=mappers)


def routes(spec: GeneratorInput) -> list[route.Route]:
    out = []
    for index, entry in enumerate(spec.routes):
        action = route.RouteAction(
            cluster=entry.upstream,
            prefix_rewrite=entry.prefix_rewrite or "",
            timeout=_seconds(spec.route_timeout_seconds),
        )
        out.append(
            route.Route(
                name=route_name(entry, index),
                match=route.RouteMatch(prefix=entry.prefix),
                route=action,
                metadata=core.Metadata(
                    filter_metadata={spec.namespace: _struct(entry.policy.metadata())}
                ),
                # BUFFERED: Envoy holds the whole body up to this limit (413 beyond).
                request_body_buffer_limit=entry.body_limit_bytes or spec.body_limit_bytes,
            )
        )
    return out


def connection_manager(spec: GeneratorInput) -> hcm.HttpConnectionManager:
    return hcm.HttpConnectionManager(
        stat_prefix="gateway",
        codec_type=hcm.HttpConnectionManagerCodecType.AUTO,
        # Slow uploads are bounded by the processor's body_timeout_seconds (408).
        stream_idle_timeout=_seconds(spec.stream_idle_timeout_seconds),
        normalize_path=True,
        merge_slashes=True,
        path_with_escaped_slashes_action=(
            hcm.HttpConnectionManagerPathWithEscapedSlashesAction.UNESCAPE_AND_REDIRECT
        ),
        access_log=[access_log(spec.namespace)],
        local_reply_config=local_reply_config(),
        route_config=route.RouteConfiguration(
            name="gateway",
            virtual_hosts=[route.VirtualHost(name="vllm", domains=["*"], routes=routes(spec))],
        ),
        http_filters=[
            hcm.HttpFilter(
                name=EXT_PROC_FILTER, typed_config=protobuf.Any.pack(ext_proc_filter(spec))
            ),
            hcm.HttpFilter(name=ROUTER_FILTER, typed_config=protobuf.Any.pack(router.Router())),
        ],
    )


def build(spec: GeneratorInput) -> bootstrap.Bootstrap:
    """The whole bootstrap as typed messages."""
    gateway = listener.Listener(
        name="gateway",
        address=_socket(spec.listener_address, spec.listener_port),
        # Everything that is not a request body on a protected route keeps Envoy's 1 MiB.
        per_connection_buffer_limit_bytes=MiB,
        filter_chains=[
            listener.FilterChain(
                filters=[
                    listener.Filter(
                        name=HCM_NAME,
                        typed_config=protobuf.Any.pack(connection_manager(spec)),
                    )
                ]
            )
        ],
    )
    clusters = [processor_cluster(spec.processor)]
    clusters += [upstream_cluster(name, address) for name, address in spec.upstreams.items()]
    return bootstrap.Bootstrap(
        admin=bootstrap.Admin(address=_socket("127.0.0.1", spec.admin_port)),
        static_resources=bootstrap.BootstrapStaticResources(listeners=[gateway], clusters=clusters),
    )


def _integral(value: Any) -> Any:
    """protobuf Struct numbers are doubles; write 131072 rather than 131072.0."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _integral(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral(item) for item in value]
    return value


def to_dict(config: bootstrap.Bootstrap) -> dict[str, Any]:
    """proto3 JSON with Envoy's snake_case names, as Envoy's YAML loader reads it."""
    data: dict[str, Any] = _integral(config.to_dict(casing=Casing.SNAKE))
    # proto3 JSON leaves out false; the fail-closed setting is written out anyway.
    for chain in data["static_resources"]["listeners"][0]["filter_chains"]:
        for net_filter in chain["filters"]:
            for http_filter in net_filter["typed_config"].get("http_filters", []):
                if http_filter["name"] == EXT_PROC_FILTER:
                    typed = http_filter["typed_config"]
                    typed["failure_mode_allow"] = typed.get("failure_mode_allow", False)
    return data


HEADER: Final = """\
# Generated by `python -m ext_proc envoy-config`; edit the input, not this file.
#
# Fail-closed invariants (keep them if you edit): ext_proc failure_mode_allow false
# (processor down or slow -> 5xx, nothing forwarded); request_body_mode BUFFERED or
# FULL_DUPLEX_STREAMED (the processor sees the whole body before the upstream sees any
# of it); every CEL attribute in request_attributes (unknown metadata fields fail
# closed); allow_content_length_header unset.
"""


def render(spec: GeneratorInput) -> str:
    return HEADER + yaml.safe_dump(to_dict(build(spec)), sort_keys=False)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ext_proc envoy-config",
        description="Write a fail-closed Envoy bootstrap for the token-id policy processor.",
    )
    parser.add_argument("input", type=Path, help="generator input (YAML)")
    parser.add_argument("-o", "--output", type=Path, help="output file (default: stdout)")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        data = yaml.safe_load(args.input.read_text())
    except (OSError, yaml.YAMLError) as exc:
        print(f"envoy-config: cannot read {args.input}: {exc}", file=sys.stderr)
        return 2
    try:
        text = render(load_input(data))
    except GeneratorError as exc:
        print(f"envoy-config: {args.input}: {exc}", file=sys.stderr)
        return 2
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
    return 0
