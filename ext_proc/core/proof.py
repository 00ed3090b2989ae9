"""Signed transfer parameters: mint a proof on the prefill leg, verify it on the decode leg.

Pure functions; keys and the time are arguments. The format and its reasons are in
docs/trust.md:

    tp4.<key id>.<minted>.<expiry>.<nonce>.<partition>.<prompt digest>.<mac>
    mac = BLAKE3 keyed with BLAKE3-derive_key(MAC_CONTEXT, key) over
          "tp4\\n" key id "\\n" minted "\\n" expiry "\\n" partition "\\n"
          prompt digest "\\n" canonical(parameters without the proof) "\\n" nonce

The digest binds the parameters to the prompt-defining fields of the request they were
minted for (the client's own ``cache_salt`` among them); the partition, to the cache
partition the route put that prompt in (``NO_PARTITION``, or the tenant's: tenants.tag),
because the engine caches the KV a decode leg loads under the decode request's own salt:
a proof honored under another partition would put one tenant's prompt in another's
cache, or in none (docs/trust.md#tenants). The nonce makes every minted proof another
(two prefill responses alike to the byte, a prompt served from the prefix cache twice in
one second, still give two proofs, each honored once: replay.py). The minting time
(unix seconds by the minter's clock) dates the proof for the record of spent proofs
(``ticket``) and bounds its lifetime: a verifier refuses a proof minted for longer than
its own lifetime. The MAC binds everything (ids, connector keys, key id, times, nonce,
partition, digest) to a key only the gateway holds. Verification compares MACs in
constant time.

BLAKE3 (its keyed mode is a MAC, its plain mode a collision-resistant hash) rather than
HMAC-SHA256: a decode leg's MAC is a pass over its ids, about 900 KB at 128k ids, and
BLAKE3 makes that pass several times faster on one core, short enough to run inline on
the event loop's thread.
"""

from __future__ import annotations

import base64
import hmac
import json
import math
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import blake3
import orjson

from ext_proc.core import reading
from ext_proc.core.errors import BadRequest
from ext_proc.core.ids import Ids
from ext_proc.core.reasons import Reason
from ext_proc.core.replay import TICKET_BYTES, Ticket
from ext_proc.core.vllm_request import EC_KEY, IDS_KEY, KV_KEY

PROOF_KEY: Final = "token_policy_proof"
VERSION: Final = "tp4"
# A turn proof (turns.py): the same format and MAC under its own version, so that no
# proof of one kind is ever read as the other's.
TURN_VERSION: Final = "tt4"
NONCE_BYTES: Final = 12
# The partition of a route that names no tenant source: the client's own cache_salt
# (or none) reaches the engine as it came.
NO_PARTITION: Final = "-"
# Fields an orchestrator legitimately changes between the prefill and the decode leg
# (the transfer parameters are each leg's own); every other field of the request is
# bound by the digest.
UNBOUND_FIELDS: Final = frozenset(
    {
        KV_KEY,
        EC_KEY,
        "max_tokens",
        "max_completion_tokens",
        "min_tokens",
        "stream",
        "stream_options",
        "return_token_ids",
    }
)
KEY_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
# A partition is NO_PARTITION or 16 bytes in base64url (22 characters): tenants.tag.
# Times are decimal without a leading zero: one spelling each.
_PROOF: Final = re.compile(
    r"(tp4|tt4)\.([A-Za-z0-9_-]{1,64})\.([1-9][0-9]{0,11})\.([1-9][0-9]{0,11})"
    r"\.([A-Za-z0-9_-]{16})"
    r"\.(-|[A-Za-z0-9_-]{22})\.([A-Za-z0-9_-]{43})\.([A-Za-z0-9_-]{43})"
)

# The formats tp4 replaced, by their shape alone: none is verified (docs/trust.md, proofs
# of an earlier format). tp3 and tt3 bound no partition: a proof minted on a tenant's
# route would be honored on a route of another tenant or of none, and nothing in it
# tells which it was. tp2's digest sorted every object's members, so it binds no member
# order, which the server renders (a reordered tool schema is another prompt): honoring
# it would honor ids for a prompt they were not computed for. tp1 had no nonce and no
# endpoint in its digest. A proof of any of these shapes is ``proof_superseded``, which
# an operator reads as a replica of an older release minting during a rollout, and is
# untrusted as a malformed one is.
_EARLIER_TP3: Final = (
    r"\.[A-Za-z0-9_-]{1,64}\.[1-9][0-9]{0,11}\.[A-Za-z0-9_-]{16}"
    r"\.[A-Za-z0-9_-]{43}\.[A-Za-z0-9_-]{43}"
)
_SUPERSEDED: Final = {
    VERSION: re.compile(
        r"tp1\.[A-Za-z0-9_-]{1,64}\.[1-9][0-9]{0,11}\.[A-Za-z0-9_-]{43}\.[A-Za-z0-9_-]{43}"
        rf"|tp2{_EARLIER_TP3}|tp3{_EARLIER_TP3}"
    ),
    TURN_VERSION: re.compile(rf"tt3{_EARLIER_TP3}"),
}
# The versions a turn proof was ever minted under (turns.is_turn): an earlier one is
# read as a turn, and refused as superseded.
TURN_VERSIONS: Final = (TURN_VERSION, "tt3")


@dataclass(frozen=True, slots=True)
class KeySet:
    """Signing keys by id; ``signing`` names the one that mints (None: minting is off)."""

    keys: Mapping[str, bytes]
    signing: str | None


# No keys: nothing is minted and every proof names an unknown key.
NO_KEYS: Final = KeySet({}, None)


@dataclass(frozen=True, slots=True)
class Trust:
    """What proofs need from outside a stream: the current keys and the clock (their
    lifetime and skew are the configuration's, ``config.Proof``)."""

    keys: Callable[[], KeySet] = lambda: NO_KEYS
    clock: Callable[[], float] = time.time
    # The key tenants' cache salts are derived with (tenants.py); None: none configured.
    tenant_key: bytes | None = None


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _canonical(text: str) -> bool:
    """Whether ``text`` is the one unpadded base64url spelling of its bytes (43
    characters hold 32 bytes and 2 spare bits, which must be zero; 16 hold 12 bytes)."""
    return _b64(_unb64(text)) == text


# The most bytes the signed parameters but the ids may render to. json.dumps holds a few
# times its output while it writes (its pieces, the joined text, the encoded bytes), and
# a client chooses what a proof's parameters hold before its MAC is checked: the bound,
# read without rendering, keeps that transient small (one stream at a time per process)
# whatever the body. A connector's keys render to a few KiB (block ids: a few per
# 16-token block).
MAX_HEAD_BYTES: Final = 256 * 1024


def _within(value: Any, limit: int) -> bool:
    """Whether json.dumps (ASCII) of ``value`` writes at most ``limit`` bytes, from an
    upper bound of each value's text (a string: 6 per character, every escape's most),
    walked without recursion and given up as soon as it is over."""
    total, pending = 0, [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            total += 6 * len(item) + 3
        elif isinstance(item, dict):
            total += 2
            for key, member in item.items():
                pending.append(key)
                pending.append(member)
        elif isinstance(item, list):
            total += 2
            pending.extend(item)
        elif isinstance(item, int):  # bool included
            total += item.bit_length() // 3 + 7
        else:  # a float, None
            total += 26
        if total > limit:
            return False
    return True


def canonical(params: Mapping[str, Any]) -> tuple[bytes, bytes] | None:
    """The parameters (without the proof) as signed bytes, in two parts signed as
    ``head + b"\\n" + ids``; None when not renderable.

    Everything but the ids through ``json.dumps`` (sorted keys, ASCII, NaN refused, so
    equal documents and only they give equal bytes); the ids, the bulk, as their
    canonical text (``Ids.signed``): for ids read from the body, that text is taken from
    the body's bytes, not rendered again. The head is ASCII JSON without a newline, so
    the parts are told apart; the signed bytes are those the two parts joined make.
    Parameters whose head could render past ``MAX_HEAD_BYTES`` are not renderable.
    """
    rest = {k: v for k, v in params.items() if k not in (IDS_KEY, PROOF_KEY)}
    if not _within(rest, MAX_HEAD_BYTES):
        return None
    try:
        head = json.dumps(
            rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
        ).encode()
    except (ValueError, TypeError, RecursionError):
        return None
    ids = Ids.of(params[IDS_KEY]).signed if IDS_KEY in params else b"-"
    return None if ids is None else (head, ids)


def prompt_digest(document: Mapping[str, Any], orjson_safe: bool, endpoint: str) -> bytes | None:
    """BLAKE3 of the API the request is for (``endpoint``, the upstream path after the
    route's rewrite, as vLLM routes it) and of the request's prompt-defining fields
    (all but ``UNBOUND_FIELDS``): a proof minted for one endpoint is a
    ``prompt_mismatch`` on any other, whose rendering of the same fields differs.

    The rendering depends only on those fields' values and on the order of every
    object's members, so both legs agree whatever the rest of their bodies hold. The
    order is bound because the server renders in it: vLLM validates a request's free
    objects (a tool's ``parameters``, ``chat_template_kwargs``) into dicts that keep the
    request's member order, and chat templates write them in that order
    (``tojson`` does not sort): reordered members are another prompt. The order is
    that of the document ``json.loads`` reads (a duplicate key keeps its first place
    and its last value, as orjson's reading does: reading.py), never of the bytes.
    orjson when it renders the fields exactly, else ``json.dumps`` (NaN, huge integers,
    lone surrogates, nesting deeper than the 254 levels orjson writes). A document
    orjson read has neither NaN nor huge integers (reading.py). None when only
    json.dumps renders them: ``prompt_digest_slow`` then, once the caller has charged
    its cost (``admission.digest``).
    """
    bound = _bound(document)
    if not orjson_safe and reading.holds(bound, _nonfinite):
        return None  # orjson would write null for NaN or infinity
    try:
        rendered = orjson.dumps(bound)
    except (TypeError, orjson.JSONEncodeError):
        return None
    return _digest(endpoint, b"o", (rendered,))


def prompt_digest_slow(document: Mapping[str, Any], endpoint: str) -> bytes:
    """``prompt_digest`` rendered by ``json.dumps`` (the same bytes it would hash there).
    Raises ``BadRequest`` (``body_too_deep``) past Python's recursion limit, where no
    rendering exists.

    Its memory (``memory.slow_extra``): json.dumps's text, ASCII (``ensure_ascii``), at
    most 3 characters per body byte in strings (12 for a 4-byte UTF-8 character) and a
    float's repr per value, and its chunks while it joins them; the text is hashed a
    slice at a time, never copied whole again.
    """
    try:
        text = json.dumps(_bound(document), separators=(",", ":"), ensure_ascii=True)
    except RecursionError as exc:
        raise BadRequest(
            "request body is nested too deeply to be bound to a proof", reason=Reason.BODY_TOO_DEEP
        ) from exc
    slices = (text[at : at + _SLICE].encode("ascii") for at in range(0, len(text), _SLICE))
    return _digest(endpoint, b"j", slices)


# How much of json.dumps's text is encoded at once for the hash.
_SLICE: Final = 1 << 16


def _bound(document: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k not in UNBOUND_FIELDS}


def _digest(endpoint: str, marker: bytes, rendering: Iterable[bytes]) -> bytes:
    """BLAKE3 of the endpoint, preceded by its length (no endpoint and rendering run
    into another pair), the marker byte saying which rendering follows, and the
    rendering's parts in order."""
    named = endpoint.encode("utf-8", "surrogatepass")
    digest = blake3.blake3(b"%d:%s%s" % (len(named), named, marker))
    for part in rendering:
        digest.update(part)
    return digest.digest()


def _nonfinite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


# The context of the MAC's key derivation: a configured key of any length becomes the
# 32 bytes BLAKE3's keyed mode takes, and a key used anywhere else gives another.
MAC_CONTEXT: Final = "ext_proc token_policy_proof tp4 MAC key"


def _mac_key(key: bytes) -> bytes:
    """The BLAKE3 key the MAC is keyed with, derived from a configured ``key``."""
    return blake3.blake3(key, derive_key_context=MAC_CONTEXT).digest()


# A proof's fields under its MAC but the nonce: key id, minted, expiry, partition, the
# digest shown.
Fields = tuple[str, str, str, str, str]


def _mac(key: bytes, fields: Fields, body: tuple[bytes, bytes], version: str) -> blake3.blake3:
    """The MAC's state over the proof's ``version``, its ``fields`` and ``body``; the
    nonce, fed last, completes it (``_sealed``)."""
    mac = blake3.blake3("\n".join((version, *fields, "")).encode(), key=_mac_key(key))
    head, ids = body
    mac.update(head)
    mac.update(b"\n")
    mac.update(ids)  # fed as it is: the ids are most of the message
    return mac


def _sealed(state: blake3.blake3, nonce: str) -> bytes:
    mac = state.copy()
    mac.update(b"\n" + nonce.encode())
    return mac.digest()


def minter(
    keys: KeySet,
    params: Mapping[str, Any],
    digest: bytes,
    expiry: int,
    version: str = VERSION,
    *,
    minted: int,
    partition: str = NO_PARTITION,
) -> Callable[[bytes], str] | None:
    """Proofs for ``params`` minted at ``minted`` (unix seconds by this clock, no later
    than ``expiry``) for a request with ``digest`` in ``partition`` (``NO_PARTITION``,
    or the tenant's ``tenants.tag``) that differ in their nonce (``NONCE_BYTES`` bytes)
    alone, the MAC over the rest computed once; None when there is no signing key or
    the parameters cannot be rendered."""
    if keys.signing is None:
        return None
    body = canonical(params)
    if body is None:
        return None
    key_id, shown = keys.signing, _b64(digest)
    fields = (key_id, str(minted), str(expiry), partition, shown)
    state = _mac(keys.keys[key_id], fields, body, version)
    fixed = f"{version}.{key_id}.{minted}.{expiry}"

    def make(nonce: bytes) -> str:
        text = _b64(nonce)
        return f"{fixed}.{text}.{partition}.{shown}.{_b64(_sealed(state, text))}"

    return make


def mint(
    keys: KeySet,
    params: Mapping[str, Any],
    digest: bytes,
    expiry: int,
    nonce: bytes | None = None,
    *,
    minted: int,
    version: str = VERSION,
    partition: str = NO_PARTITION,
) -> str | None:
    """The proof for ``params`` minted at ``minted`` (unix seconds) to expire at
    ``expiry`` for a request with ``digest`` in ``partition``; None when there is no
    signing key or the parameters cannot be rendered. ``nonce``: fresh random bytes
    unless given; ``version``: the proof's kind (``TURN_VERSION`` for turns.py)."""
    make = minter(keys, params, digest, expiry, version, minted=minted, partition=partition)
    if make is None:
        return None
    return make(secrets.token_bytes(NONCE_BYTES) if nonce is None else nonce)


@dataclass(frozen=True, slots=True)
class Claim:
    """A proof that is well formed and names a known key, before its MAC is checked:
    what ``settle`` needs."""

    key: bytes
    fields: Fields
    nonce: str
    shown: bytes  # the MAC the proof carries
    body: tuple[bytes, bytes]
    version: str = VERSION

    def settle(
        self,
        digest: bytes,
        now: float,
        skew: float,
        lifetime: float,
        *,
        partition: str = NO_PARTITION,
    ) -> Reason | None:
        """``verify``'s verdict: the MAC the proof should carry (a pass over the ids)
        computed and compared first, then the partition, then the digest."""
        why = self.authentic(now, skew, lifetime)
        if why is not None:
            return why
        if not self.within(partition):
            return Reason.PROOF_PARTITION_MISMATCH
        return None if self.matches(digest) else Reason.PROMPT_MISMATCH

    def authentic(self, now: float, skew: float, lifetime: float) -> Reason | None:
        """Why the proof is not this deployment's and current (its MAC, then its expiry
        and lifetime), or None: everything but the digest it was minted for.
        ``lifetime``: the longest this processor mints a proof of its kind for; a proof
        minted for longer, or whose expiry lies further ahead, is refused, so that
        everything honored is honored within the lifetime + 2 x ``skew`` of its
        minting (the connector's lease bounds that: ``config.Proof``). So is one that
        states a minting time more than ``skew`` ahead of this clock: no minter within
        the skew wrote it, and ``ticket`` dates a proof by that time (a record that
        began after it was spent would take it for fresh)."""
        expected = _sealed(_mac(self.key, self.fields, self.body, self.version), self.nonce)
        if not hmac.compare_digest(expected, self.shown):
            return Reason.PROOF_BAD_SIGNATURE
        _, minted, expiry, _, _ = self.fields
        if now > int(expiry) + skew:
            return Reason.PROOF_EXPIRED
        if int(expiry) - int(minted) > lifetime or int(expiry) > now + lifetime + skew:
            return Reason.PROOF_OUTLIVES_LEASE
        if int(minted) > now + skew:
            return Reason.PROOF_OUTLIVES_LEASE
        return None

    def within(self, partition: str) -> bool:
        """Whether the proof was minted in ``partition`` (the route's that honors it).
        Compared only after the MAC: a tag is no secret from the clients of its
        partition, and one compared here was minted by this deployment."""
        return self.fields[3] == partition

    def matches(self, digest: bytes) -> bool:
        """Whether the proof was minted for ``digest``."""
        return hmac.compare_digest(_unb64(self.fields[4]), digest)


def claim(keys: KeySet, params: Mapping[str, Any], version: str = VERSION) -> Claim | Reason:
    """The proof in ``params`` as a ``Claim``, or why it is none (missing, malformed,
    an unknown key): the checks that need neither the MAC nor the prompt digest. A
    proof of another kind than ``version`` is malformed here."""
    proof = params.get(PROOF_KEY)
    if proof is None:
        return Reason.PROOF_MISSING
    if not isinstance(proof, str):
        return Reason.PROOF_MALFORMED
    match = _PROOF.fullmatch(proof)
    if match is None:
        superseded = _SUPERSEDED[version].fullmatch(proof) is not None
        return Reason.PROOF_SUPERSEDED if superseded else Reason.PROOF_MALFORMED
    kind, key_id, minted, expiry, nonce, partition, shown, mac = match.groups()
    spelt = partition == NO_PARTITION or _canonical(partition)
    if kind != version or not (spelt and all(map(_canonical, (nonce, shown, mac)))):
        return Reason.PROOF_MALFORMED
    if int(minted) > int(expiry):
        return Reason.PROOF_MALFORMED  # no minter writes it
    key = keys.keys.get(key_id)
    if key is None:
        return Reason.PROOF_UNKNOWN_KEY
    body = canonical(params)
    if body is None:
        return Reason.PROOF_MALFORMED
    fields = (key_id, minted, expiry, partition, shown)
    return Claim(key, fields, nonce, _unb64(mac), body, version)


def verify(
    keys: KeySet,
    params: Mapping[str, Any],
    digest: bytes,
    now: float,
    skew: float,
    *,
    lifetime: float = math.inf,
    partition: str = NO_PARTITION,
) -> Reason | None:
    """None when ``params`` carry a valid proof for a request with ``digest`` on a route
    of ``partition``; otherwise the reason they are unproven (docs/trust.md lists them,
    in this order). ``lifetime``: the longest this processor mints for
    (``ttl_seconds``): a proof minted for longer (with another lifetime than the
    connector's lease allows here) is refused."""
    found = claim(keys, params)
    if isinstance(found, Reason):
        return found
    return found.settle(digest, now, skew, lifetime, partition=partition)


def ticket(params: Mapping[str, Any], skew: float) -> Ticket:
    """The record's entry for the proof in ``params``, which ``verify`` accepted with
    ``skew``.

    ``skew`` bounds how far apart any two processors' clocks are (minters and verifiers
    alike). A proof with expiry E is verified until E + skew by a verifier's clock, so
    it can be honored until E + 2 x skew by the minter's clock, and a spender's clock
    may read up to one more skew less than the minter's: the entry is kept until
    E + 3 x skew by the spender's clock. (3 x, not 2 x, so that processors merely each
    within ``skew`` of the minter, up to 2 x skew apart, still never honor a proof
    another has already forgotten.)

    The minter's clock read the proof's minting time when it minted it, so every
    processor's clock had reached that time less ``skew`` (``Ticket.minted_after``),
    whatever lifetime it was minted for."""
    match = _PROOF.fullmatch(params[PROOF_KEY])
    assert match is not None, "verified"
    _, _, minted, expiry, _, _, _, mac = match.groups()
    margin = math.ceil(skew)
    return Ticket(_unb64(mac)[:TICKET_BYTES], int(expiry) + 3 * margin, int(minted) - margin)
