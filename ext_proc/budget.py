"""The processor-wide budget of request-body bytes held in memory at once.

Streams reserve bytes before holding them and give them back when they end. All streams
of a process run on one event loop, so plain integers need no lock. A request that would
exceed the budget is refused with 503 (retry later) rather than queued: queuing would
hold the bytes anyway.
"""

from __future__ import annotations


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
