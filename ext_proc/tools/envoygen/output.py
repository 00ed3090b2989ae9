"""The Envoy bootstrap as envoy-data-plane's typed messages, then as YAML.

A misspelt field or a wrong type is a Python error here rather than an Envoy start-up
failure; the messages become a dict (proto3 JSON, snake_case) only at the end.
"""

from __future__ import annotations

import datetime
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Final

import yaml
from betterproto2 import Casing, Message

from ext_proc.core import tenants
from ext_proc.core.address import HostPort
from ext_proc.edge.attributes import READ_HEADERS, attribute_keys
from ext_proc.edge.supervisor import worker_ports
from ext_proc.tools import carrier_headers
from ext_proc.tools.envoy_names import (
    BUFFER_FILTER,
    MINT_RESPONSE,
    RETRY_AFTER,
    RETRY_SAFE,
    RETRY_STATUS,
    RETRY_UNSAFE,
)
from ext_proc.tools.envoygen import route_headers
from ext_proc.tools.envoygen.inputs import (
    PROCESSOR_CLUSTER,
    RESERVED_ROUTE_PREFIX,
    GeneratorInput,
    KiB,
    ListenerTls,
    MiB,
    ProcessorTls,
    RouteInput,
    TenantRateLimit,
    UnixSocket,
    route_name,
)
from ext_proc.tools.refused_paths import (
    PROGRAM_SIZE_LIMIT,
    PROGRAM_SIZE_RUNTIME_KEY,
    refused_names,
    route_regex,
)
from ext_proc.tools.token_endpoints import EVERYWHERE, ROOT, Match, rewritten_into

with warnings.catch_warnings():
    # envoy-data-plane 2.2 decorates classmethods with @model_validator(mode="after"),
    # which pydantic >= 2.12 reports as deprecated while the classes are created.
    from pydantic.warnings import PydanticDeprecatedSince212

    warnings.simplefilter("ignore", PydanticDeprecatedSince212)
    from envoy_data_plane.envoy.config.accesslog import v3 as accesslog
    from envoy_data_plane.envoy.config.bootstrap import v3 as bootstrap
    from envoy_data_plane.envoy.config.cluster import v3 as cluster
    from envoy_data_plane.envoy.config.common.mutation_rules import v3 as mutation_rules
    from envoy_data_plane.envoy.config.core import v3 as core
    from envoy_data_plane.envoy.config.endpoint import v3 as endpoint
    from envoy_data_plane.envoy.config.listener import v3 as listener
    from envoy_data_plane.envoy.config.overload import v3 as overload
    from envoy_data_plane.envoy.config.route import v3 as route
    from envoy_data_plane.envoy.extensions.access_loggers.filters.cel import v3 as cel_filter
    from envoy_data_plane.envoy.extensions.access_loggers.stream import v3 as stream_log
    from envoy_data_plane.envoy.extensions.common.ratelimit import v3 as ratelimit
    from envoy_data_plane.envoy.extensions.compression.gzip.decompressor import v3 as gzip
    from envoy_data_plane.envoy.extensions.filters.http.buffer import v3 as buffer
    from envoy_data_plane.envoy.extensions.filters.http.decompressor import v3 as decompressor
    from envoy_data_plane.envoy.extensions.filters.http.ext_proc import v3 as ext_proc
    from envoy_data_plane.envoy.extensions.filters.http.header_mutation import (
        v3 as header_mutation,
    )
    from envoy_data_plane.envoy.extensions.filters.http.local_ratelimit import (
        v3 as local_ratelimit,
    )
    from envoy_data_plane.envoy.extensions.filters.http.router import v3 as router
    from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager import (
        v3 as hcm,
    )
    from envoy_data_plane.envoy.extensions.resource_monitors.downstream_connections import (
        v3 as downstream_connections,
    )
    from envoy_data_plane.envoy.extensions.resource_monitors.fixed_heap import v3 as fixed_heap
    from envoy_data_plane.envoy.extensions.transport_sockets.tls import v3 as tls
    from envoy_data_plane.envoy.extensions.upstreams.http import v3 as upstream_http
    from envoy_data_plane.envoy.type import v3 as envoy_type
    from envoy_data_plane.envoy.type.matcher import v3 as matcher
    from envoy_data_plane.envoy.type.metadata import v3 as metadata
    from envoy_data_plane.google import protobuf

# The gRPC service name the processor's health service reports (ext_proc/edge/server.py).
PROCESSOR_SERVICE: Final = "envoy.service.ext_proc.v3.ExternalProcessor"
HCM_NAME: Final = "envoy.filters.network.http_connection_manager"
DECOMPRESSOR_FILTER: Final = "envoy.filters.http.decompressor"
EXT_PROC_FILTER: Final = "envoy.filters.http.ext_proc"
ROUTER_FILTER: Final = "envoy.filters.http.router"
RATE_LIMIT_FILTER: Final = "envoy.filters.http.local_ratelimit"
# The descriptor entry a tenant's requests are counted under: its partition id.
TENANT_DESCRIPTOR: Final = "tenant_partition"
HTTP_OPTIONS: Final = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
TLS_SOCKET: Final = "envoy.transport_sockets.tls"
# The overload manager's resource monitors and actions (Envoy's edge best practices).
CONNECTIONS_MONITOR: Final = "envoy.resource_monitors.global_downstream_max_connections"
HEAP_MONITOR: Final = "envoy.resource_monitors.fixed_heap"
HEAP_ACTIONS: Final = {
    "envoy.overload_actions.shrink_heap": 0.95,
    "envoy.overload_actions.stop_accepting_requests": 0.98,
}
# Each downstream connection's read and write buffers: how much Envoy reads from a client
# per read() call and holds before it stops reading. Request bodies are held up to the
# route's request_body_buffer_limit instead (policy_route), which Envoy 1.40 makes the
# stream's limit, both directions: with this listener limit a 16 MiB - 1 KiB body is
# still buffered whole over HTTP/1.1 and HTTP/2, and a larger one still gets 413
# (tests/e2e/test_large_bodies.py, tests/e2e/test_decompress_limits.py). It also bounds
# what the gzip decompressor inflates at once: GZIP_MAX_INFLATE_RATIO times one read.
CONNECTION_BUFFER_BYTES: Final = 32 * KiB
# Deflate's largest possible expansion: a 258-byte copy per two bits of input. Envoy's
# gzip decompressor stops inflating a read that expands more than max_inflate_ratio
# times and passes the truncated output on, so the processor would see a body that is
# not JSON (400) where Envoy should answer 413. At this ratio no valid gzip body is
# truncated, and the route's buffer limit bounds the inflated size (413).
GZIP_MAX_INFLATE_RATIO: Final = 1032
# Downstream HTTP/2 (Envoy's edge best practices): streams per connection and flow
# control windows; a buffered body still reaches the route's limit, window by window.
DOWNSTREAM_HTTP2_STREAMS: Final = 100
DOWNSTREAM_HTTP2_STREAM_WINDOW: Final = 64 * KiB
DOWNSTREAM_HTTP2_CONNECTION_WINDOW: Final = MiB
# A client must send its whole request headers within this time.
REQUEST_HEADERS_TIMEOUT_SECONDS: Final = 10.0
# Envoy sends the processor DATA frames of 16 KiB (nghttp2's payload size, whatever
# SETTINGS_MAX_FRAME_SIZE the processor allows), over a thousand for a 16 MiB body, and
# ends a connection whose frames not yet written pass max_outbound_frames (10,000 unless
# set) as a flood, resetting every stream on it. A processor that grants its windows
# (gRPC opens a stream's window to the whole message it reads) but reads slower than
# Envoy writes lets every body on a connection queue there: so a connection carries at
# most PROCESSOR_STREAMS streams (Envoy opens more connections beyond), and the limit is
# their largest bodies' frames on top of Envoy's default for everything else.
ENVOY_DATA_FRAME_BYTES: Final = 16 * KiB
ENVOY_OUTBOUND_FRAMES: Final = 10_000
PROCESSOR_STREAMS: Final = 8
# A ProcessingRequest is the body plus its headers and attributes (the processor's own
# gRPC message limit allows the same).
MESSAGE_OVERHEAD_BYTES: Final = MiB


def _seconds(value: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=value)


def _socket(host: str, port: int) -> core.Address:
    return core.Address(socket_address=core.SocketAddress(address=host, port_value=port))


def _address(address: HostPort | UnixSocket) -> core.Address:
    if isinstance(address, UnixSocket):
        return core.Address(pipe=core.Pipe(path=address.path))
    return _socket(address.host, address.port)


def _struct(value: Mapping[str, Any]) -> protobuf.Struct:
    struct: protobuf.Struct = protobuf.Struct.from_dict(dict(value))
    return struct


def _endpoints(
    name: str, addresses: Iterable[HostPort | UnixSocket]
) -> endpoint.ClusterLoadAssignment:
    return endpoint.ClusterLoadAssignment(
        cluster_name=name,
        endpoints=[
            endpoint.LocalityLbEndpoints(
                lb_endpoints=[
                    endpoint.LbEndpoint(endpoint=endpoint.Endpoint(address=_address(address)))
                    for address in addresses
                ]
            )
        ],
    )


def _one_endpoint(name: str, address: HostPort | UnixSocket) -> endpoint.ClusterLoadAssignment:
    return _endpoints(name, [address])


def processor_endpoints(
    processor: HostPort | UnixSocket, workers: int = 1
) -> endpoint.ClusterLoadAssignment:
    """One endpoint per processor worker, at the port its supervisor gives it
    (``worker_ports``): Envoy picks an endpoint per stream, so every worker serves
    streams whatever the number of connections (one per Envoy worker thread and
    endpoint while under PROCESSOR_STREAMS streams)."""
    if isinstance(processor, UnixSocket):
        return _one_endpoint(PROCESSOR_CLUSTER, processor)
    ports = worker_ports(str(processor), workers)
    return _endpoints(PROCESSOR_CLUSTER, [HostPort.parse(a) for a in ports])


def worker_outlier_detection() -> cluster.OutlierDetection:
    """A worker's port that refuses a connection is out for a while, at once: a killed
    worker stays listed (its supervisor restarts it on the same port in a second or
    two) and Envoy, which health-checks it only every few seconds, would meanwhile send
    it a share of the new streams, each failing. Only connection failures count
    (local-origin errors, split from the answers): a worker's answers say nothing about
    its health, and success-rate ejection is off. Every worker may be out at once;
    Envoy's panic threshold then spreads streams over all of them again."""
    return cluster.OutlierDetection(
        split_external_local_origin_errors=True,
        consecutive_local_origin_failure=1,
        enforcing_consecutive_local_origin_failure=100,
        enforcing_success_rate=0,
        enforcing_local_origin_success_rate=0,
        interval=_seconds(1),
        base_ejection_time=_seconds(2),
        max_ejection_percent=100,
    )


def processor_workers_fields(processor: HostPort, workers: int) -> dict[str, Any]:
    """The processor cluster's fields that list ``workers`` workers, as a rendered
    config has them (for configs edited as YAML: the benchmark's, the end-to-end
    tests'): ``load_assignment`` and, for several workers, ``outlier_detection``."""
    fields: dict[str, Any] = {
        "load_assignment": processor_endpoints(processor, workers).to_dict(casing=Casing.SNAKE)
    }
    if workers > 1:
        fields["outlier_detection"] = worker_outlier_detection().to_dict(casing=Casing.SNAKE)
    return fields


def _discovery(address: HostPort | UnixSocket) -> cluster.ClusterDiscoveryType:
    # A DNS name (a Kubernetes headless Service) resolves to every replica.
    if isinstance(address, HostPort) and not address.is_ip:
        return cluster.ClusterDiscoveryType.STRICT_DNS
    return cluster.ClusterDiscoveryType.STATIC


def _file(path: str) -> core.DataSource:
    return core.DataSource(filename=path)


def processor_tls(settings: ProcessorTls) -> core.TransportSocket:
    """Envoy verifies the processor's certificate; with a client certificate, mTLS."""
    certificates = []
    if settings.cert_file is not None and settings.key_file is not None:
        certificates.append(
            tls.TlsCertificate(
                certificate_chain=_file(settings.cert_file),
                private_key=_file(settings.key_file),
            )
        )
    context = tls.UpstreamTlsContext(
        sni=settings.server_name,
        common_tls_context=tls.CommonTlsContext(
            alpn_protocols=["h2"],
            tls_certificates=certificates,
            validation_context=tls.CertificateValidationContext(
                trusted_ca=_file(settings.ca_file),
                match_typed_subject_alt_names=[
                    tls.SubjectAltNameMatcher(
                        san_type=tls.SubjectAltNameMatcherSanType.DNS,
                        matcher=matcher.StringMatcher(exact=settings.server_name),
                    )
                ],
            ),
        ),
    )
    return core.TransportSocket(name=TLS_SOCKET, typed_config=protobuf.Any.pack(context))


def listener_tls(settings: ListenerTls) -> core.TransportSocket:
    """The gateway's certificate; clients must present one that ``client_ca_file``
    signed, or the handshake fails. Which of them a route trusts is its ``peers``."""
    context = tls.DownstreamTlsContext(
        require_client_certificate=True,
        common_tls_context=tls.CommonTlsContext(
            alpn_protocols=["h2", "http/1.1"],
            tls_certificates=[
                tls.TlsCertificate(
                    certificate_chain=_file(settings.cert_file),
                    private_key=_file(settings.key_file),
                )
            ],
            validation_context=tls.CertificateValidationContext(
                trusted_ca=_file(settings.client_ca_file)
            ),
        ),
    )
    return core.TransportSocket(name=TLS_SOCKET, typed_config=protobuf.Any.pack(context))


def processor_outbound_frames(largest_body_bytes: int) -> int:
    """The frames Envoy may queue for the processor on one connection before it ends the
    connection as a flood: PROCESSOR_STREAMS largest messages and Envoy's default. Every
    wiring of the processor (envoy/, deploy/, the chart) sets this for its largest body."""
    message = largest_body_bytes + MESSAGE_OVERHEAD_BYTES
    return PROCESSOR_STREAMS * -(-message // ENVOY_DATA_FRAME_BYTES) + ENVOY_OUTBOUND_FRAMES


def processor_cluster(spec: GeneratorInput) -> cluster.Cluster:
    options = upstream_http.HttpProtocolOptions(
        explicit_http_config=upstream_http.HttpProtocolOptionsExplicitHttpConfig(
            http2_protocol_options=core.Http2ProtocolOptions(
                # Room for a 16 MiB body in one gRPC message.
                initial_stream_window_size=32 * MiB,
                initial_connection_window_size=64 * MiB,
                max_concurrent_streams=PROCESSOR_STREAMS,
                max_outbound_frames=processor_outbound_frames(spec.largest_body_bytes),
            )
        )
    )
    return cluster.Cluster(
        name=PROCESSOR_CLUSTER,
        type=_discovery(spec.processor),
        connect_timeout=_seconds(1),
        # NOT_SERVING from the first moment of a processor's drain moves new streams to
        # the other replicas.
        health_checks=[
            core.HealthCheck(
                timeout=_seconds(1),
                interval=_seconds(2),
                # Checked as often when no request flows (Envoy's default is a minute): an
                # idle gateway knows at once which replicas are draining or gone.
                no_traffic_interval=_seconds(2),
                unhealthy_threshold=2,
                healthy_threshold=1,
                grpc_health_check=core.HealthCheckGrpcHealthCheck(service_name=PROCESSOR_SERVICE),
            )
        ],
        transport_socket=(
            None if spec.processor_tls is None else processor_tls(spec.processor_tls)
        ),
        typed_extension_protocol_options={HTTP_OPTIONS: protobuf.Any.pack(options)},
        load_assignment=processor_endpoints(spec.processor, spec.processor_workers),
        outlier_detection=worker_outlier_detection() if spec.processor_workers > 1 else None,
    )


def upstream_cluster(name: str, address: HostPort) -> cluster.Cluster:
    return cluster.Cluster(
        name=name,
        type=cluster.ClusterDiscoveryType.STRICT_DNS,
        connect_timeout=_seconds(2),
        load_assignment=_one_endpoint(name, address),
    )


def processing_mode(
    spec: GeneratorInput, *, response: bool, request_headers: bool = False
) -> ext_proc.ProcessingMode:
    """The filter's modes; with ``response``, the response headers and the buffered
    response body go to the processor as well (a ``mint`` route); with
    ``request_headers``, the request headers too, whatever the arrangement."""
    headers, bodies = ext_proc.ProcessingModeHeaderSendMode, ext_proc.ProcessingModeBodySendMode
    skip = spec.one_message and not request_headers
    return ext_proc.ProcessingMode(
        # One message: no headers message; the headers checked come as attributes.
        request_header_mode=headers.SKIP if skip else headers.SEND,
        request_body_mode=(
            bodies.BUFFERED if spec.body_mode == "buffered" else bodies.FULL_DUPLEX_STREAMED
        ),
        # FULL_DUPLEX_STREAMED needs the trailers sent.
        request_trailer_mode=headers.SEND,
        response_header_mode=(
            headers[MINT_RESPONSE["response_header_mode"]] if response else headers.SKIP
        ),
        response_body_mode=(
            bodies[MINT_RESPONSE["response_body_mode"]] if response else bodies.NONE
        ),
        response_trailer_mode=headers.SKIP,
    )


def ext_proc_filter(spec: GeneratorInput) -> ext_proc.ExternalProcessor:
    attributes = list(attribute_keys(spec.namespace).all())
    if spec.one_message:
        # The headers the processor checks, and those a span of its decision reads.
        attributes += READ_HEADERS.values()
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
        # A processor that cannot be reached or fails: 503 (the local reply mappers add
        # retry-after where nothing was forwarded); its own refusals keep their status.
        status_on_error=envoy_type.HttpStatus(code=envoy_type.StatusCode(RETRY_STATUS)),
        message_timeout=_seconds(spec.message_timeout_seconds),
        processing_mode=processing_mode(spec, response=False),
        request_attributes=attributes,
        metadata_options=ext_proc.MetadataOptions(
            receiving_namespaces=ext_proc.MetadataOptionsMetadataNamespaces(
                untyped=[spec.namespace]
            )
        ),
    )


def route_override(spec: GeneratorInput, entry: RouteInput) -> ext_proc.ExtProcPerRoute | None:
    """A route's filter settings where they are not the filter's own: a route whose
    responses the processor reads (``RouteInput.responds``) has them sent; a route that
    names a tenant source has its request headers sent even with one message per
    request, so a request without a body still reaches the processor and names its
    tenant (a stored response is read by its id alone). None: the filter's own.

    Only the processing mode is overridden; failure_mode_allow is never set here, so
    the route fails closed as the filter does.
    """
    tenant = entry.read().tenant is not None
    if not entry.responds and not (tenant and spec.one_message):
        return None
    mode = processing_mode(spec, response=entry.responds, request_headers=tenant)
    return ext_proc.ExtProcPerRoute(overrides=ext_proc.ExtProcOverrides(processing_mode=mode))


def _enabled(default: bool, runtime_key: str) -> decompressor.DecompressorCommonDirectionConfig:
    return decompressor.DecompressorCommonDirectionConfig(
        enabled=core.RuntimeFeatureFlag(default_value=default, runtime_key=runtime_key)
    )


def gzip_decompressor() -> decompressor.Decompressor:
    """Request bodies only; codings it does not decode keep their header (415)."""
    return decompressor.Decompressor(
        decompressor_library=core.TypedExtensionConfig(
            name="gzip",
            typed_config=protobuf.Any.pack(
                gzip.Gzip(window_bits=15, max_inflate_ratio=GZIP_MAX_INFLATE_RATIO)
            ),
        ),
        request_direction_config=decompressor.DecompressorRequestDirectionConfig(
            common_config=_enabled(True, "request_decompressor_enabled")
        ),
        response_direction_config=decompressor.DecompressorResponseDirectionConfig(
            common_config=_enabled(False, "response_decompressor_enabled")
        ),
    )


def hold_request(limit: int) -> buffer.BufferPerRoute:
    """The buffer filter's settings on a route whose body may hold up to ``limit``.

    The filter sets the stream's buffer limit to its own ``max_request_bytes`` when the
    headers pass it, which would replace the route's ``request_body_buffer_limit`` under
    which ext_proc buffers: each route states its own limit again here.
    """
    return buffer.BufferPerRoute(buffer=buffer.Buffer(max_request_bytes=limit))


def _set(name: str, value: str) -> mutation_rules.HeaderMutation:
    return mutation_rules.HeaderMutation(
        append=core.HeaderValueOption(
            header=core.HeaderValue(key=name, value=value),
            append_action=core.HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
        )
    )


def header_step(spec: GeneratorInput) -> header_mutation.HeaderMutation:
    """The request headers no client may set (``ext_proc.tools.carrier_headers``): the id the
    request came with moved aside and a fresh one set, the routing headers removed."""
    mutations = [
        _set(carrier_headers.CLIENT_REQUEST_ID, carrier_headers.INCOMING_ID),
        *(
            mutation_rules.HeaderMutation(remove=name)
            for name in carrier_headers.removed(spec.remove_request_headers)
        ),
        _set(carrier_headers.REQUEST_ID, carrier_headers.NEW_ID),
    ]
    return header_mutation.HeaderMutation(
        mutations=header_mutation.Mutations(request_mutations=mutations)
    )


def _filter(name: str, config: Message) -> hcm.HttpFilter:
    return hcm.HttpFilter(name=name, typed_config=protobuf.Any.pack(config))


def http_filters(spec: GeneratorInput) -> list[hcm.HttpFilter]:
    # First: no filter of this chain, the processor included, sees a client's copy of
    # a header that a component behind the gateway trusts.
    filters = [_filter(carrier_headers.FILTER, header_step(spec))]
    selecting = _selecting(spec)
    if selecting:
        # A header that chooses the route stated twice is refused before the processor
        # sees the request (route_headers).
        filters.append(route_header_filter(selecting))
    if spec.decompress_gzip:
        # Before ext_proc: the processor sees, and the upstream receives, the plain body.
        filters.append(_filter(DECOMPRESSOR_FILTER, gzip_decompressor()))
    filters.append(_filter(EXT_PROC_FILTER, ext_proc_filter(spec)))
    if spec.one_message:
        # The request is held here until ext_proc has let the whole body through: with
        # the headers message skipped, ext_proc passes the headers on at once, and the
        # router would open the upstream request (and send the headers) before the
        # decision, for refused requests and slow uploads alike. Held, the upstream sees
        # nothing of a refused request, a slow upload takes no upstream request, and the
        # body arrives with its content-length (the filter adds it). Two messages and
        # FULL_DUPLEX_STREAMED hold the headers at ext_proc until the processor answers.
        filters.append(
            _filter(BUFFER_FILTER, buffer.Buffer(max_request_bytes=spec.body_limit_bytes))
        )
    if spec.tenant_rate_limit is not None:
        # After the decision (and the hold): the partition id is in the dynamic metadata
        # by then, and a request the processor refused takes no tenant's token.
        filters.append(
            _filter(RATE_LIMIT_FILTER, tenant_rate_limit(spec.tenant_rate_limit, spec.namespace))
        )
    filters.append(_filter(ROUTER_FILTER, router.Router()))
    return filters


def _every_request(runtime_key: str) -> core.RuntimeFractionalPercent:
    return core.RuntimeFractionalPercent(
        default_value=envoy_type.FractionalPercent(
            numerator=100, denominator=envoy_type.FractionalPercentDenominatorType.HUNDRED
        ),
        runtime_key=runtime_key,
    )


def tenant_rate_limit(limit: TenantRateLimit, namespace: str) -> local_ratelimit.LocalRateLimit:
    """One token bucket per partition id the processor reported (a wildcard descriptor:
    a bucket for each value), read from its dynamic metadata, which only the processor
    writes; a request without one (no tenant named) is counted in the filter's own
    bucket alone, never in a tenant's."""
    bucket, shared = (
        envoy_type.TokenBucket(
            max_tokens=size, tokens_per_fill=size, fill_interval=_seconds(limit.interval_seconds)
        )
        for size in (limit.requests, limit.shared_requests or limit.requests)
    )
    partition = metadata.MetadataKey(
        key=namespace, path=[metadata.MetadataKeyPathSegment(key=tenants.METADATA_KEY)]
    )
    return local_ratelimit.LocalRateLimit(
        stat_prefix="tenant_rate_limit",
        token_bucket=shared,
        filter_enabled=_every_request("tenant_rate_limit.enabled"),
        filter_enforced=_every_request("tenant_rate_limit.enforced"),
        descriptors=[
            ratelimit.LocalRateLimitDescriptor(
                entries=[ratelimit.RateLimitDescriptorEntry(key=TENANT_DESCRIPTOR)],
                token_bucket=bucket,
            )
        ],
        always_consume_default_token_bucket=False,
        max_dynamic_descriptors=limit.tenants,
        rate_limits=[
            route.RateLimit(
                actions=[
                    route.RateLimitAction(
                        metadata=route.RateLimitActionMetaData(
                            descriptor_key=TENANT_DESCRIPTOR,
                            metadata_key=partition,
                            source=route.RateLimitActionMetaDataSource.DYNAMIC,
                        )
                    )
                ]
            )
        ],
    )


def access_log(namespace: str) -> accesslog.AccessLog:
    fields = {
        "time": "%START_TIME%",
        "request_id": "%REQ(X-REQUEST-ID)%",
        "client_request_id": "%REQ(X-CLIENT-REQUEST-ID)%",
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
    # What a mint route did with the response (signed, or why not).
    for key in ("action", "reason"):
        fields[f"policy_response_{key}"] = f"%DYNAMIC_METADATA({namespace}:response_{key})%"
    log = stream_log.StdoutAccessLog(
        log_format=core.SubstitutionFormatString(json_format=_struct(fields))
    )
    return accesslog.AccessLog(
        name="envoy.access_loggers.stdout", typed_config=protobuf.Any.pack(log)
    )


def _not_processor_denial() -> accesslog.AccessLogFilter:
    return _cel("!response.code_details.startsWith('token_policy_')")


def _details(details: str) -> accesslog.AccessLogFilter:
    quoted = details.replace("\\", "\\\\").replace("'", "\\'")  # a CEL string literal
    return _cel(f"response.code_details == '{quoted}'")


def _cel(text: str) -> accesslog.AccessLogFilter:
    expression = cel_filter.ExpressionFilter(expression=text)
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


def _selecting(spec: GeneratorInput) -> list[str]:
    return route_headers.selecting(entry.headers for entry in spec.routes)


def route_header_filter(selecting: Iterable[str]) -> hcm.HttpFilter:
    """The RBAC filter refusing each of ``selecting`` stated twice (``route_headers``)."""
    config = route_headers.rbac_config(selecting)
    return hcm.HttpFilter(name=route_headers.FILTER, typed_config=protobuf.Any.pack(config))


def route_header_mappers(selecting: Iterable[str]) -> list[hcm.ResponseMapper]:
    """Its denials (RBAC's 403) as 400s in vLLM's error shape, naming the header."""
    return [
        hcm.ResponseMapper(
            filter=_details(route_headers.denial_details(header)),
            status_code=400,
            body_format_override=_error_body(route_headers.message(header), "BadRequestError"),
        )
        for header in selecting
    ]


def local_reply_config(
    selecting: Iterable[str] = (), *, rate_limited: bool = False
) -> hcm.LocalReplyConfig:
    """Envoy's own local replies in vLLM's error shape; processor denials untouched.
    ``rate_limited``: the tenant rate limit's 429 among them.

    The client's messages are fixed text: ``%RESPONSE_CODE_DETAILS%`` can hold internal
    state (exception class names, the ext_proc state machine's messages), so it goes
    to the access log's ``details`` field only, never into a reply body.
    """
    specific: tuple[tuple[int, str, str], ...] = (
        (413, "request body exceeds this route's buffer limit", "PayloadTooLargeError"),
        # Every 504 left comes after the router chose an upstream (the route's timeout,
        # the idle timeout awaiting a response; the processor's message timeout is
        # mapped above): the upstream may have run the request.
        (504, "the gateway timed out; the upstream may have processed it", "GatewayTimeoutError"),
        (408, "the request was not received in time", "RequestTimeoutError"),
        # The token endpoints' direct responses (token_endpoint_routes), and a path no
        # route matches; an upstream's own 404 is no local reply and passes unchanged.
        (404, "not found", "NotFoundError"),
    )
    if rate_limited:
        specific += ((429, "the tenant's rate limit is exceeded", "RateLimitError"),)
    # A header that chooses the route, stated twice (route_headers): RBAC's 403 as 400.
    mappers = route_header_mappers(selecting)
    mappers += processor_failure_mappers()
    mappers += [
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
            body_format_override=_error_body("gateway error", "GatewayError"),
        )
    )
    return hcm.LocalReplyConfig(mappers=mappers)


def processor_failure_mappers() -> list[hcm.ResponseMapper]:
    """The ext_proc filter's own failures (``envoy_names.PROCESSOR_FAILED``): before the
    router chose an upstream, 503 with retry-after (unreachable, failed or slower than
    message_timeout, whose 504 becomes a 503 too: nothing was forwarded, a retry is
    safe); after it, or a stream the processor refused, 500 without one (the upstream
    may have run the request; the same request fails again)."""
    retry = core.HeaderValueOption(
        header=core.HeaderValue(key="retry-after", value=RETRY_AFTER),
        append_action=core.HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
    )
    return [
        hcm.ResponseMapper(
            filter=_cel(RETRY_SAFE),
            status_code=RETRY_STATUS,
            headers_to_add=[retry],
            body_format_override=_error_body(
                "the policy processor is unavailable; the request was not processed, retry it",
                "ServiceUnavailableError",
            ),
        ),
        hcm.ResponseMapper(
            filter=_cel(RETRY_UNSAFE),
            status_code=500,
            body_format_override=_error_body("gateway error", "GatewayError"),
        ),
    ]


def _per_route(
    spec: GeneratorInput,
    config: ext_proc.ExtProcPerRoute | None,
    hold: buffer.BufferPerRoute | None,
) -> dict[str, protobuf.Any]:
    out = {} if config is None else {EXT_PROC_FILTER: protobuf.Any.pack(config)}
    if spec.one_message and hold is not None:
        out[BUFFER_FILTER] = protobuf.Any.pack(hold)
    return out


def _not_found(spec: GeneratorInput, name: str, match: route.RouteMatch) -> route.Route:
    # Nothing to hold: the router answers without an upstream. Nor to count: no tenant
    # is named (the processor is skipped), and a 404 costs no upstream anything.
    configs = _per_route(
        spec, ext_proc.ExtProcPerRoute(disabled=True), buffer.BufferPerRoute(disabled=True)
    )
    if spec.tenant_rate_limit is not None:
        configs[RATE_LIMIT_FILTER] = protobuf.Any.pack(route.FilterConfig(disabled=True))
    return route.Route(
        name=name,
        match=match,
        direct_response=route.DirectResponseAction(status=404),
        typed_per_filter_config=configs,
    )


def _match(found: Match) -> route.RouteMatch:
    # Any case: a server that matched paths case-insensitively is closed too.
    if found.kind == "prefix":
        return route.RouteMatch(prefix=found.value, case_sensitive=False)
    if found.kind == "path":
        return route.RouteMatch(path=found.value, case_sensitive=False)
    return route.RouteMatch(safe_regex=matcher.RegexMatcher(regex=found.value))


# The route names of the matches every config has (EVERYWHERE, then ROOT).
_NAMES: Final = ("echo", "inference", "render", "derender")


def token_endpoint_routes(spec: GeneratorInput) -> list[route.Route]:
    """vLLM's token-in and echo endpoints (``ext_proc.tools.token_endpoints``), as the upstream
    would see them after each route's rewrite, answered 404 in vLLM's error shape with
    nothing forwarded: a render or derender last segment and an ``inference`` segment
    behind any prefix (two RE2 regexes on the normalised path without its query
    string), the root render and derender prefixes, then each policy route's
    downstream paths that its rewrite sends there.

    The processor is skipped: the router answers before any upstream is contacted, so
    there is nothing to inspect. The body is the local reply mappers' business
    (``local_reply_config``), which would otherwise replace it.
    """
    out = [
        _not_found(spec, f"{RESERVED_ROUTE_PREFIX}-{name}", _match(found))
        for name, found in zip(_NAMES, (*EVERYWHERE, *ROOT), strict=True)
    ]
    seen: set[tuple[str, str]] = set()
    for index, entry in enumerate(spec.routes):
        derived = rewritten_into(entry.prefix, entry.prefix_rewrite)
        for number, found in enumerate(derived):
            key = (found.kind, found.value.lower())
            if key not in seen:
                seen.add(key)
                name = f"{RESERVED_ROUTE_PREFIX}-{route_name(entry, index)}-{number}"
                out.append(_not_found(spec, name, _match(found)))
    return out


def policy_route(spec: GeneratorInput, entry: RouteInput, index: int) -> route.Route:
    action = route.RouteAction(
        cluster=entry.upstream,
        prefix_rewrite=entry.prefix_rewrite or "",
        timeout=_seconds(spec.route_timeout_seconds),
    )
    limit = entry.body_limit_bytes or spec.body_limit_bytes
    return route.Route(
        name=route_name(entry, index),
        match=route.RouteMatch(prefix=entry.prefix, headers=_header_matchers(entry)),
        route=action,
        metadata=core.Metadata(filter_metadata={spec.namespace: _struct(entry.metadata())}),
        # BUFFERED: Envoy holds the whole body up to this limit (413 beyond). Envoy 1.40
        # sets it as the stream's buffer limit, so it also bounds a mint route's buffered
        # response (500 response_payload_too_large beyond; inputs.MINT_BUFFER_MIN); the
        # listener's per_connection_buffer_limit_bytes does not.
        request_body_buffer_limit=limit,
        typed_per_filter_config=_per_route(spec, route_override(spec, entry), hold_request(limit)),
    )


def _header_matchers(entry: RouteInput) -> list[route.HeaderMatcher]:
    return [
        route.HeaderMatcher(name=name, string_match=matcher.StringMatcher(exact=value))
        for name, value in entry.headers.items()
    ]


def refused_route(spec: GeneratorInput, entry: RouteInput, index: int) -> route.Route | None:
    """The endpoints ``entry``'s policy refuses (``refused_paths``), answered 404 right
    before it for every request it would take (its headers matched too) whose path
    reaches one upstream through its rewrite: with a body or without, by any method.
    The processor refuses them from a body, and a request without one never reaches it
    where Envoy skips the headers. None when the route accepts both classes."""
    regex = route_regex(entry.prefix, entry.prefix_rewrite, refused_names(entry.read().accept))
    if regex is None:
        return None
    match = route.RouteMatch(
        safe_regex=matcher.RegexMatcher(regex=regex), headers=_header_matchers(entry)
    )
    return _not_found(spec, f"{RESERVED_ROUTE_PREFIX}-{route_name(entry, index)}-refused", match)


def routes(spec: GeneratorInput) -> list[route.Route]:
    out = token_endpoint_routes(spec)
    for index, entry in enumerate(spec.routes):
        refused = refused_route(spec, entry, index)
        out += (
            [policy_route(spec, entry, index)]
            if refused is None
            else [refused, policy_route(spec, entry, index)]
        )
    return out


def connection_manager(spec: GeneratorInput) -> hcm.HttpConnectionManager:
    return hcm.HttpConnectionManager(
        stat_prefix="gateway",
        codec_type=hcm.HttpConnectionManagerCodecType.AUTO,
        # Slow uploads are bounded by the processor's body_timeout_seconds (408).
        stream_idle_timeout=_seconds(spec.stream_idle_timeout_seconds),
        request_headers_timeout=_seconds(REQUEST_HEADERS_TIMEOUT_SECONDS),
        # Envoy closes an HTTP/1.1 connection after any 400 it answers itself unless
        # this is set; its HTTP/1 codec closes the connection on a framing error (a bad
        # header, chunk or content-length, content-length with transfer-encoding) in any
        # case, so only whole, well-framed requests keep it. HTTP/2 is unaffected.
        http_protocol_options=core.Http1ProtocolOptions(
            override_stream_error_on_invalid_http_message=True
        )
        if spec.keep_alive_after_denial
        else None,
        http2_protocol_options=core.Http2ProtocolOptions(
            max_concurrent_streams=DOWNSTREAM_HTTP2_STREAMS,
            initial_stream_window_size=DOWNSTREAM_HTTP2_STREAM_WINDOW,
            initial_connection_window_size=DOWNSTREAM_HTTP2_CONNECTION_WINDOW,
        ),
        # A header name with an underscore never reaches a filter or the upstream: a
        # reader that takes "_" for "-" (CGI, WSGI, nginx with underscores_in_headers)
        # would see x_request_id as the x-request-id the header step renewed.
        common_http_protocol_options=core.HttpProtocolOptions(
            headers_with_underscores_action=(
                core.HttpProtocolOptionsHeadersWithUnderscoresAction.DROP_HEADER
            )
        ),
        normalize_path=True,
        merge_slashes=True,
        path_with_escaped_slashes_action=(
            hcm.HttpConnectionManagerPathWithEscapedSlashesAction.UNESCAPE_AND_REDIRECT
        ),
        access_log=[access_log(spec.namespace)],
        local_reply_config=local_reply_config(
            _selecting(spec), rate_limited=spec.tenant_rate_limit is not None
        ),
        route_config=route.RouteConfiguration(
            name="gateway",
            virtual_hosts=[route.VirtualHost(name="vllm", domains=["*"], routes=routes(spec))],
        ),
        http_filters=http_filters(spec),
    )


def _heap_trigger(value: float) -> overload.Trigger:
    return overload.Trigger(name=HEAP_MONITOR, threshold=overload.ThresholdTrigger(value=value))


def overload_manager(spec: GeneratorInput) -> overload.OverloadManager:
    """Envoy sheds load before it runs out of connections or memory: a connection beyond
    ``max_downstream_connections`` is closed at accept (a proactive monitor, no action
    needed); near ``max_heap_size_bytes`` free memory is released, then new requests are
    answered 503."""
    connections = downstream_connections.DownstreamConnectionsConfig(
        max_active_downstream_connections=spec.max_downstream_connections
    )
    heap = fixed_heap.FixedHeapConfig(max_heap_size_bytes=spec.max_heap_size_bytes)
    return overload.OverloadManager(
        resource_monitors=[
            overload.ResourceMonitor(
                name=CONNECTIONS_MONITOR, typed_config=protobuf.Any.pack(connections)
            ),
            overload.ResourceMonitor(name=HEAP_MONITOR, typed_config=protobuf.Any.pack(heap)),
        ],
        actions=[
            overload.OverloadAction(name=name, triggers=[_heap_trigger(value)])
            for name, value in HEAP_ACTIONS.items()
        ],
    )


def build(spec: GeneratorInput) -> bootstrap.Bootstrap:
    """The whole bootstrap as typed messages."""
    gateway = listener.Listener(
        name="gateway",
        address=_socket(spec.listener_address, spec.listener_port),
        per_connection_buffer_limit_bytes=CONNECTION_BUFFER_BYTES,
        filter_chains=[
            listener.FilterChain(
                transport_socket=(
                    None if spec.listener_tls is None else listener_tls(spec.listener_tls)
                ),
                filters=[
                    listener.Filter(
                        name=HCM_NAME,
                        typed_config=protobuf.Any.pack(connection_manager(spec)),
                    )
                ],
            )
        ],
    )
    clusters = [processor_cluster(spec)]
    clusters += [upstream_cluster(name, address) for name, address in spec.upstreams.items()]
    return bootstrap.Bootstrap(
        admin=bootstrap.Admin(address=_socket("127.0.0.1", spec.admin_port)),
        static_resources=bootstrap.BootstrapStaticResources(listeners=[gateway], clusters=clusters),
        overload_manager=overload_manager(spec),
        layered_runtime=layered_runtime(),
    )


def layered_runtime() -> bootstrap.LayeredRuntime:
    """Envoy's default layers (a static one and the admin one), the static one raising
    RE2's program size limit above the refused endpoints' regexes (``refused_paths``)."""
    return bootstrap.LayeredRuntime(
        layers=[
            bootstrap.RuntimeLayer(
                name="base", static_layer=_struct({PROGRAM_SIZE_RUNTIME_KEY: PROGRAM_SIZE_LIMIT})
            ),
            bootstrap.RuntimeLayer(name="admin", admin_layer=bootstrap.RuntimeLayerAdminLayer()),
        ]
    )


def as_dict(message: Any) -> dict[str, Any]:
    """One typed message as proto3 JSON with Envoy's snake_case names (for manifests
    that carry a piece of what ``build`` writes)."""
    data: dict[str, Any] = _integral(message.to_dict(casing=Casing.SNAKE))
    return data


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
    # proto3 JSON writes 64-bit integers as strings; the monitors' limits are written as
    # the numbers they are.
    for monitor in data.get("overload_manager", {}).get("resource_monitors", []):
        typed = monitor["typed_config"]
        for key in ("max_active_downstream_connections", "max_heap_size_bytes"):
            if key in typed:
                typed[key] = int(typed[key])
    # proto3 JSON leaves out false; the fail-closed setting is written out anyway.
    for chain in data["static_resources"]["listeners"][0]["filter_chains"]:
        for net_filter in chain["filters"]:
            for http_filter in net_filter["typed_config"].get("http_filters", []):
                if http_filter["name"] == EXT_PROC_FILTER:
                    typed = http_filter["typed_config"]
                    typed["failure_mode_allow"] = typed.get("failure_mode_allow", False)
    return data


INVARIANTS: Final = """\
# Fail-closed invariants, written whatever the input: ext_proc failure_mode_allow false
# (processor down or slow -> 5xx, nothing forwarded); request_body_mode BUFFERED or
# FULL_DUPLEX_STREAMED (the processor sees the whole body before the upstream sees any
# of it); every CEL attribute in request_attributes (unknown metadata fields fail
# closed); allow_content_length_header unset; a mint route's per-route override changes
# the processing mode only (its response goes to the processor), never failure_mode_allow.
"""


def header(spec: GeneratorInput, source: str | None = None) -> str:
    """The comment above the configuration: where it comes from, what it is."""
    origin = f" from {source}" if source else ""
    lines = [
        f"# Generated by `python -m ext_proc envoy-config`{origin};",
        "# edit the input, not this file.",
        "#",
    ]
    if spec.description:
        lines += [f"# {line}".rstrip() for line in spec.description.strip("\n").splitlines()]
        lines.append("#")
    return "\n".join(lines) + "\n" + INVARIANTS


def render(spec: GeneratorInput, source: str | None = None) -> str:
    """The bootstrap as YAML under its header; ``source`` names the input in it."""
    return header(spec, source) + yaml.safe_dump(to_dict(build(spec)), sort_keys=False)
