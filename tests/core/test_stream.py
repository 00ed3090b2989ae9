import contextlib
import json

import pytest

from ext_proc.core import memory, proof, reading, vllm_request
from ext_proc.core.budget import Budget
from ext_proc.core.errors import ProtocolError
from ext_proc.core.events import (
    BodyMode,
    ContinueBody,
    ContinueHeaders,
    ContinueResponseBody,
    ContinueResponseHeaders,
    ContinueTrailers,
    Reject,
    RequestBody,
    RequestHeaders,
    RequestTrailers,
    ResponseBody,
    ResponseHeaders,
    RouteMetadata,
    StreamedBody,
    TimedOut,
    Unexpected,
)
from ext_proc.core.policy import Allow, Deny, Mint, Strip
from ext_proc.core.proof import Trust
from ext_proc.core.stream import STREAM_CHUNK, State
from tests.driver import Driven

JSON = (("content-type", b"application/json"), ("x-request-id", b"r1"))
AGGREGATED = RouteMetadata({"topology": "aggregated", "action": "strip"}, 2.0)
# Id validation on a route that trusts any caller; proofs are tested further down.
DISAGGREGATED = RouteMetadata(
    {"topology": "disaggregated", "vocab_size": "50", "trust_any_caller": True}, 3.0
)
IDS = json.dumps({"messages": [], "kv_transfer_params": {"prompt_token_ids": [1, 2], "k": 1}})
STRIPPED = {"messages": []}  # untrusted: the whole kv_transfer_params object goes
BUFFERED = BodyMode.BUFFERED
DUPLEX = BodyMode.FULL_DUPLEX_STREAMED


# The path every test request is for (the upstream path: test routes rewrite nothing).
CHAT_PATH = "/v1/chat/completions"


def headers(route=AGGREGATED, *, eos=False, mode=BUFFERED, extra=JSON, path=CHAT_PATH):
    return RequestHeaders(extra, eos, mode, route, path=path)


def new(limit=1 << 20, budget=None, values=262_144):
    return Driven(max_body_bytes=limit, max_json_values=values, budget=budget)


def only(actions):
    (action,) = actions
    return action


def error_body(actions):
    action = only(actions)
    assert isinstance(action, Reject)
    payload = json.loads(action.body)
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["code"] == action.status
    assert action.details.startswith("token_policy_")
    return payload["error"]


def streamed(actions):
    """The headers answer followed by the streamed body; returns the joined body."""
    assert actions[0] == ContinueHeaders()
    pieces = actions[1:]
    assert pieces
    assert all(isinstance(p, StreamedBody) for p in pieces)
    assert [p.end_of_stream for p in pieces] == [False] * (len(pieces) - 1) + [True]
    return b"".join(p.chunk for p in pieces)


# --- BUFFERED mode ---------------------------------------------------------------


def test_strip_flow():
    stream = new()
    assert stream.handle(headers()) == [ContinueHeaders()]
    action = only(stream.handle(RequestBody(IDS.encode(), True)))
    assert isinstance(action, ContinueBody)
    assert json.loads(action.replacement) == STRIPPED
    assert action.length_header  # the headers Envoy holds get the new content-length
    assert isinstance(stream.decision, Strip)
    assert stream.state is State.DONE


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
    assert "ext_proc.token_policy.action" in error["message"]
    assert actions[0].details == "token_policy_invalid_route_policy"
    assert stream.state is State.REJECTED


def test_request_without_body_is_allowed():
    stream = new()
    assert stream.handle(headers(eos=True)) == [ContinueHeaders()]
    assert stream.decision == Allow("no_body")
    assert stream.state is State.DONE


@pytest.mark.parametrize(
    "mode", [BodyMode.NONE, BodyMode.STREAMED, BodyMode.BUFFERED_PARTIAL, BodyMode.GRPC]
)
def test_uninspectable_body_mode_is_a_protocol_error(mode):
    stream = new()
    with pytest.raises(ProtocolError):
        stream.handle(headers(mode=mode))
    assert stream.state is State.ERROR


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_wrong_media_type_rejected_before_body(mode):
    stream = new()
    actions = stream.handle(headers(mode=mode, extra=(("content-type", b"text/plain"),)))
    assert error_body(actions)["code"] == 415
    assert stream.state is State.REJECTED
    assert stream.decision is not None
    assert stream.decision.reason == "unsupported_media_type"


def test_unparseable_body_denied():
    stream = new()
    stream.handle(headers())
    error = error_body(stream.handle(RequestBody(b'{"a": ', True)))
    assert error["code"] == 400
    assert "not valid JSON" in error["message"]


def test_oversized_body_denied_with_413():
    stream = new(limit=10)
    stream.handle(headers())
    actions = stream.handle(RequestBody(b'{"a": "0123456789"}', True))
    assert error_body(actions)["code"] == 413
    assert isinstance(stream.decision, Deny)


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_announced_oversized_body_denied_at_headers(mode):
    stream = new(limit=10)
    actions = stream.handle(headers(mode=mode, extra=(*JSON, ("content-length", b"11"))))
    assert error_body(actions)["code"] == 413


def test_body_then_trailers():
    stream = new()
    stream.handle(headers())
    assert isinstance(only(stream.handle(RequestBody(IDS.encode(), False))), ContinueBody)
    assert stream.state is State.EXPECT_TRAILERS
    assert stream.handle(RequestTrailers()) == [ContinueTrailers()]
    assert stream.state is State.DONE


def test_trailers_without_body_denied():
    stream = new()
    stream.handle(headers())
    assert error_body(stream.handle(RequestTrailers()))["code"] == 400


def deep(depth):
    """A body ``depth`` levels deep with parameters to strip (the outer object: level 1)."""
    inner = '{"a":' * (depth - 1) + "1" + "}" * (depth - 1)
    return f'{{"kv_transfer_params":{{"prompt_token_ids":[1]}},"x":{inner}}}'.encode()


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


# --- FULL_DUPLEX_STREAMED mode ------------------------------------------------------


def feed(stream, data, size, *, empty_final=False):
    """Feed ``data`` in chunks of ``size``; every answer before the end must be empty."""
    pieces = [data[i : i + size] for i in range(0, len(data), size)]
    for piece in pieces[:-1]:
        assert stream.handle(RequestBody(piece, False)) == []
    if empty_final:
        assert stream.handle(RequestBody(pieces[-1], False)) == []
        return stream.handle(RequestBody(b"", True))
    return stream.handle(RequestBody(pieces[-1], True))


def test_duplex_holds_headers_and_chunks_until_the_end():
    stream = new()
    assert stream.handle(headers(mode=DUPLEX)) == []
    assert stream.waiting_for_body
    out = feed(stream, IDS.encode(), 7)
    assert json.loads(streamed(out)) == STRIPPED
    assert stream.state is State.DONE
    assert not any(isinstance(a, ContinueBody) for a in out)


def test_duplex_empty_final_chunk():
    stream = new()
    stream.handle(headers(mode=DUPLEX))
    assert json.loads(streamed(feed(stream, IDS.encode(), 10, empty_final=True))) == STRIPPED


def test_duplex_unchanged_body_is_sent_back_byte_for_byte():
    data = json.dumps({"messages": [], "x": "y" * 100}).encode() + b"  "
    stream = new()
    stream.handle(headers(DISAGGREGATED, mode=DUPLEX))
    assert streamed(feed(stream, data, 9)) == data


def test_duplex_large_body_is_split_into_pieces():
    ids = list(range(40)) * 30000
    data = json.dumps({"kv_transfer_params": {"prompt_token_ids": ids}}).encode()
    assert len(data) > 2 * STREAM_CHUNK
    stream = new(limit=8 << 20, values=2 << 20)
    stream.handle(headers(DISAGGREGATED, mode=DUPLEX))
    out = feed(stream, data, 65536)
    assert len(out) == 1 + -(-len(data) // STREAM_CHUNK)
    assert streamed(out) == data


def test_duplex_repeated_final_chunk_is_ignored():
    stream = new()
    stream.handle(headers(mode=DUPLEX))
    data = IDS.encode()
    feed(stream, data, 10)
    last = data[(len(data) - 1) // 10 * 10 :]
    assert stream.handle(RequestBody(last, True)) == []
    with pytest.raises(ProtocolError):
        stream.handle(RequestBody(b"different", True))


def test_duplex_denial_is_an_immediate_response_and_nothing_else():
    stream = new()
    stream.handle(headers(DISAGGREGATED, mode=DUPLEX))
    out = feed(stream, IDS.replace("[1, 2]", "[1, true]").encode(), 5)
    assert error_body(out)["code"] == 400


def test_duplex_oversized_body_denied_as_soon_as_it_exceeds():
    stream = new(limit=20)
    stream.handle(headers(mode=DUPLEX))
    assert stream.handle(RequestBody(b"x" * 15, False)) == []
    assert error_body(stream.handle(RequestBody(b"x" * 15, False)))["code"] == 413


def test_duplex_trailers_denied():
    stream = new()
    stream.handle(headers(mode=DUPLEX))
    stream.handle(RequestBody(b"{}", False))
    assert error_body(stream.handle(RequestTrailers()))["code"] == 400


def test_buffered_stream_never_accepts_a_repeated_body():
    stream = new()
    stream.handle(headers())
    stream.handle(RequestBody(IDS.encode(), True))
    with pytest.raises(ProtocolError):
        stream.handle(RequestBody(IDS.encode(), True))


# --- timeouts and the in-flight budget ----------------------------------------------


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_body_timeout_answers_408(mode):
    stream = new()
    stream.handle(headers(mode=mode))
    assert error_body(stream.handle(TimedOut()))["code"] == 408


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_exhausted_budget_answers_503_with_retry_after(mode):
    budget = Budget(400)
    holder = new(budget=budget)
    holder.handle(headers(mode=DUPLEX))
    holder.handle(RequestBody(b"x" * 80, False))
    assert budget.used == memory.held(80) == 320
    stream = new(budget=budget)
    stream.handle(headers(mode=mode))
    actions = stream.handle(RequestBody(b"y" * 30, mode is BUFFERED))
    assert error_body(actions)["code"] == 503
    assert actions[0].headers == (("retry-after", b"1"),)
    holder.close()
    assert budget.used == 0


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_an_announced_body_is_charged_only_when_it_arrives(mode):
    # Announcing a large body and never sending it costs the gateway nothing: streams
    # that only announce cannot starve the ones that send.
    budget = Budget(memory.cost(1 << 20, 262_144))
    announced = (*JSON, ("content-length", str(1 << 20).encode()))
    idle = [new(budget=budget) for _ in range(16)]
    for stream in idle:
        stream.handle(headers(mode=mode, extra=announced))
    assert budget.used == 0
    sender = new(budget=budget)
    sender.handle(headers(mode=mode, extra=(*JSON, ("content-length", str(len(IDS)).encode()))))
    out = sender.handle(RequestBody(IDS.encode(), True))
    assert not isinstance(out[0], Reject)
    assert budget.peak == memory.cost(len(IDS), reading.scan(IDS.encode()).values)
    assert budget.used == 0


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_a_rewritten_body_stays_charged_until_it_is_sent(mode):
    # The rewrite and its protobuf message are held while gRPC sends them.
    budget = Budget(1 << 20)
    stream = new(budget=budget)
    stream.handle(headers(mode=mode))
    stream.handle(RequestBody(IDS.encode(), True), sent=False)
    assert stream.decision.action == "strip"
    assert budget.used == memory.cost(len(IDS), reading.scan(IDS.encode()).values)
    stream.release()
    assert budget.used == 0


SLOW_BODIES = {
    # orjson refuses NaN: json.loads reads it; empty parameters, nothing is written back.
    "json.loads": b'{"n": NaN, "messages": [], "kv_transfer_params": {}}',
    # orjson reads 300 levels but writes only 254: json.dumps writes the stripped body.
    "json.dumps": ('{"d": ' + "[" * 300 + "]" * 300 + ', "kv_transfer_params": {"x": 1}}').encode(),
}


@pytest.mark.parametrize("slow", sorted(SLOW_BODIES))
def test_the_slow_path_is_charged_before_it_runs(slow):
    raw = SLOW_BODIES[slow]
    budget = Budget(1 << 20)
    stream = new(budget=budget)
    stream.handle(headers())
    assert not isinstance(only(stream.handle(RequestBody(raw, True))), Reject)
    shape = reading.scan(raw)
    assert budget.peak == memory.cost(len(raw), shape.values) + memory.slow_extra(len(raw))
    # Not affordable: refused before the slow parser or writer runs.
    tight = Budget(memory.cost(len(raw), shape.values))
    stream = new(budget=tight)
    stream.handle(headers())
    assert error_body(stream.handle(RequestBody(raw, True)))["code"] == 503
    assert tight.used == 0


def test_a_body_with_too_many_values_is_refused_before_it_is_parsed():
    stream = new(values=8)
    stream.handle(headers())
    raw = b'{"a": [1, 2, 3, 4, 5, 6, 7], "kv_transfer_params": {}}'
    refusal = error_body(stream.handle(RequestBody(raw, True)))
    assert refusal["code"] == 413
    assert "more than 8 JSON values" in refusal["message"]
    assert stream.decision.reason == "body_too_complex"


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_budget_released_on_every_ending(mode):
    budget = Budget(1000)
    for ending in (TimedOut(), RequestBody(b"not json", True), Unexpected("response_body")):
        stream = new(budget=budget)
        stream.handle(headers(mode=mode, extra=(*JSON, ("content-length", b"9"))))
        if mode is DUPLEX:
            stream.handle(RequestBody(b"{", False))
            assert budget.used == memory.held(1)
        with contextlib.suppress(ProtocolError):
            stream.handle(ending)
        assert budget.used == 0  # released by the stream itself, not by the caller
    assert budget.peak > 0


# --- message order --------------------------------------------------------------------

OUT_OF_ORDER = [
    [RequestBody(b"{}", True)],
    [RequestTrailers()],
    [TimedOut()],
    [Unexpected("response_headers")],
    [Unexpected("empty")],
    [Unexpected("observability_mode")],
    [headers(), headers()],
    [headers(mode=DUPLEX), headers()],
    [headers(), RequestBody(b"{}", True), RequestTrailers()],
    [headers(eos=True), RequestBody(b"{}", True)],
    [headers(eos=True), headers()],
    [headers(), Unexpected("response_body")],
    [headers(), RequestBody(b"{}", False), RequestBody(b"{}", True)],
    [headers(), RequestBody(b"{}", False), RequestTrailers(), RequestTrailers()],
    [headers(), RequestBody(b"{}", True), TimedOut()],
    [headers(mode=DUPLEX), RequestBody(b"{}", True), RequestBody(b"{}", False)],
]


@pytest.mark.parametrize("events", OUT_OF_ORDER)
def test_out_of_order_and_repeated_messages_are_protocol_errors(events):
    stream = new()
    *prefix, last = events
    for event in prefix:
        stream.handle(event)
    with pytest.raises(ProtocolError):
        stream.handle(last)
    assert stream.state is State.ERROR


def test_error_state_is_sticky():
    stream = new()
    with pytest.raises(ProtocolError):
        stream.handle(RequestBody(b"{}", True))
    for event in (headers(), RequestBody(b"{}", True), RequestTrailers()):
        with pytest.raises(ProtocolError):
            stream.handle(event)


def test_after_reject_late_chunks_and_trailers_are_dropped_unanswered():
    # Streamed mode: chunks Envoy read before our ImmediateResponse still arrive.
    budget = Budget(memory.held(64))
    stream = new(budget=budget)
    assert stream.handle(headers(mode=DUPLEX)) == []  # chunked: no length to reserve
    assert stream.handle(RequestBody(b"x" * 40, False)) == []
    assert error_body(stream.handle(RequestBody(b"x" * 40, False)))["code"] == 503
    assert stream.state is State.REJECTED
    assert budget.used == 0
    assert stream.handle(RequestBody(b"x" * 40, False)) == []
    assert stream.handle(RequestBody(b"x" * 20, True)) == []
    assert stream.handle(RequestTrailers()) == []
    assert budget.used == 0
    assert isinstance(stream.decision, Deny)


def test_rejected_at_headers_then_late_chunks_are_dropped():
    budget = Budget(1000)
    stream = new(limit=64, budget=budget)
    actions = stream.handle(headers(mode=DUPLEX, extra=(*JSON, ("content-length", b"100"))))
    assert error_body(actions)["code"] == 413
    assert stream.handle(RequestBody(b"x" * 100, True)) == []
    assert budget.used == 0


def test_after_reject_other_messages_are_protocol_errors():
    stream = new()
    stream.handle(headers())
    stream.handle(RequestBody(b"nope", True))
    with pytest.raises(ProtocolError):
        stream.handle(headers())


# --- audit mode -----------------------------------------------------------------------

AUDIT_ROUTE = RouteMetadata(
    {"topology": "disaggregated", "vocab_size": "50", "audit": True, "trust_any_caller": True},
    4.0,
)
MALFORMED = IDS.replace("[1, 2]", "[1, true]").encode()


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


# --- one message per request (request_header_mode SKIP) ----------------------------------


def first_body(data, route=AGGREGATED, extra=JSON, mode=BUFFERED, eos=True):
    # Envoy evaluated a skipped headers message's attributes after routing.
    preamble = RequestHeaders(extra, False, mode, route, path=CHAT_PATH)
    return RequestBody(data, eos, preamble)


def test_headerless_body_is_decided_in_one_message():
    stream = new()
    (action,) = stream.handle(first_body(IDS.encode()))
    assert isinstance(action, ContinueBody)
    assert json.loads(action.replacement) == STRIPPED
    # Envoy skipped the headers: it applies no header mutation and drops content-length.
    assert not action.length_header
    assert stream.state is State.DONE
    assert stream.route_name == ""


def test_headerless_body_checks_headers_from_attributes():
    stream = new()
    assert error_body(stream.handle(first_body(IDS.encode(), extra=())))["code"] == 415
    stream = new()
    gz = (*JSON, ("content-encoding", b"gzip"))
    assert error_body(stream.handle(first_body(b"\x1f\x8b", extra=gz)))["code"] == 415


def test_headerless_body_applies_the_route_policy():
    stream = new()
    out = stream.handle(first_body(MALFORMED, route=DISAGGREGATED))
    assert error_body(out)["param"] == "kv_transfer_params.prompt_token_ids"


def test_headerless_body_without_preamble_or_in_streamed_mode_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        new().handle(RequestBody(IDS.encode(), True))
    with pytest.raises(ProtocolError):
        new().handle(first_body(IDS.encode(), mode=DUPLEX))


def test_headerless_trailers_without_a_body_are_an_empty_body_not_a_protocol_error():
    # One message per request and an HTTP/2 request with trailers and no DATA: the
    # trailers are the first message, with the attributes.
    preamble = first_body(b"").preamble
    stream = new()
    refusal = error_body(stream.handle(RequestTrailers(preamble)))
    assert (refusal["code"], refusal["message"]) == (400, "request body is empty")
    assert stream.state is State.REJECTED
    bad_route = first_body(b"", route=RouteMetadata({"action": "nope"}, 1.0)).preamble
    assert error_body(new().handle(RequestTrailers(bad_route)))["code"] == 500
    with pytest.raises(ProtocolError):  # no attributes: not a first message
        new().handle(RequestTrailers())


def test_headerless_body_then_trailers():
    stream = new()
    stream.handle(first_body(IDS.encode(), eos=False))
    assert stream.handle(RequestTrailers()) == [ContinueTrailers()]


# --- a body without the key is forwarded unparsed (spelling.spelled) -----------------

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


def test_a_mint_route_parses_every_request_for_its_digest():
    stream = Driven(max_body_bytes=1 << 20)
    stream.handle(headers(MINT_ROUTE))
    assert error_body(stream.handle(RequestBody(b'{"messages": [}', True)))["code"] == 400
    assert stream.decision.reason == "body_not_json"


# --- mint routes: the response is signed (docs/trust.md) ---------------------------

MINT_ROUTE = RouteMetadata({"topology": "disaggregated", "action": "mint"}, 2.0)
KEYS = proof.KeySet({"k1": b"k" * 32}, "k1")
PREFILL = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "return_token_ids": True}
).encode()
OK_JSON = ((":status", b"200"), ("content-type", b"application/json"))


def prefill_stream(limit=1 << 20, **options):
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=limit, trust=trust, **options)
    stream.handle(headers(MINT_ROUTE))
    assert stream.handle(RequestBody(PREFILL, True)) == [ContinueBody(None)]
    return stream


def response_outcome(stream, headers_=OK_JSON, raw=None):
    stream.outcome = None
    assert stream.handle(ResponseHeaders(headers_, raw is None)) == [ContinueResponseHeaders()]
    if raw is None:
        return None
    (answer,) = stream.handle(ResponseBody(raw, True))
    assert isinstance(answer, ContinueResponseBody)
    assert stream.state is State.RESPONSE_DONE
    return answer


def test_mint_signs_the_response_parameters():
    stream = prefill_stream()
    response = {"id": "c", "prompt_token_ids": [3, 4], "kv_transfer_params": None}
    answer = response_outcome(stream, raw=json.dumps(response).encode())
    assert stream.outcome.phase == "response"
    assert stream.outcome.decision == Mint("minted", 2)
    minted = json.loads(answer.replacement)
    params = minted.pop("kv_transfer_params")
    assert minted == {"id": "c", "prompt_token_ids": [3, 4]}
    assert params["prompt_token_ids"] == [3, 4]
    digest = proof.prompt_digest(json.loads(PREFILL), True, CHAT_PATH)
    assert proof.verify(KEYS, params, digest, now=1000.0, skew=0) is None
    expiry = 1000 + stream.config.proof.ttl_seconds
    assert params[proof.PROOF_KEY].split(".")[2] == str(expiry)  # clock + ttl


@pytest.mark.parametrize(
    ("headers_", "reason"),
    [
        (((":status", b"500"), ("content-type", b"application/json")), "response_not_ok"),
        (((":status", b"200"), ("content-type", b"text/event-stream")), "response_not_json"),
        ((*OK_JSON, ("content-encoding", b"gzip")), "response_encoded"),
    ],
)
def test_other_responses_pass_unchanged(headers_, reason):
    stream = prefill_stream()
    answer = response_outcome(stream, headers_, b'{"prompt_token_ids": [1]}')
    assert answer == ContinueResponseBody(None)
    assert stream.outcome.decision == Allow(reason)


def test_a_response_that_is_not_json_passes_unchanged():
    stream = prefill_stream()
    assert response_outcome(stream, raw=b"{oops") == ContinueResponseBody(None)
    assert stream.outcome.decision == Allow("response_not_json")


def test_a_response_whose_parameters_cannot_be_rendered_exactly_passes_unsigned():
    # orjson refuses NaN, json.loads reads it, and canonical() cannot sign it.
    budget = Budget(1 << 30)
    stream = prefill_stream(budget=budget)
    raw = b'{"prompt_token_ids": [1], "kv_transfer_params": {"x": NaN}}'
    assert response_outcome(stream, raw=raw) == ContinueResponseBody(None)
    assert stream.outcome.decision == Allow("not_renderable")
    assert budget.used == 0


PREFILL_COST = memory.cost(len(PREFILL), reading.scan(PREFILL).values)


def padded(size):
    """A response the stream would sign, exactly ``size`` bytes long."""
    head = b'{"prompt_token_ids": [1], "pad": "'
    return head + b"a" * (size - len(head) - 2) + b'"}'


@pytest.mark.parametrize(
    ("limits", "raw"),
    [
        pytest.param({}, padded((1 << 20) + 1), id="over_max_body_bytes"),
        pytest.param(
            {"max_json_values": reading.scan(PREFILL).values},
            json.dumps({"prompt_token_ids": list(range(1, 64))}).encode(),
            id="over_max_json_values",
        ),
        pytest.param({"budget_limit": PREFILL_COST}, padded(4 * len(PREFILL)), id="over_budget"),
    ],
)
def test_a_response_the_stream_cannot_afford_passes_unsigned_and_is_never_charged(limits, raw):
    values = limits.get("max_json_values", memory.MAX_JSON_VALUES)
    budget = Budget(limits.get("budget_limit", memory.largest(1 << 20, values)))
    stream = prefill_stream(budget=budget, max_json_values=values)
    assert response_outcome(stream, raw=raw) == ContinueResponseBody(None)
    assert stream.outcome.decision == Allow("response_not_affordable")
    assert budget.peak == PREFILL_COST  # the request's charge; none for the response
    assert budget.used == 0


@pytest.mark.parametrize(
    ("limit", "raw"),
    [
        # orjson reads 1000 levels but writes 254; json.dumps hits the recursion limit.
        pytest.param(1 << 20, deep(1000), id="past_the_recursion_limit"),
        # 300 levels in a body json.dumps may not write (over SLOW_PARSE_MAX_BYTES).
        pytest.param(
            2 * memory.SLOW_PARSE_MAX_BYTES,
            deep(300).replace(b'"x":', b'"pad":"' + b"a" * memory.SLOW_PARSE_MAX_BYTES + b'","x":'),
            id="over_the_json_dumps_size",
        ),
    ],
)
def test_a_response_too_deep_to_write_back_passes_unsigned(limit, raw):
    budget = Budget(memory.largest(limit, memory.MAX_JSON_VALUES))
    stream = prefill_stream(limit, budget=budget)
    assert response_outcome(stream, raw=raw) == ContinueResponseBody(None)
    assert stream.outcome.decision == Allow("response_too_deep")
    assert budget.used == 0


def test_a_response_whose_rewrite_the_budget_cannot_hold_passes_unsigned():
    # 300 levels: orjson reads it, only json.dumps writes it, and its extra charge does
    # not fit in a budget that holds the parsed response alone.
    raw = deep(300)
    budget = Budget(memory.cost(len(raw), reading.scan(raw).values))
    stream = prefill_stream(budget=budget)
    assert response_outcome(stream, raw=raw) == ContinueResponseBody(None)
    assert stream.outcome.decision == Allow("response_not_affordable")
    assert budget.used == 0


def test_audit_records_the_mint_but_changes_nothing():
    stream = prefill_stream(audit=True)
    answer = response_outcome(stream, raw=b'{"prompt_token_ids": [1]}')
    assert answer == ContinueResponseBody(None)
    assert stream.outcome.decision == Mint("minted", 1)


def test_only_mint_routes_sign():
    stream = Driven(max_body_bytes=1 << 20, trust=Trust(keys=lambda: KEYS))
    stream.handle(headers(AGGREGATED))
    stream.handle(RequestBody(PREFILL, True))
    answer = response_outcome(stream, raw=b'{"prompt_token_ids": [1]}')
    assert answer == ContinueResponseBody(None)
    assert stream.outcome.decision == Allow("not_minted_on_this_route")


def test_a_response_without_body_is_reported():
    stream = prefill_stream()
    assert response_outcome(stream, OK_JSON) is None
    assert stream.outcome.decision == Allow("response_without_body")


@pytest.mark.parametrize("with_body", [True, False])
def test_a_response_whose_request_the_processor_never_saw_passes_unsigned(with_body):
    # Envoy sends a mint route's response even when the request never reached the
    # processor: one without a body (one message per request), or Envoy's own answer or
    # an earlier filter's (a buffer limit's 413, a route header stated twice).
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    answers = stream.handle(ResponseHeaders(OK_JSON, not with_body))
    assert answers == [ContinueResponseHeaders()]
    if with_body:
        # Everything a prefill response carries, and still nothing is signed.
        answers = stream.handle(ResponseBody(SIGNED_RESPONSE, True))
        assert answers == [ContinueResponseBody(None)]
    assert stream.outcome is not None
    assert (stream.outcome.phase, stream.outcome.decision) == (
        "response",
        Allow("not_minted_on_this_route"),
    )
    with pytest.raises(ProtocolError):  # and then nothing more
        stream.handle(RequestBody(PREFILL, True))


def test_response_messages_out_of_order_are_protocol_errors():
    streamed = prefill_stream()
    streamed.handle(ResponseHeaders(OK_JSON, False))
    with pytest.raises(ProtocolError):
        streamed.handle(ResponseBody(b"{", False))


def test_a_repeated_final_chunk_during_the_response_is_ignored():
    # envoy#46237: the last request chunk can come again, even after the response began.
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    stream.handle(headers(MINT_ROUTE, mode=DUPLEX))
    stream.handle(RequestBody(PREFILL, True))
    stream.handle(ResponseHeaders(OK_JSON, False))
    assert stream.handle(RequestBody(PREFILL, True)) == []
    with pytest.raises(ProtocolError):
        stream.handle(RequestBody(b"{}", True))


@pytest.mark.parametrize("route", ["mint", "proof"])
@pytest.mark.parametrize("depth", [255, 1000, 1023])
def test_deep_bodies_on_trust_routes_are_decided_or_refused_never_raised(route, depth):
    # The prompt digest renders the body too: past the recursion limit it is refused.
    proof_param = '"token_policy_proof":"tp2.k1.1.x","prompt_token_ids":[1]'
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


# --- endpoints: where a mint route signs, what a proof is bound to ----------------------

SIGNED_RESPONSE = json.dumps({"id": "c", "prompt_token_ids": [3, 4]}).encode()
REWRITTEN_MINT = RouteMetadata(
    {
        "topology": "disaggregated",
        "action": "mint",
        "match_prefix": "/pd/prefill/v1/",
        "prefix_rewrite": "/v1/",
    },
    4.0,
)


@pytest.mark.parametrize(
    ("route", "path", "minted"),
    [
        (MINT_ROUTE, "/v1/chat/completions", True),
        (REWRITTEN_MINT, "/pd/prefill/v1/chat/completions", True),
        (REWRITTEN_MINT, "/pd/prefill/v1/chat/%63ompletions", True),  # vLLM decodes it
        # Endpoints that can echo the request, or whose ids are the request's.
        (MINT_ROUTE, "/v1/chat/completions/derender", False),
        (MINT_ROUTE, "/v1/completions/derender", False),
        (MINT_ROUTE, "/v1/chat/completions/render", False),
        (MINT_ROUTE, "/v1/completions", False),
        (MINT_ROUTE, "/inference/v1/generate", False),
        (MINT_ROUTE, "/tokenize", False),
        (MINT_ROUTE, "/v1/messages", False),
        (MINT_ROUTE, "/v1/responses", False),
        (REWRITTEN_MINT, "/pd/prefill/v1/chat/completions/derender", False),
        # Without the rewrite metadata the route's own path is not chat completions.
        (MINT_ROUTE, "/pd/prefill/v1/chat/completions", False),
    ],
)
def test_a_mint_route_signs_only_chat_completions(route, path, minted):
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    stream.handle(headers(route, path=path))
    assert stream.handle(RequestBody(PREFILL, True)) == [ContinueBody(None)]
    answer = response_outcome(stream, raw=SIGNED_RESPONSE)
    if minted:
        assert stream.outcome.decision == Mint("minted", 2)
        assert answer.replacement is not None
    else:
        assert stream.outcome.decision == Allow("endpoint_not_mintable")
        assert answer.replacement is None


def test_a_path_outside_the_routes_match_prefix_is_invalid_metadata():
    stream = new()
    (answer,) = stream.handle(headers(REWRITTEN_MINT, path="/pd/v1/chat/completions"))
    assert isinstance(answer, Reject)
    assert answer.status == 500
    assert answer.details == "token_policy_invalid_route_policy"
    assert b"match_prefix" in answer.body


def test_a_proof_minted_for_chat_completions_is_a_mismatch_elsewhere():
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    stream.handle(headers(MINT_ROUTE))
    stream.handle(RequestBody(PREFILL, True))
    answer = response_outcome(stream, raw=SIGNED_RESPONSE)
    params = json.loads(answer.replacement)["kv_transfer_params"]
    decode = {**json.loads(PREFILL), "kv_transfer_params": params}
    honor = RouteMetadata({"topology": "disaggregated", "action": "honor"}, 2.0)
    for path, reason in [
        ("/v1/chat/completions", "trusted_proof"),
        ("/v1/messages", "prompt_mismatch"),
        ("/v1/responses", "prompt_mismatch"),
    ]:
        stream = Driven(max_body_bytes=1 << 20, trust=trust)
        stream.handle(headers(honor, path=path))
        stream.handle(RequestBody(json.dumps(decode).encode(), True))
        assert stream.outcome.decision.reason == reason


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
    "extra",
    [
        # A member named as a carrier where vLLM reads none: its content could still
        # come back in a response, so nothing the response carries is signed.
        {"messages": [{"role": "user", "content": "hi", "kv_transfer_params": {"a": 1}}]},
        {"metadata": {"ec_transfer_params": {"a": 1}}},
        # Only the bytes are read for this: a string that is the name blocks it too.
        {"messages": [{"role": "user", "content": "kv_transfer_params"}]},
        # Two top-level members of the name (the last wins in vLLM's reading).
        "duplicate",
    ],
)
def test_a_mint_route_signs_nothing_for_a_request_that_names_a_carrier_elsewhere(extra):
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    stream.handle(headers(MINT_ROUTE))
    if extra == "duplicate":
        raw = b'{"kv_transfer_params": {"x": 1}, "messages": [], "kv_transfer_params": {}}'
    else:
        raw = json.dumps({**json.loads(PREFILL), **extra}).encode()
    (answer,) = stream.handle(RequestBody(raw, True))
    assert isinstance(answer, ContinueBody)
    answer = response_outcome(stream, raw=SIGNED_RESPONSE)
    assert stream.outcome.decision == Allow("request_may_echo")
    assert answer.replacement is None


def test_a_mint_route_signs_for_a_request_with_only_its_own_parameters():
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    stream.handle(headers(MINT_ROUTE))
    raw = json.dumps({**json.loads(PREFILL), "kv_transfer_params": {"do_remote_decode": True}})
    stream.handle(RequestBody(raw.encode(), True))
    response_outcome(stream, raw=SIGNED_RESPONSE)
    assert stream.outcome.decision == Mint("minted", 2)


@pytest.mark.parametrize(
    "extra",
    [
        {"tokens": {"token_ids": [1, 2], "features": None}},
        {"nvext": {"token_data": [1, 2]}},
        {"prompt_token_ids": [1, 2]},
        {"request_id": "r"},
    ],
)
def test_a_mint_route_signs_for_a_request_whose_other_stacks_carriers_it_removed(extra):
    # vLLM reads none of these: removed, they cannot come back in the response (an
    # orchestrator such as llm-d's coordinator writes ``tokens`` into its prefill leg).
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    stream.handle(headers(MINT_ROUTE))
    raw = json.dumps({**json.loads(PREFILL), **extra}).encode()
    (answer,) = stream.handle(RequestBody(raw, True))
    assert answer.replacement is not None
    emptied = {"nvext": {}} if "nvext" in extra else {}  # only the carrier's member goes
    assert json.loads(answer.replacement) == {**json.loads(PREFILL), **emptied}
    response_outcome(stream, raw=SIGNED_RESPONSE)
    assert stream.outcome.decision == Mint("minted", 2)


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


def test_one_message_per_request_gets_the_path_before_the_rewrite():
    # The buffer filter keeps the headers from the router: the attributes show the
    # path the client sent, rewritten by the processor as the router will.
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    for path, minted in [
        ("/pd/prefill/v1/chat/completions", True),
        ("/pd/prefill/v1/chat/completions/derender", False),
    ]:
        stream = Driven(max_body_bytes=1 << 20, trust=trust)
        preamble = RequestHeaders(JSON, False, BUFFERED, REWRITTEN_MINT, path=path)
        assert stream.handle(RequestBody(PREFILL, True, preamble)) == [
            ContinueBody(None, length_header=True)
        ]
        response_outcome(stream, raw=SIGNED_RESPONSE)
        assert stream.outcome.decision.action == ("mint" if minted else "allow")
    # An already rewritten path: the metadata does not describe the route that matched.
    stream = new()
    preamble = RequestHeaders(JSON, False, BUFFERED, REWRITTEN_MINT, path="/v1/chat/completions")
    (answer,) = stream.handle(RequestBody(PREFILL, True, preamble))
    assert isinstance(answer, Reject)
    assert b"match_prefix" in answer.body


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


NIXL_ROUTE = RouteMetadata(
    {"topology": "disaggregated", "action": "mint", "connector": "nixl"}, 3.0
)


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
@pytest.mark.parametrize(
    "params", [None, {"remote_host": "10.0.0.7", "do_remote_decode": True, "prompt_token_ids": [1]}]
)
def test_a_connector_route_forwards_its_connector_request_and_signs_the_answer(mode, params):
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    stream = Driven(max_body_bytes=1 << 20, trust=trust)
    stream.handle(headers(NIXL_ROUTE, mode=mode))
    sent = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    if params is not None:
        sent["kv_transfer_params"] = params
    answers = stream.handle(RequestBody(json.dumps(sent).encode(), True))
    forwarded = json.loads(streamed(answers) if mode is DUPLEX else only(answers).replacement)
    assert forwarded["kv_transfer_params"] == vllm_request.CONNECTOR_REQUESTS["nixl"]
    assert {k: v for k, v in forwarded.items() if k != "kv_transfer_params"} == {
        k: v for k, v in sent.items() if k != "kv_transfer_params"
    }
    assert stream.decision.action == "strip"
    assert stream.decision.reason == ("connector_written" if params is None else "unproven")
    reply = {"prompt_token_ids": [5], "kv_transfer_params": {"remote_engine_id": "e"}}
    answer = response_outcome(stream, raw=json.dumps(reply).encode())
    minted = json.loads(answer.replacement)["kv_transfer_params"]
    assert minted["remote_engine_id"] == "e"
    assert minted["prompt_token_ids"] == [5]
    assert stream.outcome.decision == Mint("minted", 1)
