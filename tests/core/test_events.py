"""The plain values between the codec and the stream machine: vLLM's error shape for a
refusal, header lookups, route metadata and outcomes."""

import json

import pytest

from ext_proc._pb import processing_mode_pb2
from ext_proc.core import route_policy
from ext_proc.core.errors import BadRequest, PayloadTooLarge, Refusal, ServiceUnavailable
from ext_proc.core.events import (
    NO_PEER,
    BodyMode,
    ContinueBody,
    Outcome,
    Peer,
    Reject,
    RequestHeaders,
    ResponseHeaders,
    RouteMetadata,
    Step,
)


def test_a_refusal_is_answered_in_vllms_error_shape_as_compact_json():
    refusal = BadRequest("ids are not allowed here", reason="ids_denied", param="ids").refusal()
    reject = Reject.of(refusal)
    assert reject.status == 400
    assert reject.body == (
        b'{"error":{"message":"ids are not allowed here","type":"BadRequestError",'
        b'"param":"ids","code":400}}'
    )
    assert reject.details == "token_policy_ids_denied"
    assert reject.headers == ()


def test_the_error_has_exactly_vllms_keys_and_a_null_param_when_there_is_none():
    reject = Reject.of(PayloadTooLarge("too big", reason="body_too_large").refusal())
    assert json.loads(reject.body) == {
        "error": {"message": "too big", "type": "PayloadTooLargeError", "param": None, "code": 413}
    }
    assert b" " not in reject.body.replace(b"too big", b"")


def test_the_message_is_utf8_not_ascii_escapes():
    reject = Reject.of(Refusal(400, "BadRequestError", "x", "identité ≠ 🙂"))
    assert "identité ≠ 🙂".encode() in reject.body
    assert b"\\u" not in reject.body


def test_a_member_name_with_a_lone_surrogate_is_quoted_escaped_in_valid_json():
    # json.loads reads a lone surrogate from a \\udXXX escape or a UTF-16 body; a
    # refusal quoting such a member's name is still answered (orjson writes none).
    name = "generate_respons\uda65.1.prompt_embeds"
    reject = Reject.of(Refusal(400, "BadRequestError", "x", f"{name} is refused", name))
    assert json.loads(reject.body)["error"] == {
        "message": f"{name} is refused",
        "type": "BadRequestError",
        "param": name,
        "code": 400,
    }
    assert b"\\uda65" in reject.body
    assert b" " not in reject.body.replace(b" is refused", b"")  # compact, as orjson's


def test_the_status_and_code_come_from_the_refusal():
    reject = Reject.of(Refusal(418, "TeapotError", "teapot", "no"))
    assert reject.status == 418
    assert json.loads(reject.body)["error"]["code"] == 418
    assert json.loads(reject.body)["error"]["type"] == "TeapotError"


def test_a_transient_refusal_carries_retry_after():
    refusal = ServiceUnavailable("busy", reason="budget").refusal()
    reject = Reject.of(refusal)
    assert reject.status == 503
    assert reject.headers == (("retry-after", b"1"),)
    assert reject.details == "token_policy_budget"


@pytest.mark.parametrize(("seconds", "header"), [(0, b"0"), (30, b"30")])
def test_retry_after_is_the_refusals_seconds_even_zero(seconds, header):
    refusal = Refusal(503, "ServiceUnavailableError", "r", "m", retry_after=seconds)
    assert Reject.of(refusal).headers == (("retry-after", header),)


def test_request_headers_values_keeps_order_and_duplicates():
    event = RequestHeaders(
        headers=(("x-a", b"1"), ("x-b", b"2"), ("x-a", b"3"), ("x-a", b"1")),
        end_of_stream=False,
        body_mode=BodyMode.BUFFERED,
        route=RouteMetadata(),
    )
    assert event.values("x-a") == [b"1", b"3", b"1"]
    assert event.values("x-b") == [b"2"]
    assert event.values("x-c") == []
    # Envoy sends lower-case names; the lookup is exact.
    assert event.values("X-A") == []


def test_response_headers_values_keeps_order_and_duplicates():
    event = ResponseHeaders(
        headers=(("set-cookie", b"a"), (":status", b"200"), ("set-cookie", b"b")),
        end_of_stream=False,
    )
    assert event.values("set-cookie") == [b"a", b"b"]
    assert event.values(":status") == [b"200"]
    assert event.values("content-type") == []


def test_request_headers_defaults():
    event = RequestHeaders((), True, BodyMode.NONE, RouteMetadata())
    assert event.peer == NO_PEER
    assert event.path == ""


def test_route_metadata_items_are_made_from_its_values():
    values = {"action": "honor", "vocab_size": 7.0, "audit": True}
    route = RouteMetadata(values, 3.0, "decode")
    assert route.items == route_policy.items_of(values)
    assert route.items == (
        ("action", "str", "honor"),
        ("vocab_size", "float", 7.0),
        ("audit", "bool", True),
    )


def test_route_metadata_items_tell_true_from_one():
    # Equal as values (True == 1.0), but a different policy: the items keep the type.
    assert RouteMetadata({"audit": True}).items != RouteMetadata({"audit": 1.0}).items


def test_route_metadata_items_are_not_compared_or_shown():
    route = RouteMetadata({"action": "deny"}, 1.0, "r")
    assert route == RouteMetadata({"action": "deny"}, 1.0, "r")
    assert route != RouteMetadata({"action": "deny"}, 1.0, "other")
    assert "items" not in repr(route)


def test_empty_route_metadata():
    route = RouteMetadata()
    assert (route.values, route.size, route.name, route.items) == ({}, None, "", ())
    assert route_policy.parse_items(route.items, route.size) == route_policy.DEFAULT_POLICY


def test_route_metadata_is_frozen():
    route = RouteMetadata({"action": "deny"})
    with pytest.raises(AttributeError):
        route.name = "changed"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        route.items = ()  # type: ignore[misc]


@pytest.mark.parametrize(("audit", "mode"), [(True, "audit"), (False, "enforce")])
def test_outcome_mode(audit, mode):
    # ``mode`` reads only ``audit``: no decision is needed.
    outcome = Outcome(None, audit, route="r", body_size=0, request_id="id")  # type: ignore[arg-type]
    assert outcome.mode == mode
    assert outcome.phase == "request"


def test_body_modes_are_envoys_body_send_modes():
    envoy = processing_mode_pb2.ProcessingMode.BodySendMode
    assert {mode.name: int(mode) for mode in BodyMode} == dict(envoy.items())


def test_defaults_of_answers_and_steps():
    assert ContinueBody() == ContinueBody(replacement=None, length_header=True)
    assert Step([]).outcome is None
    assert Peer(mtls=False, identities=()) == NO_PEER


def test_requests_refused_alike_share_one_answer():
    # One answer per refusal: equal refusals (errors.bad_request returns one per
    # arguments) are answered by the same frozen Reject, built once.
    first = Reject.of(BadRequest("no", reason="ids_denied", param="ids").refusal())
    again = Reject.of(BadRequest("no", reason="ids_denied", param="ids").refusal())
    other = Reject.of(BadRequest("no!", reason="ids_denied", param="ids").refusal())
    assert again is first
    assert other is not first
    assert other.body != first.body
