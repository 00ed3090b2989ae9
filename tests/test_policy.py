import copy
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ext_proc import body
from ext_proc.policy import Allow, Deny, Strip, decide
from ext_proc.route_policy import Action, RoutePolicy, Topology

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
STRIP = RoutePolicy(Topology.AGGREGATED, Action.STRIP)
DENY = RoutePolicy(Topology.AGGREGATED, Action.DENY)
HONOR = RoutePolicy(Topology.DISAGGREGATED, Action.HONOR, vocab_size=100, max_ids=4)
HONOR_UNLIMITED = RoutePolicy(Topology.DISAGGREGATED, Action.HONOR)


def doc(params=None, **extra):
    document = {**CHAT, **extra}
    if params is not None:
        document["kv_transfer_params"] = params
    return document


@pytest.mark.parametrize("route", [STRIP, DENY, HONOR])
@pytest.mark.parametrize(
    "document", [doc(), doc({}), doc({"do_remote_prefill": True}), doc(None, echo=True)]
)
def test_no_reused_ids_is_allowed_everywhere(route, document):
    assert decide(route, document) == Allow("no_reused_ids")


@pytest.mark.parametrize("key", ["prompt_token_ids", "prompt_features"])
def test_strip_removes_policed_keys(key):
    decision = decide(STRIP, doc({key: [1, 2, 3], "remote_host": "h"}))
    assert decision == Strip((key,), "stripped_by_policy", 3)


def test_strip_removes_both_keys_and_even_malformed_values():
    decision = decide(STRIP, doc({"prompt_token_ids": "junk", "prompt_features": [1]}))
    assert isinstance(decision, Strip)
    assert decision.keys == ("prompt_token_ids", "prompt_features")


@pytest.mark.parametrize("key", ["prompt_token_ids", "prompt_features"])
def test_deny_answers_400_naming_the_key(key):
    decision = decide(DENY, doc({key: [1]}))
    assert isinstance(decision, Deny)
    assert decision.refusal.status == 400
    assert decision.refusal.param == f"kv_transfer_params.{key}"
    assert decision.reason == "denied_by_policy"


@pytest.mark.parametrize("route", [STRIP, DENY, HONOR])
def test_non_object_transfer_params_denied(route):
    decision = decide(route, doc([1, 2]))
    assert isinstance(decision, Deny)
    assert decision.reason == "kv_params_not_object"


@pytest.mark.parametrize("key", ["prompt_token_ids", "prompt_features"])
def test_honor_allows_valid_ids(key):
    assert decide(HONOR, doc({key: [0, 5, 99]})) == Allow("honored", 3)


def test_honor_without_limits_allows_large_ids():
    assert decide(HONOR_UNLIMITED, doc({"prompt_token_ids": [10**6] * 10})) == Allow("honored", 10)


@pytest.mark.parametrize(
    ("ids", "reason"),
    [
        ([], "ids_malformed"),
        ("1,2", "ids_malformed"),
        ({"0": 1}, "ids_malformed"),
        ([1, True], "ids_malformed"),
        ([False], "ids_malformed"),
        ([1, -1], "ids_malformed"),
        ([1.0], "ids_malformed"),
        ([1, "2"], "ids_malformed"),
        ([1, None], "ids_malformed"),
        ([[1]], "ids_malformed"),
        ([100], "ids_out_of_vocab"),
        ([0, 99, 10**40], "ids_out_of_vocab"),
        ([1, 2, 3, 4, 5], "ids_too_many"),
    ],
)
def test_honor_denies_malformed_ids(ids, reason):
    decision = decide(HONOR, doc({"prompt_token_ids": ids}))
    assert isinstance(decision, Deny)
    assert decision.reason == reason
    assert decision.refusal.status == 400
    assert decision.refusal.param == "kv_transfer_params.prompt_token_ids"


def test_honor_checks_every_policed_key():
    decision = decide(HONOR, doc({"prompt_token_ids": [1], "prompt_features": [1, True]}))
    assert isinstance(decision, Deny)
    assert decision.refusal.param == "kv_transfer_params.prompt_features"


@pytest.mark.parametrize(
    "document",
    [
        doc({"prompt_token_ids": [1, 2]}, echo=True),
        {
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            "kv_transfer_params": {"prompt_token_ids": [1, 2]},
        },
        {
            "input": [{"role": "user", "content": [{"type": "input_file"}]}],
            "kv_transfer_params": {"prompt_token_ids": [1, 2]},
        },
    ],
)
def test_honor_strips_ids_vllm_would_ignore(document):
    assert decide(HONOR, document) == Strip(("prompt_token_ids",), "ignored_by_upstream", 2)


def test_honor_strips_null_ids_which_vllm_ignores():
    decision = decide(HONOR, doc({"prompt_token_ids": None}))
    assert decision == Strip(("prompt_token_ids",), "ignored_by_upstream", 0)


def test_honor_strips_ignored_ids_even_when_malformed():
    # vLLM would not read them, so they are removed rather than judged.
    decision = decide(HONOR, doc({"prompt_token_ids": [True]}, echo=True))
    assert isinstance(decision, Strip)


@pytest.mark.parametrize("route", [STRIP, DENY, HONOR])
def test_decide_does_not_mutate_its_input(route):
    document = doc({"prompt_token_ids": [1, 2], "remote_port": 1})
    before = copy.deepcopy(document)
    decide(route, document)
    assert document == before


@pytest.mark.parametrize(
    ("ids", "named"),
    [
        ([1, 2, True], "prompt_token_ids[2] is not"),
        ([1, "x", 2.0], "prompt_token_ids[1] is not"),
        ([3, -7, 2], "prompt_token_ids[1] is not"),
        ([1, 99, 100, 5], "prompt_token_ids[2] = 100 is outside"),
    ],
)
def test_denial_names_an_offending_index(ids, named):
    decision = decide(
        HONOR_UNLIMITED if "outside" not in named else HONOR, doc({"prompt_token_ids": ids})
    )
    assert isinstance(decision, Deny)
    assert named in decision.refusal.message


@pytest.mark.parametrize(
    ("ids", "named"),
    [
        ([1, 2, 3, True], "prompt_token_ids[3] is not"),
        ([False, 1], "prompt_token_ids[0] is not"),
        ([1, "x", 2.0], "prompt_token_ids[1] is not"),
        ([3, -7, 2], "prompt_token_ids[1] is not"),
        ([1, None], "prompt_token_ids[1] is not"),
        ([[1], 2], "prompt_token_ids[0] is not"),
        ([1, 2**64, True], "prompt_token_ids[2] is not"),
        ([1, 1e300], "prompt_token_ids[1] is not"),
        ([1, 99, 100, 5], "prompt_token_ids[2] = 100 is outside"),
        ([1, 2**64], "prompt_token_ids[1] = 18446744073709551616 is outside"),
    ],
)
def test_every_kind_of_malformed_id_is_found_and_named(ids, named):
    decision = decide(HONOR_UNLIMITED if len(ids) > 4 else HONOR, doc({"prompt_token_ids": ids}))
    assert isinstance(decision, Deny)
    assert named in decision.refusal.message


def test_ints_beyond_64_bits_are_honored_when_no_vocabulary_is_known():
    document = doc({"prompt_token_ids": [1, 2**64, 10**40]})
    assert decide(HONOR_UNLIMITED, document) == Allow("honored", 3)


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-32"])
def test_a_boolean_id_is_denied_in_every_encoding_json_loads_reads(encoding):
    raw = json.dumps({"kv_transfer_params": {"prompt_token_ids": [1, True]}}).encode(encoding)
    decision = decide(HONOR, body.parse(raw).document)
    assert isinstance(decision, Deny)
    assert decision.reason == "ids_malformed"


ID_ITEMS = st.one_of(
    st.integers(min_value=-3, max_value=120),
    st.integers(min_value=2**63, max_value=2**65),
    st.booleans(),
    st.floats(allow_nan=False),
    st.none(),
    st.text(max_size=2),
)


@given(st.lists(ID_ITEMS, min_size=1, max_size=6))
def test_id_validation_matches_the_plain_definition(ids):
    # The plain per-item reading of "at most max_ids non-negative ints, in vocabulary".
    if len(ids) > HONOR.max_ids:  # the count is checked first, whatever the items
        expected = "ids_too_many"
    elif any(type(v) is not int or v < 0 for v in ids):
        expected = "ids_malformed"
    elif max(ids) >= HONOR.vocab_size:
        expected = "ids_out_of_vocab"
    else:
        expected = "honored"
    decision = decide(HONOR, doc({"prompt_token_ids": ids}))
    assert decision.reason == expected
    if expected == "ids_malformed":  # and the index it names holds a malformed item
        assert isinstance(decision, Deny)
        index = int(decision.refusal.message.split("[", 1)[1].split("]", 1)[0])
        assert type(ids[index]) is not int or ids[index] < 0
