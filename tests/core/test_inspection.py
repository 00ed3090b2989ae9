"""A request's inspection: what its headers say and what its body decides, through the
stream (``Driven``) and as values."""

import json

import pytest

from bench import bodies
from ext_proc.core import inspection, memory, mint, reading, splice
from ext_proc.core.budget import Account, Budget
from ext_proc.core.errors import PayloadTooLarge, ProtocolError, bad_request
from ext_proc.core.events import (
    ContinueBody,
    ContinueHeaders,
    Reject,
    RequestBody,
    RouteMetadata,
    StreamedBody,
    TimedOut,
)
from ext_proc.core.policy import Allow, Deny, Strip
from ext_proc.core.proof import Trust
from ext_proc.core.stream import State
from tests.core.messages import (
    AGGREGATED,
    BUFFERED,
    DISAGGREGATED,
    DUPLEX,
    IDS,
    JSON,
    KEYS,
    MALFORMED,
    MINT_ROUTE,
    PREFILL,
    REWRITTEN_MINT,
    deep,
    error_body,
    headers,
    new,
    only,
    streamed,
)
from tests.driver import Driven, config


def test_body_without_ids_passes_unchanged():
    stream = new()
    stream.handle(headers())
    assert stream.handle(RequestBody(b'{"messages": []}', True)) == [ContinueBody(None)]
    assert stream.decision == Allow("no_transfer_params")


def test_honor_flow_passes_unchanged_and_validates():
    stream = new()
    stream.handle(headers(DISAGGREGATED))
    assert stream.handle(RequestBody(IDS.encode(), True)) == [ContinueBody(None)]
    assert stream.decision == Allow("trusted_any_caller", 2)
    bad = new()
    bad.handle(headers(DISAGGREGATED))
    out_of_vocab = IDS.replace("[1, 2]", "[1, 50]").encode()
    error = error_body(bad.handle(RequestBody(out_of_vocab, True)))
    assert error["param"] == "kv_transfer_params.prompt_token_ids"
    assert error["type"] == "BadRequestError"
    assert isinstance(bad.decision, Deny)
    assert bad.decision.id_count == 2


@pytest.mark.parametrize(
    ("at", "value", "detail"),
    [(None, 49, None), (0, 50, "[0] = 50"), (5999, 50, "[5999] = 50"), (2500, 1 << 31, "[2500] =")],
)
def test_a_long_array_is_checked_against_the_routes_bound_as_it_is_read(
    at: int | None, value: int, detail: str | None
) -> None:
    """Ids long enough to be lifted from the bytes are checked against the honoring
    route's vocab_size in the pass that reads them: the same decision as a short list's,
    the same first out-of-vocabulary id named."""
    ids = [7] * 6000
    if at is not None:
        ids[at] = value
    body = json.dumps({"messages": [], "kv_transfer_params": {"prompt_token_ids": ids}})
    assert len(body) >= reading.LIFT_MIN_BYTES
    stream = new()
    stream.handle(headers(DISAGGREGATED))
    answers = stream.handle(RequestBody(body.encode(), True))
    if detail is None:
        assert answers == [ContinueBody(None)]
        assert stream.decision == Allow("trusted_any_caller", 6000)
        return
    assert isinstance(stream.decision, Deny)
    assert detail in error_body(answers)["message"]


def test_missing_metadata_means_aggregated_strip():
    stream = new()
    stream.handle(headers(RouteMetadata()))
    assert isinstance(only(stream.handle(RequestBody(IDS.encode(), True))), ContinueBody)
    assert isinstance(stream.decision, Strip)


def test_invalid_metadata_rejects_at_headers_even_without_body():
    stream = new()
    actions = stream.handle(headers(RouteMetadata({"action": "allow"}, 1.0), eos=True))
    error = error_body(actions)
    assert actions[0].status == 500
    assert error["message"] == "invalid_route_policy"
    assert actions[0].details == "token_policy_invalid_route_policy"
    assert stream.state is State.REJECTED


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_wrong_media_type_rejected_before_body(mode):
    stream = new()
    actions = stream.handle(headers(mode=mode, extra=(("content-type", b"text/plain"),)))
    assert error_body(actions)["code"] == 415
    assert stream.state is State.REJECTED
    assert stream.decision is not None
    assert stream.decision.reason == "unsupported_media_type"


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
@pytest.mark.parametrize("depth", [254, 255, 1000, 1023])
def test_deep_bodies_are_stripped_or_refused_never_raised(mode, depth):
    # orjson reads 1024 levels but writes 254; json.dumps stops at the recursion limit.
    budget = Budget(1 << 20)
    stream = new(budget=budget)
    stream.handle(headers(mode=mode))
    data = deep(depth)
    out = stream.handle(RequestBody(data, True))
    assert budget.used == 0
    if isinstance(stream.decision, Deny):
        assert depth > 255  # what orjson cannot write, json.dumps writes to ~1000 levels
        error = error_body(out)
        assert error["code"] == 400
        assert stream.decision.reason == "body_too_deep"
        assert only(out).details == "token_policy_body_too_deep"
        assert stream.state is State.REJECTED
        return
    assert isinstance(stream.decision, Strip)
    forwarded = only(out).replacement if mode is BUFFERED else streamed(out)
    expected = json.loads(data)
    del expected["kv_transfer_params"]
    assert json.loads(forwarded) == expected


def test_a_body_with_too_many_values_is_refused_before_it_is_parsed():
    stream = new(values=8)
    stream.handle(headers())
    raw = b'{"a": [1, 2, 3, 4, 5, 6, 7], "kv_transfer_params": {}}'
    refusal = error_body(stream.handle(RequestBody(raw, True)))
    assert refusal["code"] == 413
    assert "more than 8 JSON values" in refusal["message"]
    assert stream.decision.reason == "body_too_complex"


AUDIT_ROUTE = RouteMetadata(
    {"topology": "disaggregated", "vocab_size": "50", "audit": True, "trust_any_caller": True},
    4.0,
)


def audited(route=AGGREGATED, *, mode=BUFFERED, extra=JSON, global_audit=True):
    stream = Driven(max_body_bytes=1 << 20, audit=global_audit)
    first = stream.handle(headers(route, mode=mode, extra=extra))
    assert first == ([ContinueHeaders()] if mode is BUFFERED else [])
    return stream


def passes_unchanged(stream, data, mode=BUFFERED):
    actions = stream.handle(RequestBody(data, True))
    if mode is BUFFERED:
        assert actions == [ContinueBody(None)]
    else:
        assert streamed(actions) == data


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_audit_records_a_strip_but_forwards_unchanged(mode):
    stream = audited(mode=mode)
    passes_unchanged(stream, IDS.encode(), mode)
    assert isinstance(stream.decision, Strip)
    assert stream.audit


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_route_audit_records_a_denial_but_forwards_unchanged(mode):
    stream = audited(AUDIT_ROUTE, mode=mode, global_audit=False)
    passes_unchanged(stream, MALFORMED, mode)
    assert isinstance(stream.decision, Deny)
    assert stream.decision.reason == "ids_malformed"


def test_audit_records_media_type_and_parse_refusals():
    stream = audited(extra=(("content-type", b"text/plain"),))
    passes_unchanged(stream, b"not json at all")
    assert stream.decision.reason == "unsupported_media_type"
    stream = audited()
    passes_unchanged(stream, b"not json at all")
    assert stream.decision.reason == "body_not_json"


def test_audit_never_relaxes_limits_protocol_or_configuration():
    stream = Driven(max_body_bytes=10, audit=True)
    stream.handle(headers())
    assert error_body(stream.handle(RequestBody(b'{"a": "0123456789"}', True)))["code"] == 413
    stream = Driven(max_body_bytes=100, audit=True)
    stream.handle(headers())
    assert error_body(stream.handle(TimedOut()))["code"] == 408
    stream = Driven(max_body_bytes=100, audit=True)
    invalid = RouteMetadata({"action": "allow", "audit": True}, 2.0)
    assert error_body(stream.handle(headers(invalid)))["code"] == 500
    stream = Driven(max_body_bytes=100, audit=True)
    with pytest.raises(ProtocolError):
        stream.handle(RequestBody(b"{}", True))
    stream = Driven(max_body_bytes=1000, audit=True, budget=Budget(50))
    stream.handle(headers())
    assert error_body(stream.handle(RequestBody(b"x" * 100, True)))["code"] == 503


# Neither reader would take it whole (NaN, more values than allowed), yet no spelling
# of kv_transfer_params is in its bytes: nothing to judge, so it is not parsed.
UNPARSED = b'{"messages": [1, 2, 3, 4, 5, 6, 7, 8, 9], "n": NaN, "x": [[[[]]]]}'


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_a_body_without_the_key_is_forwarded_unparsed(mode):
    budget = Budget(1 << 20)
    stream = Driven(max_body_bytes=1 << 20, max_json_values=8, budget=budget)
    stream.handle(headers(mode=mode))
    out = stream.handle(RequestBody(UNPARSED, True))
    assert out in ([ContinueBody(None)], [ContinueHeaders(), StreamedBody(UNPARSED, True)])
    assert stream.decision == Allow("no_transfer_params")
    # Charged as bytes held, not as a parsed document.
    assert budget.peak == memory.held(len(UNPARSED))
    # The same body with the key is parsed: too many values.
    stream = Driven(max_body_bytes=1 << 20, max_json_values=8)
    stream.handle(headers(mode=mode))
    raw = UNPARSED[:-1] + b', "kv_transfer_params": null}'
    assert error_body(stream.handle(RequestBody(raw, True)))["code"] == 413


@pytest.mark.parametrize("spelling", ["PRECOMPUTED_EMBEDDING", "PROCESSOR_OUTPUT"])
def test_a_body_whose_only_carrier_is_an_upper_case_media_format_is_parsed_and_refused(spelling):
    # SGLang takes the format's enum name as it takes its lower-case value: the bytes'
    # search must name it, or the body would be forwarded unparsed.
    item = {"format": spelling, "feature": "AAAA", "input_ids": [1, 2], "hash": "h"}
    raw = json.dumps({"text": "describe", "image_data": [item]}).encode()
    stream = Driven()
    stream.handle(headers(AGGREGATED))
    error = error_body(stream.handle(RequestBody(raw, True)))
    assert (error["code"], error["param"]) == (400, "image_data.0")
    assert stream.decision.reason == "embeddings_refused"


def test_a_mint_route_parses_every_request_for_its_digest():
    stream = Driven(max_body_bytes=1 << 20)
    stream.handle(headers(MINT_ROUTE))
    assert error_body(stream.handle(RequestBody(b'{"messages": [}', True)))["code"] == 400
    assert stream.decision.reason == "body_not_json"


@pytest.mark.parametrize("route", ["mint", "proof"])
@pytest.mark.parametrize("depth", [255, 1000, 1023])
def test_deep_bodies_on_trust_routes_are_decided_or_refused_never_raised(route, depth):
    # The prompt digest renders the body too: past the recursion limit it is refused.
    proof_param = '"token_policy_proof":"tp3.k1.1.x","prompt_token_ids":[1]'
    data = deep(depth).replace(b'"prompt_token_ids":[1]', proof_param.encode())
    metadata = MINT_ROUTE if route == "mint" else RouteMetadata({"action": "honor"}, 1.0)
    stream = Driven(max_body_bytes=1 << 20, trust=Trust(keys=lambda: KEYS))
    stream.handle(headers(metadata))
    out = stream.handle(RequestBody(data, True))
    assert stream.decision is not None
    if isinstance(stream.decision, Deny):
        assert depth >= 1000
        assert only(out).details == "token_policy_body_too_deep"
    else:
        assert isinstance(only(out), ContinueBody)


@pytest.mark.parametrize(("size", "refused"), [(15 << 20, True), (1 << 20, False)])
def test_a_digest_only_json_dumps_renders_is_gated_like_the_slow_parse(size, refused):
    # A prefill request nested 300 levels deep: orjson reads them but writes 254, so
    # json.dumps renders its digest (nothing to strip: no rewrite). Within the slow
    # path's limits it is charged first; beyond them, 413 as the parse and the write.
    head = PREFILL[:-1] + b',"x":' + b"[" * 300 + b"]" * 300 + b',"pad":"'
    data = head + b"a" * (size - len(head) - 2) + b'"}'
    stream = Driven(max_body_bytes=16 << 20, trust=Trust(keys=lambda: KEYS))
    stream.handle(headers(MINT_ROUTE))
    out = stream.handle(RequestBody(data, True), sent=False)
    if refused:
        assert only(out).status == 413
        assert only(out).details == "token_policy_body_needs_slow_parse"
    else:
        assert isinstance(only(out), ContinueBody)
        assert stream.last is not None
        charged = memory.cost(size, reading.scan(data).values) + memory.slow_extra(size)
        assert stream.last.held == charged


def test_a_path_outside_the_routes_match_prefix_is_invalid_metadata():
    stream = new()
    (answer,) = stream.handle(headers(REWRITTEN_MINT, path="/pd/v1/chat/completions"))
    assert isinstance(answer, Reject)
    assert answer.status == 500
    assert answer.details == "token_policy_invalid_route_policy"
    # The client learns the reason only; the detail is the operator's (the log's).
    error = json.loads(answer.body)["error"]
    assert error == {
        "message": "invalid_route_policy",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
    assert stream.last is not None
    assert stream.last.outcome is not None
    denied = stream.last.outcome.decision
    assert isinstance(denied, Deny)
    assert "match_prefix" in (denied.refusal.detail or "")


@pytest.mark.parametrize(
    "extra",
    [
        {"ec_transfer_params": {"consumer_zmq": "tcp://10.0.0.9:1"}},
        {"vllm_xargs": {"kv_transfer_params": "x", "n": 1}},
        {"vllm_xargs": {"ec_transfer_params": [1]}},
    ],
)
def test_other_carriers_are_found_and_removed(extra):
    raw = json.dumps({"messages": [], **extra}).encode()
    stream = new()
    stream.handle(headers())
    (answer,) = stream.handle(RequestBody(raw, True))
    assert isinstance(answer, ContinueBody)
    assert answer.replacement is not None
    forwarded = json.loads(answer.replacement)
    assert "ec_transfer_params" not in forwarded
    assert "kv_transfer_params" not in forwarded.get("vllm_xargs", {})
    assert stream.outcome.decision.reason == "stripped_by_policy"


@pytest.mark.parametrize(
    ("extra", "kept"),
    [
        ({"nvext": {"token_data": [7], "backend_instance_id": 3, "x": 1}}, {"nvext": {"x": 1}}),
        ({"tokens": {"token_ids": [7]}}, {}),
        ({"tokens": [7, 8]}, {"tokens": [7, 8]}),  # vLLM's /detokenize input
        ({"prompt_token_ids": [7], "prompt_features": "f"}, {}),
        ({"request_id": "x___prefill_addr_10.0.0.9:7___decode_addr_"}, {}),
        # Spelled inside a string only: parsed, nothing to remove.
        ({"messages": [{"role": "user", "content": '"tokens" and "request_id"'}]}, None),
    ],
)
def test_the_other_stacks_carriers_are_found_and_removed(extra, kept):
    raw = json.dumps({"model": "m", **extra}).encode()
    stream = new()
    stream.handle(headers())
    (answer,) = stream.handle(RequestBody(raw, True))
    assert isinstance(answer, ContinueBody)
    if kept is None or kept == extra:
        assert answer.replacement is None
        assert stream.outcome.decision == Allow("no_transfer_params")
        return
    assert json.loads(answer.replacement) == {"model": "m", **kept}
    assert stream.outcome.decision.reason == "stripped_by_policy"


# --- the values themselves ---------------------------------------------------------------


def inspected(raw, route=AGGREGATED, *, audit=False, extra=JSON):
    """The request ``read`` from its headers, and what ``inspect`` makes of ``raw``."""
    settings = config(audit=audit)
    request = inspection.read(headers(route, extra=extra), settings, with_body=True)
    account = Account(Budget(1 << 30))
    return request, inspection.inspect(raw, request, account, settings, Trust())


def test_a_strip_is_one_value_with_its_replacement():
    _, found = inspected(IDS.encode())
    assert isinstance(found.decision, Strip)
    assert json.loads(found.replacement) == {"messages": []}
    assert (found.refused, found.pending, found.proof) == (None, mint.NOTHING, None)


@pytest.mark.parametrize("audit", [False, True])
def test_a_deny_is_refused_unless_audit_mode_lets_it_pass(audit):
    _, found = inspected(MALFORMED, DISAGGREGATED, audit=audit)
    assert isinstance(found.decision, Deny)
    assert found.decision.reason == "ids_malformed"
    assert found.refused is (None if audit else found.decision)
    assert found.replacement is None


def test_a_refusal_of_the_headers_that_audit_lets_pass_is_the_bodys_decision():
    plain = (("content-type", b"text/plain"),)
    request, found = inspected(IDS.encode(), audit=True, extra=plain)
    assert request.refused is None
    assert request.held is not None
    assert request.held.reason == "unsupported_media_type"
    assert found == inspection.Inspection(request.held)
    enforced = inspection.read(headers(extra=plain), config(), with_body=True)
    assert enforced.refused is not None
    assert enforced.held is None


def test_invalid_route_metadata_refuses_at_the_headers():
    request = inspection.read(
        headers(RouteMetadata({"action": "allow"}, 1.0)), config(), with_body=False
    )
    assert request.refused is not None
    assert request.refused.reason == "invalid_route_policy"
    assert (request.route, request.request_id, request.audit) == ("", "r1", False)


SCORING = json.dumps({"model": "m", "query": [5, 6, 7], "items": [[8, 9]]}).encode()


@pytest.mark.parametrize(
    "path",
    [
        "/generative_scoring",
        "/x/generative_scoring",
        "/GENERATIVE_SCORING/",
        "/generative_scoring%0A",
        "/generative_%73coring",
    ],
)
def test_a_token_endpoint_is_refused_unless_the_route_accepts_it(path):
    stream = new()
    error = error_body(stream.handle(headers(path=path)))
    assert "/generative_scoring" in error["message"]
    assert stream.decision.refusal.reason == "token_endpoint_refused"
    accepting = RouteMetadata({"action": "strip", "accept": "token_endpoints"}, 2.0)
    served = new()
    served.handle(headers(accepting, path=path))
    assert served.handle(RequestBody(SCORING, True)) == [ContinueBody(None)]


def test_a_token_endpoint_is_only_reported_in_audit_mode():
    audited = RouteMetadata({"action": "strip", "audit": True}, 2.0)
    stream = new()
    assert stream.handle(headers(audited, path="/generative_scoring")) == [ContinueHeaders()]
    assert stream.handle(RequestBody(SCORING, True)) == [ContinueBody(None)]
    assert stream.decision.refusal.reason == "token_endpoint_refused"


def test_a_path_that_only_ends_like_a_token_endpoint_is_served():
    stream = new()
    stream.handle(headers(path="/v1/my_generative_scoring"))
    assert stream.handle(RequestBody(SCORING, True)) == [ContinueBody(None)]


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/collective_rpc", "/collective_rpc"),
        ("/x/update_weights/", "/update_weights"),
        ("/v1/load_lora_adapter", "/v1/load_lora_adapter"),
        ("/dumper/anything", "/dumper/{method}"),
    ],
)
def test_an_internal_endpoint_is_refused_unless_the_route_accepts_it(path, named):
    stream = new()
    error = error_body(stream.handle(headers(path=path)))
    assert named in error["message"]
    assert stream.decision.refusal.reason == "internal_endpoint_refused"
    accepting = RouteMetadata({"action": "strip", "accept": "internal_endpoints"}, 2.0)
    served = new()
    served.handle(headers(accepting, path=path))
    assert served.handle(RequestBody(b"{}", True)) == [ContinueBody(None)]


# --- a strip cut out of the bytes ----------------------------------------------------------


def test_a_large_strip_is_cut_out_of_the_body_it_came_in():
    document = json.loads(bodies.build("1m", "strip").data)
    raw = json.dumps(document, ensure_ascii=False).encode()  # spaced: not as orjson writes
    _, found = inspected(raw)
    assert isinstance(found.decision, Strip)
    cut = raw.index(b', "kv_transfer_params"')
    assert found.replacement == raw[:cut] + b"}"


@pytest.mark.parametrize(
    ("raw", "forwarded"),
    [
        (
            b'{"model": "m", "kv_transfer_params": {"prompt_token_ids": [1, 2]}, "messages": []}',
            b'{"model": "m", "messages": []}',
        ),
        # An escape of no carrier's character: the byte scan answered, the cut stands.
        (
            b'{"c": "caf\\u00e9", "kv_transfer_params": {"a": 1}, "messages": []}',
            b'{"c": "caf\\u00e9", "messages": []}',
        ),
        # An escape that may spell a carrier's character, or twice the key: rewritten.
        (
            b'{"c": "\\u0061", "kv_transfer_params": {"a": 1}, "messages": []}',
            b'{"c":"a","messages":[]}',
        ),
        (
            b'{"kv_transfer_params": 1, "kv_transfer_params": {"a": 1}, "messages": []}',
            b'{"messages":[]}',
        ),
    ],
)
def test_a_strip_is_cut_where_the_cut_is_shown_and_rewritten_elsewhere(monkeypatch, raw, forwarded):
    monkeypatch.setattr(splice, "MIN_BYTES", 0)
    _, found = inspected(raw)
    assert isinstance(found.decision, Strip)
    assert found.replacement == forwarded


@pytest.mark.parametrize(
    "decision",
    [
        Allow("no_transfer_params"),
        Strip(None, "stripped_by_policy", 3),
        Deny(bad_request("x", reason="ids_malformed"), 2),
        Deny(PayloadTooLarge("big", reason="body_too_large").refusal()),
    ],
)
def test_without_audit_mode_every_decision_is_enforced(decision):
    # inspection._enforce asks only in audit mode.
    assert inspection.enforced(decision, False)
