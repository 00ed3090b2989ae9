"""Fixtures shared by the tests of the compiled parts."""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Callable, Iterator

import pytest

PAGE = mmap.PAGESIZE


@pytest.fixture
def at_a_guard_page() -> Iterator[Callable[[bytes], memoryview]]:
    """Puts bytes flush against a page that may not be read: a read past their end
    stops the process."""
    region = mmap.mmap(-1, 2 * PAGE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    start = ctypes.addressof(ctypes.c_char.from_buffer(region))
    assert libc.mprotect(start + PAGE, PAGE, 0) == 0

    def placed(raw: bytes) -> memoryview:
        region[PAGE - len(raw) : PAGE] = raw
        return memoryview(region)[PAGE - len(raw) : PAGE]

    yield placed
    assert libc.mprotect(start + PAGE, PAGE, mmap.PROT_READ | mmap.PROT_WRITE) == 0
