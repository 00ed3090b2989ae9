"""What the policy decided for one request (or a mint route's response): the values
the stream enforces and the edge reports. No behaviour beyond naming the action."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Final

from ext_proc.core.errors import Refusal
from ext_proc.core.vllm_request import KV_KEY, Path


@dataclass(frozen=True, slots=True)
class Allow:
    """Forward the body unchanged."""

    action: ClassVar[str] = "allow"
    reason: str
    id_count: int = 0


@dataclass(frozen=True, slots=True)
class Strip:
    """Forward the body with ``keys`` removed from kv_transfer_params (None: the whole
    object) and the ``carriers`` (other members carrying transfer parameters) removed.
    ``honored``: the parameters are trusted and only the proof goes. ``connector``: the
    kv_transfer_params then written in their place (a mint route's connector request),
    as pairs."""

    keys: tuple[str, ...] | None
    reason: str
    id_count: int
    honored: bool = False
    carriers: tuple[Path, ...] = ()
    connector: tuple[tuple[str, Any], ...] | None = None

    @property
    def action(self) -> str:
        return "honor" if self.honored else "strip"

    @property
    def paths(self) -> tuple[Path, ...]:
        """Every member the forwarded body goes without."""
        if self.keys is None:
            return ((KV_KEY,), *self.carriers)
        return (*((KV_KEY, key) for key in self.keys), *self.carriers)


@dataclass(frozen=True, slots=True)
class Mint:
    """The response's transfer parameters were signed (the prefill leg)."""

    action: ClassVar[str] = "mint"
    reason: str
    id_count: int = 0


@dataclass(frozen=True, slots=True)
class Deny:
    action: ClassVar[str] = "deny"
    refusal: Refusal
    id_count: int = 0

    @property
    def reason(self) -> str:
        return self.refusal.reason


Decision = Allow | Strip | Mint | Deny
# The decision for a document without kv_transfer_params (or an empty one).
NO_PARAMS: Final = Allow("no_transfer_params")
