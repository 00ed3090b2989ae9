"""Turns: the decode server's parameters for a conversation's next turn, signed on its
response and honored once on the next turn's prefill leg (docs/trust.md#turns).

A decode server whose NIXL connector runs with ``bidirectional_kv_xfer`` keeps a turn's
KV blocks after it answered, and its response's ``kv_transfer_params`` say where
(``do_remote_decode``, ``remote_block_ids``, ``remote_engine_id``, ...,
``remote_num_tokens``). A prefill server given them reads the KV of the first
``remote_num_tokens`` tokens of its prompt from the decode server instead of computing
it, and checks nothing: the blocks must hold exactly those tokens' KV.

What a turn proof (``proof.TURN_VERSION``) binds, so that the next turn's prefill leg
can check that before and after the read:

- the conversation: the prompt digest of the decode request (every prompt-defining
  field, its ``messages`` included) and the digest of the answer as the next turn's
  request repeats it, ``{"role": "assistant", "content": <the answer's text>}``. The
  next turn's request must hold the same fields, begin with the same messages, then
  that answer, exactly, every object's members in the same order (the server renders
  in that order), as json.loads reads them (checked before anything is forwarded);
- the cache partition of the decode route (proof.py): the next turn's prefill route
  must put the request in the same one, or the blocks read back would fill another
  tenant's partition (or none);
- the tokens (``TURN_KEY``): the digest of the first ``remote_num_tokens`` of the decode
  server's tokens, its prompt's ids and its output's, which are the tokens whose KV it
  holds. The prefill server's own rendering of the next turn (the ``prompt_token_ids``
  of its response) must begin with them (checked on the response: a chat template that
  renders a past turn otherwise than it was generated, or a tokenizer that does not
  read the answer's text back to the same ids, diverges there, and nothing of that
  response is signed).

Pure: no I/O; keys, the clock and the digests are arguments.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import blake3
import orjson

from ext_proc.core import connector_bounds, proof
from ext_proc.core.decisions import Allow, Decision, Mint
from ext_proc.core.ids import MAX_BOUND, Ids
from ext_proc.core.proof import PROOF_KEY, TURN_VERSION, KeySet
from ext_proc.core.reasons import Reason
from ext_proc.core.vllm_request import IDS_KEY, KV_KEY

# The signed member of a turn object that states what the next turn must begin with:
# {"messages": <how many messages came before the answer>, "tokens": <digest>}.
TURN_KEY: Final = "token_policy_turn"
# The keys of a decode server's turn parameters that the next turn's prefill request
# carries to its connector: where the blocks are and how many tokens they hold. The
# rest of the connector request (do_remote_decode, do_remote_prefill) is the route's.
READ_BACK_KEYS: Final = (
    "remote_block_ids",
    "remote_engine_id",
    "remote_request_id",
    "remote_host",
    "remote_port",
    "tp_size",
    "dcp_size",
    "pp_size",
    "remote_num_tokens",
    "remote_blocks_expiry_time",
    "transfer_mode",
)
# The connector keys without which a prefill server reads nothing back
# (vLLM's nixl/pull_scheduler.py get_num_new_matched_tokens).
_REQUIRED: Final = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")
# base64url of 32 bytes, unpadded (its one canonical spelling is checked after decoding).
_DIGEST_TEXT: Final = re.compile(r"[A-Za-z0-9_-]{43}")


@dataclass(frozen=True, slots=True)
class Expected:
    """What the next turn's prefill response must show: its ``prompt_token_ids`` begin
    with ``count`` tokens whose digest is ``tokens``."""

    tokens: bytes
    count: int


# How a turn proof of any format begins.
_TURN_PREFIXES: Final = tuple(f"{version}." for version in proof.TURN_VERSIONS)


def is_turn(params: Mapping[str, Any]) -> bool:
    """Whether ``params`` carry a turn proof (rather than a prefill leg's, or none), of
    this format or an earlier one (refused as superseded)."""
    found = params.get(PROOF_KEY)
    return isinstance(found, str) and found.startswith(_TURN_PREFIXES)


def answer(content: str) -> dict[str, str]:
    """The message that repeats a decode server's answer in the next turn's request."""
    return {"role": "assistant", "content": content}


def message_digest(message: Any) -> bytes | None:
    """BLAKE3 of a message as orjson writes it, its members in their order, as the
    prompt digest binds every other message (``proof.prompt_digest``: the server
    renders in that order). None: not writable."""
    try:
        return blake3.blake3(orjson.dumps(message)).digest()
    except (TypeError, orjson.JSONEncodeError):
        return None


def conversation(prompt: bytes, answered: bytes) -> bytes:
    """The digest a turn proof is minted for: the request's prompt digest and its
    answer's message digest (both 32 bytes, so no pair runs into another)."""
    return blake3.blake3(b"turn\n" + prompt + answered).digest()


def tokens_digest(ids: list[int]) -> bytes:
    """BLAKE3 of token ids as orjson writes a list of integers."""
    return blake3.blake3(orjson.dumps(ids)).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _ids(value: Any) -> list[int] | None:
    """``value`` when it is a non-empty list of token ids, else None."""
    if not isinstance(value, list):
        return None
    ids = Ids.of(value)
    if not ids.count or ids.fault(MAX_BOUND) is not None:
        return None
    return value


def _answer_of(document: Mapping[str, Any]) -> tuple[str, list[int]] | None:
    """The one choice's text and output ids of a chat response, or None."""
    choices = document.get("choices")
    if not (isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict)):
        return None
    message, output = choices[0].get("message"), _ids(choices[0].get("token_ids"))
    if not isinstance(message, dict) or output is None:
        return None
    content = message.get("content")
    return (content, output) if isinstance(content, str) else None


def mint(
    document: Mapping[str, Any],
    prompt: bytes,
    messages: int,
    keys: KeySet,
    expiry: int,
    *,
    minted: int,
    partition: str = proof.NO_PARTITION,
) -> tuple[Decision, dict[str, Any] | None]:
    """What a decode response's ``kv_transfer_params`` become when they are a turn's
    (``do_remote_decode`` and blocks): signed at ``minted`` for the request's prompt digest
    ``prompt`` (a request of ``messages`` messages in the cache ``partition``) and the
    response's answer, with the digest of the tokens the blocks hold. None (and the
    reason) when not minted: a response without them, with more than one choice, or
    without its token ids (the request must ask ``return_token_ids``) is not signed."""
    connector = document.get(KV_KEY)
    if not (
        isinstance(connector, dict)
        and connector.get("do_remote_decode") is True
        and connector.get("remote_block_ids")
    ):
        return Allow(Reason.NOTHING_TO_MINT), None
    found = _answer_of(document)
    prompt_ids = _ids(document.get(IDS_KEY))
    if found is None or prompt_ids is None:
        return Allow(Reason.TURN_IDS_MISSING), None
    content, output = found
    held = connector.get("remote_num_tokens")
    tokens = len(prompt_ids) + len(output)
    if type(held) is not int or not 0 < held <= tokens:
        return Allow(Reason.RESPONSE_CONNECTOR_OUT_OF_BOUNDS), None
    params = {k: v for k, v in connector.items() if k not in (PROOF_KEY, TURN_KEY)}
    if connector_bounds.refusal(params, tokens) is not None:
        return Allow(Reason.RESPONSE_CONNECTOR_OUT_OF_BOUNDS), None
    answered = message_digest(answer(content))
    if answered is None:
        return Allow(Reason.NOT_RENDERABLE), None
    sequence = prompt_ids[:held] + output[: max(0, held - len(prompt_ids))]
    params[TURN_KEY] = {"messages": messages, "tokens": _b64(tokens_digest(sequence))}
    digest = conversation(prompt, answered)
    token = proof.mint(
        keys, params, digest, expiry, version=TURN_VERSION, minted=minted, partition=partition
    )
    if token is None:
        unsigned = Reason.NO_SIGNING_KEY if keys.signing is None else Reason.NOT_RENDERABLE
        return Allow(unsigned), None
    return Mint(Reason.MINTED, held), {**params, PROOF_KEY: token}


@dataclass(frozen=True, slots=True)
class Honored:
    """A turn proof that verified: the connector request the next turn's prefill leg is
    forwarded with, and what its response must show."""

    connector: tuple[tuple[str, Any], ...]
    expected: Expected


def _stated(params: Mapping[str, Any]) -> tuple[int, bytes] | None:
    """The turn member's message count and token digest, when well formed."""
    turn = params.get(TURN_KEY)
    if not isinstance(turn, dict) or set(turn) != {"messages", "tokens"}:
        return None
    messages, tokens = turn["messages"], turn["tokens"]
    if type(messages) is not int or messages < 1 or not isinstance(tokens, str):
        return None
    if not _DIGEST_TEXT.fullmatch(tokens):
        return None
    raw = base64.urlsafe_b64decode(tokens + "=")
    return (messages, raw) if _b64(raw) == tokens else None


def honor(
    params: Mapping[str, Any],
    document: Mapping[str, Any],
    *,
    keys: KeySet,
    prefix: Callable[[int], bytes],
    now: float,
    skew: float,
    lifetime: float,
    connector: tuple[tuple[str, Any], ...],
    partition: str = proof.NO_PARTITION,
) -> Honored | Reason:
    """The next turn's prefill request ``document`` with turn parameters ``params`` in
    the cache ``partition``: honored (its read-back keys merged into the route's
    ``connector`` request) when the proof verifies for this conversation and was minted
    in that partition, or why not. ``prefix(n)``: the prompt digest
    of the request with its first ``n`` messages only. The record of spent proofs is
    asked afterwards (``proof.ticket``); a replay is caught there."""
    found = proof.claim(keys, params, TURN_VERSION)
    if isinstance(found, Reason):
        return found
    # Nothing the proof states is read before its MAC and lifetime hold.
    why = found.authentic(now, skew, lifetime)
    if why is not None:
        return why
    if not found.within(partition):
        return Reason.PROOF_PARTITION_MISMATCH
    stated = _stated(params)
    if stated is None:
        return Reason.PROOF_MALFORMED
    count, tokens = stated
    messages = document.get("messages")
    if not isinstance(messages, list) or len(messages) <= count:
        return Reason.PROMPT_MISMATCH
    answered = message_digest(messages[count])
    if answered is None or not found.matches(conversation(prefix(count), answered)):
        return Reason.PROMPT_MISMATCH
    # The check after the read needs the prefill server's ids in a JSON response.
    if document.get("return_token_ids") is not True or document.get("stream") not in (None, False):
        return Reason.TURN_NOT_CHECKABLE
    held = params.get("remote_num_tokens")
    if type(held) is not int or held < 1 or any(key not in params for key in _REQUIRED):
        return Reason.PROOF_MALFORMED  # signed, yet not a read-back: nothing to honor
    merged = dict(connector)
    merged.update((key, params[key]) for key in READ_BACK_KEYS if key in params)
    return Honored(tuple(merged.items()), Expected(tokens, held))


def expected(params: Mapping[str, Any]) -> Expected | None:
    """What the response to a request honored with turn parameters ``params`` must
    show (read again from the parameters ``honor`` verified)."""
    stated, held = _stated(params), params.get("remote_num_tokens")
    if stated is None or type(held) is not int:
        return None
    return Expected(stated[1], held)


def diverged(document: Mapping[str, Any], expected: Expected) -> bool:
    """Whether a prefill response's ``prompt_token_ids`` fail to begin with the tokens
    whose KV was read back (or are missing)."""
    ids = _ids(document.get(IDS_KEY))
    if ids is None or len(ids) < expected.count:
        return True
    return tokens_digest(ids[: expected.count]) != expected.tokens
