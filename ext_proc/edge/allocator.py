"""The C allocator told to keep the memory a request frees for the next one.

A large body passes through a dozen buffers of its size (gRPC's message, the body,
scans and copies, the rewrite). glibc hands out each buffer over 128 KiB as fresh pages
from the kernel and returns them when it is freed, so every large request faults in its
memory page by page again, one fault per 4 KiB of every buffer. With the two
thresholds below, buffers up to 32 MiB come from the heap and freed memory is kept up
to ``keep`` bytes (the in-flight budget: ``memory`` counts it as resident already), so
a request reuses what the last one freed.

glibc only: elsewhere (musl) nothing changes and ``keep_freed_memory`` says so.
"""

from __future__ import annotations

import ctypes
from typing import Final

# mallopt parameters (glibc's malloc.h) and the largest mmap threshold it accepts on
# 64-bit systems.
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
MMAP_THRESHOLD_MAX: Final = 32 * 1024 * 1024


def keep_freed_memory(keep: int) -> bool:
    """Serve buffers up to ``MMAP_THRESHOLD_MAX`` from the heap and keep up to ``keep``
    freed bytes in it; False when the C library has no ``mallopt`` or refuses."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the process runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    trim = min(max(keep, MMAP_THRESHOLD_MAX), 2**31 - 1)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) and mallopt(_M_TRIM_THRESHOLD, trim))
