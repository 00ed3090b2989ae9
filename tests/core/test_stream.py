"""The stream machine: the answers of each body mode, Envoy's message order, refusals
and what follows them, one message per request."""

import json

import pytest

from ext_proc.core import memory
from ext_proc.core.budget import Budget
from ext_proc.core.errors import ProtocolError
from ext_proc.core.events import (
    BodyMode,
    ContinueBody,
    ContinueHeaders,
    ContinueTrailers,
    RequestBody,
    RequestTrailers,
    ResponseBody,
    ResponseHeaders,
    RouteMetadata,
    TimedOut,
    Unexpected,
)
from ext_proc.core.policy import Allow, Deny, Strip
from ext_proc.core.proof import Trust
from ext_proc.core.stream import STREAM_CHUNK, State
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
    OK_JSON,
    PREFILL,
    error_body,
    headers,
    new,
    only,
    prefill_stream,
    streamed,
)
from tests.driver import Driven

STRIPPED = {"messages": []}  # untrusted: the whole kv_transfer_params object goes


def test_strip_flow():
    stream = new()
    assert stream.handle(headers()) == [ContinueHeaders()]
    action = only(stream.handle(RequestBody(IDS.encode(), True)))
    assert isinstance(action, ContinueBody)
    assert json.loads(action.replacement) == STRIPPED
    assert action.length_header  # the headers Envoy holds get the new content-length
    assert isinstance(stream.decision, Strip)
    assert stream.state is State.DONE


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


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_body_timeout_answers_408(mode):
    stream = new()
    stream.handle(headers(mode=mode))
    assert error_body(stream.handle(TimedOut()))["code"] == 408


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


def first_body(data, route=AGGREGATED, extra=JSON, mode=BUFFERED, eos=True, response=None):
    # Envoy evaluated a skipped headers message's attributes after routing.
    preamble = headers(route, mode=mode, extra=extra, response=response)
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


# --- the end of the stream: ``final`` once nothing is left to process -----------------

NONE = BodyMode.NONE


def finals(stream, events):
    """Whether each event's step was final."""
    out = []
    for event in events:
        stream.handle(event)
        out.append(stream.last.final)
    return out


@pytest.mark.parametrize(
    "events",
    [
        [first_body(IDS.encode(), response=NONE)],  # one message per request
        [first_body(IDS.encode(), eos=False, response=NONE), RequestTrailers()],
        [headers(response=NONE), RequestBody(IDS.encode(), True)],  # two messages
        [headers(response=NONE), RequestBody(IDS.encode(), False), RequestTrailers()],
        [headers(mode=DUPLEX, response=NONE), RequestBody(b"{", False), RequestBody(b"}", True)],
        [headers(eos=True, response=NONE)],
    ],
    ids=["one", "one+trailers", "two", "two+trailers", "streamed", "no body"],
)
def test_the_last_answer_is_final_where_envoy_declared_no_response(events):
    # Only the answer to the last message Envoy sends for the request: before it (the
    # headers answer of two messages, a body that trailers follow), Envoy still waits.
    assert finals(new(), events) == [False] * (len(events) - 1) + [True]


@pytest.mark.parametrize("response", [None, BodyMode.BUFFERED, DUPLEX])
def test_no_answer_is_final_where_a_response_may_follow(response):
    stream = new()
    assert finals(stream, [first_body(IDS.encode(), response=response)]) == [False]
    assert finals(new(), [headers(response=response), RequestBody(b"{}", True)]) == [False, False]


def test_a_mint_route_waits_for_its_response_whatever_envoy_declared():
    stream = prefill_stream()  # headers declaring no response body mode
    assert not stream.last.final
    trust = Trust(keys=lambda: KEYS, clock=lambda: 1000.0)
    declared_none = Driven(max_body_bytes=1 << 20, trust=trust)
    assert finals(
        declared_none, [headers(MINT_ROUTE, response=NONE), RequestBody(PREFILL, True)]
    ) == [False, False]
    declared_none.handle(ResponseHeaders(OK_JSON, False))
    assert not declared_none.last.final


@pytest.mark.parametrize("response", [None, NONE, BodyMode.BUFFERED])
def test_a_refusal_is_final_whatever_envoy_declared(response):
    stream = new(limit=10)
    stream.handle(first_body(IDS.encode(), response=response))
    assert isinstance(stream.decision, Deny)
    assert stream.last.final
