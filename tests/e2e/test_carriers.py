"""Every carrier of transfer parameters through the real Envoy (docs/trust.md#carriers):
besides the top-level kv_transfer_params, vLLM reads ``ec_transfer_params`` and the
transfer parameters inside ``vllm_xargs`` (its ``SamplingParams.extra_args``), and its
token-in shapes nest them (``sampling_params.extra_args``, ``generate_response(s)``);
the stacks that deploy vLLM read prompts and peers from members of their own.
From an untrusted caller each is removed before the upstream reads it (or denied where
the route denies), on every route; what arrived is checked as the bytes the stand-in
recorded. Proof tokens must be the canonical spelling of their bytes."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.e2e.test_gateway import chat, only_request
from tests.e2e.test_handoff import (
    DECODE,
    PREFILL,
    PREFILL_REQUEST_PARAMS,
    minted,
    post,
    request_id,
    sent_upstream,
)
from tests.e2e.test_operations import access_log

EC = {"consumer_zmq": "tcp://10.0.0.9:5555", "do_remote_encode": True}
CARRIERS = {
    "ec_transfer_params": {"ec_transfer_params": EC},
    "vllm_xargs.kv_transfer_params": {
        "vllm_xargs": {"kv_transfer_params": "remote_host=10.0.0.9", "seed_hint": 3}
    },
    "vllm_xargs.ec_transfer_params": {"vllm_xargs": {"ec_transfer_params": ["x"]}},
    "sampling_params.extra_args.kv_transfer_params": {
        "sampling_params": {"extra_args": {"kv_transfer_params": {"remote_port": 1}}}
    },
    "generate_response.kv_transfer_params": {
        "generate_response": {"kv_transfer_params": {"prompt_token_ids": [1, 2]}}
    },
    "generate_responses.1.kv_transfer_params": {
        "generate_responses": [{}, {"kv_transfer_params": {"remote_host": "h"}}]
    },
    # The stacks around vLLM: vLLM's coming top-level ids (vllm #55771), NVIDIA Dynamo's
    # prompt ids and worker, llm-d's coordinator's tokens, the request id vLLM's MoRIIO
    # connector parses for its peer.
    "prompt_token_ids": {"prompt_token_ids": [7, 8, 9]},
    "prompt_features": {"prompt_features": {"pixel": [1]}},
    "nvext.token_data": {"nvext": {"token_data": [7, 8, 9], "ignore_eos": True}},
    "nvext.backend_instance_id": {"nvext": {"backend_instance_id": 4}},
    "tokens": {"tokens": {"token_ids": [7, 8, 9], "features": None}},
    "request_id": {"request_id": "r___prefill_addr_10.0.0.9:1___decode_addr_10.0.0.8:2"},
}
# (path, what the untrusted carriers get there): strip on /v1/, honor routes (a proof
# covers only the top-level object; a caller is untrusted there), deny on /deny/v1/.
ROUTES = {
    "/v1/chat/completions": "stripped_by_policy",
    "/pd/v1/chat/completions": "unproven",
    "/pd/prefill/v1/chat/completions": "unproven",
}


def without(sent: dict[str, Any], dotted: str) -> dict[str, Any]:
    expected = json.loads(json.dumps(sent))
    *way, last = dotted.split(".")
    holder: Any = expected
    for step in way:
        holder = holder[int(step)] if isinstance(holder, list) else holder[step]
    del holder[last]
    return expected


@pytest.fixture
def client():
    with httpx.Client(timeout=20) as c:
        yield c


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize("path", ROUTES)
def test_an_untrusted_carrier_never_reaches_the_upstream(gateway, client, carrier, path):
    sent = chat(**CARRIERS[carrier])
    rid = request_id()
    reply = client.post(gateway.url + path, json=sent, headers={"x-request-id": rid})
    assert reply.status_code == 200, reply.text
    received = only_request(gateway)
    expected = without(sent, carrier)
    if path == PREFILL:  # and the route's connector request written
        expected["kv_transfer_params"] = PREFILL_REQUEST_PARAMS
    assert json.loads(received.body) == expected
    line = access_log(gateway, rid)
    assert (line["policy_action"], line["policy_reason"]) == ("strip", ROUTES[path])


@pytest.mark.parametrize("carrier", CARRIERS)
def test_a_deny_route_refuses_every_carrier(gateway, client, carrier):
    reply = client.post(gateway.url + "/deny/v1/chat/completions", json=chat(**CARRIERS[carrier]))
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == carrier
    assert gateway.received() == []


@pytest.mark.parametrize("carrier", CARRIERS)
def test_a_route_trusting_any_caller_keeps_every_carrier(gateway, client, carrier):
    sent = chat(**CARRIERS[carrier])
    reply = client.post(gateway.url + "/trusted/v1/chat/completions", json=sent)
    assert reply.status_code == 200, reply.text
    assert json.loads(only_request(gateway).body) == sent


def test_a_proven_request_keeps_its_parameters_and_loses_a_clients_carrier(gateway, client):
    # Transfer parameters are each leg's own: ec_transfer_params is not bound.
    params = minted(client, gateway)
    sent = chat(params, **CARRIERS["ec_transfer_params"])
    rid = request_id()
    post(client, gateway, DECODE, sent, rid)
    _received, document = sent_upstream(gateway)
    assert "ec_transfer_params" not in document
    assert document["kv_transfer_params"] == params  # as sent, its proof included
    assert access_log(gateway, rid)["policy_reason"] == "trusted_proof"


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def test_a_non_canonical_proof_is_malformed(gateway, client):
    params = minted(client, gateway)
    proof = params["token_policy_proof"]
    last = _B64.index(proof[-1])
    # The low 2 bits of the last character are spare: flipping one spells the same MAC.
    respelled = proof[:-1] + _B64[last ^ 1]
    sent = chat({**params, "token_policy_proof": respelled})
    rid = request_id()
    post(client, gateway, DECODE, sent, rid)
    _received, document = sent_upstream(gateway)
    assert "kv_transfer_params" not in document
    assert access_log(gateway, rid)["policy_reason"] == "proof_malformed"
