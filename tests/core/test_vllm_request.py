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


@pytest.mark.parametrize(
    ("upstream", "named"),
    [
        ("/dumper/x", "/dumper/{method}"),
        # "%0A" decoded to a newline that Starlette's "[^/]+" takes as the method, though
        # ``endpoint`` drops it: the final template segment may be left empty.
        ("/dumper/%0A", "/dumper/{method}"),
        ("/x/DUMPER//", "/dumper/{method}"),
        ("/dumper", None),
        ("/workers/1/drain", "/workers/{worker_id}/drain"),
        ("/workers//drain", None),
    ],
)
def test_a_final_template_segment_may_be_what_a_dropped_newline_left(upstream, named):
    assert vllm_request.internal_endpoint(vllm_request.endpoint(upstream)) == named


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


@pytest.mark.parametrize(
    ("document", "found"),
    [
        # Below a member typed as any JSON that a server reads parameters from, every
        # carrier's name at any depth, where it sits.
        (
            {"vllm_xargs": {"kv_cache_report_mode": "full"}},
            [("vllm_xargs", "kv_cache_report_mode")],
        ),
        (
            {"custom_params": {"a": [{"b": {"session_params": {"rid": "x"}}}]}},
            [("custom_params", "a", 0, "b", "session_params")],
        ),
        (
            {"sampling_params": {"extra_args": {"x": {"kv_transfer_params": {}}}}},
            [("sampling_params", "extra_args", "x", "kv_transfer_params")],
        ),
        (
            {"extra_args": {"nvext": {"metadata_upload": {"url": "s3://b"}}}},
            [("extra_args", "nvext", "metadata_upload")],
        ),
        # SGLang's /vertex_generate: its instances and parameters are a generate request.
        (
            {"instances": [{"text": "hi"}, {"input_ids": [1]}], "parameters": {"rid": "r"}},
            [("parameters", "rid"), ("instances", 1, "input_ids")],
        ),
        (
            {"parameters": {"sampling_params": {"deep": [[{"bootstrap_host": "h"}]]}}},
            [("parameters", "sampling_params", "deep", 0, 0, "bootstrap_host")],
        ),
        # Null is absent; a carrier inside another is not named.
        ({"vllm_xargs": {"rid": None, "x": {"rid": {"rid": 1}}}}, [("vllm_xargs", "x", "rid")]),
        # The caller's content (a schema, template arguments) is not searched.
        ({"response_format": {"json_schema": {"schema": {"rid": {}}}}}, []),
        ({"chat_template_kwargs": {"rid": "x"}, "metadata": {"request_id": "x"}}, []),
        # A top-level `tokens` list is vLLM's /detokenize input; below an untyped member
        # a `tokens` is a carrier whatever it holds.
        ({"vllm_xargs": {"tokens": [1]}}, [("vllm_xargs", "tokens")]),
    ],
)
def test_carriers_are_found_at_any_depth_below_untyped_members(document, found):
    assert vllm_request.other_carriers(document, 64) == tuple(found)


def test_every_name_searched_below_untyped_members_is_one_the_pre_scan_looks_for():
    # A body whose bytes spell none of CARRIER_NAMES is forwarded unparsed: that holds
    # only if no name the deep search finds is missing from them.
    assert set(vllm_request.CARRIER_NAMES) >= vllm_request.DEEP_NAMES
    assert "kv_cache_report_mode" in vllm_request.DEEP_NAMES
    assert "metadata_upload" in vllm_request.DEEP_NAMES


def test_the_search_below_untyped_members_is_bounded():
    # At most `most` are named, and the objects met count against MAX_SEARCHED.
    many = {"vllm_xargs": [{"rid": index} for index in range(10)]}
    assert len(vllm_request.other_carriers(many, 3) or ()) == 3
    wide = {"vllm_xargs": [[] for _ in range(vllm_request.MAX_SEARCHED)]}
    assert vllm_request.other_carriers(wide, 64) is None
    deep: object = {"rid": 1}
    for _ in range(5000):  # deeper than Python's recursion limit
        deep = [deep]
    assert vllm_request.other_carriers({"vllm_xargs": deep}, 64) == (
        ("vllm_xargs", *([0] * 5000), "rid"),
    )


@pytest.mark.parametrize(
    ("path", "served"),
    [
        # A literal route the server matches before its template: not the stored response.
        ("/v1/responses/render", None),
        ("/v1/responses/resp_1", "/v1/responses/{response_id}"),
        # More of the path is the dumper's than the text parser's.
        ("/dumper/separate_reasoning", None),
        ("/separate_reasoning", "/separate_reasoning"),
        ("/root/v1/responses/resp_1/cancel", "/v1/responses/{response_id}/cancel"),
    ],
)
def test_a_path_is_the_endpoint_covering_most_of_it(path: str, served: str | None) -> None:
    assert vllm_request.tenant_endpoint(path) == served


@pytest.mark.parametrize(
    "path",
    [
        "/metrics/v1/models",
        "/metrics/v1/chat/completions",
        "/metrics/generate",
        "/metrics_x/v1/completions",
    ],
)
def test_a_path_the_servers_metrics_mount_takes_is_not_served_on_tenant_routes(path: str) -> None:
    """vLLM and SGLang mount Prometheus' app with the regex ``^/metrics(?P<path>.*)$``
    and append it after their routes: every path that starts with /metrics and is no
    route of theirs reaches it, whatever it ends with. /metrics itself is refused on a
    tenant route (no endpoint of the inventory), so the same reply must not come
    through a path whose tail names a served endpoint."""
    assert vllm_request.tenant_endpoint("/metrics") is None
    assert vllm_request.tenant_endpoint(path) is None


@pytest.mark.parametrize(
    "path",
    [
        "/static/x/v1/chat/completions",
        "/static/v1/completions",
        "/Static/x/v1/models",
        "/root/static/x/generate",
        "/static",
    ],
)
def test_a_path_vllms_static_mount_takes_is_not_served_on_tenant_routes(path: str) -> None:
    """vLLM mounts StaticFiles at /static (--enable-offline-docs): every path below it is
    the mount's, whatever endpoint its tail names, behind a root path too."""
    assert vllm_request.tenant_endpoint(path) is None


@pytest.mark.parametrize(
    ("path", "served"),
    [
        ("/readyz", "/readyz"),
        ("/root/readyz", "/readyz"),
        ("/openapi.json", "/openapi.json"),
        ("/v1/realtime", None),
        ("/team/v1/realtime/", None),
    ],
)
def test_routes_the_servers_register_beside_their_api_are_judged(
    path: str, served: str | None
) -> None:
    assert vllm_request.tenant_endpoint(path) == served


def test_no_served_endpoint_is_as_much_an_endpoint_not_served(monkeypatch) -> None:
    """Equal coverage is refused whichever name is literal: a server takes the first
    route registered that matches."""
    monkeypatch.setattr(vllm_request.classified, "UNTENANTED_ENDPOINTS", ("/v1/{anything}",))
    monkeypatch.setattr(vllm_request, "_TENANTS", {})
    assert vllm_request.tenant_endpoint("/v1/models") is None
    assert vllm_request.tenant_endpoint("/v1/chat/completions") == "/v1/chat/completions"
