import json

import pytest

from ext_proc.errors import ProtocolError
from ext_proc.events import (
    BodyMode,
    ContinueBody,
    ContinueHeaders,
    ContinueTrailers,
    Reject,
    RequestBody,
    RequestHeaders,
    RequestTrailers,
    RouteMetadata,
    Unexpected,
)
from ext_proc.policy import Allow, Deny, Strip
from ext_proc.stream import State, Stream

JSON = (("content-type", b"application/json"), ("x-request-id", b"r1"))
AGGREGATED = RouteMetadata({"topology": "aggregated", "action": "strip"}, 2.0)
DISAGGREGATED = RouteMetadata({"topology": "disaggregated", "vocab_size": "50"}, 2.0)
IDS = json.dumps({"messages": [], "kv_transfer_params": {"prompt_token_ids": [1, 2], "k": 1}})


def headers(route=AGGREGATED, *, eos=False, mode=BodyMode.BUFFERED, extra=JSON):
    return RequestHeaders(extra, eos, mode, route)


def new(limit=1 << 20):
    return Stream(max_body_bytes=limit)


def error_body(action):
    assert isinstance(action, Reject)
    payload = json.loads(action.body)
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["code"] == action.status
    return payload["error"]


def test_strip_flow():
    stream = new()
    assert stream.handle(headers()) == ContinueHeaders()
    action = stream.handle(RequestBody(IDS.encode(), True))
    assert isinstance(action, ContinueBody)
    assert json.loads(action.replacement) == {"messages": [], "kv_transfer_params": {"k": 1}}
    assert isinstance(stream.decision, Strip)
    assert stream.state is State.DONE


def test_body_without_ids_passes_unchanged():
    stream = new()
    stream.handle(headers())
    assert stream.handle(RequestBody(b'{"messages": []}', True)) == ContinueBody(None)
    assert stream.decision == Allow("no_reused_ids")


def test_honor_flow_passes_unchanged_and_validates():
    stream = new()
    stream.handle(headers(DISAGGREGATED))
    assert stream.handle(RequestBody(IDS.encode(), True)) == ContinueBody(None)
    assert stream.decision == Allow("honored", 2)
    bad = new()
    bad.handle(headers(DISAGGREGATED))
    out_of_vocab = IDS.replace("[1, 2]", "[1, 50]").encode()
    error = error_body(bad.handle(RequestBody(out_of_vocab, True)))
    assert error["param"] == "kv_transfer_params.prompt_token_ids"
    assert error["type"] == "BadRequestError"


def test_missing_metadata_means_aggregated_strip():
    stream = new()
    stream.handle(headers(RouteMetadata()))
    assert isinstance(stream.handle(RequestBody(IDS.encode(), True)), ContinueBody)
    assert isinstance(stream.decision, Strip)


def test_invalid_metadata_rejects_at_headers_even_without_body():
    stream = new()
    action = stream.handle(headers(RouteMetadata({"action": "allow"}, 1.0), eos=True))
    error = error_body(action)
    assert action.status == 500
    assert "ext_proc.token_policy.action" in error["message"]
    assert action.details == "ext_proc_invalid_route_policy"
    assert stream.state is State.DONE


def test_request_without_body_is_allowed():
    stream = new()
    assert stream.handle(headers(eos=True)) == ContinueHeaders()
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


def test_wrong_media_type_rejected_before_body():
    stream = new()
    action = stream.handle(headers(extra=(("content-type", b"text/plain"),)))
    assert error_body(action)["code"] == 415
    with pytest.raises(ProtocolError):
        stream.handle(RequestBody(IDS.encode(), True))


def test_unparseable_body_denied():
    stream = new()
    stream.handle(headers())
    error = error_body(stream.handle(RequestBody(b'{"a": ', True)))
    assert error["code"] == 400
    assert "not valid JSON" in error["message"]


def test_oversized_body_denied_with_413():
    stream = new(limit=10)
    stream.handle(headers())
    action = stream.handle(RequestBody(b'{"a": "0123456789"}', True))
    assert error_body(action)["code"] == 413
    assert isinstance(stream.decision, Deny)


def test_body_then_trailers():
    stream = new()
    stream.handle(headers())
    assert isinstance(stream.handle(RequestBody(IDS.encode(), False)), ContinueBody)
    assert stream.state is State.EXPECT_TRAILERS
    assert stream.handle(RequestTrailers()) == ContinueTrailers()
    assert stream.state is State.DONE


def test_trailers_without_body_denied():
    stream = new()
    stream.handle(headers())
    assert error_body(stream.handle(RequestTrailers()))["code"] == 400


OUT_OF_ORDER = [
    [RequestBody(b"{}", True)],
    [RequestTrailers()],
    [Unexpected("response_headers")],
    [Unexpected("empty")],
    [headers(), headers()],
    [headers(), RequestBody(b"{}", True), RequestBody(b"{}", True)],
    [headers(), RequestBody(b"{}", True), RequestTrailers()],
    [headers(eos=True), RequestBody(b"{}", True)],
    [headers(eos=True), headers()],
    [headers(), Unexpected("response_body")],
    [headers(), RequestBody(b"{}", False), RequestBody(b"{}", True)],
    [headers(), RequestBody(b"{}", False), RequestTrailers(), RequestTrailers()],
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


def test_after_reject_nothing_more_is_accepted():
    stream = new()
    stream.handle(headers())
    stream.handle(RequestBody(b"nope", True))
    with pytest.raises(ProtocolError):
        stream.handle(RequestTrailers())
