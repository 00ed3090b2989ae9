"""Connector values within bounds (docs/trust.md#connector-values-within-bounds): every
value in bounds passes, every one out of bounds is refused naming its key. The bounds
are stated here again, apart from the package, as docs/trust.md's table gives them."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ext_proc.core import connector_bounds, connector_keys
from ext_proc.core.connector_bounds import refusal

# key: (lowest, highest), as docs/trust.md's table states them.
FIXED = {
    "tp_size": (1, 1024),
    "remote_tp_size": (1, 1024),
    "pp_size": (1, 1024),
    "dcp_size": (1, 1024),
    "remote_dp_size": (1, 1024),
    "remote_port": (1, 65535),
    "remote_handshake_port": (1, 65535),
    "remote_notify_port": (1, 65535),
    "remote_block_size": (1, 2**24),
    # Without remote_dp_size beside them:
    "remote_dp_rank": (0, 1023),
    "remote_dp_size_local": (0, 1024),
    # Without the prompt's ids or a max_ids:
    "remote_num_tokens": (0, 2**24),
}
BLOCK_ID_BOUND = 2**31
# remote_blocks_expiry_time: a finite number from 0 to this (seconds).
CLOCK_BOUND = 2**32
# What vLLM 0.32's NixlConnector answered a 14-token prefill with (deploy/LLM-D.md).
NIXL_REPLY = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[1]],
    "remote_engine_id": "45d6e289-ba3f-4917-8b49-2a5b8f34011f",
    "remote_request_id": "chatcmpl-8ba0d1e8-c895-4999-a3ed-28ab4ea9c3d3-9cdc1601",
    "remote_host": "127.0.0.1",
    "remote_port": 27604,
    "tp_size": 1,
    "dcp_size": 1,
    "pp_size": 1,
    "remote_num_tokens": 14,
    "remote_blocks_expiry_time": None,
    "transfer_mode": "pull",
}
# What vLLM 0.32's NixlConnector answers after a decode with bidirectional_kv_xfer, for
# the next turn's prefill to read back (nixl/pull_scheduler.py request_finished): the
# expiry is the decode server's time.perf_counter() plus decoder_kv_blocks_ttl (480 s).
NIXL_TURN2_REPLY = {
    **NIXL_REPLY,
    "do_remote_prefill": False,
    "do_remote_decode": True,
    "remote_block_ids": [[3, 4]],
    "remote_num_tokens": 30,
    "remote_blocks_expiry_time": 183_402.734_501_2 + 480,
}
# What vLLM 0.32's MoRIIOConnector answers (moriio_connector.py request_finished).
MORIIO_REPLY = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[4, 5], [9]],
    "remote_engine_id": "e",
    "remote_host": "10.0.0.2",
    "remote_handshake_port": 6301,
    "remote_notify_port": 6105,
    "remote_dp_rank": 3,
    "remote_dp_rank_override": True,
    "remote_dp_size": 16,
    "remote_dp_size_local": 8,
    "tp_size": 4,
    "transfer_id": "t",
}


def param(refused: Any) -> str | None:
    assert refused is None or (refused.status, refused.reason) == (400, "connector_out_of_bounds")
    return None if refused is None else refused.param


def test_every_key_the_module_checks_is_in_the_table():
    assert set(connector_bounds.KEYS) == {
        *FIXED,
        "remote_block_ids",
        "remote_blocks_expiry_time",
        "remote_engine_id",
        "remote_request_id",
    }


@pytest.mark.parametrize("key", ["remote_engine_id", "remote_request_id"])
@pytest.mark.parametrize("value", [["e"], {"e": 1}, 7, True, 1.5])
def test_a_name_the_connector_keys_a_record_by_is_a_string(key, value):
    assert param(refusal({**NIXL_REPLY, key: value})) == f"kv_transfer_params.{key}"
    assert param(refusal({**NIXL_REPLY, key: "any name"})) is None
    assert param(refusal({**NIXL_REPLY, key: None})) is None


@pytest.mark.parametrize("params", [NIXL_REPLY, MORIIO_REPLY, {}, {"x": 10**40}])
def test_what_the_connectors_answer_passes(params):
    assert refusal(params, 14) is None


def test_what_a_decode_server_answers_for_the_read_back_passes():
    assert refusal(NIXL_TURN2_REPLY, 30) is None


@pytest.mark.parametrize("key", [*sorted(FIXED), "remote_blocks_expiry_time"])
def test_absent_and_null_pass(key):
    assert refusal({key: None}) is None
    assert refusal({"remote_block_ids": None}) is None


@pytest.mark.parametrize(
    ("params", "tokens", "key"),
    [
        # vllm#51137's cases.
        ({"tp_size": 20_000_000}, None, "tp_size"),
        ({"tp_size": 0}, None, "tp_size"),
        ({"tp_size": -1}, None, "tp_size"),
        ({"tp_size": "big"}, None, "tp_size"),
        ({"tp_size": 1025}, None, "tp_size"),
        ({"pp_size": 0}, None, "pp_size"),
        ({"pp_size": 1025}, None, "pp_size"),
        ({"remote_port": 0}, None, "remote_port"),
        ({"remote_port": 65536}, None, "remote_port"),
        # A boolean, a float or a numeric string is not an integer.
        ({"tp_size": True}, None, "tp_size"),
        ({"remote_port": 8000.0}, None, "remote_port"),
        ({"remote_handshake_port": "6301"}, None, "remote_handshake_port"),
        ({"remote_notify_port": [6105]}, None, "remote_notify_port"),
        ({"remote_tp_size": 0}, None, "remote_tp_size"),
        ({"dcp_size": 0}, None, "dcp_size"),
        ({"remote_dp_size": 0}, None, "remote_dp_size"),
        # One engine's ranks in all, under either TP key: the smallest products refused.
        ({"tp_size": 64, "pp_size": 32}, None, "pp_size"),
        ({"tp_size": 41, "pp_size": 25}, None, "pp_size"),
        ({"remote_tp_size": 64, "pp_size": 32}, None, "pp_size"),
        ({"remote_tp_size": 5, "pp_size": 205}, None, "pp_size"),
        ({"remote_tp_size": 2, "pp_size": 513}, None, "pp_size"),
        ({"tp_size": 1, "remote_tp_size": 1024, "pp_size": 2}, None, "pp_size"),
        # remote_block_size: the smallest refused above and below.
        ({"remote_block_size": 2**24 + 1}, None, "remote_block_size"),
        ({"remote_block_size": 0}, None, "remote_block_size"),
        ({"remote_block_size": -16}, None, "remote_block_size"),
        ({"remote_block_size": 16.0}, None, "remote_block_size"),
        ({"remote_block_size": True}, None, "remote_block_size"),
        ({"remote_block_size": "16"}, None, "remote_block_size"),
        ({"remote_block_size": 10**400}, None, "remote_block_size"),
        ({"remote_tp_size": True}, None, "remote_tp_size"),
        ({"remote_tp_size": 4.0}, None, "remote_tp_size"),
        ({"remote_tp_size": 1025}, None, "remote_tp_size"),
        ({"remote_tp_size": -4}, None, "remote_tp_size"),
        ({"remote_tp_size": 10**400}, None, "remote_tp_size"),
        # remote_blocks_expiry_time: a finite number, 0 to 2**32 seconds.
        ({"remote_blocks_expiry_time": -1}, None, "remote_blocks_expiry_time"),
        ({"remote_blocks_expiry_time": -0.001}, None, "remote_blocks_expiry_time"),
        ({"remote_blocks_expiry_time": 2**32 + 1}, None, "remote_blocks_expiry_time"),
        ({"remote_blocks_expiry_time": 2.0**32 + 0.001}, None, "remote_blocks_expiry_time"),
        ({"remote_blocks_expiry_time": 10**400}, None, "remote_blocks_expiry_time"),
        ({"remote_blocks_expiry_time": float("nan")}, None, "remote_blocks_expiry_time"),
        ({"remote_blocks_expiry_time": float("inf")}, None, "remote_blocks_expiry_time"),
        ({"remote_blocks_expiry_time": float("-inf")}, None, "remote_blocks_expiry_time"),
        ({"remote_blocks_expiry_time": True}, None, "remote_blocks_expiry_time"),
        ({"remote_blocks_expiry_time": "1234.5"}, None, "remote_blocks_expiry_time"),
        ({"remote_blocks_expiry_time": [1234.5]}, None, "remote_blocks_expiry_time"),
        # A rank below the size sent beside it.
        ({"remote_dp_size": 4, "remote_dp_rank": 4}, None, "remote_dp_rank"),
        ({"remote_dp_rank": -1}, None, "remote_dp_rank"),
        ({"remote_dp_rank": 1024}, None, "remote_dp_rank"),
        ({"remote_dp_size": 4, "remote_dp_size_local": 5}, None, "remote_dp_size_local"),
        # No more tokens than the prompt's.
        ({"remote_num_tokens": 15}, 14, "remote_num_tokens"),
        ({"remote_num_tokens": -1}, 14, "remote_num_tokens"),
        ({"remote_num_tokens": 2**24 + 1}, None, "remote_num_tokens"),
        # Block ids: their shape, their values, their count against the prompt's.
        ({"remote_block_ids": "1,2"}, 14, "remote_block_ids"),
        ({"remote_block_ids": {"0": [1]}}, 14, "remote_block_ids"),
        ({"remote_block_ids": [[1], 2]}, 14, "remote_block_ids"),
        ({"remote_block_ids": [1, [2]]}, 14, "remote_block_ids"),
        ({"remote_block_ids": [[1, True]]}, 14, "remote_block_ids"),
        ({"remote_block_ids": [1, None]}, 14, "remote_block_ids"),
        ({"remote_block_ids": [[-1]]}, 14, "remote_block_ids"),
        ({"remote_block_ids": [[2**31]]}, 14, "remote_block_ids"),
        ({"remote_block_ids": [[1.0]]}, 14, "remote_block_ids"),
        ({"remote_block_ids": [[[1]]]}, 14, "remote_block_ids"),
        ({"remote_block_ids": [list(range(15))]}, 14, "remote_block_ids"),
        ({"remote_block_ids": list(range(15))}, 14, "remote_block_ids"),
        ({"remote_block_ids": [[1], list(range(15))]}, 14, "remote_block_ids"),
        ({"remote_block_ids": [[]] * 1025}, 14, "remote_block_ids"),
    ],
)
def test_out_of_bounds_is_refused_naming_the_key(params, tokens, key):
    refused = refusal(params, tokens)
    assert param(refused) == f"kv_transfer_params.{key}"
    assert refused is not None
    assert refused.message.startswith(f"kv_transfer_params.{key}")


@pytest.mark.parametrize(
    "params",
    [
        {"tp_size": 1024, "pp_size": 1},
        {"tp_size": 32, "pp_size": 32},
        {"tp_size": 1, "pp_size": 1024},
        {"remote_tp_size": 1024, "pp_size": 1},
        {"remote_tp_size": 512, "pp_size": 2},
        {"tp_size": 4, "remote_tp_size": 256, "pp_size": 4},
        {"remote_block_size": 1},
        {"remote_block_size": 2**24},
        {"remote_blocks_expiry_time": 0},
        {"remote_blocks_expiry_time": 0.0},
        {"remote_blocks_expiry_time": 2**32},
        {"remote_blocks_expiry_time": 2.0**32},
        {"remote_dp_size": 4, "remote_dp_rank": 3, "remote_dp_size_local": 4},
        {"remote_dp_size_local": 0},
        {"remote_num_tokens": 0},
        {"remote_num_tokens": 14},
        {"remote_block_ids": []},
        {"remote_block_ids": [[]]},
        {"remote_block_ids": list(range(14))},
        {"remote_block_ids": [list(range(14)), [2**31 - 1]]},
        {"remote_block_ids": [[]] * 1024},
    ],
)
def test_the_edges_pass(params):
    assert refusal(params, 14) is None


def test_the_message_names_the_group_and_the_item():
    refused = refusal({"remote_block_ids": [[1, 2], [3, -4]]}, 14)
    assert refused is not None
    assert refused.message.startswith("kv_transfer_params.remote_block_ids[1][1] ")
    refused = refusal({"remote_block_ids": [[1], list(range(20))]}, 14)
    assert refused is not None
    assert "remote_block_ids[1] has 20 block ids" in refused.message


def test_the_product_names_the_tp_key_it_was_taken_with():
    refused = refusal({"tp_size": 1, "remote_tp_size": 64, "pp_size": 32})
    assert refused is not None
    assert refused.message == (
        "kv_transfer_params.pp_size must be at most 16 with remote_tp_size 64 (1024 ranks)"
    )


def test_values_are_not_echoed():
    refused = refusal({"tp_size": 10**4000})
    assert refused is not None
    assert "1000" not in refused.message


# --- every value in bounds passes, every one out of bounds fails ---------------------

not_an_int = st.one_of(
    st.booleans(),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)


@given(st.data())
def test_every_value_in_bounds_passes(data):
    params: dict[str, Any] = {}
    for key, (low, high) in FIXED.items():
        if data.draw(st.booleans(), label=f"has {key}"):
            params[key] = data.draw(st.integers(low, high), label=key)
    # The dependent bounds, as docs/trust.md states them.
    if "pp_size" in params:
        widest = max(params.get("tp_size", 1), params.get("remote_tp_size", 1))
        params["pp_size"] = max(1, min(params["pp_size"], 1024 // widest))
    params["remote_blocks_expiry_time"] = data.draw(
        st.one_of(
            st.none(),
            st.integers(0, CLOCK_BOUND),
            st.floats(0, CLOCK_BOUND, allow_nan=False, allow_infinity=False),
        ),
        label="expiry",
    )
    if "remote_dp_size" in params:
        size = params["remote_dp_size"]
        if "remote_dp_rank" in params:
            params["remote_dp_rank"] = data.draw(st.integers(0, size - 1))
        if "remote_dp_size_local" in params:
            params["remote_dp_size_local"] = data.draw(st.integers(0, size))
    tokens = data.draw(st.integers(1, 64), label="tokens")
    if "remote_num_tokens" in params:
        params["remote_num_tokens"] = data.draw(st.integers(0, tokens))
    block_ids = st.lists(st.integers(0, BLOCK_ID_BOUND - 1), max_size=tokens)
    params["remote_block_ids"] = data.draw(
        st.one_of(st.none(), block_ids, st.lists(block_ids, max_size=4)), label="blocks"
    )
    assert refusal(params, tokens) is None


@given(
    key=st.sampled_from(sorted(FIXED)),
    value=st.one_of(
        not_an_int,
        st.integers(max_value=-1),
        st.integers(min_value=2**24 + 1),
    ),
)
def test_every_value_out_of_bounds_fails(key, value):
    low, high = FIXED[key]
    if type(value) is int and low <= value <= high:
        value = high + 1
    assert param(refusal({key: value})) == f"kv_transfer_params.{key}"


@given(
    key=st.sampled_from(sorted(FIXED)),
    offset=st.integers(1, 2**70),
    below=st.booleans(),
)
def test_every_integer_just_past_a_bound_fails(key, offset, below):
    low, high = FIXED[key]
    value = low - offset if below else high + offset
    assert param(refusal({key: value})) == f"kv_transfer_params.{key}"
    # The same key, in bounds, beside other valid values, passes.
    assert refusal({**NIXL_REPLY, key: low}, 2**24) is None
    assert refusal({**NIXL_REPLY, key: high}, 2**24) is None


@given(
    tokens=st.integers(1, 32),
    groups=st.integers(1, 4),
    bad=st.one_of(
        st.integers(max_value=-1),
        st.integers(min_value=BLOCK_ID_BOUND),
        st.booleans(),
        st.none(),
        st.floats(allow_nan=False),
        st.text(max_size=3),
    ),
    data=st.data(),
)
def test_a_bad_block_id_or_too_many_fail_anywhere(tokens, groups, bad, data):
    lists = [
        data.draw(st.lists(st.integers(0, BLOCK_ID_BOUND - 1), max_size=tokens))
        for _ in range(groups)
    ]
    assert refusal({"remote_block_ids": lists}, tokens) is None
    group = data.draw(st.integers(0, groups - 1))
    spoiled = [list(ids) for ids in lists]
    spoiled[group].insert(data.draw(st.integers(0, len(spoiled[group]))), bad)
    assert param(refusal({"remote_block_ids": spoiled}, tokens + 1)) == (
        "kv_transfer_params.remote_block_ids"
    )
    many = [list(ids) for ids in lists]
    many[group] = [0] * (tokens + 1)
    assert param(refusal({"remote_block_ids": many}, tokens)) == (
        "kv_transfer_params.remote_block_ids"
    )


@given(
    value=st.one_of(
        not_an_int,
        st.integers(),
        st.floats(),  # NaN and both infinities too
    )
)
def test_an_expiry_passes_exactly_when_a_finite_number_from_0_to_2_32(value):
    number = type(value) in (int, float)
    fits = number and math.isfinite(value) and 0 <= value <= CLOCK_BOUND
    refused = refusal({"remote_blocks_expiry_time": value})
    assert param(refused) == (None if fits else "kv_transfer_params.remote_blocks_expiry_time")


@given(
    key=st.sampled_from(["tp_size", "remote_tp_size"]),
    tp=st.integers(1, 1024),
    pp=st.integers(1, 1024),
)
def test_either_tp_size_times_pp_size_passes_exactly_up_to_1024(key, tp, pp):
    refused = refusal({key: tp, "pp_size": pp})
    assert param(refused) == (None if tp * pp <= 1024 else "kv_transfer_params.pp_size")


# Values at and around every bound, of every JSON type (and a few Python ones a caller
# could hand over), for the differential test of the one-pass check below.
_EDGE_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([-1, 0, 1, 2, 1023, 1024, 1025, 65535, 65536, 2**24, 2**24 + 1, 2**32]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.lists(st.one_of(st.integers(-1, 3), st.lists(st.integers(-1, 3), max_size=3)), max_size=4),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
_ANY_KEY = st.sampled_from(
    [*connector_bounds.KEYS, *connector_bounds._READ, "prompt_token_ids", "do_remote_prefill", ""]
)


@given(
    st.dictionaries(_ANY_KEY, _EDGE_VALUES, max_size=8),
    st.one_of(st.none(), st.integers(0, 4)),
)
def test_the_one_pass_check_answers_as_the_whole_check(params, tokens):
    # The pass over a dict's own keys is a shortcut to None: whatever it passes the
    # whole check in its order passes too, and every refusal is the whole check's.
    assert refusal(params, tokens) == connector_bounds._refusal(
        params, tokens, "kv_transfer_params"
    )


def test_every_key_the_whole_check_reads_is_looked_at_by_the_one_pass_check():
    # A key the shortcut skipped but the whole check read would pass unchecked.
    edges = {key: (low - 1, low, high, high + 1) for key, low, high in connector_keys.SPANS}
    for key in connector_bounds._READ:
        for bad in (True, -1, 2**40, 1.5, "x", [None], {}, *edges.get(key, ())):
            whole = connector_bounds._refusal({key: bad}, None, "kv_transfer_params")
            assert refusal({key: bad}) == whole, (key, bad)
    for key in (*connector_bounds.KEYS, "remote_engine_id", "remote_block_ids"):
        assert key in connector_bounds._READ, key
