"""The response phase of a mint route: the prefill server's transfer parameters,
signed for the request they answer (docs/trust.md#what-a-mint-route-signs).

What the request leaves for its response is a ``Pending`` value: the request's prompt
digest when its response may be signed, or why it may not. The response's headers can
only add a reason not to sign; its body is signed when none was found. A response is
never refused: one that is not signed passes unchanged, with the reason reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ext_proc.core import admission, policy, turns
from ext_proc.core.budget import Account
from ext_proc.core.content_headers import check_headers
from ext_proc.core.decisions import Allow, Decision
from ext_proc.core.errors import Refusal, attempt
from ext_proc.core.events import Body, ResponseHeaders
from ext_proc.core.proof import NO_PARTITION, KeySet
from ext_proc.core.reasons import TRUSTED, Reason
from ext_proc.core.vllm_request import KV_KEY, MINT_ENDPOINTS


@dataclass(frozen=True, slots=True)
class Pending:
    """What a request leaves for its response: the prompt digest the response's
    parameters are signed for, or (``digest`` None) the reason they are not.
    ``messages``: set on a decode route whose responses are processed, the request's
    message count: its response's turn parameters are what is signed (turns.py).
    ``expected``: set for a turn read back, what the response's ids must begin with.
    ``partition``: the request's cache partition."""

    digest: bytes | None
    refused: Reason | None = None  # set exactly when ``digest`` is None
    messages: int | None = None
    expected: turns.Expected | None = None
    # The cache partition the request was put in (``inspection.Request.tag``): what is
    # signed binds it.
    partition: str = NO_PARTITION

    @property
    def unsigned(self) -> Reason:
        """Why a response that brings nothing beyond its headers is not signed."""
        return Reason.RESPONSE_WITHOUT_BODY if self.refused is None else self.refused


# A request that leaves nothing to sign: not on a mint route, or without a body.
NOTHING: Final = Pending(None, Reason.NOT_MINTED_ON_THIS_ROUTE)


def expect(endpoint: str, digest: Callable[[], bytes], partition: str = NO_PARTITION) -> Pending:
    """What a mint route's request in ``partition`` leaves, before the policy judged it:
    only the responses of ``MINT_ENDPOINTS`` are signed (``digest`` is rendered for
    those)."""
    if endpoint not in MINT_ENDPOINTS:
        return Pending(None, Reason.ENDPOINT_NOT_MINTABLE)
    return Pending(digest(), partition=partition)


def expect_turn(
    endpoint: str, digest: Callable[[], bytes], messages: object, partition: str = NO_PARTITION
) -> Pending:
    """What a decode route's request leaves when its response is processed: the turn
    parameters of a chat request's response are signed (``digest`` rendered for those),
    when its messages are text: the digest binds what a media part names, not what it
    held when the server read it."""
    if endpoint not in MINT_ENDPOINTS or not isinstance(messages, list) or not messages:
        return Pending(None, Reason.ENDPOINT_NOT_MINTABLE)
    if not all(isinstance(m, dict) and _text(m.get("content")) for m in messages):
        return Pending(None, Reason.TURN_MEDIA_UNBOUND)
    return Pending(digest(), messages=len(messages), partition=partition)


def _text(content: object) -> bool:
    """Whether a message's content is text only (a string, none, or text parts)."""
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" for part in content
    )


def judged(pending: Pending, decision: Decision, echo_free: bool) -> Pending:
    """``pending`` once the policy decided: nothing is signed for a caller the route
    does not trust whose request names a member vLLM reads transfer parameters from
    anywhere but its top-level kv_transfer_params (``echo_free`` false), whose content
    could come back in the response's parameters (docs/trust.md). A turn is signed only
    for a decode leg whose parameters this deployment proved (what its decode server
    read is then the deployment's own), and never for one that may echo."""
    if pending.digest is None:
        return pending
    if pending.messages is not None:
        if decision.reason is not Reason.TRUSTED_PROOF:
            return Pending(None, Reason.TURN_LEG_UNPROVEN)
        return pending if echo_free else Pending(None, Reason.REQUEST_MAY_ECHO)
    if not echo_free and decision.reason not in TRUSTED:
        return Pending(None, Reason.REQUEST_MAY_ECHO)
    return pending


def unproven(pending: Pending) -> Pending:
    """``pending`` once the record refused the request's proof: a turn is not signed,
    and a read-back that did not happen is not checked."""
    if pending.messages is not None:
        return Pending(None, Reason.TURN_LEG_UNPROVEN)
    return dataclasses.replace(pending, expected=None)


def checked(pending: Pending, event: ResponseHeaders) -> Pending:
    """``pending`` once the response's headers are in: only a 200 with a plain JSON body
    is signed."""
    if pending.digest is None:
        return pending
    if event.values(":status") != [b"200"]:
        return Pending(None, Reason.RESPONSE_NOT_OK)
    # The request's rule: one JSON media type, no content encoding.
    refused = attempt(check_headers, event.values("content-type"), event.values("content-encoding"))
    if refused is not None:
        return Pending(None, unreadable(refused.reason))
    return pending


def unreadable(refused: Reason) -> Reason:
    """Why a response is not signed, by the reason its request would be refused for the
    same headers: an encoding the processor cannot read, or (any other reason) not
    plain JSON. Total, so a reason ``content_headers.check_headers`` gains later still maps."""
    if refused is Reason.CONTENT_ENCODING:
        return Reason.RESPONSE_ENCODED
    return Reason.RESPONSE_NOT_JSON


@dataclass(frozen=True, slots=True)
class Signing:
    """What signing a response needs from the stream: its budget account, its limits,
    the keys, and the time a proof is minted at and expires at (unix seconds)."""

    account: Account
    max_body_bytes: int
    max_json_values: int
    keys: KeySet
    minted: int
    expiry: int
    turn_expiry: int = 0  # a turn proof's (proof.turn_ttl_seconds)


def sign(pending: Pending, raw: Body, signing: Signing) -> tuple[Decision, bytes | None]:
    """The response's decision and its signed body (None: unchanged). What it holds
    stays in ``signing.account`` until the stream hands it over with the answer."""
    if pending.digest is None:
        return Allow(pending.unsigned), None
    account = signing.account
    if attempt(admission.check_size, len(raw), signing.max_body_bytes) is not None:
        return Allow(Reason.RESPONSE_NOT_AFFORDABLE), None
    shape = attempt(admission.admit, raw, account, signing.max_json_values)
    if isinstance(shape, Refusal):
        return Allow(Reason.RESPONSE_NOT_AFFORDABLE), None
    parsed = attempt(admission.parse, raw, shape, account)
    if isinstance(parsed, Refusal):
        return Allow(Reason.RESPONSE_NOT_JSON), None
    document, keys = parsed.document, signing.keys
    if pending.messages is not None:
        decision, params = turns.mint(
            document,
            pending.digest,
            pending.messages,
            keys,
            signing.turn_expiry,
            minted=signing.minted,
            partition=pending.partition,
        )
    elif pending.expected is not None and turns.diverged(document, pending.expected):
        # The prefill server's prompt does not begin with the tokens whose KV it read
        # back: nothing it answered is signed, so no decode leg runs on it.
        return Allow(Reason.TURN_PROMPT_DIVERGED), None
    else:
        decision, params = policy.mint_response(
            document,
            pending.digest,
            keys,
            signing.expiry,
            minted=signing.minted,
            partition=pending.partition,
        )
    if params is None:
        return decision, None
    written = attempt(admission.write, parsed, {**parsed.document, KV_KEY: params}, account)
    if isinstance(written, Refusal):
        # Too deep for orjson's writer and past what json.dumps may write, or the
        # budget cannot hold json.dumps's extra.
        affordable = written.reason is not Reason.INFLIGHT_BUDGET_EXHAUSTED
        unsigned = Reason.RESPONSE_TOO_DEEP if affordable else Reason.RESPONSE_NOT_AFFORDABLE
        return Allow(unsigned), None
    return decision, written
