"""The token-id reuse policy as a pure function: route policy + document + evidence →
decision. Client-written kv_transfer_params are untrusted on every route; they are
honored only when proven, sent by a listed peer, or on a route that trusts any caller
(docs/trust.md).

No I/O, no logging, no exceptions, no mutation of its inputs: every outcome, refusals
included, is a value.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import orjson

from ext_proc import proof
from ext_proc.body import Document
from ext_proc.errors import Refusal, bad_request
from ext_proc.events import NO_PEER, Peer
from ext_proc.ids import RawIds
from ext_proc.proof import PROOF_KEY, KeySet
from ext_proc.route_policy import Action, RoutePolicy
from ext_proc.vllm_request import (
    IDS_KEY,
    KV_KEY,
    MAX_CARRIERS,
    Path,
    ignores_reused_ids,
    other_carriers,
    policed_keys,
)


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
    ``honored``: the parameters are trusted and only the proof goes."""

    keys: tuple[str, ...] | None
    reason: str
    id_count: int
    honored: bool = False
    carriers: tuple[Path, ...] = ()

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
NO_KEYS: Final = KeySet({}, None)


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the policy may weigh besides the document: who called, with which keys,
    when; ``digest`` renders the request's prompt digest on demand (only a proof needs
    it)."""

    digest: Callable[[], bytes]
    peer: Peer = NO_PEER
    keys: KeySet = NO_KEYS
    now: float = 0.0
    skew: float = 0.0


# Response ids are the deployment's own; only their shape is checked before signing.
_ANY_IDS: Final = RoutePolicy()


def _count(value: Any) -> int:
    if isinstance(value, RawIds):
        return value.count
    return len(value) if isinstance(value, list) else 0


# vLLM's token ids are 32-bit signed: without a route's vocab_size, no id at or above
# this bound can be a token of any model, and none is forwarded.
_TOKEN_ID_BOUND: Final = 2**31


def _invalid_ids(key: str, value: Any, policy: RoutePolicy) -> Refusal | None:
    """At least as strict as vLLM: a non-empty list of ints, each below the route's
    vocab_size (or, when it is unset, below 2**31), at most max_ids of them."""
    param = f"{KV_KEY}.{key}"
    if isinstance(value, RawIds):
        # Non-empty non-negative ints, read from the bytes (ids.py); the largest is
        # looked for only to name it in a refusal.
        too_many = _too_many(param, value.count, policy)
        if too_many is not None or not value.reaches(_bound(policy)):
            return too_many
        return _out_of_vocab(param, *value.largest(), policy)
    if not isinstance(value, list) or not value:
        return bad_request(
            f"{param} must be a non-empty list of integers", reason="ids_malformed", param=param
        )
    too_many = _too_many(param, len(value), policy)
    if too_many is not None:
        return too_many
    # Everything below runs in C (no per-id Python loop; about 3 ms for 128k ids).
    # array("Q") accepts exactly the ints in [0, 2**64), and bool, a subclass of int.
    # JSON true/false are not token ids: once every item is an int or a bool, orjson
    # writes the ints as digits and the bools as "true"/"false". The first "e" lies in
    # the first bool, and the commas before it (the only commas: no strings here)
    # give its index.
    try:
        array("Q", value)
    except (TypeError, OverflowError):
        index = _first_malformed(value)
        if index is not None:
            return _malformed(param, index)
        # ints of 2**64 and beyond are left to the bound check below
    else:
        written = orjson.dumps(value)
        first_bool = written.find(b"e")
        if first_bool >= 0:
            return _malformed(param, written.count(b",", 0, first_bool))
    highest = max(value)
    return _out_of_vocab(param, highest, value.index(highest), policy)


def _too_many(param: str, count: int, policy: RoutePolicy) -> Refusal | None:
    if policy.max_ids is not None and count > policy.max_ids:
        return bad_request(
            f"{param} has {count} ids; this route allows at most {policy.max_ids}",
            reason="ids_too_many",
            param=param,
        )
    return None


def _bound(policy: RoutePolicy) -> int:
    """The least id the route refuses."""
    return policy.vocab_size if policy.vocab_size is not None else _TOKEN_ID_BOUND


def _out_of_vocab(param: str, highest: int, index: int, policy: RoutePolicy) -> Refusal | None:
    """The refusal when ``highest``, the largest id (first at ``index``), is not a token
    of the route's vocabulary."""
    if highest < _bound(policy):
        return None
    if policy.vocab_size is not None:
        why = f"is outside the vocabulary (size {policy.vocab_size})"
    else:
        why = f"is not a token id (token ids are below 2**31 = {_TOKEN_ID_BOUND})"
    return bad_request(
        f"{param}[{index}] = {highest} {why}", reason="ids_out_of_vocab", param=param
    )


def _first_malformed(value: list[Any]) -> int | None:
    """The index of an item that is not an int (bool excluded) or is negative; None
    when there is none."""
    types = set(map(type, value))
    if types != {int}:
        kinds = list(map(type, value))
        return min(kinds.index(kind) for kind in types - {int})
    lowest = min(value)
    return None if lowest >= 0 else value.index(lowest)


def _malformed(param: str, index: int) -> Refusal:
    return bad_request(
        f"{param}[{index}] is not a non-negative integer", reason="ids_malformed", param=param
    )


def _trusted_caller(policy: RoutePolicy, evidence: Evidence) -> str:
    """Why the caller is trusted ("trusted_*"), or why it is not: whatever it sends is
    then trusted only where a proof covers it."""
    if policy.action not in (Action.HONOR, Action.MINT):
        return "denied_by_policy" if policy.action is Action.DENY else "stripped_by_policy"
    if policy.action is Action.HONOR and policy.trust_any_caller:
        return "trusted_any_caller"
    peer = evidence.peer
    # An identity matches only one of its own type (a DNS SAN never stands for a URI SAN).
    if policy.peers and peer.mtls and not policy.peers.isdisjoint(peer.identities):
        return "trusted_peer"
    return "peer_not_listed" if policy.peers else "unproven"


def _trusted(policy: RoutePolicy, params: dict[str, Any], evidence: Evidence) -> str:
    """Why the parameters are trusted ("trusted_*"), or why they are not."""
    caller = _trusted_caller(policy, evidence)
    if caller.startswith("trusted_") or policy.action is not Action.HONOR:
        return caller
    why = proof.verify(evidence.keys, params, evidence.digest(), evidence.now, evidence.skew)
    if why is None:
        return "trusted_proof"
    if why == "proof_missing" and policy.peers:
        return "peer_not_listed"
    return why


def _untrusted(policy: RoutePolicy, params: dict[str, Any], reason: str, count: int) -> Decision:
    keys = policed_keys(params)
    if policy.untrusted_denied:
        param = f"{KV_KEY}.{keys[0]}" if keys else KV_KEY
        return Deny(
            bad_request(f"{param} is not accepted on this route", reason=reason, param=param),
            count,
        )
    if not policy.keep_other_keys:
        return Strip(None, reason, count)
    drop = (*keys, PROOF_KEY) if PROOF_KEY in params else keys
    return Strip(drop, reason, count) if drop else Allow("no_reused_ids")


def decide(
    policy: RoutePolicy,
    document: Document,
    evidence: Evidence,
    carriers: tuple[Path, ...] | None = None,
) -> Decision:
    """The decision for a request ``document``. ``carriers``: its other members that
    carry transfer parameters (``vllm_request.other_carriers``), when the caller has
    shown there are none cheaply; None: looked for here."""
    decision = _decide_params(policy, document, evidence)
    found = other_carriers(document, MAX_CARRIERS + 1) if carriers is None else carriers
    if not found or isinstance(decision, Deny):
        return decision
    # Only the top-level kv_transfer_params can be proven; every other carrier is
    # trusted only from a trusted caller, and untrusted like a client's parameters.
    caller = _trusted_caller(policy, evidence)
    if caller.startswith("trusted_"):
        return decision
    if len(found) > MAX_CARRIERS:
        return Deny(
            bad_request(
                f"request carries more than {MAX_CARRIERS} members of transfer parameters",
                reason="carriers_too_many",
            ),
            decision.id_count,
        )
    if policy.untrusted_denied:
        param = ".".join(map(str, found[0]))
        return Deny(
            bad_request(f"{param} is not accepted on this route", reason=caller, param=param),
            decision.id_count,
        )
    if isinstance(decision, Strip):
        return Strip(
            decision.keys,
            decision.reason,
            decision.id_count,
            decision.honored,
            (*decision.carriers, *found),
        )
    reason = caller if decision is NO_PARAMS else decision.reason
    return Strip((), reason, decision.id_count, carriers=found)


def _decide_params(policy: RoutePolicy, document: Document, evidence: Evidence) -> Decision:
    """The decision on the top-level kv_transfer_params alone."""
    params = document.get(KV_KEY)
    if params is None:
        return NO_PARAMS
    if not isinstance(params, dict):
        return Deny(
            bad_request(
                f"{KV_KEY} must be a JSON object", reason="kv_params_not_object", param=KV_KEY
            )
        )
    if not params:
        return NO_PARAMS
    keys = policed_keys(params)
    count = max((_count(params[key]) for key in keys), default=0)
    reason = _trusted(policy, params, evidence)
    if not reason.startswith("trusted_"):
        return _untrusted(policy, params, reason, count)
    proof_key = (PROOF_KEY,) if PROOF_KEY in params else ()
    # vLLM treats a null value as "no ids"; stripping leaves the same meaning.
    if keys and (ignores_reused_ids(document) or any(params[key] is None for key in keys)):
        return Strip((*keys, *proof_key), "ignored_by_upstream", count)
    for key in keys:
        refusal = _invalid_ids(key, params[key], policy)
        if refusal is not None:
            return Deny(refusal, count)
    if proof_key:
        return Strip(proof_key, reason, count, honored=True)
    return Allow(reason, count)


def mint_response(
    document: Document, digest: bytes, keys: KeySet, expiry: int
) -> tuple[Decision, dict[str, Any] | None]:
    """What a prefill response's ``kv_transfer_params`` become: the connector's keys
    plus the response's ``prompt_token_ids``, signed for the request's ``digest``.
    The new object, or None (with the reason) when there is nothing to mint."""
    ids = document.get(IDS_KEY)
    connector = document.get(KV_KEY)
    minted: dict[str, Any] = {}
    if isinstance(connector, dict):
        minted = {k: v for k, v in connector.items() if k != PROOF_KEY}
    if ids is not None:
        if _invalid_ids(IDS_KEY, ids, _ANY_IDS) is not None:
            return Allow("response_ids_malformed"), None
        minted[IDS_KEY] = ids
    if not minted:
        return Allow("nothing_to_mint"), None
    token = proof.mint(keys, minted, digest, expiry)
    if token is None:
        return Allow("no_signing_key" if keys.signing is None else "not_renderable"), None
    return Mint("minted", _count(ids)), {**minted, PROOF_KEY: token}
