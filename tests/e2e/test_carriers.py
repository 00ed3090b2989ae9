"""Every body carrier through the real Envoy (docs/trust.md#carriers): each member of
the classification's list (``classified.BODY_CARRIERS``) that a server or a stack behind
the gateway reads transfer parameters, a prompt's tokens, a peer, a rank or a request
id from: vLLM's ``ec_transfer_params`` and the transfer parameters in ``vllm_xargs``
(its ``SamplingParams.extra_args``) and in its token-in shapes, vLLM's coming top-level
ids, SGLang's ``input_ids`` and disaggregation bootstrap, NVIDIA Dynamo's ``nvext``
routing hints, llm-d's ``tokens``.
From an untrusted caller each is removed before the upstream reads it (or denied where
the route denies), on every route; a route trusting any caller keeps it. Each carrier
has a case made from its path, and some also one by hand where a real value's shape
matters; each is sent on its own in the default arrangement, and all of them in one
request in every arrangement. What arrived is checked as the bytes the stand-in
recorded. Proof tokens must be the canonical spelling of their bytes."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import httpx
import pytest

from ext_proc.core import classified
from ext_proc.core.vllm_request import EVERY, MAX_CARRIERS
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


class Case(NamedTuple):
    """Members added to a chat request, and the carriers among them by dotted path (list
    items by index), as a deny route names them."""

    members: dict[str, Any]
    carriers: tuple[str, ...]


def dotted(path: tuple[str, ...]) -> str:
    """A carrier's path as the gateway names it, for the document ``nested`` makes."""
    return ".".join("1" if step == EVERY else step for step in path)


def nested(path: tuple[str, ...], value: Any) -> Any:
    """``value`` at ``path``: a member per step; for ``EVERY``, a list whose second item
    holds the rest (the first holds nothing: the carrier's index is told)."""
    if not path:
        return value
    inner = nested(path[1:], value)
    return [{}, inner] if path[0] == EVERY else {path[0]: inner}


def merged(*documents: dict[str, Any]) -> dict[str, Any]:
    """The members of every one of ``documents``; objects met twice merged, lists item
    by item."""
    out: dict[str, Any] = {}
    for document in documents:
        _merge(out, document)
    return out


def _merge(into: Any, new: Any) -> None:
    if not isinstance(new, (dict, list)):
        assert into == new, (into, new)  # a member two documents hold alike
        return
    if type(into) is not type(new):
        raise TypeError(f"an object and a list at one path: {into!r}, {new!r}")
    pairs = enumerate(new) if isinstance(new, list) else new.items()
    for key, value in pairs:
        if isinstance(into, list) and key >= len(into):
            into.append(json.loads(json.dumps(value)))
        elif isinstance(into, dict) and key not in into:
            into[key] = json.loads(json.dumps(value))
        else:
            _merge(into[key], value)


def generated(path: tuple[str, ...]) -> Case:
    """The carrier at ``path``, and what the gateway removes for it: the outermost
    carrier that holds it (``features`` for ``features.mm_hashes``)."""
    outer = next(path[:end] for end in range(1, len(path) + 1) if path[:end] in _ALL)
    return Case(nested(path, f"forged {dotted(path)}"), (dotted(outer),))


_ALL = frozenset(classified.BODY_CARRIERS)


EC = {"consumer_zmq": "tcp://10.0.0.9:5555", "do_remote_encode": True}
# Values as their readers take them, where a value's shape could matter to the gateway:
# a string or a list where an object is usual, a member beside the carrier that stays,
# a falsy rank, a 63-bit bootstrap room, batched ids.
BY_HAND = {
    "ec_transfer_params": Case({"ec_transfer_params": EC}, ("ec_transfer_params",)),
    "vllm_xargs-string": Case(
        {"vllm_xargs": {"kv_transfer_params": "remote_host=10.0.0.9", "seed_hint": 3}},
        ("vllm_xargs.kv_transfer_params",),
    ),
    "vllm_xargs-list": Case(
        {"vllm_xargs": {"ec_transfer_params": ["x"]}}, ("vllm_xargs.ec_transfer_params",)
    ),
    "sampling_params": Case(
        {"sampling_params": {"extra_args": {"kv_transfer_params": {"remote_port": 1}}}},
        ("sampling_params.extra_args.kv_transfer_params",),
    ),
    "generate_response": Case(
        {"generate_response": {"kv_transfer_params": {"prompt_token_ids": [1, 2]}}},
        ("generate_response.kv_transfer_params",),
    ),
    "generate_responses": Case(
        {"generate_responses": [{}, {"kv_transfer_params": {"remote_host": "h"}}]},
        ("generate_responses.1.kv_transfer_params",),
    ),
    # vLLM's coming top-level ids (vllm #55771).
    "prompt_token_ids": Case({"prompt_token_ids": [7, 8, 9]}, ("prompt_token_ids",)),
    "prompt_features": Case({"prompt_features": {"pixel": [1]}}, ("prompt_features",)),
    # NVIDIA Dynamo's prompt ids and worker, every routing hint at once, a flag beside.
    "nvext-token_data": Case(
        {"nvext": {"token_data": [7, 8, 9], "ignore_eos": True}}, ("nvext.token_data",)
    ),
    "nvext-routing": Case(
        {
            "nvext": {
                "backend_instance_id": 4,
                "prefill_worker_id": 1,
                "decode_worker_id": 2,
                "dp_rank": 0,
                "prefill_dp_rank": 1,
                "ignore_eos": True,
            }
        },
        (
            "nvext.backend_instance_id",
            "nvext.decode_worker_id",
            "nvext.dp_rank",
            "nvext.prefill_dp_rank",
            "nvext.prefill_worker_id",
        ),
    ),
    # llm-d's coordinator's tokens.
    "tokens": Case({"tokens": {"token_ids": [7, 8, 9], "features": None}}, ("tokens",)),
    # The request id vLLM's MoRIIO connector parses for its peer.
    "request_id": Case(
        {"request_id": "r___prefill_addr_10.0.0.9:1___decode_addr_10.0.0.8:2"}, ("request_id",)
    ),
    # SGLang: batched ids, its prefill server's bootstrap (a 63-bit room), a request id,
    # data-parallel ranks (0 carries a rank as well as any).
    "input_ids": Case({"input_ids": [[7, 8, 9], [10]]}, ("input_ids",)),
    "bootstrap": Case(
        {"bootstrap_host": "10.0.0.9", "bootstrap_port": 8998, "bootstrap_room": 2**63 - 1},
        ("bootstrap_host", "bootstrap_port", "bootstrap_room"),
    ),
    "rid": Case({"rid": ["a", "b"]}, ("rid",)),
    # vLLM reads it from extra_args (vllm_xargs): "full" publishes prefix-cache hits as
    # KV events for KV-aware routers.
    "kv_cache_report_mode": Case(
        {"vllm_xargs": {"kv_cache_report_mode": "full", "seed_hint": 3}},
        ("vllm_xargs.kv_cache_report_mode",),
    ),
    # NVIDIA Dynamo's SGLang worker reads its upload target at each of these scopes.
    "metadata_upload": Case(
        {
            "metadata_upload": {"fs_url": "s3://elsewhere/a"},
            "nvext": {"metadata_upload": {"url": "s3://elsewhere/b"}},
            "extra_args": {
                "metadata_upload": {"s3_url": "s3://elsewhere/c"},
                "nvext": {"metadata_upload": {"url": "s3://elsewhere/d"}},
                "seed_hint": 3,
            },
        },
        (
            "metadata_upload",
            "extra_args.metadata_upload",
            "extra_args.nvext.metadata_upload",
            "nvext.metadata_upload",
        ),
    ),
    # Any carrier's name at any depth below a member a server reads parameters from,
    # removed where it sits.
    "below-untyped": Case(
        {
            "vllm_xargs": {"deep": [{"rid": "r"}, {"kept": 1}]},
            "custom_params": {"x": {"bootstrap_host": "10.0.0.9", "kept": 2}},
        },
        ("vllm_xargs.deep.0.rid", "custom_params.x.bootstrap_host"),
    ),
    "ranks": Case(
        {"routed_dp_rank": 0, "data_parallel_rank": 0}, ("data_parallel_rank", "routed_dp_rank")
    ),
}
CARRIERS = {
    **{dotted(path): generated(path) for path in classified.BODY_CARRIERS},
    **{f"hand:{name}": case for name, case in BY_HAND.items()},
}


# Every carrier in one request: with the values made from the paths, and with those of
# the cases by hand.
def _together(paths: tuple[tuple[str, ...], ...]) -> tuple[tuple[str, ...], ...]:
    """The carriers one document can hold at once, shorter paths first: a path inside
    another carrier goes with it, and one whose steps need a list where another needs an
    object (``audio_data.content_hash`` beside ``audio_data.*.content_hash``) is left to
    its own case."""
    kept: list[tuple[str, ...]] = []
    document: dict[str, Any] = {}
    for path in sorted(paths, key=lambda p: (len(p), p)):
        if any(path[: len(other)] == other for other in kept):
            continue
        trial = json.loads(json.dumps(document))
        try:
            _merge(trial, generated(path).members)
        except (AssertionError, TypeError, KeyError):
            continue
        document = trial
        kept.append(path)
    return tuple(kept)


TOGETHER = _together(classified.BODY_CARRIERS)
# A request with more carriers than MAX_CARRIERS is refused whole (carriers_too_many):
# the generated ones go in as few requests as fit under it.
CHUNKS = [TOGETHER[at : at + MAX_CARRIERS] for at in range(0, len(TOGETHER), MAX_CARRIERS)]
AT_ONCE = {
    **{
        f"generated-{number}": Case(
            merged(*(generated(path).members for path in chunk)),
            tuple(dotted(path) for path in chunk),
        )
        for number, chunk in enumerate(CHUNKS, 1)
    },
    "by-hand": Case(
        merged(*(case.members for case in BY_HAND.values())),
        tuple(dict.fromkeys(c for case in BY_HAND.values() for c in case.carriers)),
    ),
}
# (path, what the untrusted carriers get there): strip on /v1/, honor routes (a proof
# covers only the top-level object; a caller is untrusted there), deny on /deny/v1/.
ROUTES = {
    "/v1/chat/completions": "stripped_by_policy",
    "/pd/v1/chat/completions": "unproven",
    "/pd/prefill/v1/chat/completions": "unproven",
}
DENY = "/deny/v1/chat/completions"
TRUSTED = "/trusted/v1/chat/completions"
# Each carrier on its own in the default arrangement (one message per request); the
# request with all of them runs in every arrangement.
DEFAULT_ARRANGEMENT = pytest.mark.parametrize("stack", ["one-message"], indirect=True)


def without(sent: dict[str, Any], *carriers: str) -> dict[str, Any]:
    expected = json.loads(json.dumps(sent))
    for carrier in carriers:
        *way, last = carrier.split(".")
        holder: Any = expected
        for step in way:
            holder = holder[int(step)] if isinstance(holder, list) else holder[step]
        del holder[last]
    return expected


@pytest.fixture
def client():
    with httpx.Client(timeout=20) as c:
        yield c


def test_every_classified_carrier_has_a_case():
    assert {dotted(path) for path in classified.BODY_CARRIERS} <= set(CARRIERS)
    every = {dotted(path) for path in classified.BODY_CARRIERS}
    sent = {c for name, case in AT_ONCE.items() if name != "by-hand" for c in case.carriers}
    assert sent <= every
    # Every top-level carrier is among the ones sent at once.
    assert {dotted(p) for p in classified.BODY_CARRIERS if len(p) == 1} <= set(sent)
    # By hand, the rest lie below a member typed as any JSON, at any depth.
    below = {dotted(path) + "." for path in classified.UNTYPED_MEMBERS}
    deep = {c for c in AT_ONCE["by-hand"].carriers if c.startswith(tuple(below))}
    assert deep
    assert set(AT_ONCE["by-hand"].carriers) - deep <= every


def assert_removed(gateway, client, path: str, case: Case) -> None:
    """``case``'s carriers sent to the untrusted ``path``: everything else arrives."""
    sent = chat(**case.members)
    rid = request_id()
    reply = client.post(gateway.url + path, json=sent, headers={"x-request-id": rid})
    assert reply.status_code == 200, reply.text
    received = only_request(gateway)
    expected = without(sent, *case.carriers)
    if path == PREFILL:  # and the route's connector request written
        expected["kv_transfer_params"] = PREFILL_REQUEST_PARAMS
    assert json.loads(received.body) == expected
    line = access_log(gateway, rid)
    assert (line["policy_action"], line["policy_reason"]) == ("strip", ROUTES[path])


def assert_denied(gateway, client, case: Case) -> None:
    reply = client.post(gateway.url + DENY, json=chat(**case.members))
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] in case.carriers
    assert gateway.received() == []


def assert_kept(gateway, client, case: Case) -> None:
    sent = json.dumps(chat(**case.members)).encode()
    headers = {"content-type": "application/json"}
    reply = client.post(gateway.url + TRUSTED, content=sent, headers=headers)
    assert reply.status_code == 200, reply.text
    assert only_request(gateway).body == sent


@DEFAULT_ARRANGEMENT
@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize("path", ROUTES)
def test_an_untrusted_carrier_never_reaches_the_upstream(gateway, client, carrier, path):
    assert_removed(gateway, client, path, CARRIERS[carrier])


@DEFAULT_ARRANGEMENT
@pytest.mark.parametrize("carrier", CARRIERS)
def test_a_deny_route_refuses_every_carrier(gateway, client, carrier):
    assert_denied(gateway, client, CARRIERS[carrier])


@DEFAULT_ARRANGEMENT
@pytest.mark.parametrize("carrier", CARRIERS)
def test_a_route_trusting_any_caller_keeps_every_carrier(gateway, client, carrier):
    assert_kept(gateway, client, CARRIERS[carrier])


@pytest.mark.parametrize("values", AT_ONCE)
@pytest.mark.parametrize("path", ROUTES)
def test_every_carrier_at_once_is_removed_in_every_arrangement(gateway, client, path, values):
    assert_removed(gateway, client, path, AT_ONCE[values])


@pytest.mark.parametrize("values", AT_ONCE)
def test_every_carrier_at_once_is_refused_in_every_arrangement(gateway, client, values):
    assert_denied(gateway, client, AT_ONCE[values])


@pytest.mark.parametrize("values", AT_ONCE)
def test_every_carrier_at_once_is_kept_for_a_trusted_caller_in_every_arrangement(
    gateway, client, values
):
    assert_kept(gateway, client, AT_ONCE[values])


@DEFAULT_ARRANGEMENT
@pytest.mark.parametrize("path", [*ROUTES, DENY])
def test_a_tokens_list_is_vllms_detokenize_input_and_stays(gateway, client, path):
    sent = json.dumps(chat(tokens=[7, 8, 9])).encode()
    headers = {"content-type": "application/json"}
    reply = client.post(gateway.url + path, content=sent, headers=headers)
    assert reply.status_code == 200, reply.text
    document = json.loads(only_request(gateway).body)
    assert document["tokens"] == [7, 8, 9]


def test_a_proven_request_keeps_its_parameters_and_loses_a_clients_carrier(gateway, client):
    # Transfer parameters are each leg's own: ec_transfer_params is not bound.
    params = minted(client, gateway)
    sent = chat(params, **BY_HAND["ec_transfer_params"].members)
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


# --- requests an endpoint builds from another shape ----------------------------------------

# SGLang's /vertex_generate builds a generate request from every instance's input_ids
# (its prompt: token ids) and from any member of `parameters`.
VERTEX_PROBES = {
    "input_ids": Case(
        {"instances": [{"input_ids": [7, 8, 9]}, {"input_ids": [10]}]},
        ("instances.0.input_ids", "instances.1.input_ids"),
    ),
    "rid": Case({"parameters": {"rid": "r-1"}}, ("parameters.rid",)),
    "bootstrap": Case(
        {
            "parameters": {
                "bootstrap_host": "10.0.0.9",
                "bootstrap_port": 8998,
                "bootstrap_room": 2**63 - 1,
                "return_logprob": False,
            }
        },
        ("parameters.bootstrap_host", "parameters.bootstrap_port", "parameters.bootstrap_room"),
    ),
    "ranks": Case(
        {"parameters": {"routed_dp_rank": 0, "data_parallel_rank": 0}},
        ("parameters.data_parallel_rank", "parameters.routed_dp_rank"),
    ),
    "custom_logit_processor": Case(
        {"parameters": {"custom_logit_processor": "gASV..."}},
        ("parameters.custom_logit_processor",),
    ),
    "session_params": Case(
        {"parameters": {"session_params": {"id": "s", "rid": "r"}}}, ("parameters.session_params",)
    ),
    "sampling_params": Case(
        {"parameters": {"sampling_params": {"custom_params": {"rid": "r"}, "temperature": 0}}},
        ("parameters.sampling_params.custom_params.rid",),
    ),
}
# The shipped routes it reaches, by what an untrusted caller's carriers get there.
VERTEX_ROUTES = {
    "/vertex_generate": "stripped_by_policy",
    "/v1/vertex_generate": "stripped_by_policy",
    "/pd/v1/vertex_generate": "unproven",
    "/pd/prefill/v1/vertex_generate": "unproven",
    "/strict-sglang/vertex_generate": "stripped_by_policy",
}


def vertex(case: Case) -> dict[str, Any]:
    instances = case.members.get("instances", [{"text": "hi"}])
    return {**case.members, "instances": instances}


@DEFAULT_ARRANGEMENT
@pytest.mark.parametrize("probe", VERTEX_PROBES)
@pytest.mark.parametrize("path", VERTEX_ROUTES)
def test_vertex_generate_loses_the_carriers_of_the_request_it_builds(gateway, client, probe, path):
    case = VERTEX_PROBES[probe]
    sent = vertex(case)
    rid = request_id()
    reply = client.post(gateway.url + path, json=sent, headers={"x-request-id": rid})
    assert reply.status_code == 200, reply.text
    expected = without(sent, *case.carriers)
    if path.startswith(PREFILL.removesuffix("chat/completions")):
        expected["kv_transfer_params"] = PREFILL_REQUEST_PARAMS
    assert json.loads(only_request(gateway).body) == expected
    line = access_log(gateway, rid)
    assert (line["policy_action"], line["policy_reason"]) == ("strip", VERTEX_ROUTES[path])


@DEFAULT_ARRANGEMENT
@pytest.mark.parametrize("probe", VERTEX_PROBES)
@pytest.mark.parametrize(
    "path", ["/deny/v1/vertex_generate", "/strict-sglang-deny/vertex_generate"]
)
def test_vertex_generate_carriers_are_refused_where_the_route_denies(gateway, client, probe, path):
    case = VERTEX_PROBES[probe]
    reply = client.post(gateway.url + path, json=vertex(case))
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] in case.carriers
    assert gateway.received() == []


@DEFAULT_ARRANGEMENT
def test_a_strict_route_reads_vertex_generate_as_the_request_it_builds(gateway, client):
    # Its instances and parameters are checked against GenerateReqInput's members: what
    # that request does not declare goes, as a carrier does; what it does is forwarded.
    sent = {
        "instances": [{"text": "hi", "next_release_hint": 1}],
        "parameters": {"sampling_params": {"max_new_tokens": 4}, "next_release_peer": "h"},
    }
    reply = client.post(gateway.url + "/strict-sglang/vertex_generate", json=sent)
    assert reply.status_code == 200, reply.text
    expected = without(sent, "instances.0.next_release_hint", "parameters.next_release_peer")
    assert json.loads(only_request(gateway).body) == expected


# A strict route forwards what the engine declares, and below a member it types as any
# JSON that a server reads parameters from, no carrier's name at any depth.
STRICT_BELOW_UNTYPED = {
    "kv_cache_report_mode": Case(
        {"vllm_xargs": {"kv_cache_report_mode": "full", "seed_hint": 3}},
        ("vllm_xargs.kv_cache_report_mode",),
    ),
    "nested": Case(
        {"vllm_xargs": {"a": {"b": [{"kv_transfer_params": {"remote_host": "h"}}]}}},
        ("vllm_xargs.a.b.0.kv_transfer_params",),
    ),
    "ids": Case(
        {"vllm_xargs": {"x": {"prompt_token_ids": [1, 2], "input_ids": [3]}}},
        ("vllm_xargs.x.input_ids", "vllm_xargs.x.prompt_token_ids"),
    ),
}


@DEFAULT_ARRANGEMENT
@pytest.mark.parametrize("probe", STRICT_BELOW_UNTYPED)
def test_a_strict_route_removes_carriers_below_untyped_members(gateway, client, probe):
    case = STRICT_BELOW_UNTYPED[probe]
    sent = chat(**case.members)
    reply = client.post(gateway.url + "/strict-vllm/v1/chat/completions", json=sent)
    assert reply.status_code == 200, reply.text
    assert json.loads(only_request(gateway).body) == without(sent, *case.carriers)
