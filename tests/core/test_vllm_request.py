import pytest

from ext_proc.core import vllm_request
from ext_proc.core.vllm_request import ignores_reused_ids, policed_keys


def test_policed_keys():
    assert policed_keys({}) == ()
    assert policed_keys({"do_remote_prefill": True}) == ()
    assert policed_keys({"prompt_features": {}, "prompt_token_ids": None}) == (
        "prompt_token_ids",
        "prompt_features",
    )


@pytest.mark.parametrize(
    ("document", "ignored"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, False),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, False),
        ({"input": "hi"}, False),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]}, False),
        ({"system": "s", "messages": []}, False),
        ({"echo": False, "messages": []}, False),
        ({"echo": True, "messages": []}, True),
        ({"echo": 1, "messages": []}, True),
        ({"echo": "true", "messages": []}, True),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            True,
        ),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, True),
        ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, True),
        ({"messages": [{"role": "user", "content": {"type": "text"}}]}, True),
        ({"messages": "not a list"}, False),
        ({"messages": 5}, True),
        ({"messages": ["not an object"]}, True),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, True),
        ({"input": [{"type": "message", "role": "user", "content": "hi"}]}, False),
        ({"input": [{"type": "input_text", "text": "hi"}]}, False),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, True),
        ({"system": [{"type": "image"}], "messages": []}, True),
    ],
)
def test_ignores_reused_ids(document, ignored):
    assert ignores_reused_ids(document) is ignored


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/chat/%63ompletions", "/v1/chat/completions"),
        ("/v1/chat/completions%0A", "/v1/chat/completions"),  # Starlette's $ ignores it
        ("/v1/chat/completions%0A%0A", "/v1/chat/completions\n"),
        ("/v1/chat/completions%2Fderender", "/v1/chat/completions/derender"),
    ],
)
def test_the_endpoint_is_the_path_as_vllm_routes_it(path, expected):
    assert vllm_request.endpoint(path) == expected


def test_the_endpoint_memo_keeps_no_long_path_and_empties_when_full():
    vllm_request._KINDS.clear()
    long_path = "/v1/" + "a" * vllm_request._KINDS_PATH + "/flush_cache"
    assert vllm_request.internal_endpoint(long_path) == "/flush_cache"
    assert long_path not in vllm_request._KINDS
    for number in range(vllm_request._KINDS_MEMO + 1):
        assert vllm_request.token_endpoint(f"/v1/p{number}") is None
    assert len(vllm_request._KINDS) <= vllm_request._KINDS_MEMO
    # Judged the same from the memo as afresh.
    assert vllm_request.internal_endpoint("/v1/flush_cache") == "/flush_cache"
    assert vllm_request.internal_endpoint("/v1/flush_cache") == "/flush_cache"


# SGLang takes a media item's format as its lower-case value or its MultimodalInputFormat
# member's name, and no other spelling (multimodal/processors/base_processor.py,
# BaseMultimodalProcessor._get_preprocessed_input_format).
FORMAT_SPELLINGS = [
    ("precomputed_embedding", True),
    ("PRECOMPUTED_EMBEDDING", True),
    ("processor_output", True),
    ("PROCESSOR_OUTPUT", True),
    ("Processor_Output", False),
    ("normal", False),
]


@pytest.mark.parametrize(("spelling", "embedded"), FORMAT_SPELLINGS)
def test_a_media_item_is_embeddings_in_every_format_spelling_sglang_takes(spelling, embedded):
    item = {"format": spelling, "feature": "AAAA", "input_ids": [1, 2], "hash": "h"}
    found = vllm_request.embeddings({"text": "x", "image_data": [[item]]})
    assert found == ((("image_data", 0, 0),) if embedded else ())
    # The bytes are searched for it before any parse.
    assert (spelling in vllm_request.CARRIER_NAMES) is embedded
