"""The token-id reuse policy as a pure function: route policy + document + evidence →
decision. Client-written kv_transfer_params are untrusted on every route; they are
honored only when proven, sent by a listed peer, or on a route that trusts any caller
(docs/trust.md).

No I/O, no logging, no exceptions, no mutation of its inputs: every outcome, refusals
included, is a value.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ext_proc.core import caller, connector_bounds, declared, proof, turns
from ext_proc.core.caller import Caller
from ext_proc.core.decisions import NO_PARAMS, Allow, Decision, Deny, Honor, Mint, Strip
from ext_proc.core.errors import PayloadTooLarge, Refusal, bad_request
from ext_proc.core.events import NO_PEER, Peer
from ext_proc.core.ids import MAX_BOUND, Ids, Kind
from ext_proc.core.proof import NO_KEYS, PROOF_KEY, KeySet
from ext_proc.core.reading import Document
from ext_proc.core.reasons import TRUSTED, Reason
from ext_proc.core.route_policy import Accept, Action, RoutePolicy
from ext_proc.core.vllm_request import (
    IDS_KEY,
    KV_KEY,
    MAX_CARRIERS,
    MAX_SEARCHED,
    Path,
    embeddings,
    ignores_reused_ids,
    other_carriers,
    policed_keys,
)


# Made per request on a route that weighs evidence and only read after (a changed copy
# is made with dataclasses.replace): a plain slotted class, as a frozen dataclass sets
# each field through object.__setattr__, several times the cost of the assignment.
@dataclass(slots=True)
class Evidence:
    """What the policy may weigh besides the document: who called, with which keys,
    when; ``digest`` renders the request's prompt digest on demand (only a proof needs
    it). ``spent``: why a proof that verifies is not honored (the record of spent
    proofs' verdict, ``replay.Verdict``); None: not asked yet, or honored."""

    digest: Callable[[], bytes]
    peer: Peer = NO_PEER
    keys: KeySet = NO_KEYS
    now: float = 0.0
    skew: float = 0.0
    # The longest lifetime this deployment mints proofs for (proof.ttl_seconds).
    lifetime: float = math.inf
    spent: Reason | None = None
    # The prompt digest of the request with only its first n messages (a turn proof's
    # conversation), and the longest lifetime of a turn proof (proof.turn_ttl_seconds).
    prefix: Callable[[int], bytes] = lambda n: _no_digest()
    turn_lifetime: float = math.inf
    # The cache partition the route puts the request in (``Request.tag``): a proof is
    # honored only in the one it was minted in.
    partition: str = proof.NO_PARTITION


def _no_digest() -> bytes:
    raise AssertionError("a strip or deny route weighs no evidence")


# The evidence of a request on a route that weighs none: strip and deny decide on the
# route alone (``caller.of``), so nothing is gathered for them.
NO_EVIDENCE: Final = Evidence(_no_digest)
# The reason of a decision that honors parameters because their proof verified: the
# proof is then spent (replay.py) before the decision stands.
HONORED_PROOF: Final = Reason.TRUSTED_PROOF
# The reasons of every decision that spends a proof: a decode leg's, and a turn's read
# back on the next turn's prefill leg.
SPENDS_PROOF: Final = frozenset({HONORED_PROOF, Reason.TURN_READ_BACK})
# The actions whose decisions read the evidence.
WEIGHS_EVIDENCE: Final = frozenset({Action.HONOR, Action.MINT})


# Response ids are the deployment's own; only their shape is checked before signing.
_ANY_IDS: Final = RoutePolicy()


def ids_bound(policy: RoutePolicy) -> int:
    """The bound a route's token ids are checked against: its vocab_size, else vLLM's."""
    return policy.vocab_size if policy.vocab_size is not None else MAX_BOUND


def _invalid_ids(key: str, ids: Ids, policy: RoutePolicy) -> Refusal | None:
    """At least as strict as vLLM: a non-empty list of ints, each below the route's
    vocab_size (or, when it is unset, below 2**31), at most max_ids of them."""
    param = f"{KV_KEY}.{key}"
    if not ids.count:
        return bad_request(
            f"{param} must be a non-empty list of integers",
            reason=Reason.IDS_MALFORMED,
            param=param,
        )
    if policy.max_ids is not None and ids.count > policy.max_ids:
        return bad_request(
            f"{param} has {ids.count} ids; this route allows at most {policy.max_ids}",
            reason=Reason.IDS_TOO_MANY,
            param=param,
        )
    fault = ids.fault(ids_bound(policy))
    if fault is None:
        return None
    if fault.kind is Kind.MALFORMED:
        return bad_request(
            f"{param}[{fault.index}] is not a non-negative integer",
            reason=Reason.IDS_MALFORMED,
            param=param,
        )
    if policy.vocab_size is not None:
        why = f"is outside the vocabulary (size {policy.vocab_size})"
    else:
        why = f"is not a token id (token ids are below 2**31 = {MAX_BOUND})"
    return bad_request(
        f"{param}[{fault.index}] = {fault.value} {why}", reason=Reason.IDS_OUT_OF_VOCAB, param=param
    )


def _trusted(
    policy: RoutePolicy, params: dict[str, Any], evidence: Evidence, sender: Caller
) -> Reason:
    """Why the parameters are trusted (``reasons.TRUSTED``), or why they are not: the
    caller's trust, else (on an honor route) their proof's (``proof.verify``)."""
    if sender.trusted or policy.action is not Action.HONOR:
        return sender.reason
    claim = proof.claim(evidence.keys, params)
    if isinstance(claim, Reason):
        return Reason.PEER_NOT_LISTED if claim is Reason.PROOF_MISSING and policy.peers else claim
    # The prompt digest is rendered only for a proof that names a known key.
    why = claim.settle(
        evidence.digest(),
        evidence.now,
        evidence.skew,
        evidence.lifetime,
        partition=evidence.partition,
    )
    return (evidence.spent or HONORED_PROOF) if why is None else why


def _untrusted(
    policy: RoutePolicy, params: dict[str, Any], reason: Reason, count: int, keys: tuple[str, ...]
) -> Decision:
    """The decision on untrusted parameters whose policed keys are ``keys``."""
    if policy.untrusted_denied:
        param = f"{KV_KEY}.{keys[0]}" if keys else KV_KEY
        return Deny(
            bad_request(f"{param} is not accepted on this route", reason=reason, param=param),
            count,
        )
    if not policy.keep_other_keys:
        return Strip(keys=None, reason=reason, id_count=count)
    drop = (*keys, PROOF_KEY) if PROOF_KEY in params else keys
    if not drop:
        return Allow(Reason.NO_REUSED_IDS)
    return Strip(keys=drop, reason=reason, id_count=count)


def decide(
    policy: RoutePolicy,
    document: Document,
    evidence: Evidence,
    carriers: tuple[Path, ...] | None = None,
    sender: caller.Caller | None = None,
    *,
    body: declared.Body | None = None,
) -> Decision:
    """The decision for a request ``document``. ``carriers``: its other members that
    carry transfer parameters (``vllm_request.other_carriers``), when the caller has
    shown there are none cheaply (then it holds no prompt embeddings either); None:
    both looked for here. ``sender``: who the caller is
    (``caller.of`` for this route and ``evidence.peer``), when the request already
    knows; None: decided here, once for every part of the decision. ``body``: what the
    route's engine declares for the endpoint (a ``strict_body`` route): an untrusted
    caller's undeclared members go too."""
    if sender is None:
        sender = caller.of(policy, evidence.peer)
    turn = None if policy.connector is None else _turn(policy, document, evidence)
    # A turn that verified is judged as a request without parameters: they go, and
    # what the route writes in their place carries its read-back keys.
    judged = _without_params(document) if isinstance(turn, turns.Honored) else document
    decision = _decide_carriers(policy, judged, evidence, sender, carriers)
    if body is not None and not sender.trusted and not isinstance(decision, Deny):
        decision = _strict(policy, document, body, decision, sender)
    if policy.connector is None or isinstance(decision, Deny):
        return decision
    if sender.trusted and turn is None:
        return decision  # a listed peer's own parameters are its own
    # Whatever the caller sent goes; the route's connector request is written instead,
    # so no caller steers the prefill server's connector and none need be trusted. A
    # turn object goes too, even a peer's: it is always what this gateway handed to a
    # client, and is checked and spent like any.
    connector, salted, reason = policy.connector, False, Reason.CONNECTOR_WRITTEN
    if isinstance(turn, turns.Honored):
        # Signed by this deployment, yet held to the bounds like every honored object.
        refused = connector_bounds.refusal(dict(turn.connector))
        if refused is not None:
            return Deny(refused, decision.id_count)
        connector, salted, reason = turn.connector, True, Reason.TURN_READ_BACK
    elif turn is not None:
        reason = turn
    if isinstance(decision, Strip):
        if turn is None:
            reason = decision.reason
        return dataclasses.replace(
            decision, keys=None, honored=False, connector=connector, salted=salted, reason=reason
        )
    return Strip(
        keys=None, reason=reason, id_count=decision.id_count, connector=connector, salted=salted
    )


def _turn(
    policy: RoutePolicy, document: Document, evidence: Evidence
) -> turns.Honored | Reason | None:
    """A turn proof in a request on a connector route (whoever sent it): what honoring
    it writes, or why it is not honored; None when there is none."""
    params = document.get(KV_KEY)
    if policy.connector is None or not isinstance(params, dict):
        return None
    if not turns.is_turn(params):
        return None
    found = turns.honor(
        params,
        document,
        keys=evidence.keys,
        prefix=evidence.prefix,
        now=evidence.now,
        skew=evidence.skew,
        lifetime=evidence.turn_lifetime,
        connector=policy.connector,
        partition=evidence.partition,
    )
    if isinstance(found, turns.Honored) and evidence.spent is not None:
        return evidence.spent
    return found


def _without_params(document: Document) -> Document:
    return {key: value for key, value in document.items() if key != KV_KEY}


def _decide_carriers(
    policy: RoutePolicy,
    document: Document,
    evidence: Evidence,
    sender: Caller,
    carriers: tuple[Path, ...] | None,
) -> Decision:
    """The decision on every carrier of transfer parameters (``decide``)."""
    decision = _decide_params(policy, document, evidence, sender)
    if isinstance(decision, Deny):
        return decision
    found = other_carriers(document, MAX_CARRIERS + 1) if carriers is None else carriers
    if found is None:
        return Deny(_too_complex(), decision.id_count)
    if not sender.trusted and len(found) > MAX_CARRIERS:
        return Deny(
            bad_request(
                f"request carries more than {MAX_CARRIERS} members of transfer parameters",
                reason=Reason.CARRIERS_TOO_MANY,
            ),
            decision.id_count,
        )
    if carriers is None and not sender.trusted and Accept.EMBEDDINGS not in policy.accept:
        refused = _embedded(document)
        if refused is not None:
            return Deny(refused, decision.id_count)
    if not found:
        return decision
    # Only the top-level kv_transfer_params can be proven; every other carrier is
    # trusted only from a trusted caller, and untrusted like a client's parameters.
    if sender.trusted:
        # Kept for a trusted caller, and read by the connector like the top-level object
        # (vLLM takes extra_args' own when that is absent): the same bounds.
        every = found if len(found) <= MAX_CARRIERS else other_carriers(document, sys.maxsize)
        if every is None:
            return Deny(_too_complex(), decision.id_count)
        refused = _carried_out_of_bounds(document, every)
        return decision if refused is None else Deny(refused, decision.id_count)
    if policy.untrusted_denied:
        param = ".".join(map(str, found[0]))
        return Deny(
            bad_request(
                f"{param} is not accepted on this route", reason=sender.reason, param=param
            ),
            decision.id_count,
        )
    if isinstance(decision, Strip):
        return dataclasses.replace(decision, carriers=(*decision.carriers, *found))
    return _removing(decision, found, sender)


def _embedded(document: Document) -> Refusal | None:
    """The refusal of the first prompt embeddings ``document`` holds, if any."""
    embedded = embeddings(document)
    if embedded is None:
        return _too_complex()
    if not embedded:
        return None
    param = ".".join(map(str, embedded[0]))
    return bad_request(
        f"{param} carries prompt embeddings, which this route does not accept from this caller",
        reason=Reason.EMBEDDINGS_REFUSED,
        param=param,
    )


def _removing(decision: Decision, found: tuple[Path, ...], sender: Caller) -> Strip:
    """An Allow or Honor ``decision`` (its parameters untouched) that removes ``found``."""
    if isinstance(decision, Honor):
        count = decision.id_count
        return Strip(keys=(), reason=decision.reason, id_count=count, honored=True, carriers=found)
    reason = sender.reason if decision is NO_PARAMS else decision.reason
    return Strip(keys=(), reason=reason, id_count=decision.id_count, carriers=found)


def _too_complex() -> Refusal:
    return PayloadTooLarge(
        f"request body has more than {MAX_SEARCHED} objects and lists to search for carriers",
        reason=Reason.BODY_TOO_COMPLEX,
    ).refusal()


def _strict(
    policy: RoutePolicy, document: Document, body: declared.Body, decision: Decision, sender: Caller
) -> Decision:
    """``decision`` with the members ``body`` does not declare removed, or refused where
    the route denies untrusted parameters (never more than ``MAX_CARRIERS``)."""
    found = declared.undeclared(document, body, MAX_CARRIERS + 1)
    if not found:
        return decision
    if len(found) > MAX_CARRIERS:
        message = f"request has more than {MAX_CARRIERS} members its endpoint does not declare"
        return Deny(bad_request(message, reason=Reason.UNDECLARED_MEMBER), decision.id_count)
    if policy.untrusted_denied:
        param = ".".join(map(str, found[0]))
        return Deny(
            bad_request(
                f"{param} is not a member this route's engine ({policy.strict_body}) declares "
                "for this endpoint",
                reason=Reason.UNDECLARED_MEMBER,
                param=param,
            ),
            decision.id_count,
        )
    if isinstance(decision, Strip):
        # An engine that declares no kv_transfer_params loses the whole object.
        keys = None if (KV_KEY,) in found else decision.keys
        inner = tuple(path for path in found if path != (KV_KEY,))
        carriers = _outermost((*decision.carriers, *inner))
        return dataclasses.replace(decision, keys=keys, carriers=carriers)
    return _removing(decision, found, sender)


def _outermost(paths: tuple[Path, ...]) -> tuple[Path, ...]:
    """``paths`` without those inside another (removing the outer removes them), each
    once, in order."""
    unique = tuple(dict.fromkeys(paths))
    kept = frozenset(unique)
    return tuple(
        path for path in unique if not any(path[:end] in kept for end in range(1, len(path)))
    )


def _carried_out_of_bounds(document: Document, found: tuple[Path, ...]) -> Refusal | None:
    """The first of the ``found`` kv_transfer_params objects that holds a connector
    value out of bounds (connector_bounds.py), as its refusal; None when none does."""
    for path in found:
        if path[-1] != KV_KEY:
            continue
        value: Any = document
        for step in path:
            value = value[step]
        if type(value) is dict:
            where = ".".join(map(str, path))
            refused = connector_bounds.refusal(value, None, where)
            if refused is not None:
                return refused
    return None


def _decide_params(
    policy: RoutePolicy, document: Document, evidence: Evidence, sender: Caller
) -> Decision:
    """The decision on the top-level kv_transfer_params alone."""
    params = document.get(KV_KEY)
    if params is None:
        return NO_PARAMS
    if not isinstance(params, dict):
        return Deny(
            bad_request(
                f"{KV_KEY} must be a JSON object", reason=Reason.KV_PARAMS_NOT_OBJECT, param=KV_KEY
            )
        )
    if not params:
        return NO_PARAMS
    keys = policed_keys(params)
    # Each policed value read once as ids: its count, the connector's bound and the
    # check of its items below all look at the same one.
    found = [Ids.of(params[key]) for key in keys]
    count = prompt = 0
    null = False
    for key, ids in zip(keys, found, strict=True):
        count = max(count, ids.count)
        if key == IDS_KEY:
            prompt = ids.count
        null = null or params[key] is None
    reason = _trusted(policy, params, evidence, sender)
    if reason not in TRUSTED:
        return _untrusted(policy, params, reason, count, keys)
    # Who wrote them is no bound on their values (vllm#51137): connector_bounds.py.
    tokens = prompt or policy.max_ids
    if (bounds := connector_bounds.refusal(params, tokens)) is not None:
        return Deny(bounds, count)
    proof_key = (PROOF_KEY,) if PROOF_KEY in params else ()
    # vLLM treats a null value as "no ids"; stripping leaves the same meaning.
    if keys and (ignores_reused_ids(document) or null):
        return Strip(keys=(*keys, *proof_key), reason=Reason.IGNORED_BY_UPSTREAM, id_count=count)
    for key, ids in zip(keys, found, strict=True):
        refusal = _invalid_ids(key, ids, policy)
        if refusal is not None:
            return Deny(refusal, count)
    # Trusted parameters that carry a proof go on unchanged, the proof with them.
    return Honor(reason, count) if proof_key else Allow(reason, count)


def mint_response(
    document: Document,
    digest: bytes,
    keys: KeySet,
    expiry: int,
    *,
    minted: int,
    partition: str = proof.NO_PARTITION,
) -> tuple[Decision, dict[str, Any] | None]:
    """What a prefill response's ``kv_transfer_params`` become: the connector's keys
    plus the response's ``prompt_token_ids``, signed at ``minted`` for the request's
    ``digest`` in its ``partition``.
    The new object, or None (with the reason) when there is nothing to mint."""
    value = document.get(IDS_KEY)
    connector = document.get(KV_KEY)
    signed: dict[str, Any] = {}
    if isinstance(connector, dict):
        signed = {k: v for k, v in connector.items() if k != PROOF_KEY}
    count = 0
    if value is not None:
        ids = Ids.of(value)
        if _invalid_ids(IDS_KEY, ids, _ANY_IDS) is not None:
            return Allow(Reason.RESPONSE_IDS_MALFORMED), None
        signed[IDS_KEY], count = value, ids.count
    if not signed:
        return Allow(Reason.NOTHING_TO_MINT), None
    if connector_bounds.refusal(signed, count) is not None:
        return Allow(Reason.RESPONSE_CONNECTOR_OUT_OF_BOUNDS), None
    token = proof.mint(keys, signed, digest, expiry, minted=minted, partition=partition)
    if token is None:
        unsigned = Reason.NO_SIGNING_KEY if keys.signing is None else Reason.NOT_RENDERABLE
        return Allow(unsigned), None
    return Mint(Reason.MINTED, count), {**signed, PROOF_KEY: token}
