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
  (``Ticket.fresh``): no earlier incarnation can have spent it.
- A replica is refused (``role`` is not ``master``): a writable replica would keep a
  second record. So is an eviction policy other than ``noeviction``: an evicted key is
  a forgotten proof.

All of it in one script, one round trip, read from the server itself at each spend, so
a processor that just started, or that never saw the Redis before, judges alike.

Every failure (refused, reset, timed out, a reply that is not Redis's, a script error)
is ``UNAVAILABLE``: the proof is not honored, a warning is logged and counted, and the
next proof tries again, so honoring resumes on its own once Redis answers. One attempt
per proof, bounded by ``timeout`` seconds: a Redis that stalls delays only the decode
legs waiting for it, never another stream.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import time
from collections.abc import Callable
from typing import Final

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ext_proc.core.replay import Ticket, Verdict

log = logging.getLogger("ext_proc.record")
PREFIX: Final = "ext_proc:spent:"
SINCE: Final = "ext_proc:spent-since"
# KEYS: SINCE, the proof's key; ARGV: now (unix seconds, rounded up), when the proof was
# minted after (unix seconds), its lifetime (ms). 1: recorded now; 0: recorded before;
# -1: minted before the record began; -2: not a master; -3: keys may be evicted.
# A field missing from INFO (not a Redis) fails the script: UNAVAILABLE.
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
# Sets ``incarnation``: the server's run_id, its master_replid and its history.
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
""".replace("@REWRITERS@", ", ".join(f"'{name.replace('-', '%-')}'" for name in _REWRITERS))
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
local began = nil
local since = redis.call('GET', KEYS[1])
if since then
  local at = string.find(since, ' ', 1, true)
  if at and string.sub(since, 1, at - 1) == incarnation then
    began = tonumber(string.sub(since, at + 1))
  end
end
if began == nil then
  began = tonumber(ARGV[1])
  redis.call('SET', KEYS[1], incarnation .. ' ' .. ARGV[1])
end
if tonumber(ARGV[2]) < began then
  return -1
end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[3]) then
  return 1
end
return 0
"""
)
# KEYS: SINCE; ARGV: when the record began (unix seconds). For a Redis known to have
# recorded nothing before (a benchmark's, a test's): the record began then, on it.
_BEGIN: Final = (
    _INCARNATION
    + """
redis.call('SET', KEYS[1], incarnation .. ' ' .. ARGV[1])
"""
)


def begin(client: redis.Redis, began: int) -> None:
    """State that the record on the Redis of ``client`` began at ``began`` (unix
    seconds), as a spend would have written it then."""
    client.eval(_BEGIN, 1, SINCE, began)


# The script's refusals: the log's ``error`` and its words. A record that began after
# the proof was minted is the record working as it should after Redis forgot: logged,
# not counted as an error (the alert on record errors would fire after every restart).
_BEGAN_AFTER_MINT: Final = -1
_NOT_MASTER: Final = -2
_EVICTS: Final = -3
_REFUSED: Final = {
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
}


class RedisRecord:
    def __init__(
        self,
        url: str,
        timeout: float,
        on_error: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = redis.asyncio.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self._spend = self._client.register_script(_SPEND)
        self._timeout = timeout
        self._on_error = on_error
        self._clock = clock
        self.size = 0  # nothing held here beyond a connection

    async def spend(self, ticket: Ticket) -> Verdict:
        """``FIRST`` when this call recorded the proof; ``SPENT`` when it was recorded
        before; ``UNAVAILABLE`` when Redis could not be consulted or the record cannot
        vouch for the proof (see the module's docstring)."""
        now = self._clock()
        lifetime = math.ceil((ticket.expires_at - now) * 1000)
        if lifetime <= 0:
            # Past its time no processor verifies it; nothing to keep.
            return Verdict.SPENT
        name = PREFIX + base64.urlsafe_b64encode(ticket.key).decode("ascii")
        try:
            async with asyncio.timeout(self._timeout):
                recorded = await self._spend(
                    keys=[SINCE, name], args=[math.ceil(now), ticket.minted_after, lifetime]
                )
        except (RedisError, OSError, TimeoutError) as exc:
            return self._unavailable(type(exc).__name__, "Redis could not be consulted")
        if recorded in _REFUSED:
            why, words = _REFUSED[recorded]
            return self._unavailable(why, words, error=recorded != _BEGAN_AFTER_MINT)
        if recorded not in (0, 1):
            return self._unavailable("unexpected_reply", "Redis answered the script oddly")
        return Verdict.FIRST if recorded == 1 else Verdict.SPENT

    def _unavailable(self, why: str, words: str, *, error: bool = True) -> Verdict:
        if error:
            self._on_error()
        log.warning(f"proof record unavailable: {words}", extra={"store": "redis", "error": why})
        return Verdict.UNAVAILABLE

    async def announce(self) -> None:
        """One log line at start-up saying what the record will find: the spends judge
        for themselves (a Redis can change under a running processor); this only tells
        the operator early."""
        try:
            async with asyncio.timeout(4 * self._timeout):
                role = (await self._client.info("replication")).get("role")
                policy = (await self._client.info("memory")).get("maxmemory_policy")
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning(
                "proof record: Redis cannot be consulted yet; no proof is honored until it answers",
                extra={"store": "redis", "error": type(exc).__name__},
            )
            return
        fields = {"store": "redis", "role": role, "maxmemory_policy": policy}
        refused = [
            _REFUSED[code][0]
            for code, wrong in ((_NOT_MASTER, role != "master"), (_EVICTS, policy != "noeviction"))
            if wrong
        ]
        if refused:
            log.warning(
                "proof record: this Redis cannot keep the record; no proof is honored "
                "(docs/operations.md#what-the-redis-must-be)",
                extra=fields | {"error": ",".join(refused)},
            )
        else:
            log.info("proof record: Redis", extra=fields)

    async def close(self) -> None:
        await self._client.aclose()
