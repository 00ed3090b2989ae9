"""The processor's one validated configuration object.

Built once at start-up and passed explicitly; nothing reads the environment or files at
import time. Sources, later ones winning: the YAML file, ``EXT_PROC_<FIELD>``
environment variables (values read as YAML scalars: ``EXT_PROC_WORKERS=2``), then
command-line flags.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ext_proc.core import memory, replay
from ext_proc.core.address import HostPort, check_listen
from ext_proc.core.route_policy import DEFAULT_NAMESPACE
from ext_proc.core.validation import problems

MiB = 1024 * 1024
ENV_PREFIX = "EXT_PROC_"


class ConfigError(Exception):
    """The processor configuration is invalid; the message names the field."""


class Tls(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    cert_file: str = Field(min_length=1)
    key_file: str = Field(min_length=1)
    # When set, clients (Envoy) must present a certificate signed by this CA (mTLS).
    client_ca_file: str | None = None


class ProofKey(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    file: str = Field(min_length=1)


class Proof(BaseModel):
    """Signed transfer parameters (docs/trust.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    # The first key signs; every key verifies, so keys rotate without downtime.
    keys: tuple[ProofKey, ...] = Field((), strict=False)  # YAML gives a list
    # Lifetime of a minted proof: the decode leg follows the prefill leg within seconds.
    # A proof minted for longer (by a processor configured otherwise) is refused here.
    ttl_seconds: int = Field(20, gt=0, le=3600)
    # How far apart the clocks of any two processors may be, minters and verifiers alike
    # (docs/trust.md#clocks).
    clock_skew_seconds: int = Field(5, ge=0, le=300)
    # How long the prefill server's KV connector keeps a finished request's blocks for
    # the decode to read before it frees them (vLLM's NIXL connector: 30 s in every
    # release from 0.27.0 to 0.32.0). A proof must never be honored past it: the blocks
    # may hold another request's KV by then. Raise it only with the lease your vLLM
    # runs with.
    kv_lease_seconds: int = Field(30, gt=0, le=86400)
    # Lifetime of a turn proof (minted on a decode server's response, honored on the
    # next turn's prefill leg; docs/trust.md#turns): the client takes the next turn,
    # so minutes rather than seconds. A turn proof minted for longer is refused here.
    turn_ttl_seconds: int = Field(300, gt=0, le=86400)
    # How long the decode server's KV connector keeps a turn's blocks for the next turn
    # to read (vLLM's NIXL decoder_kv_blocks_ttl: 480 s by default, a plain timeout).
    # A turn proof must never be honored past it.
    decode_blocks_ttl_seconds: int = Field(480, gt=0, le=86400)
    # The record of spent proofs (each is honored once): "" for a table shared by this
    # processor's workers; redis://host:port/0 (rediss://, unix://) when several
    # processors serve the same routes (a Redis keeps one record, in database 0).
    record: str = ""
    # A file holding the Redis password of proof.record (a mounted Secret; one trailing
    # newline is ignored): the credential stays out of the configuration file, which is
    # often a ConfigMap. The user name, when not default, is the URL's
    # (redis://ext-proc@host:6379/0); a URL that holds a password as well is refused.
    record_password_file: str | None = Field(None, min_length=1)
    # The local table's size in proofs (bounded memory, charged to the in-flight
    # budget): enough for every proof honored within ttl_seconds + 3 x clock_skew.
    record_slots: int = Field(65536, ge=32, le=1 << 24)
    # The longest one Redis command may take; past it the proof is not honored.
    record_timeout_seconds: float = Field(0.25, gt=0, le=5)

    @property
    def terms(self) -> replay.Terms:
        """What this processor's entries in a record of spent proofs rest on."""
        return replay.Terms(self.clock_skew_seconds)

    @model_validator(mode="after")
    def _distinct(self) -> Proof:
        ids = [key.id for key in self.keys]
        if len(set(ids)) != len(ids):
            raise ValueError("proof key ids must be distinct")
        # A processor whose clock is up to clock_skew behind the minting one's honors a
        # proof until ttl + 2 x skew after it was minted.
        honored_for = self.ttl_seconds + 2 * self.clock_skew_seconds
        if honored_for > self.kv_lease_seconds:
            raise ValueError(
                f"proof.ttl_seconds + 2 x proof.clock_skew_seconds ({honored_for}) must not "
                f"exceed proof.kv_lease_seconds ({self.kv_lease_seconds}): a proof honored "
                "after the connector's lease reads KV blocks that may hold another "
                "request's; set kv_lease_seconds to the lease your vLLM runs with"
            )
        turn_for = self.turn_ttl_seconds + 2 * self.clock_skew_seconds
        if turn_for > self.decode_blocks_ttl_seconds:
            raise ValueError(
                f"proof.turn_ttl_seconds + 2 x proof.clock_skew_seconds ({turn_for}) must "
                f"not exceed proof.decode_blocks_ttl_seconds "
                f"({self.decode_blocks_ttl_seconds}): a turn proof honored after the "
                "decode server freed its blocks reads blocks that may hold another "
                "request's KV; set decode_blocks_ttl_seconds to your vLLM's "
                "decoder_kv_blocks_ttl"
            )
        if self.record:
            record_url_shape(self.record)
        if self.record_password_file is not None:
            if not self.record:
                raise ValueError("proof.record_password_file needs a Redis proof.record")
            if urlsplit(self.record).password is not None:
                raise ValueError(
                    "proof.record holds a password and proof.record_password_file names "
                    "another: give it once, in the file"
                )
        if self.record and not names_database_zero(self.record):
            raise ValueError(
                "proof.record must name database 0 or none (redis://host:port, "
                "redis://host:port/0, no db= parameter): a Redis keeps one record, so "
                "every processor that shares it reaches the same one (processors on two "
                "databases of one Redis would keep two records, a proof honored in each)"
            )
        return self


class Tenants(BaseModel):
    """Tenants' cache partitions (docs/trust.md#tenants)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    # A file of at least 32 secret bytes: each tenant's cache_salt is an HMAC under it,
    # so no client predicts another tenant's salt, nor one deployment's from another's.
    # Shared by every processor in front of the same engines. Without it, a route that
    # names a tenant source refuses every request (500 tenant_key_missing).
    key_file: str | None = Field(None, min_length=1)


def record_url_shape(url: str) -> None:
    """``ValueError`` naming what ``url`` lacks to name a Redis: a redis:// or
    rediss:// URL with a host and a port from 1 to 65535 (6379 when none), or a
    unix:// URL with a socket path. Whether it answers is ``check-config --connect``'s
    (a Redis that is down is an outage, not a configuration)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix") or not url.startswith(f"{parts.scheme}://"):
        raise ValueError("proof.record must be empty or a redis://, rediss:// or unix:// URL")
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("proof.record: a unix:// URL names the socket's path")
        return
    if not parts.hostname:
        raise ValueError(f"proof.record: a {parts.scheme}:// URL names a host")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(
            f"proof.record: the port must be a number from 1 to 65535 (or none: 6379), "
            f"not {parts.netloc.rpartition(':')[2]!r}"
        )


def names_database_zero(url: str) -> bool:
    """Whether a Redis client given ``url`` selects database 0: no ``db`` query
    parameter, and for redis:// and rediss:// a path that is empty, ``/`` or ``/0``
    (redis-py reads a database from either; anything else is refused, not guessed)."""
    parts = urlsplit(url)
    if "db" in parse_qs(parts.query, keep_blank_values=True):
        return False
    return parts.scheme == "unix" or unquote(parts.path) in ("", "/", "/0")


class Tracing(BaseModel):
    """OpenTelemetry spans of the processor's decisions (docs/operations.md#traces).

    Off by default: when off, nothing of OpenTelemetry is imported and a request pays
    one attribute test. On, it needs the ``tracing`` extra of the package."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    enabled: bool = False
    # The OTLP/gRPC collector, host:port (plain text: a collector beside the processor,
    # as Envoy's own tracer reaches one).
    endpoint: str = "127.0.0.1:4317"
    # The share of traces recorded when no parent says (a request Envoy did not trace).
    # A request whose traceparent carries a decision follows it: Envoy's tracer samples,
    # the processor's span joins exactly the traces Envoy records.
    sample_ratio: float = Field(1.0, ge=0, le=1, strict=False)
    # The ``service.name`` resource attribute of every span.
    service_name: str = Field("ext-proc-token-policy", min_length=1)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        try:
            HostPort.parse(value)
        except ValueError as exc:
            raise ValueError(f"tracing.endpoint must be host:port: {exc}") from None
        return value


class Config(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    # gRPC address: host:port, or unix:/path/to/socket.
    listen: str = Field("127.0.0.1:9000", min_length=1)
    tls: Tls | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Processes under one supervisor, worker i serving the listen port plus i (Envoy lists
    # each as an endpoint of the processor cluster: ext_proc/edge/supervisor.py).
    workers: int = Field(1, ge=1, le=64)
    # The asyncio event loop under grpc.aio. uvloop, measured side by side (bench/, 2 KiB,
    # two runs each): 6-12% more requests/s at concurrency 32 with one message per
    # request, 1-5% with two; p50 at concurrency 1 within 5%.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    # Largest request body the processor will parse; larger bodies get a 413. The gRPC
    # receive limit is derived from it so grpcio's 4 MiB default never applies.
    max_body_bytes: int = Field(16 * MiB, gt=0, le=1024 * MiB)
    # Most JSON values one body may hold (counted from its bytes before parsing: every
    # , : [ { plus one, strings included); more is a 413 (body_too_complex). Bounds the
    # memory and CPU parsing one body can take (ext_proc/core/memory.py).
    max_json_values: int = Field(memory.MAX_JSON_VALUES, gt=0)
    # Memory all streams of this process may hold for bodies at once, in the units of
    # ext_proc/core/memory.py (a body costs 12-20 bytes per byte plus 80 per value);
    # beyond it new bodies get a 503 with retry-after. Bytes that have not arrived are
    # not counted.
    inflight_budget_bytes: int = Field(256 * MiB, gt=0)
    # Time from the request headers to the end of the body (slow uploads get a 408).
    body_timeout_seconds: float = Field(60.0, gt=0)
    # Audit mode for every route: decisions are logged, counted and exported, requests
    # pass unchanged. Routes can also opt in one by one (metadata audit: true).
    audit: bool = False
    # Prometheus /metrics address (host:port); empty disables the endpoint.
    metrics_listen: str = "127.0.0.1:9464"
    route_metadata_namespace: str = Field(DEFAULT_NAMESPACE, min_length=1)
    proof: Proof = Field(default_factory=lambda: Proof.model_validate({}))
    tracing: Tracing = Field(default_factory=lambda: Tracing.model_validate({}))
    tenants: Tenants = Field(default_factory=lambda: Tenants.model_validate({}))
    # After a stop signal: health reports NOT_SERVING for drain_seconds while streams
    # are still accepted (so Envoy's health checks move traffic away), then streams are
    # still accepted and served until none comes (the gateway moved away) or
    # shutdown_grace_seconds have passed; what is open then is ended.
    drain_seconds: float = Field(5.0, ge=0)
    shutdown_grace_seconds: float = Field(5.0, ge=0)

    @property
    def grpc_message_limit(self) -> int:
        # A ProcessingRequest is the body plus a few KiB of headers and attributes.
        return self.max_body_bytes + MiB

    @property
    def record_bytes(self) -> int:
        """What the local record of spent proofs holds (none with Redis)."""
        return 0 if self.proof.record else replay.table_bytes(self.proof.record_slots)

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        largest = memory.largest(self.max_body_bytes, self.max_json_values)
        if self.inflight_budget_bytes < largest + self.record_bytes:
            raise ValueError(
                f"inflight_budget_bytes must hold the largest admissible body and the record "
                f"of spent proofs: at least {largest + self.record_bytes} for "
                f"max_body_bytes {self.max_body_bytes}, max_json_values "
                f"{self.max_json_values} (ext_proc/core/memory.py) and proof.record_slots "
                f"{self.proof.record_slots}"
            )
        if self.workers > 1 and self.listen.startswith("unix:"):
            raise ValueError("workers > 1 needs a TCP listen address (worker i serves port + i)")
        return self

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        return check_listen(value)

    @field_validator("metrics_listen")
    @classmethod
    def _metrics_listen(cls, value: str) -> str:
        if value:
            try:
                HostPort.parse(value, allow_zero=True)
            except ValueError as exc:
                raise ValueError(f"metrics_listen must be host:port or empty: {exc}") from None
        return value

    @property
    def metrics_address(self) -> HostPort | None:
        """Where the Prometheus endpoint listens; None when disabled."""
        return HostPort.parse(self.metrics_listen, allow_zero=True) if self.metrics_listen else None

    @classmethod
    def load(
        cls,
        path: Path | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> Config:
        data: dict[str, Any] = {}
        if path is not None:
            try:
                loaded = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError) as exc:
                raise ConfigError(f"cannot read config file {path}: {exc}") from exc
            if loaded is not None and not isinstance(loaded, dict):
                raise ConfigError(f"config file {path} must hold a mapping")
            data.update(loaded or {})
        for key, value in (environ if environ is not None else os.environ).items():
            field = key.removeprefix(ENV_PREFIX).lower()
            # Other EXT_PROC_* variables (EXT_PROC_CACHE, ...) belong to other tools.
            if key.startswith(ENV_PREFIX) and field in cls.model_fields:
                try:
                    data[field] = yaml.safe_load(value) if value else value
                except yaml.YAMLError as exc:
                    raise ConfigError(f"{key}: cannot read {value!r}: {exc}") from exc
        data.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(f"invalid configuration: {problems(exc)}") from exc
