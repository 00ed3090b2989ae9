import json
import re

import orjson
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ext_proc import ids


def _expected(span: bytes) -> ids.RawIds | None:
    """What ``read`` must say of ``span``: json.loads's list when it is a non-empty
    list of non-negative ints of at most ten digits, written compactly save for
    spaces after commas."""
    try:
        value = json.loads(span)
    except ValueError:
        return None
    compact = orjson.dumps(value)
    if not (isinstance(value, list) and value) or span.replace(b", ", b",") != compact:
        return None
    if not all(type(v) is int and 0 <= v < 10**ids.MAX_DIGITS for v in value):
        return None
    return ids.RawIds(compact, len(value))


@pytest.mark.parametrize(
    "span",
    [b"[0]", b"[7]", b"[1,2,3]", b"[1, 2, 3]", b"[9999999999]", b"[0,0,10,100]", b"[5,17,0]"],
)
def test_arrays_of_ids_are_read(span):
    read = ids.read(span)
    assert read is not None
    assert read == _expected(span)
    assert read.to_list() == json.loads(span)


@pytest.mark.parametrize(
    "span",
    [
        b"[]",
        b"[ ]",
        b"[1,,2]",
        b"[,1]",
        b"[1,]",
        b"[01]",
        b"[1,02]",
        b"[00]",
        b"[1,00]",
        b"[1,000]",
        b"[-1]",
        b"[1.0]",
        b"[1e3]",
        b"[+1]",
        b"[true]",
        b'["1"]',
        b"[1 ,2]",
        b"[1,  2]",
        b"[ 1,2]",
        b"[1,2 ]",
        b"[1,\t2]",
        b"[1,\n2]",
        b"[1 2]",
        b" [1]",
        b"[1] ",
        b"[1,2, ]",
        b"[[1]]",
        b"[1",
        b"1]",
        b"[1,2]x",
    ],
)
def test_anything_else_is_left_to_the_parser(span):
    assert ids.read(span) is None


@given(
    # At most MAX_DIGITS digits per id: read's precondition (the caller checks it).
    st.lists(
        st.one_of(st.integers(0, 300), st.integers(0, 10**ids.MAX_DIGITS - 1)),
        min_size=1,
        max_size=40,
    ),
    st.lists(st.sampled_from([", ", ","]), min_size=1),
    st.lists(st.tuples(st.integers(0, 400), st.sampled_from(list(b" ,0-.e[]\t1"))), max_size=2),
)
def test_read_agrees_with_json_loads(values, separators, edits):
    text = "".join(f"{separators[i % len(separators)]}{v}" for i, v in enumerate(values))
    span = bytearray(("[" + text[len(separators[0]) :] + "]").encode())
    for at, byte in edits:  # a stray byte here and there, most of them not JSON
        span.insert(at % (len(span) + 1), byte)
    assume(re.search(rb"[0-9]{%d}" % (ids.MAX_DIGITS + 1), span) is None)
    assert ids.read(bytes(span)) == _expected(bytes(span))


@given(
    st.lists(
        st.one_of(st.integers(0, 300), st.integers(0, 10**ids.MAX_DIGITS - 1)),
        min_size=1,
        max_size=60,
    )
)
def test_the_largest_id_and_its_first_index(values):
    read = ids.read(orjson.dumps(values))
    assert read is not None
    highest = max(values)
    assert read.largest() == (highest, values.index(highest))


def test_the_largest_is_found_among_ids_of_every_length():
    values = [9, 10**9, 5, 2**31 - 1, 3, 10**18 - 1, 2**31 - 1, 10**18 - 1, 99]
    read = ids.read(orjson.dumps(values))
    assert read is not None
    assert read.largest() == (10**18 - 1, 5)


def test_written_back_as_orjson_writes_the_list():
    read = ids.read(b"[1, 20, 300]")
    assert read is not None
    assert orjson.dumps({"a": read.fragment()}) == b'{"a":[1,20,300]}'


@given(
    st.lists(
        st.one_of(st.integers(0, 300), st.integers(0, 10**7), st.integers(0, 10**12)),
        min_size=1,
        max_size=60,
    ),
    st.one_of(st.integers(1, 400), st.integers(1, 10**8), st.integers(1, 10**ids.MAX_DIGITS - 1)),
)
def test_reaches_says_whether_some_id_is_the_bound_or_more(values, bound):
    read = ids.read(orjson.dumps(values))
    assert read is not None
    assert read.reaches(bound) is (max(values) >= bound)


@pytest.mark.parametrize("bound", [262144, 128256, 10, 1000, 2**31])
def test_ids_next_to_the_bound_on_either_side(bound):
    # Every digit of the bound's predecessor, from the first to the last, is the one
    # where an id just above it differs: all of them are found.
    below = [bound - 1, bound - 2, bound // 10, 0]
    assert not ids.read(orjson.dumps(below)).reaches(bound)
    for above in (bound, bound + 1, bound * 10, bound + 10 ** (len(str(bound)) - 2)):
        assert ids.read(orjson.dumps([*below, above, *below])).reaches(bound)


def test_a_bound_longer_than_any_id_is_reached_by_none():
    read = ids.read(orjson.dumps([5, 10**ids.MAX_DIGITS - 1]))
    assert read is not None
    assert not read.reaches(10**30)
    assert read.reaches(10**ids.MAX_DIGITS - 1)
