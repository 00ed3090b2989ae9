"""The token-id reuse policy as a pure function: route policy + document → decision.

No I/O, no logging, no exceptions, no mutation of its inputs: every outcome, refusals
included, is a value.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from ext_proc.body import Document
from ext_proc.errors import Refusal, bad_request
from ext_proc.route_policy import Action, RoutePolicy
from ext_proc.vllm_request import KV_KEY, ignores_reused_ids, policed_keys


@dataclass(frozen=True, slots=True)
class Allow:
    """Forward the body unchanged."""

    action: ClassVar[str] = "allow"
    reason: str
    id_count: int = 0


@dataclass(frozen=True, slots=True)
class Strip:
    """Forward the body with ``keys`` removed from kv_transfer_params."""

    action: ClassVar[str] = "strip"
    keys: tuple[str, ...]
    reason: str
    id_count: int


@dataclass(frozen=True, slots=True)
class Deny:
    action: ClassVar[str] = "deny"
    refusal: Refusal
    id_count: int = 0

    @property
    def reason(self) -> str:
        return self.refusal.reason


Decision = Allow | Strip | Deny


def _count(value: Any) -> int:
    return len(value) if isinstance(value, list) else 0


def _invalid_ids(key: str, value: Any, policy: RoutePolicy) -> Refusal | None:
    """At least as strict as vLLM: a non-empty list of ints, in vocabulary, bounded."""
    param = f"{KV_KEY}.{key}"
    if not isinstance(value, list) or not value:
        return bad_request(
            f"{param} must be a non-empty list of integers", reason="ids_malformed", param=param
        )
    if policy.max_ids is not None and len(value) > policy.max_ids:
        return bad_request(
            f"{param} has {len(value)} ids; this route allows at most {policy.max_ids}",
            reason="ids_too_many",
            param=param,
        )
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
        # ints of 2**64 and beyond are left to the vocabulary check
    else:
        written = orjson.dumps(value)
        first_bool = written.find(b"e")
        if first_bool >= 0:
            return _malformed(param, written.count(b",", 0, first_bool))
    if policy.vocab_size is not None:
        highest = max(value)
        if highest >= policy.vocab_size:
            return bad_request(
                f"{param}[{value.index(highest)}] = {highest} is outside the vocabulary "
                f"(size {policy.vocab_size})",
                reason="ids_out_of_vocab",
                param=param,
            )
    return None


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


def decide(policy: RoutePolicy, document: Document) -> Decision:
    params = document.get(KV_KEY)
    if params is None:
        return Allow("no_reused_ids")
    if not isinstance(params, dict):
        return Deny(
            bad_request(
                f"{KV_KEY} must be a JSON object", reason="kv_params_not_object", param=KV_KEY
            )
        )
    keys = policed_keys(params)
    if not keys:
        return Allow("no_reused_ids")
    count = max(_count(params[key]) for key in keys)
    if policy.action is Action.STRIP:
        return Strip(keys, "stripped_by_policy", count)
    if policy.action is Action.DENY:
        param = f"{KV_KEY}.{keys[0]}"
        return Deny(
            bad_request(
                f"{param} is not accepted on this route", reason="denied_by_policy", param=param
            ),
            count,
        )
    # vLLM treats a null value as "no ids"; stripping leaves the same meaning.
    if ignores_reused_ids(document) or any(params[key] is None for key in keys):
        return Strip(keys, "ignored_by_upstream", count)
    for key in keys:
        refusal = _invalid_ids(key, params[key], policy)
        if refusal is not None:
            return Deny(refusal, count)
    return Allow("honored", count)
