"""The generator's input: a short YAML description, validated into ``GeneratorInput``.

An input file may name a ``base`` input (a path relative to it): the base's top-level
keys apply unless the file gives them again. The shipped configurations are one base
(``deploy/envoy-config.example.yaml``) and a few keys per variant.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from ext_proc.core.address import UNIX_PREFIX, HostPort, check_listen, is_ip
from ext_proc.core.errors import RoutePolicyError
from ext_proc.core.route_policy import (
    DEFAULT_NAMESPACE,
    DEFAULT_POLICY,
    FIELDS,
    Action,
    RoutePolicy,
    Scalar,
    TenantSource,
    beside,
    parse,
)
from ext_proc.core.validation import problems
from ext_proc.edge.attributes import as_cel
from ext_proc.tools.token_endpoints import answered, reaches_only

KiB: Final = 1024
MiB: Final = 1024 * KiB
# The processor's cluster; no upstream may take its name.
PROCESSOR_CLUSTER: Final = "ext_proc"
MAX_PORT: Final = 65535  # TCP's
BASE_KEY: Final = "base"
# Routes the generator names itself (the token endpoints' 404s) begin with this.
RESERVED_ROUTE_PREFIX: Final = "token-endpoint"
# The route policy fields a route's prefix and prefix_rewrite give (rewrite_fields),
# never written by hand.
REWRITE_FIELDS: Final = ("match_prefix", "prefix_rewrite")
# A mint route buffers the prefill response under the route's request_body_buffer_limit
# (Envoy 1.40 applies it to the stream, both directions; beyond it: a 500). vLLM's
# response with 128k prompt ids is about 1 MiB.
MINT_BUFFER_MIN: Final = 2 * MiB
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
# A lower-case HTTP header name (RFC 9110 token), not a pseudo-header.
_HEADER_NAME = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]+$")


class GeneratorError(Exception):
    """The generator input is invalid; the message names the field."""


@dataclass(frozen=True, slots=True)
class UnixSocket:
    """A processor reached over a Unix domain socket (``unix:/path``)."""

    path: str


def _host_port(value: object) -> HostPort:
    if isinstance(value, HostPort):
        return value
    if not isinstance(value, str):
        raise ValueError("expected a 'host:port' string")  # noqa: TRY004 (pydantic wants ValueError)
    return HostPort.parse(value)


def _processor_address(value: object) -> object:
    if isinstance(value, str) and value.startswith(UNIX_PREFIX):
        return UnixSocket(check_listen(value).removeprefix(UNIX_PREFIX))
    return value if isinstance(value, UnixSocket) else _host_port(value)


ProcessorAddress = Annotated[HostPort | UnixSocket, BeforeValidator(_processor_address)]


class PolicyFields(BaseModel):
    """A route's token policy; each field, then the whole, is checked by
    ``route_policy.parse``."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    @field_validator("*")
    @classmethod
    def _as_the_processor_reads_it(cls, value: Scalar | int, info: ValidationInfo) -> object:
        # Each value on its own, beside an action that admits the field, so the error
        # names the field; which fields go with which action is checked on the whole
        # policy below.
        name = info.field_name
        if value is not None and name in REWRITE_FIELDS:
            raise ValueError(
                "written from the route's prefix and prefix_rewrite, not given in its policy"
            )
        if value is not None and name is not None:
            _as_input_error(parse, beside(name) | {name: as_cel(value)}, None)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> PolicyFields:
        _as_input_error(self.read)
        return self

    def metadata(self) -> dict[str, Any]:
        """The given fields, and the topology (the route adds its rewrite's fields).

        Every route states its topology, given or not: the default action follows it.
        """
        return {"topology": DEFAULT_POLICY.topology.value} | self.model_dump(exclude_none=True)

    def read(self) -> RoutePolicy:
        """The policy as the processor reads these fields."""
        return read_metadata(self.metadata())


def _as_input_error(read: Callable[..., RoutePolicy], *args: Any) -> None:
    """``read(*args)``, its ``RoutePolicyError`` raised as the ``ValueError`` pydantic
    reports against the input field being validated."""
    try:
        read(*args)
    except RoutePolicyError as exc:
        raise ValueError(exc.message) from None


def read_metadata(fields: Mapping[str, Any]) -> RoutePolicy:
    """Route policy metadata as the processor reads it (through CEL attributes)."""
    return parse({name: as_cel(value) for name, value in fields.items()}, len(fields))


def rewrite_fields(prefix: str, prefix_rewrite: str | None) -> dict[str, str]:
    """The policy metadata that tells the processor a route's prefix rewrite, so it knows
    the path the upstream receives (``RoutePolicy.upstream_path``): the route's own
    match prefix and rewrite, nothing for a route without a rewrite. Every route that
    carries policy metadata takes these from its own match and action, in the
    generator and wherever a route is built or copied."""
    if prefix_rewrite is None:
        return {}
    return {"match_prefix": prefix, "prefix_rewrite": prefix_rewrite}


def state_rewrite(route: MutableMapping[str, Any], namespace: str = DEFAULT_NAMESPACE) -> None:
    """An Envoy route (as loaded from YAML) made to state its own rewrite: its policy
    metadata's ``match_prefix`` and ``prefix_rewrite`` replaced by ``rewrite_fields`` of
    its ``match.prefix`` and ``route.prefix_rewrite``. For routes built or copied outside
    the generator (test and benchmark routes); a route without policy metadata is left
    alone."""
    fields = route.get("metadata", {}).get("filter_metadata", {}).get(namespace)
    if not isinstance(fields, MutableMapping):
        return
    for name in REWRITE_FIELDS:
        fields.pop(name, None)
    rewrite = route.get("route", {}).get("prefix_rewrite") or None
    fields.update(rewrite_fields(route["match"]["prefix"], rewrite))


# One field per route_policy.FIELDS entry, so the policy's field list has one source.
if TYPE_CHECKING:
    PolicyInput = PolicyFields
else:
    PolicyInput = create_model(
        "PolicyInput",
        __base__=PolicyFields,
        **{name: (str | int | bool | None, None) for name in FIELDS},
    )


class RouteInput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: str | None = Field(default=None, pattern=_NAME.pattern)
    # No percent-escapes: the upstream decodes them, so a prefix or rewrite holding one
    # names another path than it reads as ("/%69nference/" is /inference/).
    prefix: str = Field(pattern=r"^/[^%]*$")
    prefix_rewrite: str | None = Field(default=None, pattern=r"^/[^%]*$")
    # Request headers the route also matches, each by its exact value (e.g. llm-d's
    # EPP-Profile for the coordinator's legs). A condition, not a credential: clients
    # can send any header, so every route's policy must hold for any client. A request
    # that states such a header twice, or with a list, is refused (route_headers): a
    # value holds no comma.
    headers: dict[
        Annotated[str, Field(pattern=_HEADER_NAME.pattern)],
        Annotated[str, Field(pattern=r"^[^,]*$")],
    ] = Field(default_factory=dict)
    upstream: str
    policy: PolicyInput = PolicyInput()
    # Largest request body held for inspection on this route (413 beyond it).
    body_limit_bytes: int | None = Field(default=None, gt=0, le=1024 * MiB)
    # An honor (decode) route whose responses go to the processor too, whole: their
    # turn parameters are signed for the conversation's next turn (docs/trust.md#turns).
    # The response is held until it ends: for non-streamed decode legs.
    turns: bool = False

    @model_validator(mode="after")
    def _metadata_valid(self) -> RouteInput:
        # The rewrite's fields beside the policy's, as the processor reads them.
        _as_input_error(self.read)
        if self.turns and self.read().action is not Action.HONOR:
            raise ValueError("turns: only an honor (decode) route signs its responses' turns")
        return self

    @property
    def responds(self) -> bool:
        """Whether the processor is sent the route's responses: a mint route's, to sign
        them, and a turns route's."""
        return self.turns or self.read().action is Action.MINT

    def metadata(self) -> dict[str, Any]:
        """The route's ``filter_metadata`` entry: its policy and its rewrite's fields."""
        return self.policy.metadata() | rewrite_fields(self.prefix, self.prefix_rewrite)

    def read(self) -> RoutePolicy:
        """The route's policy as the processor reads its metadata."""
        return read_metadata(self.metadata())


class ProcessorTls(BaseModel):
    """TLS to the processor; with ``cert_file`` and ``key_file``, mutual TLS."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    # SNI, and the DNS name the processor's certificate must carry.
    server_name: str = Field(pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")
    # The CA that signed the processor's certificate.
    ca_file: str = Field(pattern=r"^/")
    # Envoy's own certificate, for a processor that verifies clients (client_ca_file).
    cert_file: str | None = Field(default=None, pattern=r"^/")
    key_file: str | None = Field(default=None, pattern=r"^/")

    @model_validator(mode="after")
    def _pair(self) -> ProcessorTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (mutual TLS) or not at all")
        return self


class ListenerTls(BaseModel):
    """The gateway listener over mutual TLS: every client presents a certificate that
    ``client_ca_file`` signed; a route's ``peers`` are matched against it."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    # The gateway's own certificate and key.
    cert_file: str = Field(pattern=r"^/")
    key_file: str = Field(pattern=r"^/")
    # The CA that signs the clients' certificates; a client without one is refused.
    client_ca_file: str = Field(pattern=r"^/")


class TenantRateLimit(BaseModel):
    """Envoy's local rate limit after the processor's decision, one bucket per tenant:
    keyed on the partition id the processor reports for the tenant it authenticated
    (dynamic metadata ``partition``), which no client can write. Requests naming no
    tenant (routes without a tenant source) share one more bucket."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    # Each tenant's bucket holds this many requests and is filled again, whole, every
    # interval; Envoy's least fill interval is 50 ms.
    requests: int = Field(gt=0)
    interval_seconds: float = Field(ge=0.05, le=86400)
    # The one bucket of every request naming no tenant (routes without a tenant
    # source), per interval; by default a tenant's.
    shared_requests: int | None = Field(default=None, gt=0)
    # Tenant buckets kept at once (Envoy's max_dynamic_descriptors, least recently used
    # dropped): at least the tenants there are, or a dropped tenant's bucket starts full.
    tenants: int = Field(default=1000, gt=0)


class GeneratorInput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    # What this configuration is for and what it gives up; the output's header comment.
    description: str | None = None
    listener_address: str = "0.0.0.0"
    listener_port: int = Field(gt=0, lt=65536)
    listener_tls: ListenerTls | None = None
    admin_port: int = Field(default=9901, gt=0, lt=65536)
    # host:port (an IP: a STATIC cluster; a DNS name: STRICT_DNS) or unix:/path.
    processor: ProcessorAddress
    # The processor's `--workers`: worker i serves the processor's port plus i, and the
    # cluster lists each as an endpoint (Envoy picks one per stream).
    processor_workers: int = Field(default=1, ge=1, le=64)
    processor_tls: ProcessorTls | None = None
    body_mode: Literal["buffered", "streamed"] = "buffered"
    # One gRPC message per request: the headers message is skipped and the headers the
    # processor checks come as CEL attributes. Buffered bodies only.
    one_message: bool = False
    # Envoy's gzip decompressor before ext_proc: the processor sees decompressed bodies.
    decompress_gzip: bool = False
    # A rate limit per authenticated tenant after the processor's decision.
    tenant_rate_limit: TenantRateLimit | None = None
    # Per message, BUFFERED mode only (README: 16 MiB takes about 1 s on 2 cores).
    message_timeout_seconds: float = Field(default=5.0, gt=0, le=300)
    body_limit_bytes: int = Field(default=16 * MiB, gt=0, le=1024 * MiB)
    route_timeout_seconds: float = Field(default=600.0, gt=0)
    stream_idle_timeout_seconds: float = Field(default=300.0, gt=0)
    # Envoy's overload manager (docs/operations.md#envoy-edge-limits). Open downstream
    # connections, all listeners together; one beyond it is closed as it is accepted.
    max_downstream_connections: int = Field(default=50_000, gt=0)
    # Envoy's heap (fixed_heap monitor), which holds every buffered request body: at 95%
    # free memory is returned to the system, at 98% every new request is answered 503.
    max_heap_size_bytes: int = Field(default=1024 * MiB, ge=64 * MiB)
    # Must equal the processor's route_metadata_namespace.
    namespace: str = Field(default=DEFAULT_NAMESPACE, min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    # An HTTP/1.1 connection stays open after a 400 Envoy answers itself to a whole,
    # well-framed request (every denial of the processor is one), as after vLLM's own
    # 400s; false closes it, Envoy's default. A framing error closes it either way.
    keep_alive_after_denial: bool = True
    # Further request headers that a component behind this gateway parses for an
    # address, a peer or a prompt: removed with ext_proc.tools.carrier_headers' own list.
    remove_request_headers: list[Annotated[str, Field(pattern=_HEADER_NAME.pattern)]] = []
    upstreams: dict[str, HostPort] = Field(min_length=1)
    routes: list[RouteInput] = Field(min_length=1)

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
        if not is_ip(value):
            raise ValueError(f"expected an IP address to bind, got {value!r}")
        return value

    @model_validator(mode="after")
    def _workers_have_ports(self) -> GeneratorInput:
        workers = self.processor_workers
        if workers == 1:
            return self
        if isinstance(self.processor, UnixSocket):
            raise ValueError(  # noqa: TRY004 - pydantic reports ValueError as the field's
                f"processor_workers: {workers} needs a TCP processor address (a port each)"
            )
        last = self.processor.port + workers - 1
        if last > MAX_PORT:
            raise ValueError(
                f"processor_workers: {workers} from port {self.processor.port} need ports "
                f"up to {last}"
            )
        return self

    @model_validator(mode="after")
    def _one_message_needs_buffered_bodies(self) -> GeneratorInput:
        if self.one_message and self.body_mode != "buffered":
            raise ValueError("one_message: needs body_mode buffered (the whole body at once)")
        return self

    @model_validator(mode="after")
    def _routes_consistent(self) -> GeneratorInput:
        names: set[str] = set()
        earlier: list[RouteInput] = []
        for index, entry in enumerate(self.routes):
            where = f"routes.{index}"
            if entry.upstream not in self.upstreams:
                raise ValueError(
                    f"{where}.upstream: {entry.upstream!r} is not one of the upstreams "
                    f"({', '.join(sorted(self.upstreams))})"
                )
            name = route_name(entry, index)
            if name.startswith(RESERVED_ROUTE_PREFIX):
                raise ValueError(f"{where}.name: {name!r} is reserved for the token endpoints")
            if answered(entry.prefix):
                raise ValueError(
                    f"{where}.prefix: {entry.prefix!r} is under a token endpoint, answered "
                    "404 before every route"
                )
            if reaches_only(entry.prefix, entry.prefix_rewrite):
                raise ValueError(
                    f"{where}.prefix_rewrite: {entry.prefix_rewrite!r} sends every path of "
                    "the route to vLLM's token-in API, answered 404 before every route"
                )
            if name in names:
                raise ValueError(f"{where}.name: {name!r} is used by an earlier route")
            if any(
                e.prefix == entry.prefix and e.headers.items() <= entry.headers.items()
                for e in earlier
            ):
                raise ValueError(
                    f"{where}.prefix: {entry.prefix!r} is matched by an earlier route, "
                    "so this route could never be reached"
                )
            limit = entry.body_limit_bytes or self.body_limit_bytes
            if entry.responds and limit < MINT_BUFFER_MIN:
                raise ValueError(
                    f"{where}.body_limit_bytes: {limit} is below {MINT_BUFFER_MIN} (the "
                    "buffer limit of a route whose responses are processed bounds its "
                    "response as well)"
                )
            names.add(name)
            earlier.append(entry)
        return self

    @property
    def largest_body_bytes(self) -> int:
        """The largest body any route buffers (and sends the processor in one message)."""
        return max([self.body_limit_bytes, *(e.body_limit_bytes or 0 for e in self.routes)])

    @model_validator(mode="after")
    def _heap_holds_a_body(self) -> GeneratorInput:
        largest = self.largest_body_bytes
        if self.max_heap_size_bytes <= largest:
            raise ValueError(
                f"max_heap_size_bytes: {self.max_heap_size_bytes} does not exceed the largest "
                f"body buffer ({largest}); one such request alone would have Envoy answer "
                "every new request 503"
            )
        return self

    @model_validator(mode="after")
    def _peers_need_client_certificates(self) -> GeneratorInput:
        # Without a verified client certificate no request has a peer identity: a route
        # listing peers would never trust one, which is safe but not what was meant.
        for index, entry in enumerate(self.routes):
            if entry.read().peers and self.listener_tls is None:
                raise ValueError(
                    f"routes.{index}.policy.peers: needs listener_tls (client certificates "
                    "identify the peers)"
                )
        return self

    @model_validator(mode="after")
    def _pairs_share_a_tenant_source(self) -> GeneratorInput:
        # A proof binds the cache partition its mint route put the prompt in, and an
        # honor route of another refuses it (docs/trust.md#a-pair-knows-its-tenant): on
        # one listener every mint route pairs with every honor route (turns the other
        # way), so they name one tenant source, or none.
        policies = [entry.read() for entry in self.routes]
        mints = [(i, p.tenant) for i, p in enumerate(policies) if p.action is Action.MINT]
        for index, policy in enumerate(policies):
            if policy.action is not Action.HONOR:
                continue
            for at, tenant in mints:
                if tenant != policy.tenant:
                    raise ValueError(
                        f"routes.{index}.policy.tenant: this honor route names "
                        f"{_spelt(policy.tenant)} and the mint route routes.{at} names "
                        f"{_spelt(tenant)}; a proof binds the cache partition of its mint "
                        "route, so a prefill/decode pair names one tenant source (or none)"
                    )
        return self


def _spelt(source: TenantSource | None) -> str:
    return "no tenant source" if source is None else source.spelt


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


def read_input(path: Path) -> dict[str, Any]:
    """The mapping in ``path`` over its ``base`` chain, not yet validated."""
    return _read(path, ())


def _read(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    where = path.resolve()
    if where in seen:
        raise GeneratorError(f"{path}: the base chain returns to this file")
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise GeneratorError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, Mapping):
        raise GeneratorError(f"{path}: the document must be a mapping")
    own = dict(data)
    base = own.pop(BASE_KEY, None)
    if base is None:
        return own
    if not isinstance(base, str):
        raise GeneratorError(f"{path}: {BASE_KEY}: expected a path relative to this file")
    return _read(path.parent / base, (*seen, where)) | own
