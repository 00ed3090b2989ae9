"""Honoring a proof once: what a stream asks the record of spent proofs, and the answer.

A proof lets a decode server read KV blocks that a prefill server keeps for one read,
for its connector's lease. The first honored use of a proof spends it; any later use,
on any worker or processor that shares the record, is refused like an unproven one, so
a decode never reads blocks that may have been freed and reused for another request.

Pure values; the stores are ``ext_proc.edge.record`` (one processor) and
``ext_proc.edge.redis_record`` (several).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Protocol

from ext_proc.core.reasons import Reason

# Bytes of a proof's MAC that name it in the record (``Ticket.key``).
TICKET_BYTES: Final = 16

# The local record's table (``ext_proc.edge.record``): a header, then buckets of
# ``BUCKET_SLOTS`` slots. Its layout is stated here because the configuration charges
# the table's size to the in-flight budget before any record exists.
BUCKET_SLOTS: Final = 32
# magic, buckets, secret, began and the latest time seen (unix seconds), the record's
# ``Terms`` (its skew)
TABLE_HEADER: Final = struct.Struct("<8sQ16sqqI")
TABLE_SLOT: Final = struct.Struct(f"<{TICKET_BYTES}sq")  # key, kept until (unix seconds)


def allowance(skew: int) -> int:
    """How far (seconds) a processor's clock may read below the latest time a record has
    seen, given ``skew`` (``clock_skew_seconds``) between any processor and a minter:
    two processors each within ``skew`` of a minter are up to 2 x ``skew`` apart. A
    clock further behind is ``CLOCK_BEHIND``: it could verify again a proof the record
    already forgot (kept until expiry + 3 x skew, verified until expiry + skew)."""
    return 2 * skew


def table_bytes(slots: int) -> int:
    """The bytes of a table of at least ``slots`` slots (whole buckets)."""
    return TABLE_HEADER.size + -(-slots // BUCKET_SLOTS) * BUCKET_SLOTS * TABLE_SLOT.size


@dataclass(frozen=True, slots=True)
class Ticket:
    """One proof, as the record keeps it: ``key`` identifies it (part of its MAC, which
    no one without the signing key can choose); ``expires_at`` (unix seconds, this
    processor's clock) is when no processor can still verify it; ``minted_after`` (unix
    seconds) is a time every processor's clock had reached when it was minted (the
    minting time the proof states, less a skew). Both follow from the spending
    processor's own ``Terms``; a record judges them under its own (``Terms.widened``).

    A record that began (was created, or found Redis forgot or may have forgotten what
    it held) at ``began`` by some processor's clock honors only a ticket with
    ``minted_after >= began``: that proof was minted after the record began, so no
    record that came before could have spent it."""

    key: bytes
    expires_at: int
    minted_after: int

    def fresh(self, began: int) -> bool:
        """Minted after a record that began at ``began`` (unix seconds) began."""
        return self.minted_after >= began


@dataclass(frozen=True, slots=True)
class Terms:
    """What a record's entries rest on (``config.Proof``): ``skew``
    (``clock_skew_seconds``). A spender keeps a proof until its expiry + 3 x skew and
    dates its minting by the minting time it states less a skew (``proof.ticket``).
    Lifetimes date nothing: a proof states when it was minted, and a verifier refuses
    one minted for longer than its own lifetime.

    Writers of one record whose skews differ would each keep entries for their own: a
    processor with a larger skew still verifies a proof after one with a smaller skew
    let its entry expire. So a record keeps the largest skew any of its writers brought
    and judges every ticket under it (``widened``): a rollout that raises the skew
    honors nothing twice, and one that lowers it keeps entries as long as before. A
    writer whose skew the record does not cover raises it, and the record begins again
    then: what it kept before was kept for the smaller skew only
    (``Verdict.PREDATES`` for the proofs minted before, as after any beginning)."""

    skew: int = 0

    def covers(self, other: Terms) -> bool:
        """Entries kept under these terms are kept at least as long, and dated at least
        as early, as under ``other``."""
        return self.skew >= other.skew

    def joined(self, other: Terms) -> Terms:
        """The least terms that cover both."""
        return Terms(max(self.skew, other.skew))

    def widened(self, ticket: Ticket, own: Terms) -> Ticket:
        """``ticket``, made under ``own`` terms (which these cover), as these keep it
        and date its minting."""
        more_skew = self.skew - own.skew
        return Ticket(
            ticket.key, ticket.expires_at + 3 * more_skew, ticket.minted_after - more_skew
        )


# The terms of a record given none (a test's, a benchmark's): no skew.
NO_TERMS: Final = Terms()


class Verdict(StrEnum):
    """The record's answer. ``UNAVAILABLE`` refuses the request with a 503 to retry
    (``inspection.settle``): the record's state, not the proof's, never a reason to
    forward without the proof. Every other value but ``FIRST`` is the reason the proof
    is then treated as unproven (``reason``): ``PREDATES`` among them, since no record
    that began after a proof was minted will ever vouch for it, so a retry would only
    be refused again until the proof expires."""

    FIRST = "first"  # recorded now: the proof is honored
    SPENT = Reason.PROOF_REPLAYED  # honored before: not again
    # the record did not answer, or answered and cannot keep the record
    UNAVAILABLE = Reason.PROOF_RECORD_UNAVAILABLE
    PREDATES = Reason.PROOF_PREDATES_RECORD  # minted before the record began (Ticket.fresh)
    FULL = Reason.PROOF_RECORD_FULL  # the record has no room left to remember it
    CLOCK_BEHIND = Reason.CLOCK_BEHIND  # this clock reads before what the record has seen

    @property
    def reason(self) -> Reason | None:
        """Why the proof is not honored; None: it is (``FIRST``)."""
        return None if self is Verdict.FIRST else Reason(self.value)


class Record(Protocol):
    """Where spent proofs are kept (``record.LocalRecord``, ``redis_record.RedisRecord``).
    ``spend`` never raises: a record it cannot consult is ``UNAVAILABLE``, a ticket
    minted before the record began ``PREDATES``."""

    size: int  # bytes held in this process (charged to the in-flight budget)

    async def spend(self, ticket: Ticket) -> Verdict: ...

    async def close(self) -> None: ...
