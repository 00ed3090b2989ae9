"""What a request body costs the processor in memory: the model the budget counts in.

A body of ``size`` bytes holding at most ``values`` JSON values (``reading.Shape``)
costs at most ``cost(size, values)`` bytes of process memory from the moment the
servicer takes it until the answer that carries its rewrite has been handed to gRPC;
after that nothing of it is held, though a stream whose route processes the response
stays open until the response is answered:

- ``COPIES * size`` for the bytes themselves: the gRPC message as bytes, the protobuf
  message where upb parses it, the body taken out of it (a view of the message where the
  wire reader reads it: room to spare), and the rewritten body with its response
  message.
- ``PARSE_PER_BYTE * size + PER_VALUE * values`` for the parsed document at its peak
  and its rewrite or its prompt digest; ``SLOW_PARSE_PER_BYTE`` instead of
  ``PARSE_PER_BYTE`` when json.loads reads it or json.dumps writes it or renders its
  digest (``slow_extra``, charged before any of them runs, which they do one after the
  other; only for bodies within ``slow_allowed``).
  A string costs up to 4 bytes per character (one astral character makes CPython store
  the whole string in UCS-4) plus its header; every other value is one Python object
  plus the slot that holds it (an empty list: 56 bytes, 16 of GC header, 8 of slot).
  Measured peaks (RSS, orjson and json.loads alike): 1-2x the body for prose, 4-7x for
  a string with an astral character (14x through json.loads and json.dumps), 8x for
  7-digit ids (9x read from their bytes, ``reading._lifted``), 24x for ``["a","a",...]``
  and 31x for ``[[],[],...]``, each below this bound (tests/core/test_memory.py checks the
  catalogue in a fresh process).

``values`` is counted from the raw bytes before parsing (``,`` ``:`` ``[`` ``{``, strings
included, so it never undercounts) and limited per body (``max_json_values``), so the
cost of the largest admissible body (``largest``) is known before any body arrives: the
in-flight budget must hold at least one (``config.Config``). Bytes that have not arrived
are never charged: a streamed body is charged ``held`` per byte as its chunks arrive,
then its full cost once whole.

A processor's resident memory is then at most ``resident_bound``: its baseline
(``BASELINE``), WARM_UP, the in-flight budget, the body in the servicer's hands before it
is admitted or refused (``held`` of the largest body: its copies and the scan's), and the
messages gRPC has received that the servicer has not taken yet: at most one per open
stream, 1.25 times its size each (``QUEUED_FACTOR_QUARTERS``). The servicer takes them
as fast as its event loop turns and drops a refused body at once, but it cannot refuse a
body before gRPC has received it whole, so that term is not in the budget: it is what
Envoy sends at the same moment. The factor is therefore stated, not budgeted: with
the defaults (16 MiB bodies, 262,144 values, a 256 MiB budget) ``BASELINE + WARM_UP +
budget + 4 max_body`` comes to 608 MiB, plus 20 MiB per largest body received at once.
A pod's memory limit (``pod_limit``, written into the Helm chart by ``make generate``)
is that bound with ``QUEUED`` such bodies. The CPU one body takes is bounded by the same
limits (reading.py, writing.py).
"""

from __future__ import annotations

from typing import Final

MiB: Final = 1 << 20
# json.loads reads bodies up to this size and number of values, and json.dumps writes
# them or renders their prompt digest (reading.py, writing.py and proof.py say when they
# must): their cost per value is several times orjson's, in time and in memory
# (``slow_extra``).
SLOW_PARSE_MAX_BYTES: Final = 4 * MiB
SLOW_PARSE_MAX_VALUES: Final = 65_536
# Once per process, the first burst of concurrent large bodies grows gRPC's transport
# buffers and the allocator's pools (measured 60-120 MiB with 16 streams of 1.8 MiB);
# they are reused afterwards. Part of the baseline a pod is sized for.
WARM_UP: Final = 160 * MiB
# The default limit on JSON values per body (config max_json_values).
MAX_JSON_VALUES: Final = 262_144
# What a processor holds before its first body: the interpreter, gRPC, the metrics,
# the codec's memo of route attributes and the record of spent proofs at its default
# size (tests/faults/test_overload.py measures it).
BASELINE: Final = 128 * MiB
# A message gRPC has received and the servicer not yet taken: its bytes in gRPC's
# buffers and their slack, 1.25 times its size (5 quarters).
QUEUED_FACTOR_QUARTERS: Final = 5
# The largest bodies received by gRPC at the same moment a pod's memory limit leaves
# room for (``pod_limit``); more at once can exceed it.
QUEUED: Final = 24
LIMIT_STEP: Final = 64 * MiB
COPIES: Final = 4
PARSE_PER_BYTE: Final = 8
# json.loads (bodies up to SLOW_PARSE_MAX_BYTES) and json.dumps build whole
# strings before encoding them: up to 16 bytes per byte for an astral string.
SLOW_PARSE_PER_BYTE: Final = 16
PER_VALUE: Final = 80


def held(size: int) -> int:
    """The cost of ``size`` body bytes received and not parsed (yet, or at all: a body
    forwarded unparsed, ``spelling.spelled``)."""
    return COPIES * size


def cost(size: int, values: int) -> int:
    """The cost of a body of ``size`` bytes and at most ``values`` JSON values, parsed
    and written back by orjson."""
    return (COPIES + PARSE_PER_BYTE) * size + PER_VALUE * values


def slow_extra(size: int) -> int:
    """What json.loads or json.dumps costs on top of ``cost``: charged before either runs
    (bodies up to SLOW_PARSE_MAX_BYTES only)."""
    return (SLOW_PARSE_PER_BYTE - PARSE_PER_BYTE) * size


def slow_allowed(size: int, values: int) -> bool:
    """Whether json.loads may read (or json.dumps write) a body of ``size`` bytes and at
    most ``values`` JSON values."""
    return size <= SLOW_PARSE_MAX_BYTES and values <= SLOW_PARSE_MAX_VALUES


def largest(max_size: int, max_values: int) -> int:
    """The cost of the costliest body within the limits."""
    slow = min(max_size, SLOW_PARSE_MAX_BYTES)
    return max(cost(max_size, max_values), cost(slow, max_values) + slow_extra(slow))


def resident_bound(baseline: int, budget: int, max_size: int, queued: int) -> int:
    """The most a processor holds with ``queued`` bodies of ``max_size`` bytes received
    by gRPC and not yet taken by the servicer (see the module docstring)."""
    received = queued * max_size * QUEUED_FACTOR_QUARTERS // 4
    return baseline + WARM_UP + budget + held(max_size) + received


def pod_limit(budget: int, max_size: int, workers: int = 1) -> int:
    """The memory limit of a pod running ``workers`` processes with these limits (each
    worker has its own budget): ``resident_bound`` with ``BASELINE`` and ``QUEUED``,
    rounded up to ``LIMIT_STEP``."""
    bound = workers * resident_bound(BASELINE, budget, max_size, QUEUED)
    return -(-bound // LIMIT_STEP) * LIMIT_STEP
