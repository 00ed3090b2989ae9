"""Property: whatever bytes arrive, the gateway either denies or decides on exactly the
document Python's json.loads (vLLM's parser) reads, and what it forwards carries no
untrusted kv_transfer_params (strip) or no policed key (keep_other_keys). A body it
forwards without parsing (no spelling of the key in its bytes) is one json.loads either
refuses or reads without the key; disabling any clause of that proof
(ext_proc/core/spelling.py) fails this property. Ids read from the bytes of their
array (``reading._lifted``) are held to the same properties."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.core import bytescan, proof, reading
from ext_proc.core.events import (
    BodyMode,
    ContinueBody,
    ContinueHeaders,
    Reject,
    RequestBody,
    RequestHeaders,
    RouteMetadata,
    StreamedBody,
)
from ext_proc.core.proof import Trust
from ext_proc.core.vllm_request import (
    CARRIER_NAMES,
    CARRIERS,
    DEEP_NAMES,
    EVERY,
    POLICED_KEYS,
    UNTYPED_MEMBERS,
)
from tests.driver import Driven

KV = "kv_transfer_params"
STRIP = RouteMetadata({"action": "strip"}, 1.0)
KEEP = RouteMetadata({"action": "strip", "keep_other_keys": True}, 2.0)
HONOR = RouteMetadata(
    {"topology": "disaggregated", "vocab_size": "1000", "trust_any_caller": True}, 3.0
)
HEADERS = (("content-type", b"application/json"),)
MODES = [BodyMode.BUFFERED, BodyMode.FULL_DUPLEX_STREAMED]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)
# Member names include the carriers of transfer parameters, at any depth.
names = st.one_of(st.text(max_size=6), st.sampled_from(CARRIER_NAMES))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(names, inner, max_size=4)),
    max_leaves=12,
)
id_lists = st.lists(st.integers(-5, 1200), max_size=6)
kv_keys = st.sampled_from([*POLICED_KEYS, "do_remote_prefill", "remote_block_ids", "x"])
kv_params = st.dictionaries(kv_keys, st.one_of(id_lists, values), max_size=4)
documents = st.fixed_dictionaries(
    {"messages": st.just([{"role": "user", "content": "hi"}])},
    optional={
        "kv_transfer_params": st.one_of(kv_params, values),
        "echo": st.booleans(),
        "model": st.text(max_size=5),
        "extra": values,
        "ec_transfer_params": values,
        "vllm_xargs": st.dictionaries(st.sampled_from([*CARRIER_NAMES, "x"]), values),
        "sampling_params": st.fixed_dictionaries({"extra_args": values}),
        "generate_response": values,
        "generate_responses": st.lists(values, max_size=3),
    },
)


@pytest.fixture(autouse=True, scope="module", params=["compiled", "python"])
def scan(request):
    """Every property holds of the compiled carrier scan and of its Python reference
    (bytescan.COMPILED None: spelling.spelled's own search and bytescan.quoted)."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "python":
            patch.setattr(bytescan, "COMPILED", None)
        else:
            assert bytescan.COMPILED is not None, "ext_proc.core._scan is not built (make)"
        yield request.param


@pytest.fixture(autouse=True, scope="module")
def _lift_every_array():
    """Every array of ids is read from its bytes when it can be (reading._lifted), not
    only the long ones: the properties then hold of that reading too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reading, "LIFT_MIN_BYTES", 0)
        yield


def escape_some(text: str, rng: random.Random) -> str:
    """Spell some characters of JSON string keys as \\uXXXX escapes."""
    out = []
    in_string = False
    escaped = False
    for char in text:
        if in_string and not escaped and char not in '"\\' and rng.random() < 0.3:
            out.append(f"\\u{ord(char):04x}" if ord(char) < 0x10000 else char)
            continue
        out.append(char)
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            in_string = not in_string
    return "".join(out)


def variants(document: dict[str, Any], seed: int) -> bytes:
    rng = random.Random(seed)
    text = json.dumps(
        document,
        ensure_ascii=rng.random() < 0.5,
        indent=rng.choice([None, 0, 2]),
        separators=rng.choice([None, (",", ":"), (" , ", " : ")]),
    )
    if rng.random() < 0.5:
        text = escape_some(text, rng)
    if rng.random() < 0.3:
        # Exactly one character of the key escaped, each first hex digit (5, 6, 7) alike.
        digit = rng.choice("567")
        at = rng.choice([i for i, c in enumerate(KV) if f"{ord(c):02x}"[0] == digit])
        spelled = (
            KV[:at] + rng.choice(["\\u{:04x}", "\\u{:04X}"]).format(ord(KV[at])) + KV[at + 1 :]
        )
        text = text.replace(f'"{KV}"', f'"{spelled}"')
    if rng.random() < 0.3:
        # One character of every other carrier's name escaped.
        for name in CARRIER_NAMES[1:]:
            at = rng.randrange(len(name))
            spelled = name[:at] + f"\\u{ord(name[at]):04x}" + name[at + 1 :]
            text = text.replace(f'"{name}"', f'"{spelled}"')
    if rng.random() < 0.3:
        # Many escapes of other characters before the key (text escaped to ASCII).
        text = '{"pad": "' + "\\u00e9" * rng.choice([15, 16, 17, 40]) + '", ' + text[1:]
    if rng.random() < 0.3:
        # A shadowed earlier copy of the key: json.loads keeps the last one.
        text = '{"kv_transfer_params": {"prompt_token_ids": [1, 2]}, ' + text[1:]
        if text.endswith(", }"):
            text = text[:-3] + "}"
    encoding = rng.choice(["utf-8", "utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32"])
    try:
        raw = text.encode(encoding, "surrogatepass")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.2 and raw:
        position = rng.randrange(len(raw))
        raw = raw[:position] + bytes([rng.randrange(256)]) + raw[position + 1 :]
    return raw


def run(
    route: RouteMetadata, raw: bytes, mode: BodyMode, stream: Driven | None = None
) -> Reject | bytes | None:
    """The gateway's answer: a Reject, the bytes it forwards, or None for unchanged."""
    stream = stream or Driven(max_body_bytes=1 << 20)
    first = stream.handle(RequestHeaders(HEADERS, False, mode, route, path=CHAT_PATH))
    if mode is BodyMode.BUFFERED:
        assert first == [ContinueHeaders()]
        (action,) = stream.handle(RequestBody(raw, True))
        assert isinstance(action, ContinueBody | Reject)
        return action if isinstance(action, Reject) else action.replacement
    assert first == []
    half = len(raw) // 2
    assert stream.handle(RequestBody(raw[:half], False)) == []
    actions = stream.handle(RequestBody(raw[half:], True))
    if isinstance(actions[0], Reject):
        return actions[0]
    assert actions[0] == ContinueHeaders()
    forwarded = b"".join(a.chunk for a in actions[1:] if isinstance(a, StreamedBody))
    # Streamed mode always sends the body back; unchanged means byte for byte.
    return None if forwarded == raw else forwarded


def policed(document: Any) -> dict[str, Any]:
    params = document.get("kv_transfer_params") if isinstance(document, dict) else None
    if not isinstance(params, dict):
        return {}
    return {key: params[key] for key in POLICED_KEYS if key in params}


def carried(document: Any) -> list[tuple[Any, str]]:
    """Each member (its object and name) at one of vLLM's carrier paths
    (vllm_request.CARRIERS), not null, and each named in DEEP_NAMES at any depth below
    an untyped member (UNTYPED_MEMBERS), none below another: matched here step by
    step, recursively; each once."""

    def follow(node: Any, steps: tuple[str, ...], deep: bool) -> list[tuple[Any, str]]:
        step, rest = steps[0], steps[1:]
        if step == EVERY:
            items = node if isinstance(node, list) else []
            return [
                hit for item in items if isinstance(item, dict) for hit in follow(item, rest, deep)
            ]
        if not isinstance(node, dict) or node.get(step) is None:
            return []
        if rest:
            return follow(node[step], rest, deep)
        return below(node[step]) if deep else [(node, step)]

    def below(node: Any) -> list[tuple[Any, str]]:
        if isinstance(node, list):
            return [hit for item in node for hit in below(item)]
        if not isinstance(node, dict):
            return []
        hits: list[tuple[Any, str]] = []
        for key, value in node.items():
            hits += [(node, key)] if key in DEEP_NAMES and value is not None else below(value)
        return hits

    hits = [hit for carrier in CARRIERS for hit in follow(document, carrier, False)]
    hits += [hit for member in UNTYPED_MEMBERS for hit in follow(document, member, True)]
    return list({(id(holder), key): (holder, key) for holder, key in hits}.values())


def without_carriers(document: Any) -> Any:
    copied = json.loads(json.dumps(document))
    for holder, key in carried(copied):
        del holder[key]
    return copied


def same(a: Any, b: Any) -> bool:
    return json.dumps(a) == json.dumps(b)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    documents,
    st.integers(0, 2**32),
    st.sampled_from([STRIP, KEEP, HONOR]),
    st.sampled_from(MODES),
)
def test_gateway_denies_or_agrees_with_json_loads(document, seed, route, mode):
    raw = variants(document, seed)
    answer = run(route, raw, mode)
    if isinstance(answer, Reject):
        return
    try:
        seen = json.loads(raw)
    except ValueError:
        # Forwarded unread (spelling.spelled): vLLM refuses what it cannot read, so
        # nothing reaches the model. A body the gateway rewrote, it read as json.loads.
        assert answer is None
        return
    if answer is None:
        if route is STRIP:
            assert not seen.get("kv_transfer_params")
        if route is KEEP:
            assert policed(seen) == {}
        if route is not HONOR:  # HONOR trusts any caller, its carriers too
            assert carried(seen) == []
        return
    forwarded = json.loads(answer)
    assert policed(forwarded) == {}
    expected = dict(seen) if route is HONOR else without_carriers(seen)
    params = seen.get("kv_transfer_params")
    if params and route is STRIP:
        del expected["kv_transfer_params"]
    elif params:
        expected["kv_transfer_params"] = {k: v for k, v in params.items() if k not in POLICED_KEYS}
    assert same(forwarded, expected)


@settings(max_examples=200, deadline=None)
@given(documents, st.integers(0, 2**32), st.sampled_from(MODES))
def test_honored_ids_are_valid_in_json_loads_view(document, seed, mode):
    raw = variants(document, seed)
    if run(HONOR, raw, mode) is not None:
        return
    try:
        seen = json.loads(raw)
    except ValueError:
        return  # forwarded unread: vLLM refuses it
    for ids in policed(seen).values():
        assert isinstance(ids, list)
        assert ids
        assert all(type(i) is int and 0 <= i < 1000 for i in ids)


# --- proofs are judged on json.loads's document too ------------------------------

KEYS = proof.KeySet({"k1": b"k" * 32}, "k1")
PROVEN_ROUTE = RouteMetadata({"topology": "disaggregated", "vocab_size": "1000"}, 2.0)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hï"}]}
CHAT_PATH = "/v1/chat/completions"


def proven(ids: list[int]) -> dict[str, Any]:
    minted = {"prompt_token_ids": ids}
    token = proof.mint(
        KEYS,
        minted,
        proof.prompt_digest(CHAT, True, CHAT_PATH),
        1_000_000_020,
        minted=1_000_000_000,
    )
    return {**minted, proof.PROOF_KEY: token}


def decode_leg(raw: bytes, mode: BodyMode) -> Reject | bytes | None:
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1_000_000_000.0)
    return run(PROVEN_ROUTE, raw, mode, Driven(max_body_bytes=1 << 20, trust=trust))


def forwarded_params(raw: bytes, answer: Reject | bytes | None) -> Any:
    assert not isinstance(answer, Reject)
    return json.loads(raw if answer is None else answer).get("kv_transfer_params")


# No escapes of its own, so escape_some can spell any character of its keys as \uXXXX.
GOOD_PARAMS = proven([7, 8])
GOOD = json.dumps({**CHAT, "kv_transfer_params": GOOD_PARAMS}, ensure_ascii=False)
TAMPERED = json.dumps(
    {"prompt_token_ids": [7, 9], proof.PROOF_KEY: proven([7, 8])[proof.PROOF_KEY]}
)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from(MODES))
def test_a_valid_proof_is_honored_however_json_loads_spells_it(seed, mode):
    rng = random.Random(seed)
    text = escape_some(GOOD, rng) if rng.random() < 0.7 else GOOD
    encoding = rng.choice(["utf-8", "utf-8-sig", "utf-16", "utf-16-be", "utf-32"])
    raw = text.encode(encoding)
    answer = decode_leg(raw, mode)
    # Forwarded as it came (vLLM reads these bytes as the processor did), the proof too.
    assert answer is None
    assert forwarded_params(raw, answer) == GOOD_PARAMS


@pytest.mark.parametrize("mode", MODES)
def test_a_shadowed_valid_proof_is_not_honored(mode):
    # json.loads keeps the last kv_transfer_params: the tampered one.
    shadowed = GOOD[:-1] + ', "kv_transfer_params": ' + TAMPERED + "}"
    answer = decode_leg(shadowed.encode(), mode)
    assert forwarded_params(shadowed.encode(), answer) is None


@pytest.mark.parametrize("mode", MODES)
def test_a_proof_shadowed_inside_the_object_is_not_honored(mode):
    params = json.dumps(proven([7, 8]))[:-1] + f', "{proof.PROOF_KEY}": "tp3.k1.x"}}'
    raw = json.dumps(CHAT)[:-1] + f', "kv_transfer_params": {params}}}'
    answer = decode_leg(raw.encode(), mode)
    assert forwarded_params(raw.encode(), answer) is None


@pytest.mark.parametrize("mode", MODES)
def test_the_last_copy_wins_when_it_is_the_valid_one(mode):
    last = proven([7, 8])
    raw = (
        json.dumps(CHAT)[:-1] + f', "kv_transfer_params": {TAMPERED}'
        f', "kv_transfer_params": {json.dumps(last)}}}'
    ).encode()
    answer = decode_leg(raw, mode)
    # Forwarded as it came: vLLM reads the last copy too, and honors it.
    assert answer is None
    assert forwarded_params(raw, answer) == last
