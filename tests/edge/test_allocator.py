import platform
import resource
import subprocess
import sys

import pytest

from ext_proc.edge import allocator

GLIBC = platform.libc_ver()[0] == "glibc"

# Buffers of a large body's size allocated and freed while another outlives them:
# glibc's own thresholds hand each one out as fresh pages again.
PROBE = """
import resource, sys
from ext_proc.edge import allocator
if sys.argv[1] == "tuned":
    assert allocator.keep_freed_memory(256 << 20)
held = [b""] * 3
def churn():
    for size in (1 << 20, 3 << 20, 2 << 20, 5 << 20):
        buffer = bytearray(size)  # zeroed: every page touched
        held.append(bytearray(size // 4))  # outlives the buffer, not the next ones
        del buffer, held[0]
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    tuned, untuned = _faults("tuned"), _faults("untuned")
    print(f"page faults over 80 large buffers: tuned {tuned}, untuned {untuned}")
    assert tuned < untuned // 4


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_keep_is_capped_to_what_mallopt_takes():
    assert allocator.keep_freed_memory(1 << 40)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0
