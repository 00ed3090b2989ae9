"""Prompt embeddings through the real Envoy (docs/trust.md#carriers): a prompt a server
runs without rendering anything, from members and chat content parts of the
classification's lists (``classified.EMBEDDING_MEMBERS``: vLLM's completions
``prompt_embeds``, SGLang's ``input_embeds``; ``classified.EMBEDDING_PART_TYPES``).
From a caller the route does not trust they are refused, 400 ``embeddings_refused``
naming where they are, on every route, in every body arrangement, and nothing reaches
the stand-in; a route whose policy has ``accept: embeddings``, and a route trusting any
caller, forward them byte for byte."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import httpx
import pytest

from ext_proc.core import classified
from tests.e2e.conftest import BODY_MODES, KEY_ID
from tests.e2e.stack import Stack, extra_routes, new_key, route
from tests.e2e.test_gateway import chat, error_of, only_request
from tests.e2e.test_operations import access_log

# A route serving embeddings to any caller (its policy's accept), its other policy the
# shipped aggregated route's.
ACCEPTING = "/embeds/v1/"
# The shipped strip, honor and mint routes, and a deny route.
PREFIXES = ("/v1/", "/pd/v1/", "/pd/prefill/v1/", "/deny/v1/")
TRUSTED = "/trusted/v1/"
# What vLLM's prompt_embeds hold: a tensor saved by torch.save, base64-encoded (the
# gateway never decodes it: any bytes stand for it).
TENSOR = base64.b64encode(b"PK\x03\x04" + bytes(range(60))).decode()


class Embedded(NamedTuple):
    """A request carrying prompt embeddings: its endpoint under a route's prefix, its
    body, and where the gateway finds them (as it names them)."""

    endpoint: str
    body: dict[str, Any]
    param: str


def completions(**members: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 7, **members}


def chat_with_part(part: dict[str, Any]) -> dict[str, Any]:
    """``chat()`` with ``part`` after the user's text: at messages.1.content.1."""
    document = chat()
    document["messages"][1]["content"] = [{"type": "text", "text": "hello"}, part]
    return document


CASES = {
    # Each member (by name: the processor looks at any depth), each part type, made from
    # the classification's names.
    **{
        f"member:{name}": Embedded("completions", completions(**{name: TENSOR}), name)
        for name in sorted({path[-1] for path in classified.EMBEDDING_MEMBERS})
    },
    **{
        f"part:{kind}": Embedded(
            "chat/completions",
            chat_with_part({"type": kind, "data": TENSOR}),
            "messages.1.content.1",
        )
        for kind in classified.EMBEDDING_PART_TYPES
    },
    # As their readers take them: SGLang's list of per-token vectors; vLLM's chat part
    # keyed by its own type, and in a Responses API input item.
    "sglang-input_embeds": Embedded(
        "completions", completions(input_embeds=[[0.25, -0.5], [1.0, 0.0]]), "input_embeds"
    ),
    "vllm-image_embeds": Embedded(
        "chat/completions",
        chat_with_part({"type": "image_embeds", "image_embeds": TENSOR}),
        "messages.1.content.1",
    ),
    "responses-input": Embedded(
        "responses",
        {
            "model": "tiny",
            "input": [{"role": "user", "content": [{"type": "prompt_embeds", "data": TENSOR}]}],
        },
        "input.0.content.0",
    ),
}


@pytest.fixture(scope="module", params=list(BODY_MODES))
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The e2e stack with one more route: the aggregated policy, accepting embeddings."""
    accepting = route("embeds", ACCEPTING, {"action": "strip", "accept": "embeddings"})
    workdir = tmp_path_factory.mktemp(f"embeddings-{request.param}")
    source = BODY_MODES[request.param]
    with Stack(
        workdir, source=source, proof_keys={KEY_ID: new_key()}, routes=[*extra_routes(), accepting]
    ) as running:
        yield running


def send(gateway: Stack, prefix: str, case: Embedded, rid: str) -> httpx.Response:
    content = json.dumps(case.body).encode()
    headers = {"content-type": "application/json", "x-request-id": rid}
    return httpx.post(
        gateway.url + prefix + case.endpoint, content=content, headers=headers, timeout=20
    )


def test_every_classified_member_and_part_has_a_case():
    names = {path[-1] for path in classified.EMBEDDING_MEMBERS}
    assert {f"member:{name}" for name in names} <= set(CASES)
    assert {f"part:{kind}" for kind in classified.EMBEDDING_PART_TYPES} <= set(CASES)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("prefix", PREFIXES)
def test_embeddings_from_an_untrusted_caller_are_refused_naming_them(gateway, prefix, case):
    rid = f"embeds-{uuid.uuid4()}"
    reply = send(gateway, prefix, CASES[case], rid)
    assert reply.status_code == 400, reply.text
    error = error_of(reply)
    assert error["param"] == CASES[case].param
    assert "prompt embeddings" in error["message"]
    line = access_log(gateway, rid)
    assert (line["policy_action"], line["policy_reason"]) == ("deny", "embeddings_refused")
    assert gateway.received() == []


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("prefix", [ACCEPTING, TRUSTED])
def test_embeddings_pass_byte_for_byte_where_accepted_or_trusted(gateway, prefix, case):
    rid = f"embeds-{uuid.uuid4()}"
    reply = send(gateway, prefix, CASES[case], rid)
    assert reply.status_code == 200, reply.text
    received = only_request(gateway)
    assert received.target == "/v1/" + CASES[case].endpoint
    assert received.body == json.dumps(CASES[case].body).encode()


def test_accepting_embeddings_still_removes_a_clients_carriers(gateway):
    case = CASES["member:prompt_embeds"]
    sent = {**case.body, "kv_transfer_params": {"prompt_token_ids": [1, 2]}, "rid": "r"}
    reply = httpx.post(gateway.url + ACCEPTING + case.endpoint, json=sent, timeout=20)
    assert reply.status_code == 200, reply.text
    assert json.loads(only_request(gateway).body) == case.body


def test_null_embeddings_and_a_text_part_naming_them_are_no_embeddings(gateway):
    sent = chat_with_part({"type": "text", "text": "prompt_embeds"})
    sent["prompt_embeds"] = None
    reply = httpx.post(gateway.url + "/v1/chat/completions", json=sent, timeout=20)
    assert reply.status_code == 200, reply.text
    assert json.loads(only_request(gateway).body) == sent


# Shapes vLLM 0.32 reads prompt embeddings from beyond a part's "type": its part parser
# takes a part that has a "uuid" by the member it holds, whatever its type
# (renderers/chat_utils.py, _parse_chat_message_content_mm_part: {"type": "text",
# "uuid": ..., "image_embeds": ...} is image embeddings), and /v1/chat/completions/batch
# renders each conversation of a list of them (batch_serving.py). Both reached the
# stand-in before the processor searched every object for them.
UNSEEN = {
    "text-part-with-uuid": Embedded(
        "chat/completions",
        chat_with_part({"type": "text", "text": "hi", "uuid": "u", "image_embeds": TENSOR}),
        "messages.1.content.1",
    ),
    "text-part-with-uuid-prompt_embeds": Embedded(
        "chat/completions",
        chat_with_part(
            {"type": "text", "text": "hi", "uuid": "u", "prompt_embeds": 0, "data": TENSOR}
        ),
        "messages.1.content.1",
    ),
    "batch-conversation": Embedded(
        "chat/completions/batch",
        {
            "model": "tiny",
            "messages": [
                [{"role": "user", "content": [{"type": "prompt_embeds", "data": TENSOR}]}]
            ],
        },
        "messages.0.0.content.0",
    ),
}


@pytest.mark.parametrize("case", UNSEEN)
def test_embeddings_in_the_other_shapes_vllm_reads_are_refused(gateway, case):
    rid = f"embeds-{uuid.uuid4()}"
    reply = send(gateway, "/v1/", UNSEEN[case], rid)
    assert gateway.received() == []
    assert reply.status_code == 400, reply.text
    assert access_log(gateway, rid)["policy_reason"] == "embeddings_refused"


# SGLang's /generate media items that are embeddings or a processor's output, their
# format spelled as its MultimodalInputFormat member's name, which SGLang takes as it
# takes the lower-case value (multimodal/processors/base_processor.py,
# BaseMultimodalProcessor._get_preprocessed_input_format). Both reached the stand-in
# while the processor knew the lower-case spelling only.
UPPER_CASE_FORMATS = {
    "PRECOMPUTED_EMBEDDING": Embedded(
        "generate",
        {
            "text": "describe",
            "image_data": [{"format": "PRECOMPUTED_EMBEDDING", "precomputed_embeddings": TENSOR}],
        },
        "image_data.0",
    ),
    "PROCESSOR_OUTPUT": Embedded(
        "generate",
        {
            "text": "describe",
            "image_data": [
                {"format": "PROCESSOR_OUTPUT", "feature": TENSOR, "input_ids": [1, 2], "hash": 7}
            ],
        },
        "image_data.0",
    ),
}


@pytest.mark.parametrize("case", UPPER_CASE_FORMATS)
def test_a_media_item_in_the_format_spelling_sglang_also_takes_is_refused(gateway, case):
    rid = f"embeds-{uuid.uuid4()}"
    reply = send(gateway, "/v1/", UPPER_CASE_FORMATS[case], rid)
    assert gateway.received() == []
    assert reply.status_code == 400, reply.text
    assert error_of(reply)["param"] == UPPER_CASE_FORMATS[case].param
    assert access_log(gateway, rid)["policy_reason"] == "embeddings_refused"
