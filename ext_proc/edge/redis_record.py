"""The record of spent proofs shared by several processors: one Redis key per proof.

``SET <prefix><key> 1 NX PX <ms>``: Redis sets the key only when it is absent, in one
command, so exactly one of any number of processors presenting the same proof is told
``FIRST``; the key lives until the ticket expires (by this processor's clock).

A Redis that lost writes has forgotten proofs honored before, and any of them could be
honored again: one restarted (from an RDB snapshot or an AOF, or empty), restored from
a backup, flushed, or a replica promoted after a failover (which lacks what was not yet
replicated). Each of these changes what ``SINCE`` is checked against, so the record
notices it whatever the data it came back with says:

- ``SINCE`` holds the incarnation of the Redis that wrote it, its ``run_id`` (new on
  every start of a redis-server process, so on every restart, restore or failover to
  another process), ``master_replid`` (new when a replica is promoted, and when a
  master that followed another is made master again) and its history (how many keys it
  evicted, and how often it ran a command that puts other data in place of a key:
  SWAPDB, MOVE, COPY, RESTORE, a flush, DEBUG), and the time the record began.
  A missing ``SINCE`` (a flush), or one of another incarnation (whatever a snapshot,
  AOF, backup or replication brought back), is rewritten: the record begins now.
- A proof is honored only when it was minted after the record began
  (``Ticket.fresh``): no earlier incarnation can have spent it. One minted before is
  ``PREDATES``: no later spend could honor it either, so it is treated as unproven
  rather than refused to retry.
- A replica is refused (``role`` is not ``master``): a writable replica would keep a
  second record. So is an eviction policy other than ``noeviction``: an evicted key is
  a forgotten proof.
- The history is read from the server's statistics, which ``CONFIG RESETSTAT`` zeroes:
  after older data was put back, a reset would make the counts match the older
  ``SINCE``. Redis 7 keeps a line for the reset command in the statistics it zeroed,
  and no command removes it short of a new process: a Redis that shows it keeps no
  record (``redis_stats_reset``) until it is restarted, and one older than 7.0, which
  cannot show it, none at all (``redis_too_old``).
- Time never runs backwards for the record: ``SINCE`` also holds the latest time a
  spend read from a processor's clock, carried on by Redis's own clock for as long as
  a key set then may live. A spend whose clock reads more than
  ``replay.allowance(skew)`` below it (plus the longest a spend may take to reach
  Redis, which its key lives longer by) is ``CLOCK_BEHIND``: a key expires only once
  that time is past its proof's expiry + 3 x skew, when no clock within the allowance
  verifies the proof.
- The writers' terms (``replay.Terms``: ``clock_skew_seconds``) are in ``TERMS``, bound
  to the incarnation and the beginning they were written under: the largest skew any
  writer brought since the record began. Every spend keeps and dates its proof under
  it; a spend whose own skew exceeds it (a rollout that raises it) raises it and begins
  the record again (``record_terms_raised``, ``PREDATES``: its proof was minted before
  that spend's clock read, within the skew): keys set before lived for the smaller
  skew only. A record whose beginning states no terms (one a processor of an earlier
  release began) begins again the same way. Lifetimes are no terms: a proof states
  when it was minted, which dates it whoever minted it for however long.

All of it in one script, one round trip, read from the server itself at each spend, so
a processor that just started, or that never saw the Redis before, judges alike.

Every failure (refused, reset, timed out, a reply that is not Redis's, a script error,
a Redis that answers and cannot keep the record) is ``UNAVAILABLE``: the proof is not
honored, a warning is logged and counted, and the next proof tries again, so honoring
resumes on its own once Redis answers. One attempt per proof, bounded by ``timeout``
seconds: a Redis that stalls delays only the decode legs waiting for it, never another
stream.

The record's ``state`` (``RecordState``) is what the last consultation found: a spend,
or ``probe``, the start-up checks (``check``) run again every ``PROBE_SECONDS`` while
the processor serves (``edge.server``), so a record that was unreachable at
start-up, or went away with no proof to spend, is seen to answer (or to answer as a
Redis that cannot keep the record) without waiting for a proof. The state decides
nothing: every spend still judges the server it reaches.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Final

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ext_proc.core.config import ConfigError
from ext_proc.core.replay import NO_TERMS, Terms, Ticket, Verdict, allowance

log = logging.getLogger("ext_proc.record")
PREFIX: Final = "ext_proc:spent:"
SINCE: Final = "ext_proc:spent-since"
TERMS: Final = "ext_proc:spent-terms"
# The commands that put other data in place of a key without a new run_id or replid
# (SWAPDB swaps a database back, MOVE, COPY and RESTORE bring an older key back, a
# flush or DEBUG RELOAD replaces it) and the count of evicted keys make the record's
# history: a change in any of them since the record began begins it again.
_REWRITERS: Final = (
    "swapdb",
    "move",
    "copy",
    "restore",
    "restore-asking",
    "flushdb",
    "flushall",
    "debug",
)
# Sets ``incarnation``: the server's run_id, its master_replid and its history; and
# ``reset``: whether CONFIG RESETSTAT ever ran in this process. Redis 7 counts each
# subcommand apart, and a RESETSTAT zeroes every count, then counts itself: its line
# never leaves the statistics of the process that ran it.
_INCARNATION: Final = """
local server = redis.call('INFO', 'server')
local replication = redis.call('INFO', 'replication')
local stats = redis.call('INFO', 'stats')
local commands = redis.call('INFO', 'commandstats')
local history = string.match(stats, 'evicted_keys:(%d+)')
for _, name in ipairs({@REWRITERS@}) do
  history = history .. ',' .. (string.match(commands, 'cmdstat_' .. name .. ':calls=(%d+)') or '0')
end
local incarnation = string.match(server, 'run_id:(%x+)') .. ':'
  .. string.match(replication, 'master_replid:(%x+)') .. ':' .. history
local reset = string.find(commands, 'cmdstat_config|resetstat:', 1, true) ~= nil
local major = tonumber(string.match(server, 'redis_version:(%d+)%.'))
local at = redis.call('TIME')
at = tonumber(at[1]) * 1000 + math.floor(tonumber(at[2]) / 1000)
""".replace("@REWRITERS@", ", ".join(f"'{name.replace('-', '%-')}'" for name in _REWRITERS))
# SINCE's value: the incarnation that wrote it, when the record began (unix seconds),
# the latest time a spend read from a processor's clock (unix ms), Redis's clock then
# (ms), and how long after that (ms) a key then set may live.
_SINCE_FORMAT: Final = "'%s %d %d %d %d', incarnation, began, seen, at, window"
# TERMS's value: the incarnation and the beginning it was written under, then the
# terms (the skew, seconds).
_TERMS_FORMAT: Final = "'%s %d %d', incarnation, began, skew"
# KEYS: SINCE, TERMS, the proof's key; ARGV: now (unix seconds, rounded up), when the
# proof was minted after (unix seconds), its lifetime (ms), now (unix ms, rounded down),
# how far (ms) a clock may read below the latest time seen, the spender's terms (its
# skew) the two times follow from. 1: recorded now; 0: recorded before; -1: minted
# before the record began; -2: not a master; -3: keys may be evicted; -4: this clock
# reads before the latest time the record has seen;
# -5: the statistics the history is read from were reset (CONFIG RESETSTAT); -6: older
# than Redis 7, whose statistics cannot show that; -7: the spender's terms exceed the
# record's: raised, and the record began again.
# A field missing from INFO (not a Redis) fails the script: UNAVAILABLE.
_SPEND: Final = (
    _INCARNATION
    + """
if string.match(replication, 'role:(%a+)') ~= 'master' then
  return -2
end
local memory = redis.call('INFO', 'memory')
if string.match(memory, 'maxmemory_policy:([%w-]+)') ~= 'noeviction' then
  return -3
end
if major < 7 then
  return -6
end
if reset then
  return -5
end
local now = tonumber(ARGV[4])
local began, seen, anchor, window = nil, now, at, 0
local since = redis.call('GET', KEYS[1])
if since then
  local wrote, b, s, a, w = string.match(since, '^(%S+) (%d+) (%d+) (%d+) (%d+)$')
  if wrote == incarnation then
    began, seen, anchor, window = tonumber(b), tonumber(s), tonumber(a), tonumber(w)
  end
end
local begun = began == nil
if begun then
  began = tonumber(ARGV[1])
end
-- The latest time seen goes on with Redis's clock for as long as a key set then may
-- live: a key expires only once that time is past its proof's expiry + 3 x skew.
local carried = math.min(math.max(at - anchor, 0), window)
seen = seen + carried
if now < seen - tonumber(ARGV[5]) then
  return -4
end
seen = math.max(seen, now)
-- The writers' skew since the record began; a spender's that exceeds it raises it and
-- begins the record again (so does none stated for this beginning).
local own_skew = tonumber(ARGV[6])
local skew = nil
local terms = redis.call('GET', KEYS[2])
if terms and not begun then
  local wrote, b, s = string.match(terms, '^(%S+) (%d+) (%d+)$')
  if wrote == incarnation and tonumber(b) == began then
    skew = tonumber(s)
  end
end
local raised = false
if skew == nil then
  skew = own_skew
  raised = not begun
elseif skew < own_skew then
  skew = own_skew
  raised = true
end
if raised then
  began = math.max(began, tonumber(ARGV[1]))
end
-- The proof kept and dated under the record's terms (replay.Terms.widened).
local lifetime = tonumber(ARGV[3]) + 3000 * (skew - own_skew)
local minted_after = tonumber(ARGV[2]) - (skew - own_skew)
window = math.max(window - carried, lifetime)
redis.call('SET', KEYS[1], string.format(@SINCE@))
if begun or raised then
  redis.call('SET', KEYS[2], string.format(@TERMS@))
end
if raised then
  return -7
end
if minted_after < began then
  return -1
end
if redis.call('SET', KEYS[3], '1', 'NX', 'PX', lifetime) then
  return 1
end
return 0
""".replace("@SINCE@", _SINCE_FORMAT).replace("@TERMS@", _TERMS_FORMAT)
)
# KEYS: SINCE, TERMS; ARGV: when the record began (unix seconds), its terms (the
# skew). For a Redis known to have recorded nothing before (a benchmark's, a
# test's): the record began then, on it, under those terms, and has seen that time.
_BEGIN: Final = (
    _INCARNATION
    + """
local began, seen, window = tonumber(ARGV[1]), tonumber(ARGV[1]) * 1000, 0
local skew = tonumber(ARGV[2])
redis.call('SET', KEYS[1], string.format(@SINCE@))
redis.call('SET', KEYS[2], string.format(@TERMS@))
""".replace("@SINCE@", _SINCE_FORMAT).replace("@TERMS@", _TERMS_FORMAT)
)


def begin(client: redis.Redis, began: int, terms: Terms = NO_TERMS) -> None:
    """State that the record on the Redis of ``client`` began at ``began`` (unix
    seconds) under ``terms``, as a spend would have written it then."""
    client.eval(_BEGIN, 2, SINCE, TERMS, began, terms.skew)


# The script's refusals: the log's ``error`` and its words. A record that began after
# the proof was minted is the record working as it should after Redis forgot: logged,
# not counted as an error (the alert on record errors would fire after every restart),
# and ``PREDATES``, not ``UNAVAILABLE``. So is one whose terms a spender raised (it
# began again).
_BEGAN_AFTER_MINT: Final = -1
_NOT_MASTER: Final = -2
_EVICTS: Final = -3
_CLOCK_BEHIND: Final = -4
_STATS_RESET: Final = -5
_TOO_OLD: Final = -6
_TERMS_RAISED: Final = -7
_BEGINNINGS: Final = frozenset({_BEGAN_AFTER_MINT, _TERMS_RAISED})
_REFUSED: Final = {
    _TERMS_RAISED: (
        "record_terms_raised",
        "this processor's skew exceeds the one the record kept its keys for; it keeps "
        "it from now on and begins again",
    ),
    _BEGAN_AFTER_MINT: (
        "record_began_after_mint",
        "the proof may have been minted before this Redis began its record (a restart, "
        "restore, failover or flush)",
    ),
    _NOT_MASTER: ("redis_not_master", "the Redis is a replica; the record needs the master"),
    _EVICTS: (
        "redis_evicts_keys",
        "the Redis may evict keys (maxmemory-policy is not noeviction): an evicted key "
        "is a forgotten proof",
    ),
    _STATS_RESET: (
        "redis_stats_reset",
        "CONFIG RESETSTAT ran on this Redis: the statistics that show what it lost are "
        "gone; restart the redis-server",
    ),
    _TOO_OLD: (
        "redis_too_old",
        "the Redis is older than 7.0, whose statistics cannot show a CONFIG RESETSTAT",
    ),
}


# How often a serving processor runs the start-up checks again (``RedisRecord.probe``).
PROBE_SECONDS: Final = 2.0


class RecordState(StrEnum):
    """What the last consultation of the Redis found."""

    UNKNOWN = "unknown"  # not consulted yet
    UP = "up"  # it answered and can keep the record
    UNREACHABLE = "unreachable"  # it did not answer (refused, reset, timed out)
    UNSAFE = "unsafe"  # it answered and cannot keep the record (a _REFUSED check)


class RecordUnreachable(ConfigError):
    """The Redis did not answer: an outage the processor serves through (every route
    but a proof's spend), unlike a Redis that answers and cannot keep the record."""


# The script's refusals that say the server cannot keep the record (the rest are the
# record working as it should, or this processor's clock).
_UNSAFE: Final = frozenset({_NOT_MASTER, _EVICTS, _STATS_RESET, _TOO_OLD})


def read_password(path: str | None) -> str | None:
    """The Redis password in ``path`` (one trailing newline, as ``echo`` writes it, is
    not part of it); None without a file."""
    if path is None:
        return None
    try:
        password = Path(path).read_text(encoding="utf-8").removesuffix("\n").removesuffix("\r")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"proof.record_password_file: cannot read {path}: {type(exc).__name__}"
        ) from None
    if not password:
        raise ConfigError(f"proof.record_password_file: {path} is empty")
    return password


class RedisRecord:
    def __init__(
        self,
        url: str,
        timeout: float,
        on_error: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        *,
        terms: Terms = NO_TERMS,
        password_file: str | None = None,
        on_state: Callable[[RecordState], None] = lambda _state: None,
    ) -> None:
        """``terms``: this processor's (``config.Proof.terms``), which its tickets were
        made under; ``password_file``:
        ``proof.record_password_file``, read once here (``ConfigError`` when it cannot
        be, naming the file and never its content); ``on_state``: called with the new
        state whenever a consultation finds another than the last."""
        self._client = redis.asyncio.Redis.from_url(
            url,
            password=read_password(password_file),
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self._spend = self._client.register_script(_SPEND)
        self._timeout = timeout
        self._on_error = on_error
        self._clock = clock
        # A spend reads this clock before its script runs, at most ``timeout`` earlier:
        # a later spend may read less than an earlier one saw by that much. Its key lives
        # that much longer, so a clock that could verify a proof whose key expired still
        # reads more than the allowance below the latest time seen.
        self._in_flight = math.ceil(timeout * 1000)
        self._allowance = allowance(terms.skew) * 1000 + self._in_flight
        self._terms = terms
        self._on_state = on_state
        self.state = RecordState.UNKNOWN
        self.size = 0  # nothing held here beyond a connection

    async def spend(self, ticket: Ticket) -> Verdict:
        """``FIRST`` when this call recorded the proof; ``SPENT`` when it was recorded
        before; ``PREDATES`` when the record began after it was minted; ``UNAVAILABLE``
        when Redis could not be consulted or cannot keep the record (see the module's
        docstring)."""
        now = self._clock()
        lifetime = math.ceil((ticket.expires_at - now) * 1000)
        if lifetime <= 0:
            # Past its time no processor verifies it; nothing to keep.
            return Verdict.SPENT
        name = PREFIX + base64.urlsafe_b64encode(ticket.key).decode("ascii")
        try:
            async with asyncio.timeout(self._timeout):
                recorded = await self._spend(
                    keys=[SINCE, TERMS, name],
                    args=[
                        math.ceil(now),
                        ticket.minted_after,
                        lifetime + self._in_flight,
                        math.floor(now * 1000),
                        self._allowance,
                        self._terms.skew,
                    ],
                )
        except (RedisError, OSError, TimeoutError) as exc:
            self._found(RecordState.UNREACHABLE, type(exc).__name__)
            return self._unavailable(type(exc).__name__, "Redis could not be consulted")
        if recorded in _UNSAFE:
            self._found(RecordState.UNSAFE, _REFUSED[recorded][0])
        elif recorded in (0, 1, *_BEGINNINGS, _CLOCK_BEHIND):
            self._found(RecordState.UP)
        if recorded == _CLOCK_BEHIND:
            # This processor's clock, not the record: logged, counted as the decision's
            # reason.
            log.warning(
                "proof record: this processor's clock reads before a time the record has "
                "seen; no proof is honored until it catches up",
                extra={"store": "redis", "error": Verdict.CLOCK_BEHIND.value},
            )
            return Verdict.CLOCK_BEHIND
        if recorded in _BEGINNINGS:
            why, words = _REFUSED[recorded]
            log.warning(f"proof record: {words}", extra={"store": "redis", "error": why})
            return Verdict.PREDATES
        if recorded in _REFUSED:
            why, words = _REFUSED[recorded]
            return self._unavailable(why, words)
        if recorded not in (0, 1):
            return self._unavailable("unexpected_reply", "Redis answered the script oddly")
        return Verdict.FIRST if recorded == 1 else Verdict.SPENT

    def _unavailable(self, why: str, words: str) -> Verdict:
        self._on_error()
        log.warning(f"proof record unavailable: {words}", extra={"store": "redis", "error": why})
        return Verdict.UNAVAILABLE

    async def check(self) -> None:
        """Before serving: the Redis answers and can keep the record, or ``ConfigError``
        naming what is wrong (one line; the URL is not shown, it may hold a password):
        ``RecordUnreachable`` when it did not answer. The spends still judge for
        themselves: a Redis can change under a running processor."""
        log.info("proof record: Redis", extra=await self._inspect())

    async def _inspect(self) -> dict[str, object]:
        """``check`` without its log line: what the Redis said (the log's fields)."""
        try:
            async with asyncio.timeout(4 * self._timeout):
                role = (await self._client.info("replication")).get("role")
                policy = (await self._client.info("memory")).get("maxmemory_policy")
                version = str((await self._client.info("server")).get("redis_version"))
                reset = "cmdstat_config|resetstat" in await self._client.info("commandstats")
        except (RedisError, OSError, TimeoutError) as exc:
            said = str(exc).splitlines()[0] if str(exc) else "no answer"
            raise RecordUnreachable(
                f"proof.record: the Redis cannot be consulted ({type(exc).__name__}: {said})"
            ) from None
        major = version.partition(".")[0]
        checks = (
            (_NOT_MASTER, role != "master"),
            (_EVICTS, policy != "noeviction"),
            (_TOO_OLD, not major.isdigit() or int(major) < 7),
            (_STATS_RESET, reset),
        )
        refused = [_REFUSED[code] for code, wrong in checks if wrong]
        if refused:
            raise ConfigError(
                "proof.record: this Redis cannot keep the record: "
                + "; ".join(f"{why}: {words}" for why, words in refused)
                + " (docs/operations.md#what-the-redis-must-be)"
            )
        return {"store": "redis", "role": role, "maxmemory_policy": policy, "version": version}

    async def probe(self) -> RecordState:
        """The start-up checks run again (``check``); the state they find."""
        try:
            fields = await self._inspect()
        except RecordUnreachable as exc:
            self._found(RecordState.UNREACHABLE, str(exc))
        except ConfigError as exc:
            self._found(RecordState.UNSAFE, str(exc))
        else:
            self._found(RecordState.UP, fields=fields)
        return self.state

    def _found(
        self, state: RecordState, why: str = "", *, fields: dict[str, object] | None = None
    ) -> None:
        """A consultation found ``state``: logged and reported when it changed."""
        if state is self.state:
            return
        self.state = state
        fields = {**(fields or {}), "store": "redis", "state": state.value}
        if state is RecordState.UP:
            log.info("proof record: Redis answers and can keep the record", extra=fields)
        else:
            log.warning(
                "proof record: no proof is honored until Redis answers and can keep the record",
                extra={**fields, "detail": why},
            )
        self._on_state(state)

    async def close(self) -> None:
        await self._client.aclose()
