"""What a request body costs the processor in memory: the model the budget counts in.

A body of ``size`` bytes holding at most ``values`` JSON values (``body.Shape``) costs at
most ``cost(size, values)`` bytes of process memory while the processor holds it:

- ``COPIES * size`` for the bytes themselves: the gRPC message as bytes, the protobuf
  message, the body taken out of it, and the rewritten body with its response message.
- ``PARSE_PER_BYTE * size + PER_VALUE * values`` for the parsed document at its peak.
  A string costs up to 4 bytes per character (one astral character makes CPython store
  the whole string in UCS-4) plus its header; every other value is one Python object
  plus the slot that holds it (an empty list: 56 bytes, 16 of GC header, 8 of slot).
  Measured peaks (RSS, CPython 3.12, orjson and json.loads alike): 1-2x the body for
  prose, 4-7x for a string with an astral character, 7x for 7-digit ids, 22x for
  ``["a","a",...]`` and 25-30x for ``[[],[],...]``, each below this bound
  (tests/test_memory.py checks the catalogue in a fresh process).

``values`` is counted from the raw bytes before parsing (``,`` ``:`` ``[`` ``{``, strings
included, so it never undercounts) and limited per body (``max_json_values``), so the
cost of the largest admissible body is known before any body arrives: the in-flight
budget must hold at least one (``config.Config``). The budget is charged before a body
is parsed and refunded when its stream lets it go; bytes that have not arrived are never
charged.
"""

from __future__ import annotations

from typing import Final

MiB: Final = 1 << 20
# Once per process, the first burst of concurrent large bodies grows gRPC's transport
# buffers and the allocator's pools (measured 60-120 MiB with 16 streams of 1.8 MiB);
# they are reused afterwards. Part of the baseline a pod is sized for.
WARM_UP: Final = 160 * MiB
COPIES: Final = 4
PARSE_PER_BYTE: Final = 8
PER_BYTE: Final = COPIES + PARSE_PER_BYTE
PER_VALUE: Final = 80


def held(size: int) -> int:
    """The cost of ``size`` body bytes received and not parsed yet."""
    return COPIES * size


def cost(size: int, values: int) -> int:
    """The cost of a body of ``size`` bytes and at most ``values`` JSON values, parsed."""
    return PER_BYTE * size + PER_VALUE * values
