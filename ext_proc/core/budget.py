"""The processor-wide budget of request-body bytes held in memory at once.

Streams reserve bytes before holding them and give them back when they end. All streams
of a process run on one event loop, so plain integers need no lock. A request that would
exceed the budget is refused with 503 (retry later) rather than queued: queuing would
hold the bytes anyway.
"""

from __future__ import annotations

from ext_proc.core.errors import ServiceUnavailable
from ext_proc.core.reasons import Reason


class Budget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0

    def try_acquire(self, size: int) -> bool:
        if size < 0:
            raise ValueError("size must not be negative")
        if self.used + size > self.limit:
            return False
        self.used += size
        self.peak = max(self.peak, self.used)
        return True

    def release(self, size: int) -> None:
        if size < 0 or size > self.used:
            raise ValueError(f"releasing {size} bytes with {self.used} in use")
        self.used -= size


class Account:
    """What one stream holds of a budget: raised to a total before the bytes are held,
    handed over with the answers that carry them, released when the stream ends."""

    __slots__ = ("_budget", "held")

    def __init__(self, budget: Budget) -> None:
        self._budget = budget
        self.held = 0

    def hold(self, total: int) -> None:
        """Make sure ``total`` is held (``ServiceUnavailable`` when the budget cannot
        hold it)."""
        extra = total - self.held
        if extra > 0:
            if not self._budget.try_acquire(extra):
                raise ServiceUnavailable(
                    "the gateway is holding too many request bodies; retry shortly",
                    reason=Reason.INFLIGHT_BUDGET_EXHAUSTED,
                )
            self.held = total

    def hand_over(self) -> int:
        """Everything held, now the caller's to release (``Budget.release``) once the
        answers that carry it are sent."""
        held, self.held = self.held, 0
        return held

    def release(self) -> None:
        """Give back everything held; safe to call twice."""
        self._budget.release(self.hand_over())
