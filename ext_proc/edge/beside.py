"""The worker thread that computes a proof's MAC (``proof.Beside``).

The event loop's thread meanwhile renders the prompt digest and validates the ids;
hashlib releases the GIL while it hashes a large buffer, so the two overlap.

One thread: the loop's thread waits for each MAC before it takes up another request, so
at most one is asked for at a time. Created on the first MAC, not at import.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


class Beside:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ext_proc-mac")

    def __call__(self, make: Callable[[], bytes]) -> Callable[[], bytes]:
        """``make`` started on the worker thread; the returned function waits for it."""
        return self._pool.submit(make).result

    def close(self) -> None:
        """Wait for a MAC being computed, then end the thread."""
        self._pool.shutdown(wait=True)
