"""A body read and rewritten whole, without a budget: orjson where it can, else
json.loads and json.dumps (what ``admission`` does once it has charged for them)."""

from __future__ import annotations

from typing import Any

from ext_proc.core import reading, writing
from ext_proc.core.vllm_request import Path


def read(raw: bytes, **options: Any) -> reading.Parsed:
    parsed = reading.parse(raw, **options)
    return parsed if parsed is not None else reading.parse_slow(raw)


def rewritten(parsed: reading.Parsed, paths: list[Path]) -> bytes:
    document = writing.removed(parsed, paths)
    written = writing.write(parsed, document)
    return written if written is not None else writing.serialize(document)
