import json

import pytest

from ext_proc.core import mint, proof
from ext_proc.core.budget import Account, Budget
from ext_proc.core.decisions import Allow, Mint, Strip
from ext_proc.core.events import ResponseHeaders

DIGEST = b"d" * 32
NO_KEYS = proof.NO_KEYS
KEYS = proof.KeySet({"k1": b"k" * 32}, "k1")
OK = ((":status", b"200"), ("content-type", b"application/json"))


def signing(limit=1 << 20, budget=1 << 30, keys=KEYS):
    return mint.Signing(Account(Budget(budget)), limit, 100_000, keys, 2_000_000_000)


def test_only_chat_completions_responses_are_signed():
    rendered = []

    def digest():
        rendered.append(1)
        return DIGEST

    assert mint.expect("/v1/chat/completions", digest) == mint.Pending(DIGEST)
    assert mint.expect("/v1/completions", digest) == mint.Pending(None, "endpoint_not_mintable")
    assert len(rendered) == 1  # rendered only where it is kept


@pytest.mark.parametrize(
    ("alone", "decision", "kept"),
    [
        (True, Strip(None, "unproven", 0), True),
        (False, Strip(None, "unproven", 0), False),
        (False, Allow("trusted_peer", 0), True),
    ],
)
def test_a_request_naming_a_carrier_elsewhere_is_signed_only_for_a_trusted_caller(
    alone, decision, kept
):
    judged = mint.judged(mint.Pending(DIGEST), decision, alone)
    assert judged == (mint.Pending(DIGEST) if kept else mint.Pending(None, "request_may_echo"))


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        (OK, None),
        (((":status", b"201"), OK[1]), "response_not_ok"),
        ((OK[0], ("content-type", b"text/plain")), "response_not_json"),
        ((OK[0],), "response_not_json"),
        ((*OK, OK[1]), "response_not_json"),
        ((*OK, ("content-encoding", b"gzip")), "response_encoded"),
        ((*OK, ("content-encoding", b"identity")), None),
    ],
)
def test_only_a_plain_json_200_is_signed(headers, reason):
    checked = mint.checked(mint.Pending(DIGEST), ResponseHeaders(headers, False))
    assert checked == (mint.Pending(DIGEST) if reason is None else mint.Pending(None, reason))
    # A reason found with the request stands.
    assert mint.checked(mint.NOTHING, ResponseHeaders(headers, False)) == mint.NOTHING


def test_a_response_is_signed_and_written_back():
    raw = json.dumps({"id": "x", "prompt_token_ids": [1, 2], "kv_transfer_params": {"p": 7}})
    decision, signed = mint.sign(mint.Pending(DIGEST), raw.encode(), signing())
    assert decision == Mint("minted", 2)
    params = json.loads(signed)["kv_transfer_params"]
    assert params["prompt_token_ids"] == [1, 2]
    assert params["p"] == 7
    assert params[proof.PROOF_KEY].startswith("tp2.k1.")


@pytest.mark.parametrize(
    ("pending", "raw", "options", "reason"),
    [
        (mint.Pending(None, "response_not_ok"), b"{}", {}, "response_not_ok"),
        (mint.Pending(DIGEST), b"x" * 200, {"limit": 100}, "response_not_affordable"),
        (mint.Pending(DIGEST), b'{"a": 1}', {"budget": 10}, "response_not_affordable"),
        (mint.Pending(DIGEST), b"[1]", {}, "response_not_json"),
        (mint.Pending(DIGEST), b'{"a": 1}', {}, "nothing_to_mint"),
        (
            mint.Pending(DIGEST),
            b'{"prompt_token_ids": [1]}',
            {"keys": proof.NO_KEYS},
            "no_signing_key",
        ),
    ],
)
def test_a_response_that_is_not_signed_passes_unchanged(pending, raw, options, reason):
    assert mint.sign(pending, raw, signing(**options)) == (Allow(reason), None)


def test_a_response_with_connector_values_out_of_bounds_passes_unsigned():
    # vllm#51137: a tp_size the decode side would allocate by is never signed.
    connector = {"remote_port": 5600, "tp_size": 20_000_000, "remote_block_ids": [[1]]}
    raw = json.dumps({"id": "x", "prompt_token_ids": [1, 2], "kv_transfer_params": connector})
    assert mint.sign(mint.Pending(DIGEST), raw.encode(), signing()) == (
        Allow("response_connector_out_of_bounds"),
        None,
    )
    # In bounds, the same response is signed.
    raw = raw.replace("20000000", "2")
    decision, signed = mint.sign(mint.Pending(DIGEST), raw.encode(), signing())
    assert decision == Mint("minted", 2)
    assert json.loads(signed)["kv_transfer_params"]["tp_size"] == 2
