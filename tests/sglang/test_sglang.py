"""SGLang's carriers through the real Envoy and processor, judged by SGLang's own code
(docs/trust.md#carriers, #header-carriers).

The carriers are not listed here: they are the gateway's own top-level
``classified.BODY_CARRIERS`` (and ``EMBEDDING_MEMBERS``) that SGLang 0.5.23's request
model for the endpoint declares in the inventory, and the ``HEADER_CARRIERS`` its code
reads. Each test sends a body carrying all of them, with every header, through the
gateway and straight to the stand-in, and parses the bytes the stand-in recorded with
SGLang's own model (``parse_request.py``, in SGLang's environment): straight, SGLang
reads every one (so no test passes because SGLang would have ignored what it sent);
through the gateway, none, and everything else arrives as SGLang would have read it.
Prompt embeddings are refused and reach nothing. ``/vertex_generate`` is judged by the
request SGLang's own handler builds from the body (its ``instances`` and ``parameters``),
and media items by SGLang's own check of their ``format``.

Headers: SGLang writes the ``x-override-*`` headers into the request it runs when
``SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES`` is set (the helper applies them as it does);
its OpenAI handlers read ``x-smg-routing-key`` and ``x-data-parallel-rank`` always.
``x-body-compressed`` and ``x-sglext-ids-framed`` change how SGLang reads the body's
bytes: for them, and for all, what counts is that the stand-in never received them.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest

from devstack.inventory import model
from ext_proc.core import classified
from tests.e2e.stack import Received, Stack
from tests.e2e.test_gateway import only_request
from tests.e2e.test_operations import access_log
from tests.sglang.sglang_env import SOURCE, Case, Parser, Reading

SGLANG = model.loads(model.INVENTORY.read_text()).sources[SOURCE]
# SGLang's endpoint -> the gateway's paths that reach it: the shipped strip route, the
# decode leg (honor) and the prefill leg (mint, which writes its connector request);
# /generate reaches the aggregated upstream through the catch-all route.
PATHS: Mapping[str, tuple[str, ...]] = {
    "/v1/chat/completions": (
        "/v1/chat/completions",
        "/pd/v1/chat/completions",
        "/pd/prefill/v1/chat/completions",
    ),
    "/v1/completions": ("/v1/completions", "/pd/v1/completions", "/pd/prefill/v1/completions"),
    "/generate": ("/generate",),
}
TOP_CARRIERS = frozenset(path[0] for path in classified.BODY_CARRIERS if len(path) == 1)
TOP_EMBEDDINGS = frozenset(path[0] for path in classified.EMBEDDING_MEMBERS if len(path) == 1)


def request_model(endpoint: str) -> str:
    root = SGLANG.endpoints[f"POST {endpoint}"]
    assert root is not None
    return root


def declared(endpoint: str, names: frozenset[str]) -> tuple[str, ...]:
    """The names of ``names`` that SGLang's request model for ``endpoint`` declares."""
    return tuple(sorted(names & set(SGLANG.models[request_model(endpoint)])))


CARRIERS = {endpoint: declared(endpoint, TOP_CARRIERS) for endpoint in PATHS}
EMBEDDINGS = {endpoint: declared(endpoint, TOP_EMBEDDINGS) for endpoint in PATHS}
HEADERS = tuple(sorted(set(classified.HEADER_CARRIERS) & set(SGLANG.headers)))

# What a caller forges, per carrier: the only hand-kept part (a carrier the inventory
# and the classification add without a value here fails test_every_carrier_has_a_value).
VALUES: Mapping[str, Any] = {
    "input_ids": [5, 6, 7, 8, 9, 10, 11],  # "bypasses chat template tokenization entirely"
    "bootstrap_host": "10.0.0.66",
    "bootstrap_port": 8998,
    "bootstrap_room": 4242,
    "bootstrap_pair_key": "forged-pair",
    "decode_tp_size": 8,
    "rid": "victim-rid",
    "session_params": {"id": "victim-session", "rid": "victim-rid", "offset": 0},
    "routed_dp_rank": 1,
    "data_parallel_rank": 1,
    "disagg_prefill_dp_rank": 1,
    "routing_key": "victim-tenant",
    "custom_logit_processor": '{"callable": "gASV"}',
    "encoder_urls": ["http://10.0.0.66:9000"],
    "http_worker_ipc": "ipc:///tmp/forged",
    "kv_hints": {"protocol_version": "1", "message_id": "forged", "actions": []},
    "mm_hashes": ["ab" * 32],
    "mm_content_hashes": ["sha256:" + "0" * 64],
}
EMBEDDING_VALUES: Mapping[str, Any] = {
    "input_embeds": [[0.25] * 8] * 3,
    "positional_embed_overrides": {"positions": [0], "embeds": [[0.25] * 8]},
}
HEADER_VALUES: Mapping[str, str] = {
    "x-body-compressed": "zstd",
    "x-data-parallel-rank": "3",
    "x-override-bootstrap-host": "10.0.0.67",
    "x-override-bootstrap-port": "8999",
    "x-override-bootstrap-room": "4343",
    "x-override-disagg-prefill-dp-rank": "2",
    "x-override-rid": "victim-rid-header",
    "x-override-routed-dp-rank": "2",
    "x-sglext-ids-framed": "1",
    "x-smg-routing-key": "victim-tenant-header",
}
# The headers SGLang's apply_header_overrides writes into the request it runs
# (x-override-<member>), and what its OpenAI handlers read from the others.
OVERRIDDEN = {
    name.removeprefix("x-override-").replace("-", "_"): name
    for name in HEADERS
    if name.startswith("x-override-")
}
HANDLED = {"routing_key": "x-smg-routing-key", "routed_dp_rank": "x-data-parallel-rank"}
_ids = itertools.count()


def body(endpoint: str, members: Mapping[str, Any]) -> dict[str, Any]:
    """A request SGLang serves at ``endpoint``, with ``members`` added."""
    if endpoint == "/generate":
        base: dict[str, Any] = {"text": "hello", "sampling_params": {"max_new_tokens": 7}}
    elif endpoint == "/v1/completions":
        base = {"model": "tiny", "prompt": "hello", "max_tokens": 7}
    else:
        base = {
            "model": "tiny",
            "messages": [
                {"role": "system", "content": "Be careful."},
                {"role": "user", "content": "hello"},
            ],
            "max_tokens": 7,
        }
    return {**base, **members}


def every_carrier(endpoint: str) -> dict[str, Any]:
    return body(endpoint, {name: VALUES[name] for name in CARRIERS[endpoint]})


def request_id() -> str:
    return f"sglang-{time.monotonic_ns()}-{next(_ids)}"


def cases() -> Iterator[tuple[str, str]]:
    for endpoint, paths in PATHS.items():
        for path in paths:
            yield endpoint, path


def post(url: str, document: dict[str, Any], headers: Mapping[str, str]) -> httpx.Response:
    return httpx.post(url, json=document, headers=dict(headers), timeout=20)


def straight(stack: Stack, endpoint: str, document: dict[str, Any]) -> Received:
    """``document`` with every header, sent to the stand-in without the gateway."""
    stack.clear()
    reply = post(f"http://{stack.upstream}{endpoint}", document, HEADER_VALUES)
    assert reply.status_code == 200, reply.text
    return only_request(stack)


def read(sglang: Parser, endpoint: str, received: Received) -> Reading:
    (reading,) = sglang.read([Case(request_model(endpoint), received.body, received.headers)])
    assert reading.error is None, reading.error
    return reading


def test_the_carriers_are_derived():
    # What the inventory says SGLang reads, among the gateway's own lists.
    assert "input_ids" in CARRIERS["/v1/chat/completions"]
    assert {"bootstrap_room", "rid", "session_params"} <= set(CARRIERS["/v1/completions"])
    assert {"routing_key", "kv_hints", "mm_hashes"} <= set(CARRIERS["/generate"])
    assert "input_embeds" in EMBEDDINGS["/generate"]
    assert {"x-override-rid", "x-smg-routing-key", "x-body-compressed"} <= set(HEADERS)


def test_every_carrier_has_a_value():
    assert set(itertools.chain(*CARRIERS.values())) <= set(VALUES)
    assert set(itertools.chain(*EMBEDDINGS.values())) <= set(EMBEDDING_VALUES)
    assert set(HEADERS) <= set(HEADER_VALUES)


@pytest.mark.parametrize(("endpoint", "path"), list(cases()))
def test_sglang_reads_no_carrier_the_gateway_forwards(gateway, sglang, endpoint, path):
    carriers = set(CARRIERS[endpoint])
    sent = every_carrier(endpoint)

    # The control: straight to the stand-in, SGLang's own code reads every carrier,
    # from the body and from the headers.
    bare = read(sglang, endpoint, straight(gateway, endpoint, sent))
    assert carriers <= set(bare.members), sorted(carriers - set(bare.members))
    assert set(bare.overrides) == set(OVERRIDDEN)
    assert set(bare.handlers) == set(HANDLED)

    gateway.clear()
    rid = request_id()
    reply = post(gateway.url + path, sent, {**HEADER_VALUES, "x-request-id": rid})
    assert reply.status_code == 200, reply.text
    received = only_request(gateway)
    assert received.target == endpoint  # the SGLang endpoint the route reaches
    through = read(sglang, endpoint, received)
    assert not carriers & set(through.members), through.members
    assert through.overrides == {}
    assert through.handlers == {}
    # Everything else arrives as SGLang read it straight (SGLang's model has no
    # kv_transfer_params, which the prefill route writes).
    assert through.members == {k: v for k, v in bare.members.items() if k not in carriers}
    # None of SGLang's header carriers arrives, nor any forged value under another name.
    arrived = {name.lower() for name, _ in received.headers}
    assert not arrived & set(HEADERS), sorted(arrived & set(HEADERS))
    forged = set(HEADER_VALUES.values())
    assert not [pair for pair in received.headers if pair[1] in forged]
    line = access_log(gateway, rid)
    assert line["policy_action"] == "strip"


@pytest.mark.parametrize(
    "endpoint", [endpoint for endpoint in PATHS if endpoint.startswith("/v1/")]
)
def test_a_deny_route_refuses_each_carrier(gateway, endpoint):
    for name in CARRIERS[endpoint]:
        reply = post(gateway.url + "/deny" + endpoint, body(endpoint, {name: VALUES[name]}), {})
        assert reply.status_code == 400, (name, reply.text)
        assert reply.json()["error"]["param"] == name
    assert gateway.received() == []


EMBEDDING_CASES = [
    (member, endpoint, path)
    for endpoint, members in EMBEDDINGS.items()
    for member in members
    for _, path in cases()
]


@pytest.mark.parametrize(("member", "endpoint", "path"), EMBEDDING_CASES)
def test_prompt_embeddings_are_refused(gateway, sglang, member, endpoint, path):
    # The endpoint whose SGLang model reads them; sent on every path the gateway serves.
    sent = body(endpoint, {member: EMBEDDING_VALUES[member]})
    bare = read(sglang, endpoint, straight(gateway, endpoint, sent))
    assert member in bare.members

    gateway.clear()
    rid = request_id()
    reply = post(gateway.url + path, sent, {"x-request-id": rid})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == member
    assert access_log(gateway, rid)["policy_reason"] == "embeddings_refused"
    assert gateway.received_count() == 0


def test_sglang_reads_the_header_carriers_it_is_sent(sglang):
    # The helper's header readings without the stack: each header alone sets its member.
    for attribute, header in {**OVERRIDDEN, **HANDLED}.items():
        document = json.dumps(body("/generate", {})).encode()
        case = Case("GenerateReqInput", document, [(header, HEADER_VALUES[header])])
        (reading,) = sglang.read([case])
        assert attribute in {**reading.overrides, **reading.handlers}, header


# --- /vertex_generate: the request SGLang's own handler builds -----------------------------

# SGLang's handler reads each instance's text, input_ids or input_embeds (the first
# instance's choice) and image_data, and passes every member of `parameters` to the
# GenerateReqInput it builds, whose carriers are /generate's. Each gateway path that
# reaches the handler -> the path the stand-in receives: the catch-all and the strict
# route at SGLang's default route; the strip, decode and prefill legs at /v1/, where
# SGLang serves it when AIP_PREDICT_ROUTE says so (the helper posts to the handler's
# own route either way).
VERTEX_PATHS: Mapping[str, str] = {
    "/vertex_generate": "/vertex_generate",
    "/strict-sglang/vertex_generate": "/vertex_generate",
    "/v1/vertex_generate": "/v1/vertex_generate",
    "/pd/v1/vertex_generate": "/v1/vertex_generate",
    "/pd/prefill/v1/vertex_generate": "/v1/vertex_generate",
}
VERTEX = "vertex_generate"  # parse_request.HANDLERS


def vertex_body(carriers: tuple[str, ...]) -> dict[str, Any]:
    """A /vertex_generate body whose built request holds ``carriers``: input_ids in the
    instances (as the prompt, so no text beside it), the others in ``parameters``."""
    instances: list[dict[str, Any]] = [{"image_data": "http://10.0.0.5/cat.png"}, {}]
    if "input_ids" in carriers:
        instances[0]["input_ids"] = VALUES["input_ids"]
        instances[1]["input_ids"] = [12, 13]
    parameters = {name: VALUES[name] for name in carriers if name != "input_ids"}
    return {
        "instances": instances,
        "parameters": {"sampling_params": {"max_new_tokens": 7}, **parameters},
    }


def built(sglang: Parser, received: Received) -> Reading:
    (reading,) = sglang.read([Case(VERTEX, received.body)])
    assert reading.error is None, reading.error
    return reading


@pytest.mark.parametrize("path", VERTEX_PATHS)
def test_sglang_builds_no_carrier_from_what_the_gateway_forwards_to_vertex_generate(
    gateway, sglang, path
):
    carriers = set(CARRIERS["/generate"])
    sent = vertex_body(CARRIERS["/generate"])

    # The control: straight, the request SGLang's handler builds holds every carrier.
    bare = built(sglang, straight(gateway, "/vertex_generate", sent))
    assert carriers <= set(bare.members), sorted(carriers - set(bare.members))
    assert len(bare.members["input_ids"]) == 2  # one prompt per instance

    gateway.clear()
    rid = request_id()
    reply = post(gateway.url + path, sent, {"x-request-id": rid})
    assert reply.status_code == 200, reply.text
    received = only_request(gateway)
    assert received.target == VERTEX_PATHS[path]
    through = built(sglang, received)
    assert not carriers & set(through.members), through.members
    # Everything else builds as it did straight: the instances' media, the sampling.
    assert through.members == {k: v for k, v in bare.members.items() if k not in carriers}
    assert access_log(gateway, rid)["policy_action"] == "strip"


@pytest.mark.parametrize("name", CARRIERS["/generate"])
def test_a_strict_deny_route_refuses_each_carrier_of_vertex_generate(gateway, name):
    # Each carrier alone, where SGLang's handler takes it from.
    reply = post(gateway.url + "/strict-sglang-deny/vertex_generate", vertex_body((name,)), {})
    assert reply.status_code == 400, (name, reply.text)
    param = reply.json()["error"]["param"]
    assert param.startswith("instances.") if name == "input_ids" else param == f"parameters.{name}"
    assert gateway.received() == []


# --- a carrier below a member SGLang types as any JSON ---------------------------------------

# An image_data item's content_hash: SGLang's encoder takes it as the image's digest
# (disaggregation/encoder/preprocessor.py, _load_single_item), below image_data, a
# member SGLang's model leaves as any JSON.
CONTENT_HASH = "sha256:" + "ab" * 32


def test_a_carrier_below_an_untyped_member_sglang_keeps_does_not_arrive(gateway, sglang):
    item = {"url": "http://10.0.0.5/cat.png", "content_hash": CONTENT_HASH}
    sent = body("/generate", {"image_data": [item]})
    bare = read(sglang, "/generate", straight(gateway, "/generate", sent))
    assert bare.members["image_data"] == [item]

    gateway.clear()
    reply = post(gateway.url + "/generate", sent, {})
    assert reply.status_code == 200, reply.text
    through = read(sglang, "/generate", only_request(gateway))
    assert through.members == {**bare.members, "image_data": [{"url": item["url"]}]}


# --- media items in the format spellings SGLang takes ----------------------------------------

TENSOR = [[0.25] * 8] * 3
# A media item that is an embedding or a processor's output, its format spelled as the
# MultimodalInputFormat member's name: SGLang's own check takes it as it takes the
# lower-case value. Sent in /generate's image_data and in a /vertex_generate instance.
FORMAT_ITEMS: Mapping[str, dict[str, Any]] = {
    "PRECOMPUTED_EMBEDDING": {"format": "PRECOMPUTED_EMBEDDING", "precomputed_embeddings": TENSOR},
    "PROCESSOR_OUTPUT": {"format": "PROCESSOR_OUTPUT", "feature": TENSOR, "input_ids": [1, 2]},
}
FORMAT_BODIES: Mapping[str, tuple[str, str]] = {
    # endpoint -> (what SGLang reads it with, the refused member's path)
    "/generate": ("GenerateReqInput", "image_data.0"),
    "/vertex_generate": (VERTEX, "instances.0.image_data"),
}


def format_body(endpoint: str, item: dict[str, Any]) -> dict[str, Any]:
    if endpoint == "/generate":
        return body(endpoint, {"image_data": [item]})
    return {"instances": [{"text": "describe", "image_data": item}]}


FORMAT_CASES = [
    (spelling, endpoint, path)
    for spelling in FORMAT_ITEMS
    for endpoint in FORMAT_BODIES
    for path in dict.fromkeys((endpoint, *(p for p in VERTEX_PATHS if p.endswith(endpoint))))
]


@pytest.mark.parametrize(("spelling", "endpoint", "path"), FORMAT_CASES)
def test_a_media_format_sglang_takes_in_either_spelling_is_refused(
    gateway, sglang, spelling, endpoint, path
):
    model_name, param = FORMAT_BODIES[endpoint]
    sent = format_body(endpoint, FORMAT_ITEMS[spelling])
    # The control: SGLang's own check reads the item as preprocessed input.
    received = straight(gateway, endpoint, sent)
    (bare,) = sglang.read([Case(model_name, received.body)])
    assert bare.error is None, bare.error
    assert bare.formats == {"image_data": [spelling]}

    gateway.clear()
    rid = request_id()
    reply = post(gateway.url + path, sent, {"x-request-id": rid})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
    assert access_log(gateway, rid)["policy_reason"] == "embeddings_refused"
    assert gateway.received_count() == 0
