"""Every reason an outcome can carry: the one list (docs/trust.md#what-is-reported).

A member's value is its wire text: the reason in a 400's ``details``
(``token_policy_<reason>``), the log lines, the ``reason`` label of
``ext_proc_decisions_total`` and Envoy's dynamic metadata. Changing a value changes what
operators' dashboards, alerts and access logs match. A string equal to a member's value
appears nowhere else in the package (tests/core/test_reasons.py).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Reason(StrEnum):
    # A request forwarded as it came, or with what the policy removed or wrote.
    NO_BODY = "no_body"
    NO_TRANSFER_PARAMS = "no_transfer_params"
    NO_REUSED_IDS = "no_reused_ids"
    TRUSTED_PROOF = "trusted_proof"
    TRUSTED_PEER = "trusted_peer"
    TRUSTED_ANY_CALLER = "trusted_any_caller"
    IGNORED_BY_UPSTREAM = "ignored_by_upstream"
    CONNECTOR_WRITTEN = "connector_written"
    TURN_READ_BACK = "turn_read_back"

    # Why parameters are untrusted: removed, or refused where the route denies them.
    STRIPPED_BY_POLICY = "stripped_by_policy"
    DENIED_BY_POLICY = "denied_by_policy"
    UNPROVEN = "unproven"
    PEER_NOT_LISTED = "peer_not_listed"
    PROOF_MISSING = "proof_missing"
    PROOF_MALFORMED = "proof_malformed"
    PROOF_SUPERSEDED = "proof_superseded"
    PROOF_UNKNOWN_KEY = "proof_unknown_key"
    PROOF_BAD_SIGNATURE = "proof_bad_signature"
    PROOF_EXPIRED = "proof_expired"
    PROOF_OUTLIVES_LEASE = "proof_outlives_lease"
    PROOF_PARTITION_MISMATCH = "proof_partition_mismatch"
    PROMPT_MISMATCH = "prompt_mismatch"
    PROOF_REPLAYED = "proof_replayed"
    PROOF_RECORD_UNAVAILABLE = "proof_record_unavailable"
    PROOF_PREDATES_RECORD = "proof_predates_record"
    PROOF_RECORD_FULL = "proof_record_full"
    CLOCK_BEHIND = "clock_behind"
    TURN_NOT_CHECKABLE = "turn_not_checkable"

    # Why a request is refused.
    KV_PARAMS_NOT_OBJECT = "kv_params_not_object"
    IDS_MALFORMED = "ids_malformed"
    IDS_TOO_MANY = "ids_too_many"
    IDS_OUT_OF_VOCAB = "ids_out_of_vocab"
    CONNECTOR_OUT_OF_BOUNDS = "connector_out_of_bounds"
    CARRIERS_TOO_MANY = "carriers_too_many"
    EMBEDDINGS_REFUSED = "embeddings_refused"
    TOKEN_ENDPOINT_REFUSED = "token_endpoint_refused"
    INTERNAL_ENDPOINT_REFUSED = "internal_endpoint_refused"
    UNDECLARED_MEMBER = "undeclared_member"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    CONTENT_ENCODING = "content_encoding"
    BODY_NOT_JSON = "body_not_json"
    BODY_NOT_OBJECT = "body_not_object"
    BODY_TOO_DEEP = "body_too_deep"
    BODY_TOO_LARGE = "body_too_large"
    BODY_TOO_COMPLEX = "body_too_complex"
    BODY_NEEDS_SLOW_PARSE = "body_needs_slow_parse"
    TRAILERS_UNSUPPORTED = "trailers_unsupported"
    BODY_TIMEOUT = "body_timeout"
    INFLIGHT_BUDGET_EXHAUSTED = "inflight_budget_exhausted"
    INVALID_ROUTE_POLICY = "invalid_route_policy"
    TENANT_MISSING = "tenant_missing"
    TENANT_KEY_MISSING = "tenant_key_missing"
    TENANT_ENDPOINT_REFUSED = "tenant_endpoint_refused"
    CACHE_SALT_MALFORMED = "cache_salt_malformed"

    # A mint route's response: signed, or why not (a response is never refused).
    MINTED = "minted"
    RESPONSE_NOT_OK = "response_not_ok"
    RESPONSE_NOT_JSON = "response_not_json"
    RESPONSE_ENCODED = "response_encoded"
    RESPONSE_WITHOUT_BODY = "response_without_body"
    NOTHING_TO_MINT = "nothing_to_mint"
    RESPONSE_IDS_MALFORMED = "response_ids_malformed"
    RESPONSE_CONNECTOR_OUT_OF_BOUNDS = "response_connector_out_of_bounds"
    NO_SIGNING_KEY = "no_signing_key"
    NOT_RENDERABLE = "not_renderable"
    RESPONSE_NOT_AFFORDABLE = "response_not_affordable"
    RESPONSE_TOO_DEEP = "response_too_deep"
    ENDPOINT_NOT_MINTABLE = "endpoint_not_mintable"
    REQUEST_MAY_ECHO = "request_may_echo"
    NOT_MINTED_ON_THIS_ROUTE = "not_minted_on_this_route"
    TURN_IDS_MISSING = "turn_ids_missing"
    TURN_LEG_UNPROVEN = "turn_leg_unproven"
    TURN_MEDIA_UNBOUND = "turn_media_unbound"
    TURN_PROMPT_DIVERGED = "turn_prompt_diverged"


# The reasons that trust: a verified proof, a listed peer, a route that trusts any
# caller. Every other reason leaves the parameters untrusted.
TRUSTED: Final = frozenset({Reason.TRUSTED_PROOF, Reason.TRUSTED_PEER, Reason.TRUSTED_ANY_CALLER})
# Why parameters are untrusted: each is a Strip's reason, or a Deny's where the route
# denies untrusted parameters (a deny route, or ``unproven: deny``).
UNTRUSTED: Final = frozenset(
    {
        Reason.STRIPPED_BY_POLICY,
        Reason.DENIED_BY_POLICY,
        Reason.UNPROVEN,
        Reason.PEER_NOT_LISTED,
        Reason.PROOF_MISSING,
        Reason.PROOF_MALFORMED,
        Reason.PROOF_SUPERSEDED,
        Reason.PROOF_UNKNOWN_KEY,
        Reason.PROOF_BAD_SIGNATURE,
        Reason.PROOF_EXPIRED,
        Reason.PROOF_OUTLIVES_LEASE,
        Reason.PROOF_PARTITION_MISMATCH,
        Reason.PROMPT_MISMATCH,
        Reason.PROOF_REPLAYED,
        Reason.PROOF_RECORD_UNAVAILABLE,
        Reason.PROOF_PREDATES_RECORD,
        Reason.PROOF_RECORD_FULL,
        Reason.CLOCK_BEHIND,
        Reason.TURN_NOT_CHECKABLE,
    }
)
# Why a request is refused, beyond untrusted parameters: a Deny's reason only.
REFUSED: Final = frozenset(
    {
        Reason.KV_PARAMS_NOT_OBJECT,
        Reason.IDS_MALFORMED,
        Reason.IDS_TOO_MANY,
        Reason.IDS_OUT_OF_VOCAB,
        Reason.CONNECTOR_OUT_OF_BOUNDS,
        Reason.CARRIERS_TOO_MANY,
        Reason.EMBEDDINGS_REFUSED,
        Reason.TOKEN_ENDPOINT_REFUSED,
        Reason.INTERNAL_ENDPOINT_REFUSED,
        Reason.UNDECLARED_MEMBER,
        Reason.UNSUPPORTED_MEDIA_TYPE,
        Reason.CONTENT_ENCODING,
        Reason.BODY_NOT_JSON,
        Reason.BODY_NOT_OBJECT,
        Reason.BODY_TOO_DEEP,
        Reason.BODY_TOO_LARGE,
        Reason.BODY_TOO_COMPLEX,
        Reason.BODY_NEEDS_SLOW_PARSE,
        Reason.TRAILERS_UNSUPPORTED,
        Reason.BODY_TIMEOUT,
        Reason.INFLIGHT_BUDGET_EXHAUSTED,
        Reason.INVALID_ROUTE_POLICY,
        Reason.TENANT_MISSING,
        Reason.TENANT_KEY_MISSING,
        Reason.TENANT_ENDPOINT_REFUSED,
        Reason.CACHE_SALT_MALFORMED,
    }
)
# Why a mint route's response is not signed: an Allow's reason (``MINTED`` is a Mint's).
UNSIGNED: Final = frozenset(
    {
        Reason.RESPONSE_NOT_OK,
        Reason.RESPONSE_NOT_JSON,
        Reason.RESPONSE_ENCODED,
        Reason.RESPONSE_WITHOUT_BODY,
        Reason.NOTHING_TO_MINT,
        Reason.RESPONSE_IDS_MALFORMED,
        Reason.RESPONSE_CONNECTOR_OUT_OF_BOUNDS,
        Reason.NO_SIGNING_KEY,
        Reason.NOT_RENDERABLE,
        Reason.RESPONSE_NOT_AFFORDABLE,
        Reason.RESPONSE_TOO_DEEP,
        Reason.ENDPOINT_NOT_MINTABLE,
        Reason.REQUEST_MAY_ECHO,
        Reason.NOT_MINTED_ON_THIS_ROUTE,
        Reason.TURN_IDS_MISSING,
        Reason.TURN_LEG_UNPROVEN,
        Reason.TURN_MEDIA_UNBOUND,
        Reason.TURN_PROMPT_DIVERGED,
    }
)
