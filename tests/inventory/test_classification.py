"""The classification holds every name of the committed inventory, once; a name it lacks
fails here (and in the release matrix), so a release that adds a carrier is decided
before the gateway claims it."""

import dataclasses
import json

from devstack import classified
from devstack.inventory import classification as c
from devstack.inventory import derive
from devstack.inventory.model import Source, inventory
from ext_proc.core import classified as lists
from ext_proc.tools import carrier_headers


def test_every_name_of_the_committed_inventory_has_a_class():
    assert derive.unclassified(classified.inventory()) == {}


def _with(**names) -> dict:
    base = Source(
        "toy",
        "1.0",
        "test",
        endpoints={"POST /v1/chat/completions": "Chat"},
        models={"Chat": {"messages": ("list:Message",)}, "Message": {"role": ()}},
    )
    return derive.unclassified(inventory([dataclasses.replace(base, **names)]))


def test_a_name_nobody_classified_fails_by_kind():
    assert _with() == {}
    nested = {"Chat": {"messages": ("list:Message",)}, "Message": {"next_carrier": ()}}
    assert _with(models=nested) == {"field": ["next_carrier (toy 1.0)"]}
    assert _with(headers=("x-next-peer",)) == {"header": ["x-next-peer (toy 1.0)"]}
    assert _with(part_types=("next_embeds",)) == {"part type": ["next_embeds (toy 1.0)"]}
    assert _with(endpoints={"POST /next": None}) == {"endpoint": ["POST /next (toy 1.0)"]}
    assert _with(reads=("nvext.next_hint",)) == {"field": ["next_hint (toy 1.0)"]}
    assert _with(connector_keys=("remote_next",)) == {"connector key": ["remote_next (toy 1.0)"]}
    # A key the connector bounds hold is classified there.
    assert _with(connector_keys=("tp_size",)) == {}
    # A member typed as any JSON needs a judgement of what is below it, unless it goes
    # whole (a carrier, the policy's own kv_transfer_params).
    untyped = {"Chat": {"messages": ("list:Message",), "next_args": ("*",)}, "Message": {}}
    assert _with(models=untyped) == {
        "field": ["next_args (toy 1.0)"],
        "untyped member": ["next_args (toy 1.0)"],
    }
    whole = {"Chat": {"messages": ("list:Message",), "rid": ("*",)}, "Message": {}}
    assert _with(models=whole) == {}


def test_no_name_is_in_two_classes():
    groups = (c._PROMPT, c._GENERATION, c._MODEL, c._SCHEDULING, c._METADATA, c._TRANSPORT)
    names = [name for group in groups for name in group.split()]
    names += [name for group in c._STACKS.values() for name in group.split()]
    names += [*c._BODY_CARRIERS, *c._PARTITIONS, *c._EMBEDDINGS]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)


def test_every_carrier_says_who_reads_it():
    for table in (c.FIELDS, c.HEADERS, c.PART_TYPES):
        for name, entry in table.items():
            if entry.cls in c.CARRIERS | {c.Class.EMBEDDINGS}:
                assert entry.why, name


def test_the_gateways_lists_hold_the_named_carriers():
    # The carriers this gateway was first asked to close, each from its own source.
    for path in [
        ("input_ids",),
        ("bootstrap_host",),
        ("bootstrap_port",),
        ("bootstrap_room",),
        ("rid",),
        ("nvext", "prefill_worker_id"),
        ("nvext", "decode_worker_id"),
        ("nvext", "dp_rank"),
        ("nvext", "prefill_dp_rank"),
        ("nvext", "backend_instance_id"),
        ("nvext", "token_data"),
    ]:
        assert path in lists.BODY_CARRIERS, path
    assert ("prompt_embeds",) in lists.EMBEDDING_MEMBERS
    assert ("input_embeds",) in lists.EMBEDDING_MEMBERS
    assert "prompt_embeds" in lists.EMBEDDING_PART_TYPES
    assert "/generative_scoring" in lists.TOKEN_ENDPOINTS
    for header in [
        "x-dynamo-worker-instance-id",
        "x-dynamo-prefill-instance-id",
        "x-dynamo-dp-rank",
        "x-dynamo-prefill-dp-rank",
        "x-worker-instance-id",
        "x-prefill-instance-id",
        "x-dp-rank",
        "x-prefill-dp-rank",
        "x-data-parallel-rank",
    ]:
        assert header in lists.HEADER_CARRIERS, header
    assert c.RENEWED_HEADER not in lists.HEADER_CARRIERS


def test_the_cache_partition_keys_are_one_class():
    # vLLM's and SGLang's salt, SGLang's radix namespace and Dynamo's tenant header.
    assert lists.PARTITION_MEMBERS == ("cache_salt", "extra_key")
    assert lists.PARTITION_HEADERS == ("x-cache-salt", "x-tenant-id")
    assert not {*lists.PARTITION_MEMBERS} & {path[-1] for path in lists.BODY_CARRIERS}
    assert "prompt_cache_key" not in lists.PARTITION_MEMBERS  # vLLM 0.32 ignores it


def test_members_below_which_servers_read_parameters_are_searched_at_any_depth():
    # Generated from the inventory's `*` references and the judgement of each name.
    for path in [
        ("vllm_xargs",),
        ("custom_params",),
        ("sampling_params",),
        ("sampling_params", "extra_args"),
        ("extra_args",),  # NVIDIA Dynamo's SGLang worker (a stack: the classification's)
        ("parameters", "sampling_params"),
        ("instances", "*", "sampling_params"),
    ]:
        assert path in lists.UNTYPED_MEMBERS, path
    # The caller's content is not: a schema's or a tool input's names are words there.
    for path in [("response_format", "json_schema", "schema"), ("chat_template_kwargs",)]:
        assert path not in lists.UNTYPED_MEMBERS, path
    # Nor anything that goes whole, or lies below what does.
    assert not any(
        path[0] == "kv_transfer_params" or "kv_hints" in path for path in lists.UNTYPED_MEMBERS
    )
    assert all(
        c.UNTYPED[derive.leaf(path)] is c.Untyped.PARAMETERS for path in lists.UNTYPED_MEMBERS
    )


def test_the_requests_other_endpoints_build_have_their_carriers():
    # SGLang's /vertex_generate builds a GenerateReqInput from `instances` and `parameters`.
    for path in [
        ("instances", "*", "input_ids"),
        ("parameters", "rid"),
        ("parameters", "bootstrap_host"),
        ("parameters", "bootstrap_port"),
        ("parameters", "bootstrap_room"),
        ("parameters", "routed_dp_rank"),
        ("parameters", "data_parallel_rank"),
        ("parameters", "custom_logit_processor"),
        ("parameters", "session_params"),
        ("vllm_xargs", "kv_cache_report_mode"),
        ("metadata_upload",),
        ("extra_args", "metadata_upload"),
        ("extra_args", "nvext", "metadata_upload"),
        ("nvext", "metadata_upload"),
    ]:
        assert path in lists.BODY_CARRIERS, path
    assert c.FIELDS["kv_cache_report_mode"].cls in c.CARRIERS
    assert c.FIELDS["metadata_upload"].cls in c.CARRIERS


def test_bodiless_routes_are_recorded_and_judged():
    # The committed inventory holds every route of the servers, a bodiless GET too; the
    # ones that disclose the configuration or act for the operator are internal.
    sources = classified.inventory().sources
    assert sources["vllm 0.32.0"].endpoints["GET /server_info"] is None
    assert sources["vllm 0.32.0"].endpoints["GET /v1/models"] is None
    assert sources["sglang 0.5.23"].endpoints["HEAD /"] is None
    internal = [
        ("vllm 0.32.0", "GET /server_info"),
        ("vllm 0.32.0", "GET /is_paused"),
        ("vllm 0.32.0", "GET /get_world_size"),
        ("vllm 0.32.0", "GET /fault_tolerance/status"),
        ("vllm 0.32.0", "GET /kv_event_sources"),
        ("sglang 0.5.23", "GET /remote_instance_transfer_engine_info"),
        ("sglang 0.5.23", "GET /get_remote_instance_transfer_engine_info"),
        ("sglang 0.5.23", "GET /list_external_corpora"),
    ]
    for source, endpoint in internal:
        assert endpoint in sources[source].endpoints, (source, endpoint)
        path = endpoint.partition(" ")[2]
        assert c.ENDPOINTS[path] is c.Endpoint.INTERNAL, path
        assert path in lists.INTERNAL_ENDPOINTS, path
    for path in ["/health", "/v1/models", "/version", "/load", "/"]:
        assert c.ENDPOINTS[path] is c.Endpoint.PUBLIC, path
        assert path not in lists.INTERNAL_ENDPOINTS, path


def test_a_bodiless_route_nobody_classified_fails():
    assert _with(endpoints={"POST /v1/chat/completions": "Chat", "GET /next_info": None}) == {
        "endpoint": ["GET /next_info (toy 1.0)"]
    }


def test_the_catalog_of_declared_bodies_holds_only_routes_that_take_one():
    source = Source(
        "toy",
        "1.0",
        "test",
        endpoints={"POST /chat": "Chat", "GET /models": None, "GET /session": "Chat"},
        models={"Chat": {"messages": ()}},
    )
    catalog = json.loads(derive.catalog(inventory([source])))
    assert catalog["engines"]["toy 1.0"]["endpoints"] == {"/chat": "Chat", "/session": "Chat"}


def _toy(endpoints: dict, models: dict) -> Source:
    return Source("toy", "1.0", "test", endpoints=endpoints, models=models)


def test_a_tenant_route_serves_an_api_only_where_every_engine_carries_the_salt():
    salted = {"Chat": {"messages": (), "cache_salt": ()}}
    bare = {"Chat": {"messages": ()}}
    chat = {"POST /v1/chat/completions": "Chat"}
    one = dataclasses.replace(_toy(chat, salted), engine="one")
    other = dataclasses.replace(_toy(chat, bare), engine="other")
    assert "/v1/chat/completions" in derive.salted(inventory([one]))
    assert "/v1/chat/completions" not in derive.salted(inventory([one, other]))
    # A body read without a model carries nothing the gateway can point to.
    assert derive.salted(inventory([_toy({"POST /v1/chat/completions": None}, {})])) == ()


def test_the_committed_tenant_lists_part_every_endpoint():
    known = set(c.ENDPOINTS)
    served = set(lists.TENANT_ENDPOINTS)
    assert served | set(lists.UNTENANTED_ENDPOINTS) == known
    assert not served & set(lists.UNTENANTED_ENDPOINTS)
    assert served >= c.UNCACHED
    assert all(c.ENDPOINTS[path] is c.Endpoint.SERVED for path in c.UNCACHED)
    # Served by a tenant route only where the salt reaches the engine, or nothing is cached.
    for path in ("/api/chat", "/api/generate", "/vertex_generate", "/v1/messages", "/v2/embed"):
        assert path in lists.UNTENANTED_ENDPOINTS


def test_vllms_coming_cache_salt_header_is_a_partition_header_the_step_removes():
    """vLLM PR #57609 (open) reads X-Cache-Salt before the body's cache_salt: a client's
    copy would undo the partition the gateway writes from the tenant. No release of the
    inventory reads it yet, so the classification lists it with the pull request."""
    entry = c.HEADERS["x-cache-salt"]
    assert entry.cls is c.Class.PARTITION
    assert "vllm-project/vllm PR #57609" in entry.why
    assert not any("x-cache-salt" in s.headers for s in classified.inventory().sources.values())
    assert "x-cache-salt" in lists.PARTITION_HEADERS
    assert "x-cache-salt" in carrier_headers.removed()


def test_routes_the_reader_does_not_see_are_classified_with_where_they_are():
    """vLLM 0.32 registers a StaticFiles mount at /static (--enable-offline-docs), the
    DP supervisor's /readyz, FastAPI's own pages and the /v1/realtime WebSocket: none is
    a route decorator in a module named for routes, so none is in the inventory."""
    vllm = classified.inventory().sources["vllm 0.32.0"].endpoints
    for path in ("/readyz", "/openapi.json", "/redoc", "/docs/oauth2-redirect", "/v1/realtime"):
        assert not any(endpoint.endswith(f" {path}") for endpoint in vllm), path
    assert "/static" in c.MOUNTS
    assert lists.MOUNTS == ("/metrics", "/static")
    for path in ("/readyz", "/openapi.json", "/redoc", "/docs/oauth2-redirect"):
        assert c.ENDPOINTS[path] is c.Endpoint.PUBLIC, path
        assert path in lists.TENANT_ENDPOINTS, path
    assert c.ENDPOINTS["/v1/realtime"] is c.Endpoint.SERVED
    assert "/v1/realtime" in lists.UNTENANTED_ENDPOINTS
