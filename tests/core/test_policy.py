import copy
import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ext_proc.core import declared, policy, proof
from ext_proc.core import ids as ids_module
from ext_proc.core.events import Peer
from ext_proc.core.policy import Allow, Deny, Evidence, Honor, Mint, Strip
from ext_proc.core.route_policy import Accept, Action, IdentityType, RoutePolicy, Topology, Unproven
from ext_proc.core.vllm_request import MAX_CARRIERS, MAX_SEARCHED
from tests.core import previous_proofs
from tests.parsing import read

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
STRIP = RoutePolicy(Topology.AGGREGATED, Action.STRIP)
DENY = RoutePolicy(Topology.AGGREGATED, Action.DENY)
# Id validation is the same for every trusted source; these routes trust any caller.
HONOR = RoutePolicy(
    Topology.DISAGGREGATED, Action.HONOR, vocab_size=100, max_ids=4, trust_any_caller=True
)
HONOR_UNLIMITED = RoutePolicy(Topology.DISAGGREGATED, Action.HONOR, trust_any_caller=True)
HONORED = "trusted_any_caller"
EVIDENCE = Evidence(digest=lambda: b"\0" * 32)


def decide(route, document, evidence=EVIDENCE):
    return policy.decide(route, document, evidence)


def doc(params=None, **extra):
    document = {**CHAT, **extra}
    if params is not None:
        document["kv_transfer_params"] = params
    return document


@pytest.mark.parametrize("route", [STRIP, DENY, HONOR])
@pytest.mark.parametrize("document", [doc(), doc({}), doc(None, echo=True)])
def test_no_transfer_params_is_allowed_everywhere(route, document):
    assert decide(route, document) == Allow("no_transfer_params")


def test_any_other_key_is_untrusted_too():
    connector = doc({"do_remote_decode": True, "remote_host": "10.0.0.1"})
    assert decide(STRIP, connector) == Strip(None, "stripped_by_policy", 0)
    denied = decide(DENY, connector)
    assert isinstance(denied, Deny)
    assert denied.refusal.param == "kv_transfer_params"
    assert decide(HONOR, connector) == Allow(HONORED, 0)


@pytest.mark.parametrize("key", ["prompt_token_ids", "prompt_features"])
def test_strip_removes_policed_keys(key):
    decision = decide(STRIP, doc({key: [1, 2, 3], "remote_host": "h"}))
    assert decision == Strip(None, "stripped_by_policy", 3)


def test_strip_removes_both_keys_and_even_malformed_values():
    decision = decide(STRIP, doc({"prompt_token_ids": "junk", "prompt_features": [1]}))
    assert isinstance(decision, Strip)
    assert decision.keys is None


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
    assert decide(HONOR, doc({key: [0, 5, 99]})) == Allow(HONORED, 3)


def test_honor_without_limits_allows_large_ids():
    assert decide(HONOR_UNLIMITED, doc({"prompt_token_ids": [10**6] * 10})) == Allow(HONORED, 10)


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


@pytest.mark.parametrize(
    ("ids", "index"),
    [
        ([1, 2**64, 10**40], 2),
        ([2**31], 0),
        ([0, 2**31 - 1, 2**31, 5], 2),
        ([3, 2**63 - 1], 1),
        ([7, int("9" * 4300)], 1),  # the longest integer json.loads reads
    ],
)
def test_without_a_vocabulary_ids_are_bounded_by_32_bits(ids, index):
    # vLLM's token ids are 32-bit signed: nothing at or above 2**31 is a token id.
    decision = decide(HONOR_UNLIMITED, doc({"prompt_token_ids": ids}))
    assert isinstance(decision, Deny)
    assert decision.reason == "ids_out_of_vocab"
    assert decision.refusal.status == 400
    assert decision.refusal.param == "kv_transfer_params.prompt_token_ids"
    assert f"prompt_token_ids[{index}] = " in decision.refusal.message
    assert "2**31" in decision.refusal.message


def test_without_a_vocabulary_ids_below_2_31_are_honored():
    document = doc({"prompt_token_ids": [0, 1, 2**31 - 1]})
    assert decide(HONOR_UNLIMITED, document) == Allow(HONORED, 3)


def test_a_4300_digit_id_read_from_the_body_is_refused():
    raw = b'{"kv_transfer_params": {"prompt_token_ids": [1, ' + b"9" * 4300 + b"]}}"
    decision = decide(HONOR_UNLIMITED, read(raw).document)
    assert isinstance(decision, Deny)
    assert decision.reason == "ids_out_of_vocab"


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-32"])
def test_a_boolean_id_is_denied_in_every_encoding_json_loads_reads(encoding):
    raw = json.dumps({"kv_transfer_params": {"prompt_token_ids": [1, True]}}).encode(encoding)
    decision = decide(HONOR, read(raw).document)
    assert isinstance(decision, Deny)
    assert decision.reason == "ids_malformed"


ID_ITEMS = st.one_of(
    st.integers(min_value=-3, max_value=120),
    st.integers(min_value=2**31 - 3, max_value=2**31 + 3),
    st.integers(min_value=2**63, max_value=2**65),
    st.booleans(),
    st.floats(allow_nan=False),
    st.none(),
    st.text(max_size=2),
)


# No vocab_size: ids are bounded by 2**31 (vLLM's token ids are 32-bit signed).
HONOR_32_BITS = RoutePolicy(Topology.DISAGGREGATED, Action.HONOR, max_ids=4, trust_any_caller=True)


@pytest.mark.parametrize("route", [HONOR, HONOR_32_BITS])
@given(ids=st.lists(ID_ITEMS, min_size=1, max_size=6))
def test_id_validation_matches_the_plain_definition(route, ids):
    # The plain per-item reading of "at most max_ids non-negative ints, each below the
    # vocabulary size, or below 2**31 when none is configured".
    bound = route.vocab_size if route.vocab_size is not None else 2**31
    if len(ids) > route.max_ids:  # the count is checked first, whatever the items
        expected = "ids_too_many"
    elif any(type(v) is not int or v < 0 for v in ids):
        expected = "ids_malformed"
    elif max(ids) >= bound:
        expected = "ids_out_of_vocab"
    else:
        expected = HONORED
    decision = decide(route, doc({"prompt_token_ids": ids}))
    assert decision.reason == expected
    if expected == "ids_malformed":  # and the index it names holds a malformed item
        assert isinstance(decision, Deny)
        index = int(decision.refusal.message.split("[", 1)[1].split("]", 1)[0])
        assert type(ids[index]) is not int or ids[index] < 0


@pytest.mark.parametrize("route", [HONOR, HONOR_32_BITS, STRIP])
@given(ids=st.lists(st.integers(0, 2**40), min_size=1, max_size=6))
def test_ids_read_from_their_bytes_are_judged_as_their_list(route, ids):
    read = ids_module.Ids.read(orjson.dumps(ids))
    assert read is not None
    listed = decide(route, doc({"prompt_token_ids": ids, "x": 1}))
    assert decide(route, doc({"prompt_token_ids": read, "x": 1})) == listed


# --- trust: proofs, peers, unproven parameters (docs/trust.md) ---------------------

KEYS = proof.KeySet({"k1": b"k" * 32}, "k1")
PROVEN = RoutePolicy(Topology.DISAGGREGATED, Action.HONOR, vocab_size=100)
NOW = 1_000_000.0


def proven_params(document, **extra):
    """What a mint route signs for ``document``'s prompt: ids plus a proof."""
    minted = {"prompt_token_ids": [1, 2, 3], **extra}
    digest = proof.prompt_digest(document, True, "/v1/chat/completions")
    return {
        **minted,
        proof.PROOF_KEY: proof.mint(KEYS, minted, digest, int(NOW) + 60, minted=int(NOW)),
    }


def verified(route, document, *, peer=policy.NO_PEER, now=NOW, keys=KEYS):
    digest = proof.prompt_digest(document, True, "/v1/chat/completions")
    return decide(route, document, Evidence(lambda: digest, peer, keys, now, 5.0))


def test_a_proven_request_is_honored_unchanged_its_proof_included():
    document = doc(proven_params(doc()))
    decision = verified(PROVEN, document)
    assert decision == Honor("trusted_proof", 3)
    assert decision.action == "honor"


def test_honor_without_proof_strips_the_whole_object():
    assert verified(PROVEN, doc({"prompt_token_ids": [1, 2]})) == Strip(None, "proof_missing", 2)


def test_unproven_deny_answers_400_with_the_reason():
    route = RoutePolicy(Topology.DISAGGREGATED, Action.HONOR, unproven=Unproven.DENY)
    decision = verified(route, doc({"prompt_token_ids": [1, 2]}))
    assert isinstance(decision, Deny)
    assert (decision.reason, decision.refusal.status) == ("proof_missing", 400)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            lambda d: d["kv_transfer_params"].update(prompt_token_ids=[1, 2, 4]),
            "proof_bad_signature",
        ),
        (lambda d: d["kv_transfer_params"].update(remote_host="10.0.0.9"), "proof_bad_signature"),
        (lambda d: d["messages"].append({"role": "user", "content": "x"}), "prompt_mismatch"),
        (lambda d: d.update(model="other"), "prompt_mismatch"),
        (lambda d: d["kv_transfer_params"].update(token_policy_proof="tp3.x"), "proof_malformed"),
        (lambda d: d["kv_transfer_params"].update(token_policy_proof=7), "proof_malformed"),
    ],
)
def test_a_changed_request_is_unproven(change, reason):
    document = copy.deepcopy(doc(proven_params(doc())))
    change(document)
    assert verified(PROVEN, document) == Strip(None, reason, 3)


def test_fields_an_orchestrator_changes_between_legs_keep_the_proof():
    prefill = doc(max_tokens=1, stream=False, return_token_ids=True)
    decode = doc(proven_params(prefill), max_tokens=200, stream=True, stream_options={})
    assert verified(PROVEN, decode).reason == "trusted_proof"
    # The encoder-cache parameters are each leg's own too (removed here: a client's).
    decode["ec_transfer_params"] = {"x": 1}
    assert verified(PROVEN, decode).reason == "trusted_proof"


@pytest.mark.parametrize("unproven", [Unproven.STRIP, Unproven.DENY])
def test_a_proof_an_older_release_minted_is_untrusted_as_superseded(unproven):
    # A decode leg whose prefill a replica of the release before tp3 signed (during a
    # rollout): its parameters are treated as any unproven ones, under their own reason.
    route = RoutePolicy(Topology.DISAGGREGATED, Action.HONOR, unproven=unproven)
    document = doc()
    minted = {"prompt_token_ids": [1, 2, 3]}
    old_digest = previous_proofs.digest(document, "/v1/chat/completions")
    token = previous_proofs.mint_tp2("k1", b"k" * 32, minted, old_digest, int(NOW) + 60, bytes(12))
    decision = verified(route, doc({**minted, proof.PROOF_KEY: token}))
    if unproven is Unproven.STRIP:
        assert decision == Strip(None, "proof_superseded", 3)
    else:
        assert isinstance(decision, Deny)
        assert (decision.reason, decision.refusal.status) == ("proof_superseded", 400)


def test_an_expired_proof_or_an_unknown_key_is_unproven():
    document = doc(proven_params(doc()))
    assert verified(PROVEN, document, now=NOW + 60 + 5).reason == "trusted_proof"
    assert verified(PROVEN, document, now=NOW + 60 + 6).reason == "proof_expired"
    other = proof.KeySet({"k2": b"o" * 32}, "k2")
    assert verified(PROVEN, document, keys=other).reason == "proof_unknown_key"


def test_a_rotated_key_still_verifies_what_it_signed():
    document = doc(proven_params(doc()))
    rotated = proof.KeySet({"k2": b"n" * 32, "k1": b"k" * 32}, "k2")
    assert verified(PROVEN, document, keys=rotated).reason == "trusted_proof"


def test_proven_ids_are_still_validated():
    minted = {"prompt_token_ids": [1, 500]}
    digest = proof.prompt_digest(doc(), True, "/v1/chat/completions")
    params = {
        **minted,
        proof.PROOF_KEY: proof.mint(KEYS, minted, digest, int(NOW) + 60, minted=int(NOW)),
    }
    assert verified(PROVEN, doc(params)).reason == "ids_out_of_vocab"


ROUTER = (IdentityType.URI, "spiffe://td/router")
PEERS = RoutePolicy(Topology.DISAGGREGATED, Action.HONOR, peers=frozenset({ROUTER}))


def test_a_listed_mtls_peer_is_trusted_and_others_are_not():
    document = doc({"prompt_token_ids": [1, 2], "remote_port": 5600})
    listed = Peer(True, (ROUTER,))
    assert verified(PEERS, document, peer=listed) == Allow("trusted_peer", 2)
    other = Peer(True, ((IdentityType.URI, "spiffe://td/client"),))
    assert verified(PEERS, document, peer=other) == Strip(None, "peer_not_listed", 2)
    not_mtls = Peer(False, (ROUTER,))
    assert verified(PEERS, document, peer=not_mtls).reason == "peer_not_listed"


def test_keep_other_keys_removes_only_the_policed_keys_and_the_proof():
    route = RoutePolicy(Topology.AGGREGATED, Action.STRIP, keep_other_keys=True)
    params = {"prompt_token_ids": [1], "token_policy_proof": "x", "remote_port": 1}
    assert decide(route, doc(params)) == Strip(
        ("prompt_token_ids", "token_policy_proof"), "stripped_by_policy", 1
    )
    assert decide(route, doc({"remote_port": 1})) == Allow("no_reused_ids")


def test_mint_route_requests_are_untrusted_unless_from_a_listed_peer():
    mint = RoutePolicy(Topology.DISAGGREGATED, Action.MINT)
    assert verified(mint, doc({"do_remote_decode": True})) == Strip(None, "unproven", 0)
    from_router = RoutePolicy(Topology.DISAGGREGATED, Action.MINT, peers=frozenset({ROUTER}))
    router = Peer(True, (ROUTER,))
    assert verified(from_router, doc({"do_remote_decode": True}), peer=router) == Allow(
        "trusted_peer", 0
    )


def test_mint_response_signs_the_ids_and_the_connector_keys():
    response = {"id": "x", "prompt_token_ids": [5, 6], "kv_transfer_params": {"remote_port": 7}}
    digest = proof.prompt_digest(doc(), True, "/v1/chat/completions")
    decision, params = policy.mint_response(response, digest, KEYS, int(NOW) + 60, minted=int(NOW))
    assert decision == Mint("minted", 2)
    assert params is not None
    assert params["prompt_token_ids"] == [5, 6]
    assert params["remote_port"] == 7
    assert verified(PROVEN, doc(params)) == Honor("trusted_proof", 2)


@pytest.mark.parametrize(
    ("response", "keys", "reason"),
    [
        ({"id": "x", "kv_transfer_params": None}, KEYS, "nothing_to_mint"),
        ({"prompt_token_ids": [1, True]}, KEYS, "response_ids_malformed"),
        ({"prompt_token_ids": [1]}, policy.NO_KEYS, "no_signing_key"),
        (
            {"prompt_token_ids": [1], "kv_transfer_params": {"x": float("nan")}},
            KEYS,
            "not_renderable",
        ),
    ],
)
def test_mint_response_refuses_to_sign(response, keys, reason):
    assert policy.mint_response(response, b"\0" * 32, keys, 1, minted=1) == (Allow(reason), None)


def test_an_identity_matches_only_one_of_its_own_type():
    document = doc({"prompt_token_ids": [1, 2]})
    # A DNS SAN or a subject that reads like the router's URI SAN is not the router.
    for kind in (IdentityType.DNS, IdentityType.SUBJECT):
        spoof = Peer(True, ((kind, "spiffe://td/router"),))
        assert verified(PEERS, document, peer=spoof) == Strip(None, "peer_not_listed", 2)
    by_dns = RoutePolicy(
        Topology.DISAGGREGATED, Action.HONOR, peers=frozenset({(IdentityType.DNS, "r.local")})
    )
    dns = Peer(True, ((IdentityType.URI, "spiffe://td/x"), (IdentityType.DNS, "r.local")))
    assert verified(by_dns, document, peer=dns) == Allow("trusted_peer", 2)
    uri = Peer(True, ((IdentityType.URI, "r.local"),))
    assert verified(by_dns, document, peer=uri).reason == "peer_not_listed"


# --- other carriers of transfer parameters (docs/trust.md#carriers) -----------------

EC = {"consumer_zmq": "tcp://10.0.0.9:5555"}
CARRIED = [
    ({"ec_transfer_params": EC}, ("ec_transfer_params",)),
    ({"vllm_xargs": {"kv_transfer_params": "x"}}, ("vllm_xargs", "kv_transfer_params")),
    ({"vllm_xargs": {"ec_transfer_params": [1]}}, ("vllm_xargs", "ec_transfer_params")),
    (
        {"sampling_params": {"extra_args": {"kv_transfer_params": {"remote_port": 1}}}},
        ("sampling_params", "extra_args", "kv_transfer_params"),
    ),
    (
        {"generate_response": {"kv_transfer_params": {"prompt_token_ids": [1]}}},
        ("generate_response", "kv_transfer_params"),
    ),
    (
        {"generate_responses": [{}, {"kv_transfer_params": {"remote_host": "h"}}]},
        ("generate_responses", 1, "kv_transfer_params"),
    ),
    # The stacks around vLLM (docs/trust.md#carriers): prompts that skip rendering, the
    # worker that takes them, and the request id a connector parses for its peer.
    ({"prompt_token_ids": [1, 2, 3]}, ("prompt_token_ids",)),
    ({"prompt_features": {"x": 1}}, ("prompt_features",)),
    ({"nvext": {"token_data": [1, 2]}}, ("nvext", "token_data")),
    ({"nvext": {"backend_instance_id": 7}}, ("nvext", "backend_instance_id")),
    ({"tokens": {"token_ids": [1, 2], "features": None}}, ("tokens",)),
    ({"request_id": "a___prefill_addr_10.0.0.7:1___decode_addr_"}, ("request_id",)),
]


@pytest.mark.parametrize(("extra", "path"), CARRIED)
def test_every_carrier_is_removed_from_an_untrusted_caller(extra, path):
    document = doc(**extra)
    for route, reason in [(STRIP, "stripped_by_policy"), (PROVEN, "unproven")]:
        decision = verified(route, document)
        assert decision == Strip((), reason, 0, carriers=(path,))
        assert decision.paths == (path,)
    denied = decide(DENY, document)
    assert isinstance(denied, Deny)
    assert denied.refusal.param == ".".join(map(str, path))
    assert denied.reason == "denied_by_policy"
    unproven_deny = RoutePolicy(Topology.DISAGGREGATED, Action.HONOR, unproven=Unproven.DENY)
    assert verified(unproven_deny, document).reason == "unproven"


@pytest.mark.parametrize(("extra", "path"), CARRIED)
def test_a_proof_covers_only_the_top_level_parameters(extra, path):
    document = doc(proven_params(doc(**extra)), **extra)
    decision = verified(PROVEN, document)
    # The proven parameters stay as sent, their proof included; the other carrier goes.
    assert decision == Strip((), "trusted_proof", 3, True, (path,))
    assert decision.paths == (path,)


@pytest.mark.parametrize(("extra", "path"), CARRIED)
def test_a_trusted_caller_keeps_every_carrier(extra, path):
    document = doc({"prompt_token_ids": [1, 2]}, **extra)
    assert verified(PEERS, document, peer=Peer(True, (ROUTER,))) == Allow("trusted_peer", 2)
    assert decide(HONOR, document) == Allow(HONORED, 2)


def test_carriers_join_the_removal_of_the_parameters():
    document = doc({"prompt_token_ids": [1, 2]}, ec_transfer_params=EC)
    assert decide(STRIP, document) == Strip(
        None, "stripped_by_policy", 2, carriers=(("ec_transfer_params",),)
    )
    assert decide(STRIP, document).paths == (("kv_transfer_params",), ("ec_transfer_params",))
    # A denial of the parameters themselves stands.
    assert decide(DENY, document).refusal.param == "kv_transfer_params.prompt_token_ids"


def test_null_carriers_and_members_inside_the_parameters_are_not_carriers():
    assert decide(STRIP, doc(ec_transfer_params=None, vllm_xargs={"kv_transfer_params": None}))
    assert decide(STRIP, doc(ec_transfer_params=None)) == Allow("no_transfer_params")
    # Inside the top-level object, a member is the object's (signed or removed whole).
    inner = {"ec_transfer_params": EC, "prompt_token_ids": [1]}
    assert verified(PROVEN, doc(inner)) == Strip(None, "proof_missing", 1)


def test_what_other_stacks_read_beside_their_carriers_stays():
    # vLLM's /detokenize reads a list of ids under ``tokens``: not llm-d's object.
    assert decide(STRIP, doc(tokens=[1, 2, 3])) == Allow("no_transfer_params")
    assert decide(DENY, doc(tokens=[1, 2, 3])) == Allow("no_transfer_params")
    # Dynamo's other extensions, and null values, carry nothing.
    assert decide(STRIP, doc(nvext={"annotations": ["a"]})) == Allow("no_transfer_params")
    assert decide(STRIP, doc(request_id=None, tokens=None)) == Allow("no_transfer_params")


def test_every_carrier_of_one_request_goes_at_once():
    document = doc(
        {"prompt_token_ids": [1]},
        prompt_token_ids=[4],
        nvext={"token_data": [5], "backend_instance_id": 1, "greed_sampling": True},
        tokens={"token_ids": [6]},
        request_id="r",
    )
    decision = decide(STRIP, document)
    assert isinstance(decision, Strip)
    # In the order of the generated carrier list (shorter paths first).
    assert decision.paths == (
        ("kv_transfer_params",),
        ("prompt_token_ids",),
        ("request_id",),
        ("tokens",),
        ("nvext", "backend_instance_id"),
        ("nvext", "token_data"),
    )


def test_carriers_given_by_the_caller_are_taken_as_they_are():
    document = doc(ec_transfer_params=EC)
    assert policy.decide(STRIP, document, EVIDENCE, ()) == Allow("no_transfer_params")
    assert policy.decide(STRIP, document, EVIDENCE, None).reason == "stripped_by_policy"


def test_a_request_with_too_many_carriers_is_refused_not_rewritten():
    many = [{"kv_transfer_params": {"remote_port": i + 1}} for i in range(MAX_CARRIERS + 1)]
    decision = decide(STRIP, doc(generate_responses=many))
    assert isinstance(decision, Deny)
    assert (decision.reason, decision.refusal.status) == ("carriers_too_many", 400)
    # At the limit they are removed; from a trusted caller they are kept, however many.
    at_limit = decide(STRIP, doc(generate_responses=many[:MAX_CARRIERS]))
    assert isinstance(at_limit, Strip)
    assert len(at_limit.carriers) == MAX_CARRIERS
    assert decide(HONOR, doc(generate_responses=many)) == Allow("no_transfer_params")


@pytest.mark.parametrize("action", [Action.STRIP, Action.DENY])
def test_strip_and_deny_routes_weigh_no_evidence(action):
    route = RoutePolicy(Topology.DISAGGREGATED, action)
    assert action not in policy.WEIGHS_EVIDENCE
    document = doc({"prompt_token_ids": [1, 2]})
    document["vllm_xargs"] = {"kv_transfer_params": {"x": 1}}
    peer = Peer(True, (ROUTER,))
    full = Evidence(lambda: b"d" * 32, peer, KEYS, NOW, 5.0)
    # The same decision with no evidence at all: none of it is read.
    assert policy.decide(route, document, policy.NO_EVIDENCE) == policy.decide(
        route, document, full
    )


NIXL_REQUEST = RoutePolicy(
    Topology.DISAGGREGATED,
    Action.MINT,
    peers=frozenset({ROUTER}),
    connector=(("do_remote_decode", True), ("remote_host", None)),
)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (None, Strip(None, "connector_written", 0, connector=NIXL_REQUEST.connector)),
        ({}, Strip(None, "connector_written", 0, connector=NIXL_REQUEST.connector)),
        (
            {"remote_host": "evil.example", "do_remote_decode": True},
            Strip(None, "peer_not_listed", 0, connector=NIXL_REQUEST.connector),
        ),
        (
            {"prompt_token_ids": [1, 2]},
            Strip(None, "peer_not_listed", 2, connector=NIXL_REQUEST.connector),
        ),
    ],
)
def test_a_mint_route_writes_its_connector_request_for_an_untrusted_caller(params, expected):
    document = doc() if params is None else doc(params)
    assert verified(NIXL_REQUEST, document) == expected


def test_a_listed_peers_own_parameters_are_kept_and_nothing_written():
    router = Peer(True, (ROUTER,))
    own = doc({"do_remote_decode": True, "remote_host": "10.0.0.7"})
    assert verified(NIXL_REQUEST, own, peer=router) == Allow("trusted_peer", 0)
    assert verified(NIXL_REQUEST, doc(), peer=router) == policy.NO_PARAMS


def test_other_carriers_go_and_the_connector_request_is_written():
    document = doc({"remote_port": 1})
    document["vllm_xargs"] = {"kv_transfer_params": {"remote_port": 2}}
    decision = verified(NIXL_REQUEST, document)
    assert decision == Strip(
        None,
        "peer_not_listed",
        0,
        carriers=(("vllm_xargs", "kv_transfer_params"),),
        connector=NIXL_REQUEST.connector,
    )
    assert decision.paths == (("kv_transfer_params",), ("vllm_xargs", "kv_transfer_params"))


def test_unproven_deny_on_a_connector_route_still_denies():
    route = RoutePolicy(
        Topology.DISAGGREGATED,
        Action.MINT,
        unproven=Unproven.DENY,
        connector=NIXL_REQUEST.connector,
    )
    assert isinstance(verified(route, doc({"remote_port": 1})), Deny)


# --- connector values within bounds (docs/trust.md#connector-values-within-bounds) ---

HUGE_TP = {"do_remote_prefill": True, "remote_port": 5600, "tp_size": 20_000_000}


def refused_key(decision):
    assert isinstance(decision, Deny), decision
    assert (decision.reason, decision.refusal.status) == ("connector_out_of_bounds", 400)
    return decision.refusal.param


def test_a_listed_peers_values_out_of_bounds_are_refused():
    router = Peer(True, (ROUTER,))
    refused = verified(PEERS, doc({"prompt_token_ids": [1, 2], **HUGE_TP}), peer=router)
    assert refused_key(refused) == "kv_transfer_params.tp_size"
    in_bounds = doc({"prompt_token_ids": [1, 2], **HUGE_TP, "tp_size": 8})
    assert verified(PEERS, in_bounds, peer=router) == Allow("trusted_peer", 2)
    # On a mint route too: a listed peer's prefill request reaches the prefill server.
    mint = RoutePolicy(Topology.DISAGGREGATED, Action.MINT, peers=frozenset({ROUTER}))
    refused = verified(mint, doc({"do_remote_decode": True, "remote_port": 0}), peer=router)
    assert refused_key(refused) == "kv_transfer_params.remote_port"


def test_values_out_of_bounds_are_refused_on_a_route_that_trusts_any_caller():
    assert refused_key(decide(HONOR, doc({"pp_size": 0}))) == "kv_transfer_params.pp_size"
    assert decide(HONOR, doc({"pp_size": 2, "tp_size": 4})) == Allow(HONORED, 0)


def test_proven_values_out_of_bounds_are_refused():
    # What an older gateway, or a key of another deployment's, may have signed.
    minted = {"prompt_token_ids": [1, 2, 3], "remote_dp_size": 2, "remote_dp_rank": 2}
    digest = proof.prompt_digest(doc(), True, "/v1/chat/completions")
    params = {
        **minted,
        proof.PROOF_KEY: proof.mint(KEYS, minted, digest, int(NOW) + 60, minted=int(NOW)),
    }
    assert refused_key(verified(PROVEN, doc(params))) == "kv_transfer_params.remote_dp_rank"


def test_block_ids_are_counted_against_the_prompts_ids_or_the_routes_max_ids():
    three = {"remote_block_ids": [[7, 8, 9]]}
    assert decide(HONOR, doc({"prompt_token_ids": [1, 2, 3], **three})) == Allow(HONORED, 3)
    refused = decide(HONOR, doc({"prompt_token_ids": [1, 2], **three}))
    assert refused_key(refused) == "kv_transfer_params.remote_block_ids"
    # Without ids, the route's max_ids (4 on HONOR), else the ceiling.
    assert decide(HONOR, doc(three)) == Allow(HONORED, 0)
    five = {"remote_block_ids": [[1, 2, 3, 4, 5]]}
    assert refused_key(decide(HONOR, doc(five))) == "kv_transfer_params.remote_block_ids"
    assert decide(HONOR_UNLIMITED, doc(five)) == Allow(HONORED, 0)
    num = {"prompt_token_ids": [1, 2], "remote_num_tokens": 3}
    assert refused_key(decide(HONOR, doc(num))) == "kv_transfer_params.remote_num_tokens"


def test_values_are_bounded_even_where_vllm_ignores_the_ids():
    # The ids go, the connector keys stay: they are still checked.
    refused = decide(HONOR, doc({"prompt_token_ids": [1, 2], **HUGE_TP}, echo=True))
    assert refused_key(refused) == "kv_transfer_params.tp_size"


def test_an_untrusted_callers_values_are_removed_not_checked():
    document = doc({"prompt_token_ids": [1, 2], **HUGE_TP})
    assert decide(STRIP, document) == Strip(None, "stripped_by_policy", 2)
    assert verified(PROVEN, document) == Strip(None, "proof_missing", 2)
    stranger = Peer(True, ((IdentityType.URI, "spiffe://td/client"),))
    assert verified(PEERS, document, peer=stranger) == Strip(None, "peer_not_listed", 2)


def test_audit_mode_reports_values_out_of_bounds():
    route = RoutePolicy(Topology.DISAGGREGATED, Action.HONOR, trust_any_caller=True, audit=True)
    decision = decide(route, doc(HUGE_TP))
    assert isinstance(decision, Deny)
    assert decision.refusal.auditable


@pytest.mark.parametrize(
    "connector",
    [
        {"remote_port": 5600, "tp_size": 20_000_000},
        {"remote_port": 70000, "tp_size": 1},
        {"remote_block_ids": [[1, 2, 3]]},  # more blocks than the response's two ids
        {"remote_num_tokens": 3},
        {"remote_block_ids": [[1], True]},
    ],
)
def test_mint_response_out_of_bounds_is_not_signed(connector):
    response = {"prompt_token_ids": [5, 6], "kv_transfer_params": connector}
    assert policy.mint_response(response, b"\0" * 32, KEYS, 1, minted=1) == (
        Allow("response_connector_out_of_bounds"),
        None,
    )


def test_mint_response_in_bounds_is_signed():
    nixl = {
        "do_remote_prefill": True,
        "remote_block_ids": [[1]],
        "remote_port": 27604,
        "tp_size": 1,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": 2,
    }
    response = {"prompt_token_ids": [5, 6], "kv_transfer_params": nixl}
    decision, params = policy.mint_response(response, b"\0" * 32, KEYS, 1, minted=1)
    assert decision == Mint("minted", 2)
    assert params is not None
    assert params["tp_size"] == 1
    # Without ids, the ceiling bounds the counts.
    decision, _ = policy.mint_response({"kv_transfer_params": nixl}, b"\0" * 32, KEYS, 1, minted=1)
    assert decision == Mint("minted", 0)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {"sampling_params": {"extra_args": {"kv_transfer_params": {"tp_size": 10**7}}}},
            "sampling_params.extra_args.kv_transfer_params.tp_size",
        ),
        (
            {"generate_responses": [{}, {"kv_transfer_params": {"remote_port": 0}}]},
            "generate_responses.1.kv_transfer_params.remote_port",
        ),
    ],
)
def test_a_trusted_callers_other_parameters_are_held_to_the_same_bounds(extra, param):
    document = doc(**extra)
    for route, evidence in [(HONOR, {}), (PEERS, {"peer": Peer(True, (ROUTER,))})]:
        decision = verified(route, document, **evidence) if evidence else decide(route, document)
        assert isinstance(decision, Deny), decision
        assert (decision.reason, decision.refusal.param) == ("connector_out_of_bounds", param)
    # In bounds, they are kept as before; from an untrusted caller they go, unchecked.
    assert isinstance(decide(STRIP, document), Strip)


def test_the_prompt_digest_is_rendered_only_for_a_proof_of_a_known_key():
    rendered = []
    digest = proof.prompt_digest(doc(), True, "/v1/chat/completions")
    assert digest is not None

    def evidence(keys=KEYS):
        return Evidence(lambda: rendered.append(1) or digest, policy.NO_PEER, keys, NOW, 5.0)

    params = proven_params(doc())
    malformed = {**params, proof.PROOF_KEY: "tp3.x"}
    for document, keys, reason in [
        (doc(malformed), KEYS, "proof_malformed"),
        (doc(params), proof.KeySet({}, None), "proof_unknown_key"),
        (doc({k: v for k, v in params.items() if k != proof.PROOF_KEY}), KEYS, "proof_missing"),
    ]:
        assert decide(PROVEN, document, evidence(keys)).reason == reason
    assert rendered == []
    assert decide(PROVEN, doc(params), evidence()) == Honor("trusted_proof", 3)
    assert rendered == [1]


# --- prompt embeddings (docs/trust.md#carriers) ------------------------------------------

EMBEDS_PART = {"type": "prompt_embeds", "data": "AAAA"}
EMBEDDED = [
    (doc(prompt_embeds="AAAA"), "prompt_embeds"),
    (doc(input_embeds=[[0.5]]), "input_embeds"),
    (
        doc(messages=[{"role": "user", "content": [{"type": "text", "text": "x"}, EMBEDS_PART]}]),
        "messages.0.content.1",
    ),
    (doc(input=[{"role": "user", "content": [{"type": "image_embeds"}]}]), "input.0.content.0"),
]


@pytest.mark.parametrize(("document", "param"), EMBEDDED)
@pytest.mark.parametrize("route", [STRIP, DENY, RoutePolicy(Topology.DISAGGREGATED, Action.HONOR)])
def test_prompt_embeddings_are_refused_from_an_untrusted_caller(route, document, param):
    decision = decide(route, document)
    assert isinstance(decision, Deny)
    assert decision.refusal.reason == "embeddings_refused"
    assert decision.refusal.param == param
    assert decision.refusal.status == 400


@pytest.mark.parametrize(("document", "param"), EMBEDDED)
def test_prompt_embeddings_pass_where_the_route_accepts_them_or_the_caller_is_trusted(
    document, param
):
    accepting = RoutePolicy(
        Topology.AGGREGATED, Action.STRIP, accept=frozenset({Accept.EMBEDDINGS})
    )
    assert decide(accepting, document) == Allow("no_transfer_params")
    assert decide(HONOR, document) == Allow("no_transfer_params")


def test_null_embeddings_and_text_parts_are_no_embeddings():
    assert decide(STRIP, doc(prompt_embeds=None)) == Allow("no_transfer_params")
    text = doc(messages=[{"role": "user", "content": [{"type": "text", "text": "prompt_embeds"}]}])
    assert decide(STRIP, text) == Allow("no_transfer_params")


def test_embeddings_are_not_looked_for_when_the_caller_showed_there_are_no_carriers():
    # ``carriers=()``: the bytes name no carrier and no embedding (inspection's byte scan).
    assert policy.decide(STRIP, doc(prompt_embeds="A"), EVIDENCE, ()) == Allow("no_transfer_params")


@pytest.mark.parametrize(
    "extra",
    [
        {"input_ids": [1, 2]},
        {"bootstrap_host": "10.0.0.9", "bootstrap_port": 8998, "bootstrap_room": 7},
        {"rid": "r"},
        {"nvext": {"prefill_worker_id": 1, "decode_worker_id": 2, "dp_rank": 0}},
        {"nvext": {"prefill_dp_rank": 1}},
    ],
)
def test_sglang_and_dynamo_carriers_are_removed_from_an_untrusted_caller(extra):
    decision = decide(STRIP, doc(**extra))
    assert isinstance(decision, Strip)
    assert decision.carriers
    assert isinstance(decide(DENY, doc(**extra)), Deny)
    assert decide(HONOR, doc(**extra)) == Allow("no_transfer_params")


# --- strict bodies -----------------------------------------------------------------------

STRICT_BODY = declared.Body(
    "Chat",
    {
        "Chat": {"model": (), "messages": ("list:Message",), "kv_transfer_params": ("*",)},
        "Message": {"role": (), "content": ()},
    },
)


def strict(route, document, **kwargs):
    return policy.decide(route, document, EVIDENCE, body=STRICT_BODY, **kwargs)


def test_a_strict_route_removes_what_the_engine_does_not_declare():
    document = doc(
        {"prompt_token_ids": [1]}, next_release_carrier=1, messages=[{"role": "u", "x": 1}]
    )
    decision = strict(STRIP, document)
    assert isinstance(decision, Strip)
    assert decision.paths == (
        ("kv_transfer_params",),
        ("messages", 0, "x"),
        ("next_release_carrier",),
    )
    assert strict(STRIP, doc(next_release_carrier=1)) == Strip(
        keys=(), reason="stripped_by_policy", id_count=0, carriers=(("next_release_carrier",),)
    )
    assert strict(STRIP, doc()) == Allow("no_transfer_params")


def test_a_strict_route_that_denies_names_the_undeclared_member():
    denied = strict(DENY, doc(next_release_carrier=1))
    assert isinstance(denied, Deny)
    assert denied.refusal.reason == "undeclared_member"
    assert denied.refusal.param == "next_release_carrier"
    many = strict(STRIP, doc(**{f"k{i}": i for i in range(MAX_CARRIERS + 1)}))
    assert isinstance(many, Deny)
    assert many.refusal.reason == "undeclared_member"


def test_a_strict_route_keeps_a_trusted_callers_members_and_a_carrier_once():
    assert strict(HONOR, doc(next_release_carrier=1)) == Allow("no_transfer_params")
    # A carrier the engine does not declare either is removed once, whole.
    decision = strict(STRIP, doc(nvext={"token_data": [1], "other": 2}))
    assert decision.paths == (("nvext",),)


def test_a_strict_route_removes_a_carrier_at_any_depth_below_an_untyped_member():
    body = declared.Body(
        "Chat", {"Chat": {"model": (), "messages": (), "vllm_xargs": ("*",), "k": ("*",)}}
    )
    nested = {"kv_cache_report_mode": "full", "a": [{"rid": "r"}], "temperature_hint": 1}
    document = doc(vllm_xargs=nested, k={"rid": "a word in the caller's content"})
    decision = policy.decide(STRIP, document, EVIDENCE, body=body)
    assert isinstance(decision, Strip)
    # Removed where they sit: the rest of the untyped member is forwarded.
    assert decision.paths == (("vllm_xargs", "kv_cache_report_mode"), ("vllm_xargs", "a", 0, "rid"))
    denied = policy.decide(DENY, document, EVIDENCE, body=body)
    assert isinstance(denied, Deny)
    assert denied.refusal.param == "vllm_xargs.kv_cache_report_mode"


def test_an_engine_without_kv_transfer_params_loses_the_whole_object():
    body = declared.Body("Chat", {"Chat": {"model": (), "messages": ()}})
    route = RoutePolicy(Topology.AGGREGATED, Action.STRIP, keep_other_keys=True)
    decision = policy.decide(route, doc({"prompt_token_ids": [1], "k": 2}), EVIDENCE, body=body)
    assert decision.paths == (("kv_transfer_params",),)


@pytest.mark.parametrize(
    ("document", "param"),
    [
        # vLLM reads a part with a uuid (or without a type) by the member it holds.
        (
            doc(
                messages=[
                    {"role": "u", "content": [{"type": "text", "uuid": "u", "image_embeds": "A"}]}
                ]
            ),
            "messages.0.content.0.image_embeds",
        ),
        (
            doc(messages=[{"role": "u", "content": [{"prompt_embeds": 0, "data": "A"}]}]),
            "messages.0.content.0.prompt_embeds",
        ),
        # /v1/chat/completions/batch: a list of conversations.
        (
            doc(messages=[[{"role": "u", "content": [{"type": "prompt_embeds", "data": "A"}]}]]),
            "messages.0.0.content.0",
        ),
        # Anthropic's system blocks, and any depth.
        (doc(system=[{"type": "video_embeds"}]), "system.0"),
        (doc(a={"b": [{"c": {"input_embeds": [[1.0]]}}]}), "a.b.0.c.input_embeds"),
    ],
)
def test_embeddings_are_found_in_every_shape_and_depth(document, param):
    decision = decide(STRIP, document)
    assert isinstance(decision, Deny)
    assert decision.refusal.param == param


def test_the_search_for_embeddings_survives_any_nesting():
    deep: list = []
    document = doc(x=deep)
    for _ in range(MAX_SEARCHED // 2):
        deep.append([])
        deep = deep[0]
    deep.append({"type": "prompt_embeds"})
    assert decide(STRIP, document).refusal.reason == "embeddings_refused"
    # Deeper than the search goes: refused all the same.
    for _ in range(MAX_SEARCHED):
        deep.append([])
        deep = deep[-1]
    assert decide(STRIP, document).refusal.reason == "body_too_complex"


def test_a_body_built_to_cost_its_search_is_refused_not_searched():
    many = doc(messages=[{"content": [{"uuid": None}]}] * (MAX_SEARCHED // 2))
    refused = decide(STRIP, many)
    assert isinstance(refused, Deny)
    assert refused.refusal.reason == "body_too_complex"
    assert refused.refusal.status == 413
    # A long chat of an ordinary size is searched.
    fine = doc(messages=[{"role": "user", "content": [{"type": "text", "text": "x"}]}] * 2000)
    assert decide(STRIP, fine) == Allow("no_transfer_params")


@pytest.mark.parametrize("kind", [[1], {"a": 1}, 3])
def test_a_type_that_is_not_a_string_is_no_type(kind):
    parts = [{"type": kind, "text": "x"}]
    document = doc(messages=[{"role": "user", "content": parts}], input=[{"content": parts}])
    assert decide(STRIP, {**document, "rid": "r"}).reason == "stripped_by_policy"
    honored = decide(HONOR, doc({"prompt_token_ids": [1]}, messages=[{"content": parts}]))
    assert honored.reason == "ignored_by_upstream"


def test_a_part_that_names_embeddings_holds_them_even_when_null():
    # vLLM's part parser looks for the key (a part without a type, or with a uuid).
    part = {"prompt_embeds": None, "data": "AAAA"}
    refused = decide(STRIP, doc(messages=[{"role": "x", "content": [part]}]))
    assert refused.refusal.param == "messages.0.content.0.prompt_embeds"
    # A request's own member that is null is absent.
    assert decide(STRIP, doc(prompt_embeds=None)) == Allow("no_transfer_params")
    # SGLang's image_data items that are embeddings or a processor's output.
    item = {"format": "precomputed_embedding", "precomputed_embeddings": "AAAA"}
    assert decide(STRIP, doc(image_data=[item])).refusal.param == "image_data.0"


def test_carriers_below_lists_of_lists_and_object_values_are_found():
    batch = doc(messages=[[{"role": "user", "content": [{"type": "image_url", "uuid": "v"}]}]])
    assert decide(STRIP, batch).paths == (("messages", 0, 0, "content", 0, "uuid"),)
    output = doc(input=[{"type": "function_call_output", "output": [{"uuid": "v"}]}])
    assert decide(STRIP, output).paths == (("input", 0, "output", 0, "uuid"),)
