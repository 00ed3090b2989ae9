"""Cutting members out of a body's bytes forwards the document parse-and-rewrite
forwards (the reference), and is taken for ordinary bodies."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import bodies
from ext_proc.core import reading, spelling, splice
from ext_proc.core.vllm_request import EC_KEY, KV_KEY, Path
from tests.parsing import read, rewritten

KV = KV_KEY

# A document as the pairs its objects are written with (duplicate keys possible): an
# object is a list of (key, value) pairs, a list a tuple.
keys = st.sampled_from([KV, EC_KEY, "a", "b", "messages", "prompt_token_ids", "x}", 'q"'])
strings = st.one_of(
    st.text(
        alphabet=st.sampled_from(['"', "\\", "}", "{", "]", "[", ",", ":", "a", "é", "\U0001f642"]),
        max_size=6,
    ),
    st.text(max_size=4),
    st.sampled_from([KV, f'"{KV}"', f'\\"{KV}\\"', "\\u006b", "\\"]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    strings,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(st.tuples(keys, inner), max_size=4),
        st.lists(inner, max_size=4).map(tuple),
    ),
    max_leaves=14,
)
roots = st.lists(st.tuples(keys, values), max_size=6)


def write(value: Any, rng: random.Random, escapes: float = 0.0) -> str:
    """``value`` written as JSON with random whitespace, and characters of keys and
    strings escaped at the rate ``escapes``."""

    def space() -> str:
        return rng.choice(["", "", " ", "\n\t ", "\r\n"])

    if isinstance(value, list):
        members = [
            f"{space()}{text(key, rng, escapes)}{space()}:{space()}{write(item, rng, escapes)}"
            + space()
            for key, item in value
        ]
        return "{" + ",".join(members) + (space() if not members else "") + "}"
    if isinstance(value, tuple):
        items = [space() + write(item, rng, escapes) + space() for item in value]
        return "[" + ",".join(items) + (space() if not items else "") + "]"
    if isinstance(value, str):
        return text(value, rng, escapes)
    return json.dumps(value)


def text(value: str, rng: random.Random, escapes: float) -> str:
    """``value`` as a JSON string, characters escaped at the rate ``escapes``."""
    out = []
    for char in value:
        if rng.random() < escapes and ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04{rng.choice('xX')}}")
        else:
            out.append(json.dumps(char, ensure_ascii=rng.random() < 0.3)[1:-1])
    return '"' + "".join(out) + '"'


def paths_in(document: Any) -> list[Path]:
    """Every member's path in ``document``."""
    found: list[Path] = []
    pending: list[tuple[Any, Path]] = [(document, ())]
    while pending:
        node, path = pending.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                found.append((*path, key))
                pending.append((item, (*path, key)))
        elif isinstance(node, list):
            pending.extend((item, (*path, index)) for index, item in enumerate(node))
    return found


@pytest.fixture(params=[False, True], ids=["parsed", "lifted"])
def lifting(request, monkeypatch):
    """Every array of ids read from its bytes where it can be (``reading._lifted``), or
    none: the cut skips a lifted array without looking inside."""
    if request.param:
        monkeypatch.setattr(reading, "LIFT_MIN_BYTES", 0)
    return request.param


def check(raw: bytes, paths: list[Path]) -> bytes | None:
    """The splice of ``paths`` out of ``raw``, checked against the rewrite."""
    parsed = reading.parse(raw, lift_ids=True)
    assert parsed is not None
    spliced = splice.without(splice.Body(raw), parsed, paths)
    # Told what the judgment's scan tells of the carriers' names, the cut is the same.
    asked = (KV, EC_KEY)
    told = splice.Body(raw, frozenset(asked), spelling.spelled(raw, asked))
    assert splice.without(told, parsed, paths) == spliced
    # A view of the body (as the wire reader hands it over) is cut the same, to bytes.
    view = memoryview(b" " + raw + b" ")[1:-1]
    cut = splice.without(splice.Body(view), reading.parse(view, lift_ids=True) or parsed, paths)
    assert cut == spliced
    assert cut is None or type(cut) is bytes
    if spliced is not None:
        reference = json.loads(rewritten(parsed, paths))
        assert json.loads(spliced) == reference
        expected = json.loads(raw)
        for path in paths:  # the judged document minus the members, by hand
            container = expected
            for step in path[:-1]:
                container = container[step] if _has(container, step) else None
            if isinstance(container, dict):
                container.pop(path[-1], None)
        assert reference == expected
    return spliced


def _has(container: Any, step: Any) -> bool:
    if isinstance(container, dict):
        return step in container
    return isinstance(container, list) and isinstance(step, int) and 0 <= step < len(container)


@settings(
    max_examples=600,
    deadline=None,
    # The fixture only sets how arrays are read, the same for every input.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(roots, st.integers(0, 2**32), st.data())
def test_a_splice_reads_as_the_rewrite(lifting, root, seed, data):
    rng = random.Random(seed)
    if rng.random() < 0.7:  # the carrier at a random position
        root.insert(rng.randrange(len(root) + 1), (KV, data.draw(values)))
    escapes = rng.choice([0.0] * 6 + [0.02, 0.1])
    body = space_around(write(root, rng, escapes), rng).encode()
    parsed = reading.parse(body, lift_ids=True)
    if parsed is None:  # a float orjson and json.loads read apart: not this module's
        return
    members = paths_in(parsed.document)
    chosen = data.draw(st.lists(st.sampled_from(members), max_size=2)) if members else []
    chosen = chosen if rng.random() < 0.3 else []
    check(body, [*chosen, (KV,)])


def space_around(body: str, rng: random.Random) -> str:
    return rng.choice(["", " ", "\n"]) + body + rng.choice(["", "\n", " \t"])


@pytest.mark.parametrize(
    "body",
    [
        b'{"kv_transfer_params":{"prompt_token_ids":[1,2]}}',
        b'{"a":1,"kv_transfer_params":{"x":"}"}}',
        b'{"kv_transfer_params":{"x":"\\"}]"},"a":1}',
        b'{ "a" : 1 , "kv_transfer_params" : [ {"}" : "{"} ] , "b" : [2] }',
        b' {\n"kv_transfer_params"\t:\r\n"\\\\" \n}\n',
        b'{"kv_transfer_params":null,"messages":[{"content":"kv"}]}',
        b'{"a":{"kv":1},"kv_transfer_params":-1.5e3}',
    ],
)
def test_first_last_only_and_middle_members_are_cut(lifting, body):
    spliced = check(body, [(KV,)])
    assert spliced is not None
    assert KV.encode() not in spliced


@pytest.mark.parametrize(
    "body",
    [
        # A duplicate key: the earlier copy is shadowed, both copies are in the bytes.
        b'{"kv_transfer_params":{"a":1},"kv_transfer_params":{"b":2}}',
        # The key written once more inside a string, and once with an escape.
        b'{"kv_transfer_params":1,"content":"\\"kv_transfer_params\\" \\"kv_transfer_params"}',
        b'{"kv_transfer_params":1,"c":"kv_transfer_params"}',
        b'{"k\\u0076_transfer_params":1,"kv_transfer_params":2}',
        # The same name nested below.
        b'{"kv_transfer_params":{"kv_transfer_params":1}}',
    ],
)
def test_the_rewrite_decides_when_the_bytes_do_not_show_the_member(body):
    assert check(body, [(KV,)]) is None


def test_bodies_json_loads_reads_differently_are_not_cut():
    body = b'\xef\xbb\xbf{"kv_transfer_params":1}'  # a byte-order mark: json.loads reads it
    assert splice.without(splice.Body(body), read(body), [(KV,)]) is None


def test_a_nested_member_and_several_members_are_cut(lifting):
    body = (
        b'{"kv_transfer_params":{"prompt_token_ids":[1,2],"remote_port":5},'
        b'"ec_transfer_params":{},"messages":[{"role":"user","vllm_xargs":{"k":1}}]}'
    )
    spliced = check(body, [(KV, "prompt_token_ids"), (EC_KEY,), ("messages", 0, "vllm_xargs")])
    assert spliced == b'{"kv_transfer_params":{"remote_port":5},"messages":[{"role":"user"}]}'
    # A member inside another one removed goes with it.
    assert check(body, [(KV,), (KV, "prompt_token_ids")]) is not None


@pytest.mark.parametrize("size", ["2k", "64k", "1m"])
def test_the_benchmark_strip_bodies_are_cut(size):
    raw = bodies.build(size, "strip").data
    parsed = reading.parse(raw, lift_ids=True)
    assert parsed is not None
    spliced = splice.without(splice.Body(raw), parsed, [(KV,)])
    assert spliced is not None
    expected = json.loads(raw)
    del expected[KV]
    assert json.loads(spliced) == expected


@pytest.mark.parametrize(
    "params",
    [
        b'{"prompt_token_ids":[1, 2,3],"x":"]"}',
        b'{"a":"[","prompt_token_ids" : [ ]}',
        b'{"prompt_token_ids":[1,2]}',
    ],
)
def test_a_lifted_array_is_skipped_where_it_lies(lifting, params):
    for body in (
        b'{"kv_transfer_params":' + params + b',"m":"x"}',
        b'{"m":{"kv_transfer_params":1},"kv_transfer_params":' + params + b"}",
    ):
        parsed = reading.parse(body, lift_ids=True)
        assert parsed is not None
        assert (parsed.lifted is not None) == (lifting and b"1" in params)
        check(body, [(KV,)])
        check(body, [(KV, "prompt_token_ids")])


@pytest.mark.parametrize(("depth", "cut"), [(100, True), (200, False), (1000, False)])
def test_only_documents_orjson_writes_are_cut(depth, cut):
    # Deeper, the rewrite runs json.dumps, which refuses past the recursion limit: the
    # cut would forward what the rewrite refuses.
    inner = '{"a":' * depth + "1" + "}" * depth
    body = f'{{"kv_transfer_params":1,"x":{inner}}}'.encode()
    assert (splice.without(splice.Body(body), read(body), [(KV,)]) is not None) == cut


def test_a_document_too_wide_to_walk_is_not_cut():
    body = b'{"kv_transfer_params":1,"x":[' + b",".join([b"[]"] * 5000) + b"]}"
    assert splice.without(splice.Body(body), read(body), [(KV,)]) is None


def test_names_the_judgments_scan_told_of_are_not_searched_again():
    body = b'{"c":"\\u0061","kv_transfer_params":1}'  # an escape that could spell a key
    parsed = read(body)
    assert splice.without(splice.Body(body), parsed, [(KV,)]) is None
    told = splice.Body(body, frozenset({KV}), {KV: 1})
    assert splice.without(told, parsed, [(KV,)]) == b'{"c":"\\u0061"}'
    # Counted twice (a second copy), or not told: searched, and not cut.
    twice = b'{"kv_transfer_params":1,"kv_transfer_params":2}'
    assert (
        splice.without(splice.Body(twice, frozenset({KV}), {KV: 2}), read(twice), [(KV,)]) is None
    )
    assert splice.without(splice.Body(twice, frozenset({KV}), None), read(twice), [(KV,)]) is None


@pytest.mark.parametrize("size", ["2k", "1m"])
def test_the_judgments_scan_counts_what_the_cut_would_search(size):
    """What ``spelled`` tells (the number of ``"name"`` in the bytes) is what the cut
    searches for when not told."""
    raw = bodies.build(size, "strip").data
    counted = spelling.spelled(raw, (KV,))
    assert counted is not None
    assert counted[KV] == min(raw.count(b'"' + KV.encode() + b'"'), spelling.SPELLED_MOST)
