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
others answer ``PREDATES`` (unproven: no later spend could honor them). A worker the
supervisor restarts maps the same table and keeps its ``began``.

The table's file (``table_path``: in the temporary directory, named by the listen
address) outlives the process, and ``begin`` reads the old table's header before
replacing it: the new one begins after the latest second the old one saw and has seen
that second, so a process restarted with its clock behind never begins before a proof
the old one honored, and is ``CLOCK_BEHIND`` until its clock catches up. Where no file
survives (a new machine or pod, a new temporary directory) the table begins at the
clock, as every record does. The process that begins a table holds its lock while the
table is in use: no other process replaces a table some process still spends into.

Time never runs backwards for the table: its header keeps the latest second any spend
read from the clock (``seen``), and a spend whose clock reads more than
``replay.allowance(skew)`` below it is ``CLOCK_BEHIND``, not judged. A slot is reused
only by a spend that read a time past the slot's (a proof's expiry + 3 x skew), so a
clock stepped back far enough to verify that proof again reads more than 2 x skew below
``seen``.

The header also keeps the terms its entries rest on (``replay.Terms``: the skew), the
largest any of its workers brought: every ticket is kept and dated under them, and a
worker whose terms exceed them raises them and begins the table again. The supervisor
writes its configuration's terms when it creates the table and its workers share that
configuration: the terms differ only where processes configured apart map one table.
A processor restarted whole with another configuration begins a new table: what it
honors there was minted after that (a proof states when it was minted), and for no
longer than its own lifetimes (``proof.Claim.authentic``).

Layout: a header (magic, the bucket count, a random secret, when it began, the latest
second seen, the terms), then buckets of
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
import re
import secrets
import stat
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from ext_proc.core.address import UNIX_PREFIX
from ext_proc.core.config import ConfigError
from ext_proc.core.replay import (
    BUCKET_SLOTS,
    NO_TERMS,
    TABLE_HEADER,
    TABLE_SLOT,
    Terms,
    Ticket,
    Verdict,
    allowance,
    table_bytes,
)

log = logging.getLogger("ext_proc.record")
# A new layout must still read this one's mark (began, seen, terms) from a file left
# before it: a processor upgraded where its table's file is would otherwise begin at its
# clock, as on a new machine.
MAGIC: Final = b"xpspent4"
_HEADER: Final = TABLE_HEADER
_SLOT: Final = TABLE_SLOT
_BUCKET_BYTES: Final = BUCKET_SLOTS * _SLOT.size
# The header's fields a spend reads and writes: when the table began, the latest second
# a spend read from the clock, the terms.
_SECOND: Final = struct.Struct("<q")
_TERMS: Final = struct.Struct("<I")
_TERMS_AT: Final = _HEADER.size - _TERMS.size
_SEEN_AT: Final = _TERMS_AT - _SECOND.size
_BEGAN_AT: Final = _SEEN_AT - _SECOND.size
# The latest mark a table begins after: any later one (a header written wrong) is that,
# which no clock reaches, so the new table is CLOCK_BEHIND, and fits the header.
_LATEST_MARK: Final = 2**62
# What of a listen address goes into a file name as it is.
_FILE_NAME: Final = re.compile(r"[^A-Za-z0-9.]+")


def _header(slots: int, began: float, terms: Terms) -> bytes:
    # ``began`` rounded up: a proof minted within the second the table began is not fresh.
    # The table has seen its beginning.
    start = math.ceil(began)
    buckets = -(-slots // BUCKET_SLOTS)
    return _HEADER.pack(MAGIC, buckets, secrets.token_bytes(16), start, start, terms.skew)


def create(
    path: Path, slots: int, clock: Callable[[], float] = time.time, *, terms: Terms = NO_TERMS
) -> None:
    """A new, empty table of ``slots`` slots in the file ``path`` (for
    ``LocalRecord.open``), its entries kept under ``terms``."""
    with path.open("wb") as out:
        out.truncate(table_bytes(slots))
        out.write(_header(slots, clock(), terms))


def table_path(listen: str) -> Path | None:
    """Where the processor serving ``listen`` keeps its table: one file per address
    (no two processors serve one address on a host), in the temporary directory (the
    shipped manifests' emptyDir, which a container restarted in its pod keeps). None
    for port 0, a port of the system's choosing: no two starts have the same, so no
    later process finds the table there again, and processors started on it are no two
    on one address. ``ConfigError`` when there is no temporary directory to write."""
    if not listen.startswith(UNIX_PREFIX) and listen.rpartition(":")[2] == "0":
        return None
    try:
        directory = tempfile.gettempdir()
    except FileNotFoundError as exc:
        raise ConfigError(
            f"no directory for the table of spent proofs: {exc} (TMPDIR or /tmp must be writable)"
        ) from None
    return Path(directory) / f"ext-proc-spent-proofs-{_FILE_NAME.sub('-', listen)}"


def begin(
    path: Path, slots: int, clock: Callable[[], float] = time.time, *, terms: Terms = NO_TERMS
) -> int:
    """A new, empty table in ``path`` (as ``create``) that begins after the latest
    second the table it replaces saw, and has seen that second. The new file takes the
    old one's place at once (a rename): a process killed meanwhile leaves the old.

    Returns the descriptor of the table's lock (``_hold``), which the caller keeps open
    while it or its workers use the table: no other process begins one there until it
    is closed or the process ends. ``ConfigError`` when another process holds it."""
    lock = _hold(path)
    try:
        _replace(path, slots, clock, terms)
    except BaseException:
        os.close(lock)
        raise
    return lock


def _hold(path: Path) -> int:
    """The table's lock (``<path>.lock``, this user's own file), held exclusively. A
    process that replaced a table still in use would leave its users spending into a
    file no one reads again, and the next process to start there would read the wrong
    time. A POSIX lock: the kernel releases it when its process dies, however."""
    lock = path.with_name(f"{path.name}.lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise _unwritable(lock, exc.strerror or exc) from None
    try:
        _lock(fd, lock, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock(fd: int, lock: Path, path: Path) -> None:
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid():
        raise _unwritable(lock, "not a file of this user's own")
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise ConfigError(
            f"another processor keeps its table of spent proofs in {path} (it serves "
            "this listen address, or one named alike): it must stop before this one starts"
        ) from None


def _unwritable(path: Path, why: object) -> ConfigError:
    return ConfigError(
        f"cannot write the table of spent proofs {path}: {why} (it lives in the "
        "temporary directory, TMPDIR or /tmp, which must be writable)"
    )


def _replace(path: Path, slots: int, clock: Callable[[], float], terms: Terms) -> None:
    """Under the table's lock: the new table in ``path`` (``begin``)."""
    began = clock()
    mark = _mark(path, terms)
    header = bytearray(_header(slots, began, terms))
    if mark is not None:
        start = max(math.ceil(began), mark + 1)
        _SECOND.pack_into(header, _BEGAN_AT, start)
        _SECOND.pack_into(header, _SEEN_AT, max(math.ceil(began), mark))
    fresh = path.with_name(f"{path.name}.{os.getpid()}.new")
    try:
        fresh.unlink(missing_ok=True)  # one a process of this pid left
        # Only this user reads it: with its secret a client could aim proofs at a bucket.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(fresh, flags, 0o600), "wb") as out:
            out.truncate(table_bytes(slots))
            out.write(header)
        fresh.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            fresh.unlink(missing_ok=True)
        raise _unwritable(path, exc.strerror or exc) from None


def _mark(path: Path, terms: Terms) -> int | None:
    """The latest second the table in ``path`` saw, later by the skew its entries were
    dated under beyond ``terms``' (a proof it honored is dated by that larger skew
    there); None when there is no file. A file that cannot be read as a table is
    logged and leaves the clock to begin the new table, as on a new machine."""
    try:
        head, why = _read_head(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        head, why = b"", exc.strerror or str(exc)
    if len(head) < _HEADER.size or head[: len(MAGIC)] != MAGIC:
        _unreadable(path, why)
        return None
    _magic, _buckets, _secret, began, seen, skew = _HEADER.unpack(head)
    return min(int(max(began - 1, seen) + max(0, skew - terms.skew)), _LATEST_MARK)


def _read_head(path: Path) -> tuple[bytes, str]:
    """The first bytes of this user's regular file in ``path``, or none and why. Neither
    a link nor a FIFO (which would wait for a writer) is followed, nor another user's
    file read: anyone who can write the temporary directory may have put one there."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as old:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            return b"", "not a regular file"
        if found.st_uid != os.geteuid():
            return b"", "another user's file"
        return old.read(_HEADER.size), "not a table of spent proofs"


def _unreadable(path: Path, why: str) -> None:
    log.error(
        "proof record: the previous table of spent proofs cannot be read (%s); the new "
        "one begins at this clock, as on a new machine",
        why,
        extra={"store": "local", "error": "record_mark_unreadable", "path": str(path)},
    )


class LocalRecord:
    """Spent proofs in a table mapped by every worker of this processor. ``terms``:
    this processor's (``config.Proof.terms``), which its tickets were made under."""

    def __init__(
        self,
        table: mmap.mmap,
        fd: int | None,
        clock: Callable[[], float] = time.time,
        *,
        terms: Terms = NO_TERMS,
    ) -> None:
        magic, buckets, secret, *_state = _HEADER.unpack_from(table, 0)
        if magic != MAGIC or len(table) != _HEADER.size + buckets * _BUCKET_BYTES:
            raise ValueError("not a table of spent proofs")
        self._table = table
        self._fd = fd
        # The file of a table this process alone maps: cut to its header at close (its
        # time is all the next process reads). Cut by this descriptor, never by name:
        # a processor started meanwhile may have put its own table there.
        self._own: int | None = None
        # Its lock (``begin``), held until then.
        self._lock: int | None = None
        self._buckets = buckets
        self._secret = secret
        self._clock = clock
        self._terms = terms
        self._allowance = allowance(terms.skew)
        self.size = len(table)

    @property
    def began(self) -> int:
        """When the table began (unix seconds)."""
        return int(_SECOND.unpack_from(self._table, _BEGAN_AT)[0])

    @property
    def terms(self) -> Terms:
        """The terms the table keeps its entries under."""
        return Terms(*_TERMS.unpack_from(self._table, _TERMS_AT))

    @classmethod
    def open(
        cls,
        path: Path,
        clock: Callable[[], float] = time.time,
        *,
        terms: Terms = NO_TERMS,
    ) -> LocalRecord:
        """The table in ``path`` (made by ``create``), shared with every process that
        opens it."""
        fd = os.open(path, os.O_RDWR)
        try:
            table = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return cls(table, fd, clock, terms=terms)

    @classmethod
    def alone(
        cls,
        path: Path | None,
        slots: int,
        clock: Callable[[], float] = time.time,
        *,
        terms: Terms = NO_TERMS,
    ) -> LocalRecord:
        """A table for this process alone (no lock: one event loop uses it), begun in
        ``path`` (``begin``) so that its time outlives the process; in memory when
        there is no path (``table_path``)."""
        if path is None:
            return cls.anonymous(slots, clock, terms=terms)
        lock = begin(path, slots, clock, terms=terms)
        try:
            fd = os.open(path, os.O_RDWR)
        except BaseException:
            os.close(lock)
            raise
        try:
            table = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            os.close(lock)
            raise
        alone = cls(table, None, clock, terms=terms)
        alone._own, alone._lock = fd, lock
        return alone

    @classmethod
    def anonymous(
        cls,
        slots: int,
        clock: Callable[[], float] = time.time,
        began: float | None = None,
        *,
        terms: Terms = NO_TERMS,
    ) -> LocalRecord:
        """A table for this process alone (no lock: one event loop uses it), begun now
        unless ``began`` says when."""
        table = mmap.mmap(-1, table_bytes(slots))
        table[: _HEADER.size] = _header(slots, clock() if began is None else began, terms)
        return cls(table, None, clock, terms=terms)

    async def spend(self, ticket: Ticket) -> Verdict:
        return self.spend_now(ticket)

    def spend_now(self, ticket: Ticket) -> Verdict:
        """``FIRST`` and recorded until ``ticket.expires_at`` (under the table's terms),
        or why not."""
        hashed = hashlib.blake2b(ticket.key, key=self._secret, digest_size=8).digest()
        start = _HEADER.size + int.from_bytes(hashed, "little") % self._buckets * _BUCKET_BYTES
        with self._locked():
            # Read under the lock: a worker that waited for it reads no earlier than the
            # one before it wrote.
            read = self._clock()
            kept = self.terms
            if not kept.covers(self._terms):
                return self._raise(kept, read)
            ticket = kept.widened(ticket, self._terms)
            # The clock first: a table begun after a mark its clock reads before (a
            # process restarted with its clock behind) answers why.
            now = int(read)
            (seen,) = _SECOND.unpack_from(self._table, _SEEN_AT)
            if now < seen - self._allowance:
                return self._behind(now, seen)
            if now > seen:
                _SECOND.pack_into(self._table, _SEEN_AT, now)
            if not ticket.fresh(self.began):
                # The record working as it should after a restart: logged, not an error.
                log.warning(
                    "proof record: the proof may have been minted before this processor's "
                    "record of spent proofs began; it is not honored",
                    extra={"store": "local", "error": "record_began_after_mint"},
                )
                return Verdict.PREDATES
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

    def _raise(self, kept: Terms, read: float) -> Verdict:
        """Under the lock: this worker's terms exceed the table's. The table keeps the
        larger ones from now on and begins again (never earlier than it had): what it
        kept before was kept for the smaller terms only. It begins at this read of the
        clock, which the proof's ``minted_after`` (its minting less a skew) does not pass
        on any clock within the skew of the minter's: ``PREDATES``."""
        terms = kept.joined(self._terms)
        _TERMS.pack_into(self._table, _TERMS_AT, terms.skew)
        _SECOND.pack_into(self._table, _BEGAN_AT, max(self.began, math.ceil(read)))
        log.warning(
            "proof record: this processor's skew exceeds the one the record of spent "
            "proofs kept its entries for; it keeps it from now on and begins again",
            extra={"store": "local", "error": "record_terms_raised", **_fields(terms)},
        )
        return Verdict.PREDATES

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
        if self._own is not None:
            os.ftruncate(self._own, _HEADER.size)
            os.close(self._own)
            self._own = None
        if self._lock is not None:  # after the cut: the next process reads the header
            os.close(self._lock)
            self._lock = None


def _fields(terms: Terms) -> dict[str, int]:
    """A log line's fields for the terms a record now keeps."""
    return {"clock_skew_seconds": terms.skew}
