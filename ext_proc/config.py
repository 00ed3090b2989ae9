"""The processor's one validated configuration object.

Built once at start-up (YAML file, then command-line overrides) and passed explicitly;
nothing reads the environment or files at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ext_proc.route_policy import DEFAULT_NAMESPACE

MiB = 1024 * 1024


class ConfigError(Exception):
    """The processor configuration is invalid; the message names the field."""


class Config(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    listen: str = Field("127.0.0.1:9000", min_length=1, description="gRPC address host:port")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Largest request body the processor will parse; larger bodies get a 413. The gRPC
    # receive limit is derived from it so grpcio's 4 MiB default never applies.
    max_body_bytes: int = Field(16 * MiB, gt=0, le=1024 * MiB)
    # Request-body bytes all streams of this process may hold at once; beyond it new
    # bodies get a 503 with retry-after. Bounds memory under many concurrent large bodies.
    inflight_budget_bytes: int = Field(256 * MiB, gt=0)
    # Time from the request headers to the end of the body (slow uploads get a 408).
    body_timeout_seconds: float = Field(60.0, gt=0)
    route_metadata_namespace: str = Field(DEFAULT_NAMESPACE, min_length=1)
    # Seconds in-flight streams get to finish after a stop signal.
    shutdown_grace_seconds: float = Field(5.0, ge=0)

    @property
    def grpc_message_limit(self) -> int:
        # A ProcessingRequest is the body plus a few KiB of headers and attributes.
        return self.max_body_bytes + MiB

    @model_validator(mode="after")
    def _budget_holds_one_body(self) -> Config:
        if self.inflight_budget_bytes < self.max_body_bytes:
            raise ValueError("inflight_budget_bytes must be at least max_body_bytes")
        return self

    @classmethod
    def load(cls, path: Path | None = None, **overrides: Any) -> Config:
        data: dict[str, Any] = {}
        if path is not None:
            try:
                loaded = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError) as exc:
                raise ConfigError(f"cannot read config file {path}: {exc}") from exc
            if loaded is not None and not isinstance(loaded, dict):
                raise ConfigError(f"config file {path} must hold a mapping")
            data.update(loaded or {})
        data.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ConfigError(f"invalid configuration: {problems}") from exc
