"""The record of spent proofs for one processor: a fixed table every worker maps.

The table lives in a file the supervisor creates before it starts its workers (or in
anonymous memory when one process serves alone), mapped shared by each of them, so a
proof spent on one worker is spent on all: the workers share a port, and a replay must
not succeed by landing on another. An exclusive ``flock`` on the file serialises the
few microseconds each lookup takes; the kernel releases it when a holder dies, so a
killed worker never wedges the others.

A table begins when it is created (``began``, in its header): a processor restarted
whole (a crash, an OOM kill, a rollout) starts a new one that has forgotten every proof
spent before, so it honors only proofs minted after it began (``Ticket.fresh``); the
others answer ``UNAVAILABLE``. A worker the supervisor restarts maps the same table and
keeps its ``began``.

Time never runs backwards for the table: its header keeps the latest second any spend
read from the clock (``seen``), and a spend whose clock reads more than
``replay.allowance(skew)`` below it is ``CLOCK_BEHIND``, not judged. A slot is reused
only by a spend that read a time past the slot's (a proof's expiry + 3 x skew), so a
clock stepped back far enough to verify that proof again reads more than 2 x skew below
``seen``.

Layout: a header (magic, the bucket count, a random secret, when it began, the latest
second seen), then buckets of
``BUCKET_SLOTS`` slots, each a proof's key and the unix second until which it is kept.
A key goes in the bucket its keyed hash names (the secret keeps clients who hold many
proofs from aiming them at one bucket); a slot whose time has passed is free. A bucket
without a free slot answers ``FULL``: the proof is not honored, never forgotten early.

Its size is fixed at start-up (``table_bytes``) and charged to the in-flight budget
(``service.ExternalProcessor``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import math
import mmap
import os
import secrets
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from ext_proc.core.replay import (
    BUCKET_SLOTS,
    TABLE_HEADER,
    TABLE_SLOT,
    Ticket,
    Verdict,
    allowance,
    table_bytes,
)

log = logging.getLogger("ext_proc.record")
MAGIC: Final = b"xpspent3"
_HEADER: Final = TABLE_HEADER
_SLOT: Final = TABLE_SLOT
_BUCKET_BYTES: Final = BUCKET_SLOTS * _SLOT.size
# The header's last field: the latest second a spend read from the clock.
_SEEN: Final = struct.Struct("<q")
_SEEN_AT: Final = _HEADER.size - _SEEN.size


def _header(slots: int, began: float) -> bytes:
    # ``began`` rounded up: a proof minted within the second the table began is not fresh.
    # The table has seen its beginning.
    start = math.ceil(began)
    return _HEADER.pack(MAGIC, -(-slots // BUCKET_SLOTS), secrets.token_bytes(16), start, start)


def create(path: Path, slots: int, clock: Callable[[], float] = time.time) -> None:
    """A new, empty table of ``slots`` slots in the file ``path`` (for ``LocalRecord.open``)."""
    with path.open("wb") as out:
        out.truncate(table_bytes(slots))
        out.write(_header(slots, clock()))


class LocalRecord:
    """Spent proofs in a table mapped by every worker of this processor. ``skew``:
    ``proof.clock_skew_seconds``."""

    def __init__(
        self,
        table: mmap.mmap,
        fd: int | None,
        clock: Callable[[], float] = time.time,
        *,
        skew: int = 0,
    ) -> None:
        magic, buckets, secret, began, _seen = _HEADER.unpack_from(table, 0)
        if magic != MAGIC or len(table) != _HEADER.size + buckets * _BUCKET_BYTES:
            raise ValueError("not a table of spent proofs")
        self._table = table
        self._fd = fd
        self._buckets = buckets
        self._secret = secret
        self._clock = clock
        self._allowance = allowance(skew)
        self.began = began
        self.size = len(table)

    @classmethod
    def open(
        cls,
        path: Path,
        clock: Callable[[], float] = time.time,
        *,
        skew: int = 0,
    ) -> LocalRecord:
        """The table in ``path`` (made by ``create``), shared with every process that
        opens it."""
        fd = os.open(path, os.O_RDWR)
        try:
            table = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return cls(table, fd, clock, skew=skew)

    @classmethod
    def anonymous(
        cls,
        slots: int,
        clock: Callable[[], float] = time.time,
        began: float | None = None,
        *,
        skew: int = 0,
    ) -> LocalRecord:
        """A table for this process alone (no lock: one event loop uses it), begun now
        unless ``began`` says when."""
        table = mmap.mmap(-1, table_bytes(slots))
        table[: _HEADER.size] = _header(slots, clock() if began is None else began)
        return cls(table, None, clock, skew=skew)

    async def spend(self, ticket: Ticket) -> Verdict:
        return self.spend_now(ticket)

    def spend_now(self, ticket: Ticket) -> Verdict:
        """``FIRST`` and recorded until ``ticket.expires_at``, or why not."""
        if not ticket.fresh(self.began):
            # The record working as it should after a restart: logged, not an error.
            log.warning(
                "proof record unavailable: the proof may have been minted before this "
                "processor's record of spent proofs began",
                extra={"store": "local", "error": "record_began_after_mint"},
            )
            return Verdict.UNAVAILABLE
        hashed = hashlib.blake2b(ticket.key, key=self._secret, digest_size=8).digest()
        start = _HEADER.size + int.from_bytes(hashed, "little") % self._buckets * _BUCKET_BYTES
        with self._locked():
            # Read under the lock: a worker that waited for it reads no earlier than the
            # one before it wrote.
            now = int(self._clock())
            (seen,) = _SEEN.unpack_from(self._table, _SEEN_AT)
            if now < seen - self._allowance:
                return self._behind(now, seen)
            if now > seen:
                _SEEN.pack_into(self._table, _SEEN_AT, now)
            bucket = self._table[start : start + _BUCKET_BYTES]
            free = None
            for slot, (key, until) in enumerate(_SLOT.iter_unpack(bucket)):
                if until >= now:
                    if key == ticket.key:
                        return Verdict.SPENT
                elif free is None:
                    free = slot
            if free is None:
                return Verdict.FULL
            _SLOT.pack_into(self._table, start + free * _SLOT.size, ticket.key, ticket.expires_at)
        return Verdict.FIRST

    def _behind(self, now: int, seen: int) -> Verdict:
        log.warning(
            "proof record: this processor's clock reads before a time the record has "
            "seen; no proof is honored until it catches up",
            extra={
                "store": "local",
                "error": Verdict.CLOCK_BEHIND.value,
                "behind_seconds": seen - now,
            },
        )
        return Verdict.CLOCK_BEHIND

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._fd is None:
            yield
            return
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    async def close(self) -> None:
        self._table.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
