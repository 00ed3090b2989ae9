"""The record of spent proofs shared by several processors: one Redis key per proof.

``SET <prefix><key> 1 NX PX <ms>``: Redis sets the key only when it is absent, in one
command, so exactly one of any number of processors presenting the same proof is told
``FIRST``; the key lives until the ticket expires (by this processor's clock, so the
Redis server's clock never matters). Every failure (refused, reset, timed out, a
reply that is not Redis's) is ``UNAVAILABLE``: the proof is not honored, a warning is
logged and counted, and the next proof tries again, so honoring resumes on its own
once Redis answers. One attempt per proof, bounded by ``timeout`` seconds: a Redis
that stalls delays only the decode legs waiting for it, never another stream.
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

from ext_proc.replay import Ticket, Verdict

log = logging.getLogger("ext_proc.record")
PREFIX: Final = "ext_proc:spent:"


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
        self._timeout = timeout
        self._on_error = on_error
        self._clock = clock
        self.size = 0  # nothing held here beyond a connection

    async def spend(self, ticket: Ticket) -> Verdict:
        """``FIRST`` when this call recorded the proof; ``SPENT`` when it was recorded
        before; ``UNAVAILABLE`` when Redis could not be consulted."""
        lifetime = math.ceil((ticket.expires_at - self._clock()) * 1000)
        if lifetime <= 0:
            # Past its time no processor verifies it; nothing to keep.
            return Verdict.SPENT
        name = PREFIX + base64.urlsafe_b64encode(ticket.key).decode("ascii")
        try:
            async with asyncio.timeout(self._timeout):
                recorded = await self._client.set(name, b"1", nx=True, px=lifetime)
        except (RedisError, OSError, TimeoutError) as exc:
            self._on_error()
            log.warning(
                "proof record unavailable: no proof is honored until Redis answers",
                extra={"store": "redis", "error": type(exc).__name__},
            )
            return Verdict.UNAVAILABLE
        return Verdict.FIRST if recorded else Verdict.SPENT

    async def close(self) -> None:
        await self._client.aclose()
