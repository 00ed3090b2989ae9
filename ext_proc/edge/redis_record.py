"""The record of spent proofs shared by several processors: one Redis key per proof.

``SET <prefix><key> 1 NX PX <ms>``: Redis sets the key only when it is absent, in one
command, so exactly one of any number of processors presenting the same proof is told
``FIRST``; the key lives until the ticket expires (by this processor's clock, so the
Redis server's clock never matters).

A Redis that restarted (or was flushed) has forgotten the proofs honored before: until
every one of them has expired, any could be honored again. So the record keeps the
time it began (``SINCE``, set once, without expiry, so no eviction policy for expiring
keys removes it) and answers ``UNAVAILABLE`` until ``warm_up`` seconds (the longest a
proof lives, plus a clock skew between processors) have passed since: one script, one
round trip, the proof's key set only once the record is complete.

Every failure (refused, reset, timed out, a reply that is not Redis's) is
``UNAVAILABLE``: the proof is not honored, a warning is logged and counted, and the next
proof tries again, so honoring resumes on its own once Redis answers. One attempt per
proof, bounded by ``timeout`` seconds: a Redis that stalls delays only the decode legs
waiting for it, never another stream.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import time
from collections.abc import Callable
from typing import Final

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ext_proc.core.replay import Ticket, Verdict

log = logging.getLogger("ext_proc.record")
PREFIX: Final = "ext_proc:spent:"
SINCE: Final = "ext_proc:spent-since"
# KEYS: SINCE, the proof's key; ARGV: now (unix seconds), warm-up (seconds), lifetime
# (ms). 1: recorded now; 0: recorded before; -1: the record began too recently.
_SPEND: Final = """
redis.call('SET', KEYS[1], ARGV[1], 'NX')
local since = tonumber(redis.call('GET', KEYS[1]))
if since == nil or tonumber(ARGV[1]) - since < tonumber(ARGV[2]) then
  return -1
end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[3]) then
  return 1
end
return 0
"""


class RedisRecord:
    def __init__(
        self,
        url: str,
        timeout: float,
        warm_up: float,
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
        self._warm_up = warm_up
        self._on_error = on_error
        self._clock = clock
        self.size = 0  # nothing held here beyond a connection

    async def spend(self, ticket: Ticket) -> Verdict:
        """``FIRST`` when this call recorded the proof; ``SPENT`` when it was recorded
        before; ``UNAVAILABLE`` when Redis could not be consulted."""
        now = self._clock()
        lifetime = math.ceil((ticket.expires_at - now) * 1000)
        if lifetime <= 0:
            # Past its time no processor verifies it; nothing to keep.
            return Verdict.SPENT
        name = PREFIX + base64.urlsafe_b64encode(ticket.key).decode("ascii")
        try:
            async with asyncio.timeout(self._timeout):
                recorded = await self._spend(
                    keys=[SINCE, name], args=[int(now), math.ceil(self._warm_up), lifetime]
                )
        except (RedisError, OSError, TimeoutError) as exc:
            return self._unavailable(type(exc).__name__)
        if recorded == -1:
            return self._unavailable("record_warming_up")
        return Verdict.FIRST if recorded == 1 else Verdict.SPENT

    def _unavailable(self, why: str) -> Verdict:
        self._on_error()
        log.warning(
            "proof record unavailable: no proof is honored until Redis answers with a "
            "complete record",
            extra={"store": "redis", "error": why},
        )
        return Verdict.UNAVAILABLE

    async def close(self) -> None:
        await self._client.aclose()
