"""The request bodies of the matrix: size x decision, built deterministically.

Sizes are exact byte counts (2 KiB, 64 KiB, 1 MiB), reached by padding a user message.

- ``allow``: on the aggregated route ``/v1/`` a chat request without ids; at 1 MiB the
  decode request of a disaggregated deployment instead: 131072 (128k) valid ids on
  ``/pd/v1/``, honored by the service, so the body passes unchanged.
- ``strip``: the same ids on ``/v1/``; the service removes them and rewrites the body.
- ``deny``: the ids on ``/pd/v1/`` with a ``true`` in the middle; the service answers 400.

The direct and naive arrangements do not look at bodies: every body reaches the upstream.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

SIZES = {"2k": 2 * 1024, "64k": 64 * 1024, "1m": 1024 * 1024}
DECISIONS = ("allow", "strip", "deny")
AGGREGATED = "/v1/chat/completions"
DISAGGREGATED = "/pd/v1/chat/completions"
# Ids carried at each size: a decode request at 1 MiB carries the route's max_ids.
ID_COUNTS = {"2k": 200, "64k": 8000, "1m": 131072}
VOCAB = 128256
SEED = 6


@dataclass(frozen=True)
class Body:
    size: str
    decision: str
    path: str
    data: bytes
    id_count: int

    def expected_status(self, polices: bool) -> int:
        """What the client should see: the service denies, everything else forwards."""
        return 400 if polices and self.decision == "deny" else 200


def _document(ids: list[Any] | None, pad: int) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "x" * pad},
        ],
        "max_tokens": 16,
    }
    if ids is not None:
        doc["kv_transfer_params"] = {
            "prompt_token_ids": ids,
            "do_remote_prefill": False,
            "remote_engine_id": "prefill-0",
        }
    return doc


def _encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _exact(ids: list[Any] | None, size: int) -> bytes:
    """The document padded so that its encoding is exactly ``size`` bytes."""
    bare = len(_encode(_document(ids, 0)))
    if bare > size:
        raise ValueError(f"{len(ids or [])} ids do not fit in {size} bytes")
    data = _encode(_document(ids, size - bare))
    assert len(data) == size
    return data


def build(size: str, decision: str) -> Body:
    if size not in SIZES or decision not in DECISIONS:
        raise ValueError(f"unknown cell {size}/{decision}")
    rng = random.Random(f"{SEED}-{size}")  # noqa: S311 - reproducible data, not secrets
    count = ID_COUNTS[size]
    ids: list[Any] = [rng.randrange(VOCAB) for _ in range(count)]
    if decision == "allow" and size != "1m":
        return Body(size, decision, AGGREGATED, _exact(None, SIZES[size]), 0)
    if decision == "allow":
        return Body(size, decision, DISAGGREGATED, _exact(ids, SIZES[size]), count)
    if decision == "strip":
        return Body(size, decision, AGGREGATED, _exact(ids, SIZES[size]), count)
    ids[count // 2] = True
    return Body(size, decision, DISAGGREGATED, _exact(ids, SIZES[size]), count)
