"""A body read and rewritten whole, without a budget: orjson where it can, else
json.loads and json.dumps (what ``admission`` does once it has charged for them)."""

from __future__ import annotations

from typing import Any

from ext_proc.core import body
from ext_proc.core.vllm_request import Path


def read(raw: bytes, **options: Any) -> body.Parsed:
    parsed = body.parse(raw, **options)
    return parsed if parsed is not None else body.parse_slow(raw)


def rewritten(parsed: body.Parsed, paths: list[Path]) -> bytes:
    document = body.removed(parsed, paths)
    written = body.write(parsed, document)
    return written if written is not None else body.serialize(document)
