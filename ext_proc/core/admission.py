"""A body parsed and written within the memory budget (``memory``'s model).

``body`` parses and writes, and ``proof`` renders the prompt digest; neither runs
json.loads or json.dumps on its own but says when only they can (None). Here, before
either runs, their cost is charged to the stream's account and their limits are
enforced: the parser never calls back into the stream, and the budget is charged before
any memory is taken, never after.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ext_proc.core import memory, proof, reading, writing
from ext_proc.core.budget import Account
from ext_proc.core.errors import PayloadTooLarge
from ext_proc.core.events import Body
from ext_proc.core.reasons import Reason
from ext_proc.core.vllm_request import CACHE_SALT, KV_KEY, Path


def check_size(size: int, limit: int) -> None:
    """Raises ``PayloadTooLarge`` for a body of ``size`` bytes or more over ``limit``."""
    if size > limit:
        raise PayloadTooLarge(
            f"request body of {size} bytes or more exceeds the limit of {limit} bytes",
            reason=Reason.BODY_TOO_LARGE,
        )


def admit(raw: Body, account: Account, max_values: int) -> reading.Shape:
    """The shape of a whole body, once its parsed cost is held (raises
    ``PayloadTooLarge`` for too many values, ``ServiceUnavailable`` when the budget
    cannot hold it)."""
    shape = reading.scan(raw, max_values)
    if shape.values > max_values:
        raise PayloadTooLarge(
            f"request body holds more than {max_values} JSON values", reason=Reason.BODY_TOO_COMPLEX
        )
    account.hold(memory.cost(len(raw), shape.values))
    return shape


def parse(
    raw: Body,
    shape: reading.Shape,
    account: Account,
    *,
    lift_ids: bool = False,
    ids_bound: int | None = None,
) -> reading.Parsed:
    """The document ``json.loads`` reads from the admitted ``raw``: orjson's reading,
    or json.loads's once its extra cost is held (``lift_ids``, ``ids_bound``:
    ``reading.parse``'s)."""
    parsed = reading.parse(raw, shape, lift_ids=lift_ids, ids_bound=ids_bound)
    if parsed is not None:
        return parsed
    if not memory.slow_allowed(len(raw), shape.values):
        raise _needs_slow_parse()
    account.hold(_slow_cost(len(raw), shape.values))
    return reading.parse_slow(raw, shape)


def write(parsed: reading.Parsed, document: reading.Document, account: Account) -> bytes:
    """``document`` (derived from ``parsed``) as bytes: orjson's writing, or
    json.dumps's once its extra cost is held."""
    written = writing.write(parsed, document)
    if written is not None:
        return written
    # Only the size matters here: json.dumps builds the whole text as a string first.
    if not memory.slow_allowed(parsed.size, 0):
        raise _needs_slow_parse()
    account.hold(_slow_cost(parsed.size, parsed.values))
    return writing.serialize(document)


def digest(
    parsed: reading.Parsed,
    endpoint: str,
    account: Account,
    document: Mapping[str, Any] | None = None,
) -> bytes:
    """The prompt digest of ``parsed`` for ``endpoint`` (``proof.prompt_digest``):
    orjson's rendering, or json.dumps's once its extra cost is held: the gate and the
    allowance of the slow parser and writer, which it runs after the one and before
    the other (one allowance covers the three, each done before the next starts).
    ``document``: a part of ``parsed``'s document to render instead (it costs at most
    what the whole does)."""
    whole = parsed.document if document is None else document
    found = proof.prompt_digest(whole, parsed.orjson_safe, endpoint)
    if found is not None:
        return found
    if not memory.slow_allowed(parsed.size, parsed.values):
        raise _needs_slow_parse()
    account.hold(_slow_cost(parsed.size, parsed.values))
    return proof.prompt_digest_slow(whole, endpoint)


def without(
    parsed: reading.Parsed,
    paths: tuple[Path, ...],
    account: Account,
    kv_transfer_params: Mapping[str, Any] | None = None,
    cache_salt: str | None = None,
) -> bytes:
    """The body with the members at ``paths`` removed (``writing.removed``), and then
    ``kv_transfer_params`` (values orjson writes exactly) and ``cache_salt`` written
    when given."""
    document = writing.removed(parsed, paths)
    if kv_transfer_params is not None:
        document[KV_KEY] = dict(kv_transfer_params)
    if cache_salt is not None:
        document[CACHE_SALT] = cache_salt
    return write(parsed, document, account)


def _slow_cost(size: int, values: int) -> int:
    """What a body admitted with ``values`` holds once json.loads or json.dumps runs:
    one allowance covers both."""
    return memory.cost(size, values) + memory.slow_extra(size)


def _needs_slow_parse() -> PayloadTooLarge:
    return PayloadTooLarge(_NEEDS_SLOW_PARSE, reason=Reason.BODY_NEEDS_SLOW_PARSE)


_NEEDS_SLOW_PARSE: Final = (
    f"request bodies over {memory.SLOW_PARSE_MAX_BYTES} bytes or "
    f"{memory.SLOW_PARSE_MAX_VALUES} JSON values must be plain UTF-8 JSON (no NaN or "
    "Infinity, integers beyond 64 bits, byte-order mark, UTF-16/32, lone surrogates or "
    "nesting beyond 254 levels)"
)
