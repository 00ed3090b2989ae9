import pytest
from hypothesis import given
from hypothesis import strategies as st

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


# The plain definitions the service's loops are held to: differential references, kept
# in their first, declarative form.
def _policed_keys_reference(params):
    return tuple(key for key in vllm_request.POLICED_KEYS if key in params) if params else ()


def _text_only_reference(content):
    if content is None or isinstance(content, str):
        return True
    if isinstance(content, list):
        return all(
            isinstance(part, dict)
            and type(part.get("type")) is str
            and part.get("type") in vllm_request.TEXT_PART_TYPES
            for part in content
        )
    return False


def _ignores_reference(document):
    if document.get("echo") not in (None, False):
        return True
    if not _text_only_reference(document.get("system")):
        return True
    for key in ("messages", "input"):
        items = document.get(key)
        if items is None or isinstance(items, str):
            continue
        if not isinstance(items, list):
            return True
        for item in items:
            if not isinstance(item, dict) or not _text_only_reference(item.get("content")):
                return True
            kind = item.get("type", "message")
            if type(kind) is not str:
                return True
            if kind not in vllm_request.TEXT_PART_TYPES | {"message"}:
                return True
    return False


def _only_kv_params_reference(named, document):
    params = document.get(vllm_request.KV_KEY)
    room = {vllm_request.KV_KEY: int(vllm_request.KV_KEY in document)}
    if type(params) is dict:
        room.update((key, int(key in params)) for key in vllm_request.POLICED_KEYS)
    return all(count <= room.get(name, 0) for name, count in named.items())


class _Text(str):
    """A string that is not exactly ``str``: a type it holds names no type."""


_NAMES = st.sampled_from(
    [vllm_request.KV_KEY, *vllm_request.POLICED_KEYS, *vllm_request.CARRIER_NAMES[:6], "x"]
)
_KINDS = st.one_of(
    st.sampled_from(["text", "input_text", "output_text", "message", "image_url", ""]),
    st.builds(_Text, st.sampled_from(["text", "message"])),
    st.none(),
    st.integers(0, 1),
    st.lists(st.just("text"), max_size=1),
)
_PART = st.one_of(
    st.fixed_dictionaries({}, optional={"type": _KINDS, "text": st.just("t")}),
    st.just("text"),
    st.none(),
)
_CONTENT = st.one_of(
    st.none(),
    st.just("hi"),
    st.builds(_Text, st.just("hi")),
    st.lists(_PART, max_size=3),
    st.integers(0, 1),
    st.fixed_dictionaries({"type": _KINDS}),
)
_ITEM = st.one_of(
    st.fixed_dictionaries({}, optional={"content": _CONTENT, "type": _KINDS, "role": st.just("u")}),
    st.just("m"),
    st.none(),
)
_ITEMS = st.one_of(st.none(), st.just("s"), st.lists(_ITEM, max_size=4), st.integers(0, 1))
_DOCUMENT = st.fixed_dictionaries(
    {},
    optional={
        "echo": st.one_of(st.none(), st.booleans(), st.integers(0, 1), st.just("")),
        "system": _CONTENT,
        "messages": _ITEMS,
        "input": _ITEMS,
        # A policed key's name at the top level is no policed key.
        vllm_request.IDS_KEY: st.none(),
        vllm_request.KV_KEY: st.one_of(
            st.none(),
            st.lists(st.none(), max_size=1),
            st.dictionaries(_NAMES, st.none(), max_size=3),
        ),
    },
)


@given(_DOCUMENT)
def test_ignores_reused_ids_answers_as_its_definition(document):
    assert ignores_reused_ids(document) is _ignores_reference(document)


@pytest.mark.parametrize(
    "document",
    [
        # A type or content that is a str subclass: only a plain string names a type.
        {"messages": [{"content": "hi", "type": _Text("message")}]},
        {"messages": [{"content": [{"type": _Text("text")}]}]},
        {"messages": [{"content": _Text("hi")}]},
        {"system": _Text("s"), "messages": [{"content": "hi"}]},
        {"system": [{"type": "text"}, {"type": "image_url"}]},
        {"input": [{"content": None, "type": "input_text"}]},
    ],
)
def test_ignores_reused_ids_on_the_edges_of_a_plain_string(document):
    assert ignores_reused_ids(document) is _ignores_reference(document)


@given(st.one_of(st.none(), st.dictionaries(_NAMES, st.none(), max_size=4)))
def test_policed_keys_answers_as_its_definition(params):
    assert policed_keys(params or {}) == _policed_keys_reference(params or {})


@given(st.dictionaries(_NAMES, st.integers(-1, 3), max_size=5), _DOCUMENT)
def test_only_kv_params_answers_as_its_definition(named, document):
    assert vllm_request.only_kv_params(named, document) is _only_kv_params_reference(
        named, document
    )


@pytest.mark.parametrize(
    ("named", "document", "alone"),
    [
        ({"prompt_token_ids": 1}, {"kv_transfer_params": {"prompt_token_ids": []}}, True),
        ({"prompt_token_ids": 1}, {"prompt_token_ids": [], "kv_transfer_params": {}}, False),
        ({"prompt_token_ids": 1}, {"kv_transfer_params": []}, False),
        ({"kv_transfer_params": 1, "prompt_features": 0}, {"kv_transfer_params": None}, True),
        ({"kv_transfer_params": 2}, {"kv_transfer_params": {}}, False),
        ({"tokens": 1}, {"tokens": 1}, False),
        ({"tokens": 0}, {}, True),
    ],
)
def test_only_kv_params_counts_each_name_against_its_own_room(named, document, alone):
    assert vllm_request.only_kv_params(named, document) is alone
    assert _only_kv_params_reference(named, document) is alone
