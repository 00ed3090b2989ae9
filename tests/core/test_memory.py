"""The memory model (ext_proc/core/memory.py) holds on the bodies that cost the most per byte.

Each body is parsed and written back in a fresh process; its peak resident memory
above the resident memory just before parsing must stay below what the model charges
beyond the raw bytes themselves.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ext_proc.core import memory, reading

MiB = 1 << 20
SIZE = 2 * MiB

# Python source building each body from its repeated unit without intermediate lists.
BODIES = {
    "prose": 'b\'{"messages":[{"role":"user","content":"\' + b"Hello, world: \\\\u00e9 '
    "\\xc3\\xa9 \\xe4\\xb8\\xad code{x[i]}\\\\n\" * (N // 36) + b'\"}]}'",
    "astral": 'b\'{"a":"\\xf0\\x9f\\x98\\x80\' + b"a" * N + b\'"}\'',
    "empty_lists": 'b\'{"a":[\' + b"[]," * (N // 3) + b"[]]}"',
    "empty_objects": 'b\'{"a":[\' + b"{}," * (N // 3) + b"{}]}"',
    "short_strings": "b'{\"a\":[' + b'\"a\",' * (N // 4) + b'\"b\"]}'",
    "token_ids": 'b\'{"kv_transfer_params":{"prompt_token_ids":[\' + b"1234567," * (N // 8)'
    ' + b"1]}}"',
    # Read from their bytes (reading._lifted), the largest found, written back as they came.
    "token_ids_lifted": 'b\'{"kv_transfer_params":{"prompt_token_ids":[\' + b"1234567," * (N // 8)'
    ' + b"1]}}"',
    "short_ids_lifted": 'b\'{"kv_transfer_params":{"prompt_token_ids":[\' + b"7," * (N // 2)'
    ' + b"1]}}"',
    "floats": 'b\'{"a":[\' + b"0.5," * (N // 4) + b"1]}"',
    # json.loads reads at most SLOW_PARSE_MAX_VALUES values: the rest is one string.
    "nan_slow_parser": 'b\'{"n":NaN,"a":[\' + b"[]," * 32_000 + b\'[]],"s":"\' + b"x" * N'
    " + b'\"}'",
    "astral_slow_parser": 'b\'{"n":NaN,"a":"\\\\ud83d\\\\ude00\' + b"a" * N + b\'"}\'',
    "deep_slow_parser": 'b\'{"a":\' + b"[" * 900 + b"0" + b"]" * 900 + b\',"b":[\' + b"{},"'
    ' * 32_000 + b\'{}],"s":"\' + b"x" * N + b\'"}\'',
}

PROBE = """
import sys
from pathlib import Path
from ext_proc.core import admission, memory, reading
from ext_proc.core.budget import Account, Budget
N = {size}
raw = {source}
account = Account(Budget(1 << 40))

def kib(key):
    status = Path("/proc/self/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith(key)).split()[1])

Path("/proc/self/clear_refs").write_text("5")
before = kib("VmRSS")
if {lifted}:
    parsed = admission.parse(raw, reading.scan(raw), account, lift_ids=True)
    parsed.document["kv_transfer_params"]["prompt_token_ids"].fault(1)  # reached: then the largest
    out = admission.without(parsed, (("kv_transfer_params", "x"),), account)
else:
    parsed = admission.parse(raw, reading.scan(raw), account)
    out = admission.without(parsed, (("kv_transfer_params",),), account)
peak = (kib("VmHWM") - before) * 1024
# json.loads read it or json.dumps wrote it: their extra was charged.
print(len(raw), peak, int(account.held > memory.cost(len(raw), reading.scan(raw).values)))
"""


@pytest.mark.parametrize("name", sorted(BODIES))
def test_parsing_and_rewriting_stay_within_the_model(name):
    probe = PROBE.format(size=SIZE, source=BODIES[name], lifted=name.endswith("_lifted"))
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    size, peak, slow = map(int, done.stdout.split())
    raw = eval(BODIES[name], {"N": SIZE})  # the literal source above
    assert len(raw) == size
    charged = memory.cost(size, reading.scan(raw).values) - size  # the raw bytes are held
    if slow:  # json.loads read it or json.dumps wrote it
        charged += memory.slow_extra(size)
    assert bool(slow) is name.endswith("_slow_parser")
    print(f"{name}: {size} bytes, peak {peak / size:.1f}x, model {charged / size:.1f}x")
    assert peak <= charged, (peak, charged)


def test_the_resident_bound_states_every_term():
    size, budget = 16 * MiB, 256 * MiB
    fixed = memory.BASELINE + memory.WARM_UP + budget + memory.COPIES * size
    assert memory.resident_bound(memory.BASELINE, budget, size, 0) == fixed
    # Each body gRPC holds received and not yet taken adds 1.25 times its size.
    assert memory.resident_bound(memory.BASELINE, budget, size, 8) == fixed + 10 * size


def test_a_pods_limit_is_the_bound_with_queued_bodies_rounded_up():
    size, budget = 16 * MiB, 256 * MiB
    limit = memory.pod_limit(budget, size)
    bound = memory.resident_bound(memory.BASELINE, budget, size, memory.QUEUED)
    assert bound <= limit < bound + memory.LIMIT_STEP
    assert limit % memory.LIMIT_STEP == 0
    # Each worker has its own budget.
    assert memory.pod_limit(budget, size, workers=2) >= 2 * bound
    # A larger budget raises the limit by as much.
    assert memory.pod_limit(budget + memory.LIMIT_STEP, size) == limit + memory.LIMIT_STEP
