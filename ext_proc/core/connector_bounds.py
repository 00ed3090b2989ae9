"""Connector values within bounds: the numbers in an honored or minted
``kv_transfer_params`` that vLLM's KV connectors size lists, loops and connections by,
checked against bounds read from the connectors' code
(docs/trust.md#connector-values-within-bounds).

A proof, a listed peer or a route that trusts any caller says who wrote the parameters,
not that their values are sane; vLLM 0.32 reads them without a check (vllm#51137: a
large ``tp_size`` makes the decode side allocate without bound in
``TransferTopology.handshake_target_ranks``, and the EngineCore dies of it). So every
honored or minted object is checked here first. Pure: no I/O; ``refusal`` returns the
refusal or None. A key that is absent or null is fine (the connector's default); keys
not named here are not looked at. A value must be a JSON integer: a boolean, a float
or a string is refused (``type(value) is int``), whatever ``int()`` would make of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ext_proc.core.errors import Refusal, bad_request
from ext_proc.core.reasons import Reason
from ext_proc.core.vllm_request import KV_KEY

# The most ranks one engine has, along any axis and in all (tp_size times pp_size): an
# operator's ceiling far above any deployment (a rack-scale NVL72 engine has 72), and
# what bounds the decode side's work. Its sources, by key:
# - tp_size: NIXL's decode side builds ``[tp_rank * abs_ratio + i for i in
#   range(abs_ratio)]`` with abs_ratio = remote tp_size // local tp_size
#   (kv_connector/utils.py ``TransferTopology.handshake_target_ranks``; vllm#51137's
#   OOM) and divides by it in ``tp_ratio`` (0: ZeroDivisionError); vllm#51137's fix
#   refuses a tp_size below 1 or above its ``_MAX_KV_TRANSFER_TP_SIZE`` (its tests
#   refuse 0, -1, "big" and 20,000,000; the value itself is not in what was read, so
#   the ceiling here is this gateway's own). MoRIIO reads the same value as
#   ``remote_tp_size`` first, then ``tp_size`` (moriio_common.py ``add_new_req``).
# - pp_size: NIXL's handshake asks ``itertools.product(range(remote_pp_size),
#   ranks)``, one metadata round trip (5 s timeout) each (nixl/base_worker.py
#   ``_nixl_handshake``); vllm#51137's fix bounds it like tp_size
#   (``_MAX_KV_TRANSFER_PP_SIZE``). Their product is the number of those round trips
#   at most, so it is bounded too.
# - dcp_size: divides NIXL's reader count (``dcp_consumer_count``) and picks its
#   source ranks (``dcp_source_ranks``); vLLM's own ``decode_context_parallel_size``
#   is at least 1 (config/parallel.py).
# - remote_dp_size: MoRIIO's DP fan-out and notify port offsets (``dp_rank * tp_size +
#   tp_rank``, moriio_common.py ``get_port_offset``); vLLM's ``data_parallel_size`` is at
#   least 1.
MAX_RANKS: Final = 1024
# TCP ports: NIXL's side channel (``make_zmq_path("tcp", host, port)``), MoRIIO's
# handshake and notify sockets; vllm#51137's fix refuses 0 and 65536 for remote_port.
MIN_PORT: Final = 1
MAX_PORT: Final = 65535
# vLLM's block tables are int32 (v1/worker/block_table.py): no block id reaches 2**31.
BLOCK_ID_BOUND: Final = 2**31
# The most tokens a prompt may have when neither its ids nor the route's max_ids say:
# above every context length vLLM serves (the longest published is 10M tokens).
MAX_PROMPT_TOKENS: Final = 2**24
# The most KV cache groups one ``remote_block_ids`` may list: vLLM groups a model's
# layers by their KV cache spec, so there are never more groups than layers.
MAX_GROUPS: Final = 1024

# Integers within fixed bounds, checked in this order: (key, lowest, highest).
_FIXED: Final = (
    ("tp_size", 1, MAX_RANKS),
    ("remote_tp_size", 1, MAX_RANKS),
    ("pp_size", 1, MAX_RANKS),
    ("dcp_size", 1, MAX_RANKS),
    ("remote_dp_size", 1, MAX_RANKS),
    ("remote_port", MIN_PORT, MAX_PORT),
    ("remote_handshake_port", MIN_PORT, MAX_PORT),
    ("remote_notify_port", MIN_PORT, MAX_PORT),
)
# Every key checked, for the documentation's table and the tests.
KEYS: Final = (
    *(key for key, _, _ in _FIXED),
    "remote_dp_rank",
    "remote_dp_size_local",
    "remote_num_tokens",
    "remote_block_ids",
)


def refusal(
    params: Mapping[str, Any], tokens: int | None = None, where: str = KV_KEY
) -> Refusal | None:
    """Why ``params`` (a ``kv_transfer_params`` object) holds a connector value out of
    bounds, or None. ``tokens``: the most tokens the prompt has (its ids' count, else
    the route's max_ids); None or 0: ``MAX_PROMPT_TOKENS``. ``where``: the member the
    object is (refusals name its keys below it)."""
    for key, low, high in _FIXED:
        if not _within(params.get(key), low, high):
            return _out(where, key, f"an integer from {low} to {high}")
    tp, pp = params.get("tp_size"), params.get("pp_size")
    if tp is not None and pp is not None and tp * pp > MAX_RANKS:
        return _out(
            where, "pp_size", f"at most {MAX_RANKS // tp} with tp_size {tp} ({MAX_RANKS} ranks)"
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
