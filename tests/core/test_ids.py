import contextlib
import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.core import ids
from ext_proc.core.ids import MAX_BOUND, MAX_DIGITS, Fault, Ids, Kind, listed, written

BOUNDS = (1, 10, 262144, 128256, 2**31 - 1, MAX_BOUND)


@pytest.fixture(autouse=True, scope="module", params=["compiled", "python"])
def implementation(request):
    """Every test of the rule, on the compiled checks and on the reference."""
    compiled = ids._NATIVE
    if request.param == "compiled" and compiled is None:
        pytest.skip("core._ids is not built")
    if request.param == "python":
        ids._NATIVE = None
    yield request.param
    ids._NATIVE = compiled


def plain_fault(value, bound):
    """The rule read item by item: a non-empty list of non-negative ints below
    ``bound``; the first malformed item, else the first largest id at or above it."""
    if not isinstance(value, list) or not value:
        return Fault(Kind.MALFORMED, 0)
    for index, item in enumerate(value):
        if type(item) is not int or item < 0:
            return Fault(Kind.MALFORMED, index)
    highest = max(value)
    return Fault(Kind.OUT_OF_RANGE, value.index(highest), highest) if highest >= bound else None


def well_formed(value):
    return (
        isinstance(value, list)
        and bool(value)
        and all(type(v) is int and 0 <= v < 10**MAX_DIGITS for v in value)
    )


# Items at every edge of the rule: booleans, negatives, floats, ints of 18, 19 and 20
# digits, 2**63 and 2**64 on either side, strings, nulls, nested lists.
EDGES = st.sampled_from(
    [
        True,
        False,
        -1,
        -(2**63),
        0.0,
        1.0,
        1e3,
        -0.0,
        10**18 - 1,
        10**18,
        10**19 - 1,
        10**19,
        2**63 - 1,
        2**63,
        2**64 - 1,
        2**64,
        2**70,
        MAX_BOUND - 1,
        MAX_BOUND,
        "1",
        None,
        [],
        [1],
        {},
    ]
)
ITEMS = st.one_of(st.integers(0, 300), st.integers(0, 10**MAX_DIGITS - 1), EDGES)
VALUES = st.one_of(st.lists(ITEMS, max_size=12), st.integers(), st.text(max_size=3), st.none())


def spellings(value):
    """The texts ``json.loads`` reads as ``value``: compact, with a space after each
    separator, indented."""
    yield json.dumps(value, separators=(",", ":")).encode()
    yield json.dumps(value).encode()
    yield json.dumps(value, indent=1).encode()
    with contextlib.suppress(TypeError):  # an int of 64 bits or more
        yield orjson.dumps(value)


@settings(deadline=None)  # numpy warms up on the first example: no timing here
@given(VALUES)
def test_both_constructions_give_the_same_count_text_and_verdict(value):
    parsed = Ids.of(value)
    for bound in BOUNDS:
        assert parsed.fault(bound) == plain_fault(value, bound)
    for text in spellings(value):
        read = Ids.read(text)
        # Read from the bytes exactly when well-formed and spelled compactly or with
        # json.dumps's default separators; anything else is left to the parser.
        expected = well_formed(value) and b"\n" not in text
        assert (read is not None) is expected
        if read is not None:
            assert read.count == parsed.count == len(value)
            assert read.text == parsed.text == orjson.dumps(value)
            assert read.to_list() == value
            for bound in BOUNDS:
                assert read.fault(bound) == parsed.fault(bound)


@settings(deadline=None)  # numpy warms up on the first example: no timing here
@given(
    st.lists(
        st.one_of(st.integers(0, 300), st.integers(0, 10**MAX_DIGITS - 1)),
        min_size=1,
        max_size=40,
    ),
    st.lists(st.sampled_from([", ", ","]), min_size=1),
    st.lists(st.tuples(st.integers(0, 400), st.sampled_from(list(b" ,0-.e[]\t1"))), max_size=2),
)
def test_whatever_read_accepts_json_loads_reads_as_the_same_ids(values, separators, edits):
    text = "".join(f"{separators[i % len(separators)]}{v}" for i, v in enumerate(values))
    span = bytearray(("[" + text[len(separators[0]) :] + "]").encode())
    for at, byte in edits:  # a stray byte here and there, most of them not JSON
        span.insert(at % (len(span) + 1), byte)
    read = Ids.read(bytes(span))
    if read is None:
        return
    value = json.loads(span)
    assert well_formed(value)
    parsed = Ids.of(value)
    assert (read.count, read.text) == (parsed.count, parsed.text)
    for bound in BOUNDS:
        assert read.fault(bound) == parsed.fault(bound)


@pytest.mark.parametrize(
    "span",
    [b"[0]", b"[7]", b"[1,2,3]", b"[1, 2, 3]", b"[9999999999]", b"[0,0,10,100]", b"[5,17,0]"],
)
def test_arrays_of_ids_are_read(span):
    read = Ids.read(span)
    assert read is not None
    assert read.to_list() == json.loads(span)
    assert read.text == orjson.dumps(json.loads(span))
    assert read.count == len(json.loads(span))


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
        b"[1E3]",
        b"[+1]",
        b"[true]",
        b'["1"]',
        b"[null]",
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
        b"[1234567890123456789]",  # 19 digits: no longer well-formed
        b"[5, 18446744073709551616]",  # 2**64
    ],
)
def test_anything_else_is_left_to_the_parser(span):
    assert Ids.read(span) is None


@settings(deadline=None)  # numpy warms up on the first example: no timing here
@given(
    st.lists(
        st.one_of(st.integers(0, 300), st.integers(0, 10**MAX_DIGITS - 1)),
        min_size=1,
        max_size=60,
    )
)
def test_the_largest_id_and_its_first_index_are_named(values):
    read = Ids.read(orjson.dumps(values))
    assert read is not None
    highest = max(values)
    expected = Fault(Kind.OUT_OF_RANGE, values.index(highest), highest) if highest else None
    assert read.fault(1) == expected


def test_the_largest_is_found_among_ids_of_every_length():
    values = [9, 10**9, 5, 2**31 - 1, 3, 10**18 - 1, 2**31 - 1, 10**18 - 1, 99]
    read = Ids.read(orjson.dumps(values))
    assert read is not None
    assert read.fault(10) == Fault(Kind.OUT_OF_RANGE, 5, 10**18 - 1)


@pytest.mark.parametrize("bound", [262144, 128256, 10, 1000, 2**31])
def test_ids_next_to_the_bound_on_either_side(bound):
    # Every digit of the bound's predecessor, from the first to the last, is the one
    # where an id just above it differs: all of them are found.
    below = [bound - 1, bound - 2, bound // 10, 0]
    for build in (Ids.of, lambda v: Ids.read(orjson.dumps(v))):
        assert build(below).fault(bound) is None
        for above in (bound, bound + 1, bound * 10, bound + 10 ** (len(str(bound)) - 2)):
            assert build([*below, above, *below]).fault(bound) == Fault(
                Kind.OUT_OF_RANGE, len(below), above
            )


@pytest.mark.parametrize(
    ("value", "fault"),
    [
        ([], Fault(Kind.MALFORMED, 0)),
        ("[1]", Fault(Kind.MALFORMED, 0)),
        (5, Fault(Kind.MALFORMED, 0)),
        ([1, True], Fault(Kind.MALFORMED, 1)),
        ([1, 2, -3], Fault(Kind.MALFORMED, 2)),
        ([1.0], Fault(Kind.MALFORMED, 0)),
        ([1, [2]], Fault(Kind.MALFORMED, 1)),
        ([1, 2**64], Fault(Kind.OUT_OF_RANGE, 1, 2**64)),
        ([10**19, 1, 10**19], Fault(Kind.OUT_OF_RANGE, 0, 10**19)),
        ([2**63, -1], Fault(Kind.MALFORMED, 1)),
        ([0, MAX_BOUND - 1], None),
    ],
)
def test_why_ids_are_not_valid(value, fault):
    assert Ids.of(value).fault(MAX_BOUND) == fault


def test_ids_are_written_back_as_their_text_or_their_list():
    read = Ids.read(b"[1, 20, 300]")
    assert read is not None
    assert orjson.dumps({"a": read}, default=written) == b'{"a":[1,20,300]}'
    assert json.dumps({"a": read}, default=listed) == '{"a": [1, 20, 300]}'
    with pytest.raises(TypeError):
        orjson.dumps({"a": object()}, default=written)
    with pytest.raises(TypeError):
        json.dumps({"a": object()}, default=listed)


def test_ids_already_read_are_their_own_ids():
    read = Ids.read(b"[1,2]")
    assert Ids.of(read) is read
    assert Ids.of({"a": 1}).count == 0
    assert Ids.of([3, 4]).count == 2


def test_a_value_orjson_cannot_write_has_no_text():
    with pytest.raises(TypeError):
        Ids.of([2**64]).text  # noqa: B018


def test_a_caller_that_checked_the_runs_of_digits_saves_the_pass(implementation):
    long = b"[1, 1234567890123456789]"
    assert Ids.read(long) is None
    # The caller's word is taken (reading.scan has shown no such run in a body it lifts);
    # the compiled pass checks the runs with the rest, at no cost.
    assert (Ids.read(long, runs_checked=True) is None) is (implementation == "compiled")
    assert Ids.read(b"[1, 2]", runs_checked=True).count == 2


def test_what_a_proof_signs_is_the_canonical_text_or_nothing():
    read = Ids.read(b"[1, 20,300]")
    assert read is not None
    assert read.signed == b"[1,20,300]"
    assert Ids.of([1, 20, 300]).signed == b"[1,20,300]"
    assert Ids.of([True, 2.5]).signed == b"[true,2.5]"  # signed as written: no valid ids
    # orjson writes NaN and infinities as null: the text would not be the value.
    assert Ids.of([1, float("nan")]).signed is None
    assert Ids.of([1, float("inf")]).signed is None
    assert Ids.of([2**64]).signed is None  # orjson cannot write it


def test_ids_read_from_a_view_of_the_body_are_its_bytes_when_asked(implementation):
    body = b'{"prompt_token_ids": [5,60,700], "x": 1}'
    start = body.index(b"[")
    read = Ids.read(memoryview(body)[start : body.index(b"]") + 1], bound=1000)
    assert read is not None
    assert read.count == 3
    for text in (read.text, read.signed, read.text):
        assert type(text) is bytes
        assert text == b"[5,60,700]"
    assert read.text is read.text  # copied once
    assert read.fault(1000) is None
    assert read.fault(700) == Fault(Kind.OUT_OF_RANGE, 2, 700)
    assert read.to_list() == [5, 60, 700]
    assert orjson.dumps({"ids": read}, default=written) == b'{"ids":[5,60,700]}'
