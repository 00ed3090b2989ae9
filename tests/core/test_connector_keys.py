"""The table of connector keys (ext_proc/core/connector_keys.py): its rows are whole, its
stated bounds are the numbers checked, and the checks cover exactly its checked keys."""

from __future__ import annotations

import re

import pytest

from ext_proc.core import connector_bounds, connector_keys
from ext_proc.core.connector_keys import KEYS, LAST, MOONCAKE, MORIIO, NIXL

RELEASES = ("0.27.0", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0")
# Each source is a file below kv_connector/v1/ of the connector that reads the key.
SOURCE = re.compile(r"(nixl|moriio|mooncake)/[a-z_*]+\.py")
FOLDER = {NIXL: "nixl", MORIIO: "moriio", MOONCAKE: "mooncake"}


def test_each_key_is_listed_once():
    names = [key.name for key in KEYS]
    assert len(names) == len(set(names))
    assert connector_keys.BY_NAME.keys() == set(names)


@pytest.mark.parametrize("key", KEYS, ids=lambda key: key.name)
def test_each_row_names_a_connector_its_releases_and_its_sources(key):
    assert key.reads
    assert key.bound
    for read in key.reads:
        assert read.connector in FOLDER
        assert read.since in RELEASES
        assert read.use
        for source in read.source.split(", "):
            match = SOURCE.fullmatch(source)
            assert match is not None, source
            assert match.group(1) == FOLDER[read.connector]
    assert RELEASES[-1] == LAST


@pytest.mark.parametrize("key", [k for k in KEYS if k.span], ids=lambda key: key.name)
def test_a_stated_integer_range_is_the_span_checked(key):
    low, high = key.span
    assert key.bound.startswith(f"integer, {low} to {high}")
    assert connector_bounds.refusal({key.name: low}) is None
    assert connector_bounds.refusal({key.name: high}) is None
    assert connector_bounds.refusal({key.name: low - 1}) is not None
    assert connector_bounds.refusal({key.name: high + 1}) is not None


def test_the_checks_cover_exactly_the_checked_keys():
    checked = {key.name for key in KEYS if key.checked}
    assert set(connector_bounds.KEYS) == checked
    # A key the table does not check is not looked at, whatever its value.
    for key in KEYS:
        if not key.checked:
            assert connector_bounds.refusal({key.name: [10**40, -1, "x"]}) is None


def test_a_key_without_a_bound_says_so():
    for key in KEYS:
        assert key.bound.startswith("none") != key.checked, key.name


def test_the_keys_the_audit_named_are_bounded():
    # remote_tp_size (with pp_size), remote_block_size, remote_blocks_expiry_time.
    for name in ("remote_tp_size", "remote_block_size", "remote_blocks_expiry_time"):
        assert connector_keys.BY_NAME[name].checked
