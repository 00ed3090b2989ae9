"""Connector values within bounds: the numbers in an honored or minted
``kv_transfer_params`` that vLLM's KV connectors size lists, loops and connections by,
checked against bounds read from the connectors' code (connector_keys.py: every key the
connectors read, where and how; docs/trust.md#connector-values-within-bounds).

A proof, a listed peer or a route that trusts any caller says who wrote the parameters,
not that their values are sane; vLLM 0.32 reads them without a check (vllm#51137: a
large ``tp_size`` makes the decode side allocate without bound in
``TransferTopology.handshake_target_ranks``, and the EngineCore dies of it). So every
honored or minted object is checked here first. Pure: no I/O; ``refusal`` returns the
refusal or None. A key that is absent or null is fine (the connector's default); keys
the table does not check are not looked at. A number must be a JSON integer: a boolean,
a float or a string is refused (``type(value) is int``), whatever ``int()`` would make
of it; the one clock value, ``remote_blocks_expiry_time``, may also be a finite float.
The names the connectors key their records by (``TEXTS``) must be strings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from ext_proc.core.connector_keys import (
    BLOCK_ID_BOUND,
    BY_NAME,
    MAX_CLOCK_SECONDS,
    MAX_GROUPS,
    MAX_PROMPT_TOKENS,
    MAX_RANKS,
    SPANS,
    TEXTS,
)
from ext_proc.core.errors import Refusal, bad_request
from ext_proc.core.reasons import Reason
from ext_proc.core.vllm_request import KV_KEY

# Every key checked: the table's checked keys (connector_keys.py, where each bound's
# source is written).
KEYS: Final = tuple(name for name, key in BY_NAME.items() if key.checked)
# The engine's TP size under either key; each times pp_size is at most MAX_RANKS, the
# number of NIXL's handshake round trips at most (connector_keys.py: pp_size).
_TP_KEYS: Final = ("tp_size", "remote_tp_size")


# The keys whose check reads another value or the prompt's size (``_refusal`` below
# the spans): a present one sends the object to the whole check.
_RELATED: Final = frozenset(
    (
        "pp_size",
        *_TP_KEYS,
        "remote_blocks_expiry_time",
        "remote_dp_size",
        "remote_dp_rank",
        "remote_dp_size_local",
        "remote_num_tokens",
        "remote_block_ids",
    )
)
# The other keys, each checked alone: a name that must be a string, or an integer's
# bounds. A key in both tables, or related, is left to the whole check.
_TEXT_ALONE: Final = frozenset(TEXTS) - _RELATED - {key for key, _, _ in SPANS}
_SPAN_ALONE: Final = {
    key: (low, high) for key, low, high in SPANS if key not in _RELATED and key not in TEXTS
}
# Every key the whole check reads.
_READ: Final = frozenset(TEXTS) | {key for key, _, _ in SPANS} | _RELATED


def refusal(
    params: Mapping[str, Any], tokens: int | None = None, where: str = KV_KEY
) -> Refusal | None:
    """Why ``params`` (a ``kv_transfer_params`` object) holds a connector value out of
    bounds, or None. ``tokens``: the most tokens the prompt has (its ids' count, else
    the route's max_ids); None or 0: ``MAX_PROMPT_TOKENS``. ``where``: the member the
    object is (refusals name its keys below it).

    A dict whose present, non-null checked keys are each checked alone and within
    bounds is within bounds: every other check reads only absent or null values, which
    pass. Anything else, a refusal included, is found by ``_refusal`` in its order, so
    the answer is the same whichever way it is reached."""
    if type(params) is dict:
        for key, value in params.items():
            if value is None or key not in _READ:
                continue
            if key in _TEXT_ALONE:
                if type(value) is str:
                    continue
            elif key in _SPAN_ALONE:
                low, high = _SPAN_ALONE[key]
                if type(value) is int and low <= value <= high:
                    continue
            break
        else:
            return None
    return _refusal(params, tokens, where)


def _refusal(params: Mapping[str, Any], tokens: int | None, where: str) -> Refusal | None:
    """``refusal``, every check in its order: the first out of bounds is the one named."""
    for key in TEXTS:
        if (value := params.get(key)) is not None and type(value) is not str:
            return _out(where, key, "a string")
    for key, low, high in SPANS:
        # ``_within``, inline: every checked object goes through this loop.
        value = params.get(key)
        if value is not None and (type(value) is not int or not low <= value <= high):
            return _out(where, key, f"an integer from {low} to {high}")
    if (pp := params.get("pp_size")) is not None:
        for key in _TP_KEYS:
            tp = params.get(key)
            if tp is not None and tp * pp > MAX_RANKS:
                return _out(
                    where,
                    "pp_size",
                    f"at most {MAX_RANKS // tp} with {key} {tp} ({MAX_RANKS} ranks)",
                )
    if not _clock(params.get("remote_blocks_expiry_time")):
        return _out(
            where,
            "remote_blocks_expiry_time",
            f"a finite number from 0 to {MAX_CLOCK_SECONDS} (seconds of the decode server's clock)",
        )
    # MoRIIO: the rank a notify goes to (its port offset), and the per-pod DP size it
    # folds ranks by (0: one pod); moriio_connector.py ``update_state_after_alloc``.
    size = params.get("remote_dp_size")
    ranks, below = (size, " (below remote_dp_size)") if size is not None else (MAX_RANKS, "")
    if not _within(params.get("remote_dp_rank"), 0, ranks - 1):
        return _out(where, "remote_dp_rank", f"an integer from 0 to {ranks - 1}{below}")
    if not _within(params.get("remote_dp_size_local"), 0, ranks):
        return _out(where, "remote_dp_size_local", f"an integer from 0 to {ranks}")
    most = tokens or MAX_PROMPT_TOKENS
    # NIXL's producer reports request.num_computed_tokens: a prefill of the prompt
    # computes no more than its tokens (nixl/pull_scheduler.py ``request_finished``).
    if not _within(params.get("remote_num_tokens"), 0, most):
        return _out(where, "remote_num_tokens", f"an integer from 0 to {most}, the prompt's tokens")
    return _blocks(params.get("remote_block_ids"), most, where)


def _within(value: Any, low: int, high: int) -> bool:
    """Absent or null, or an integer (not a boolean) from ``low`` to ``high``."""
    return value is None or (type(value) is int and low <= value <= high)


def _clock(value: Any) -> bool:
    """Absent or null, or a finite number (an integer or a float, not a boolean) from 0
    to ``MAX_CLOCK_SECONDS``: NIXL subtracts a clock offset from it and compares it
    with ``time.perf_counter()``."""
    if value is None:
        return True
    if type(value) is int:
        return 0 <= value <= MAX_CLOCK_SECONDS
    return type(value) is float and math.isfinite(value) and 0 <= value <= MAX_CLOCK_SECONDS


def _out(where: str, key: str, rule: str) -> Refusal:
    param = f"{where}.{key}"
    return bad_request(
        f"{param} must be {rule}", reason=Reason.CONNECTOR_OUT_OF_BOUNDS, param=param
    )


def _block_id(item: Any) -> bool:
    return type(item) is int and 0 <= item < BLOCK_ID_BOUND


def _blocks(value: Any, tokens: int, where: str) -> Refusal | None:
    """``remote_block_ids``: vLLM 0.32's connectors send one list of block ids per KV
    cache group (``BlockIds``, kv_connector/utils.py); older ones, and registrations
    NIXL's push mode re-wraps (``_as_grouped_block_ids``), one flat list. A block holds
    at least one token, so a group has at most as many blocks as the prompt has tokens."""
    if value is None:
        return None
    key = "remote_block_ids"
    if type(value) is not list:
        return _out(
            where, key, "a list of block ids, or a list of such lists (one per KV cache group)"
        )
    groups: list[Any]
    if not any(type(item) is list for item in value):
        groups, names = [value], [key]
    elif all(type(item) is list for item in value):
        if len(value) > MAX_GROUPS:
            return _out(where, key, f"at most {MAX_GROUPS} lists (one per KV cache group)")
        groups, names = value, [f"{key}[{index}]" for index in range(len(value))]
    else:
        return _out(where, key, "a list of block ids or a list of lists, not both")
    param = f"{where}.{key}"
    for name, group in zip(names, groups, strict=True):
        if len(group) > tokens:
            return bad_request(
                f"{where}.{name} has {len(group)} block ids; the prompt has at most {tokens} "
                "tokens",
                reason=Reason.CONNECTOR_OUT_OF_BOUNDS,
                param=param,
            )
        # Each item's type in one pass, then the range in C (min and max).
        if not group or (
            all(type(item) is int for item in group)
            and min(group) >= 0
            and max(group) < BLOCK_ID_BOUND
        ):
            continue
        index = next(i for i, item in enumerate(group) if not _block_id(item))
        return bad_request(
            f"{where}.{name}[{index}] is not a block id (an integer from 0 to "
            f"{BLOCK_ID_BOUND - 1})",
            reason=Reason.CONNECTOR_OUT_OF_BOUNDS,
            param=param,
        )
    return None
