"""What the policy decided for one request (or a mint route's response): the values
the stream enforces and the edge reports. No behaviour beyond naming the action."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from ext_proc.core.errors import Refusal
from ext_proc.core.reasons import REFUSED, TRUSTED, UNSIGNED, UNTRUSTED, Reason
from ext_proc.core.vllm_request import KV_KEY, Path


@dataclass(frozen=True, slots=True)
class Allow:
    """Forward the body unchanged."""

    action: ClassVar[str] = "allow"
    reason: Reason
    id_count: int = 0


@dataclass(frozen=True, slots=True)
class Honor:
    """Forward the body unchanged: its kv_transfer_params are trusted and carry a proof,
    which goes on with them. The proof is no secret (whoever presents it holds it
    already), it is honored once (replay.py), and vLLM's connectors read only the keys
    they know (tests/conformance)."""

    action: ClassVar[str] = "honor"
    reason: Reason
    id_count: int = 0


@dataclass(frozen=True, slots=True)
class Strip:
    """Forward the body with ``keys`` removed from kv_transfer_params (None: the whole
    object) and the ``carriers`` (other members carrying transfer parameters) removed.
    ``honored``: the kv_transfer_params are trusted and stay as they are (an ``Honor``
    whose request also named other carriers, which go). ``connector``: the
    kv_transfer_params then written in their place (a mint route's connector request),
    as pairs. ``salted``: the body also gets a fresh ``cache_salt`` (a turn read back:
    the blocks it fills are reachable by no other request's prompt)."""

    keys: tuple[str, ...] | None
    reason: Reason
    id_count: int
    honored: bool = False
    carriers: tuple[Path, ...] = ()
    connector: tuple[tuple[str, Any], ...] | None = None
    salted: bool = False

    @property
    def action(self) -> str:
        return Honor.action if self.honored else "strip"

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
    reason: Reason
    id_count: int = 0


@dataclass(frozen=True, slots=True)
class Deny:
    action: ClassVar[str] = "deny"
    refusal: Refusal
    id_count: int = 0

    @property
    def reason(self) -> Reason:
        return self.refusal.reason


Decision = Allow | Honor | Strip | Mint | Deny
# The decision for a document without kv_transfer_params (or an empty one).
NO_PARAMS: Final = Allow(Reason.NO_TRANSFER_PARAMS)

# The reasons each action is reported with: the metrics export every pair from the
# start. Every reason is under at least one action (tests/core/test_reasons.py).
REASONS_BY_ACTION: Final[Mapping[str, frozenset[Reason]]] = {
    Allow.action: frozenset(
        {
            Reason.NO_BODY,
            Reason.NO_TRANSFER_PARAMS,
            Reason.NO_REUSED_IDS,
            Reason.TRUSTED_PEER,  # trusted parameters without a proof
            Reason.TRUSTED_ANY_CALLER,
            *UNSIGNED,
        }
    ),
    "strip": frozenset(
        {
            # A proof the record cannot vouch for refuses the request (a 503): never
            # a reason to forward without it.
            *(UNTRUSTED - {Reason.DENIED_BY_POLICY, Reason.PROOF_RECORD_UNAVAILABLE}),
            Reason.IGNORED_BY_UPSTREAM,
            Reason.CONNECTOR_WRITTEN,
            Reason.TURN_READ_BACK,
            Reason.NO_REUSED_IDS,  # other carriers of a caller whose keys are kept
        }
    ),
    Honor.action: TRUSTED,  # trusted parameters that carried a proof
    Deny.action: frozenset({*(UNTRUSTED - {Reason.STRIPPED_BY_POLICY}), *REFUSED}),
    Mint.action: frozenset({Reason.MINTED}),
}
