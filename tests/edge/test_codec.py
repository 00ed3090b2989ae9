import pytest
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict

from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.core.decisions import Allow, Deny, Mint, Strip
from ext_proc.core.errors import bad_request
from ext_proc.core.events import (
    BodyMode,
    ContinueBody,
    ContinueHeaders,
    ContinueResponseBody,
    ContinueResponseHeaders,
    ContinueTrailers,
    Outcome,
    Peer,
    Reject,
    RequestBody,
    RequestHeaders,
    RequestTrailers,
    ResponseBody,
    ResponseHeaders,
    RouteMetadata,
    Step,
    StreamedBody,
    Unexpected,
)
from ext_proc.core.route_policy import IdentityType
from ext_proc.edge import attributes, codec, wire
from ext_proc.edge.codec import Decoder, Encoder, decision_metadata, decode, encode
from tests.messages import KEYS, headers_request
from tests.x509 import pem


def test_decode_headers_with_route_attributes():
    request = headers_request(
        {
            KEYS.fields["topology"]: "disaggregated",
            KEYS.fields["vocab_size"]: "512",
            KEYS.fields["max_ids"]: {"nested": 1},
            KEYS.size: 3,
            "xds.route_name": "pd",
            "request.path": "/v1/x",
        },
        headers=(("content-type", b"application/json"), (":path", b"/v1/x")),
    )
    event = decode(request, KEYS)
    assert event == RequestHeaders(
        headers=(("content-type", b"application/json"), (":path", b"/v1/x")),
        end_of_stream=False,
        body_mode=BodyMode.BUFFERED,
        route=RouteMetadata(
            {"topology": "disaggregated", "vocab_size": "512", "max_ids": "<struct_value>"},
            3.0,
            "pd",
        ),
        response_body_mode=BodyMode.NONE,
    )


@pytest.mark.parametrize(
    ("declared", "read"),
    [(0, BodyMode.NONE), (2, BodyMode.BUFFERED), (4, BodyMode.FULL_DUPLEX_STREAMED), (99, None)],
)
def test_decode_reads_the_declared_response_body_mode(declared, read):
    request = headers_request({})
    request.protocol_config.response_body_mode = declared
    assert decode(request, KEYS).response_body_mode is read
    body = _headerless_body(ROUTE_ATTRS)
    body.protocol_config.response_body_mode = declared
    assert decode(body, KEYS).preamble.response_body_mode is read
    assert Decoder(KEYS)(body).preamble.response_body_mode is read


def test_headers_without_protocol_config_rule_out_no_response():
    request = headers_request({})
    request.ClearField("protocol_config")
    assert decode(request, KEYS).response_body_mode is None


def test_decode_reads_attributes_under_any_filter_name():
    request = headers_request({KEYS.fields["action"]: "deny"}, filter_name="my_ext_proc")
    event = decode(request, KEYS)
    assert isinstance(event, RequestHeaders)
    assert event.route == RouteMetadata({"action": "deny"}, None)


def test_decode_non_numeric_size_forces_unknown_field_error():
    request = headers_request({KEYS.size: "4"})
    event = decode(request, KEYS)
    assert isinstance(event, RequestHeaders)
    assert event.route.size == float("inf")


def test_decode_missing_metadata():
    event = decode(headers_request({}), KEYS)
    assert isinstance(event, RequestHeaders)
    assert event.route == RouteMetadata({}, None)


def test_decode_body_trailers_and_unexpected():
    body = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}", end_of_stream=True))
    assert decode(body, KEYS) == RequestBody(b"{}", True)
    trailers = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    assert decode(trailers, KEYS) == RequestTrailers()
    response = pb.ProcessingRequest(response_trailers=pb.HttpTrailers())
    assert decode(response, KEYS) == Unexpected("response_trailers")
    assert decode(pb.ProcessingRequest(), KEYS) == Unexpected("empty")


def test_decode_response_headers_and_body():
    message = pb.ProcessingRequest()
    message.response_headers.headers.headers.add(key=":status", raw_value=b"200")
    assert decode(message, KEYS) == ResponseHeaders(((":status", b"200"),), False)
    body = pb.ProcessingRequest(response_body=pb.HttpBody(body=b"{}", end_of_stream=True))
    assert decode(body, KEYS) == ResponseBody(b"{}", True)


def test_decode_the_mtls_peer():
    peer = {
        attributes.PEER["mtls"]: True,
        attributes.PEER["validated"]: True,
        attributes.PEER["certificate"]: pem(uris=("spiffe://td/a", "spiffe://td/router")),
        attributes.PEER["subject"]: "CN=router",
    }
    event = decode(headers_request(peer), KEYS)
    assert event.peer == Peer(
        True,
        (
            (IdentityType.URI, "spiffe://td/a"),
            (IdentityType.URI, "spiffe://td/router"),
            (IdentityType.SUBJECT, "CN=router"),
        ),
    )
    # A certificate without mutual TLS identifies nobody.
    event = decode(headers_request({**peer, attributes.PEER["mtls"]: False}), KEYS)
    assert event.peer == Peer()


def test_decode_the_request_path():
    event = decode(headers_request({attributes.PATH: "/pd/v1/chat/completions"}), KEYS)
    assert event.path == "/pd/v1/chat/completions"
    assert decode(headers_request({}), KEYS).path == ""


def test_encode_a_rewritten_response_body_sets_its_length():
    response = encode(ContinueResponseBody(b"{}"))
    common = response.response_body.response
    assert common.status == common.CONTINUE_AND_REPLACE
    assert common.body_mutation.body == b"{}"
    assert common.header_mutation.set_headers[0].header.raw_value == b"2"
    assert encode(ContinueResponseHeaders()).WhichOneof("response") == "response_headers"
    unchanged = encode(ContinueResponseBody(None)).response_body.response
    assert unchanged.status == unchanged.CONTINUE
    assert not unchanged.HasField("body_mutation")


def test_observability_mode_is_refused():
    request = headers_request({})
    request.observability_mode = True
    assert decode(request, KEYS) == Unexpected("observability_mode")


def test_encode_continue_headers_and_trailers():
    assert encode(ContinueHeaders()).WhichOneof("response") == "request_headers"
    assert encode(ContinueTrailers()).WhichOneof("response") == "request_trailers"


def test_encode_unchanged_body_has_no_mutation():
    response = encode(ContinueBody())
    assert response.WhichOneof("response") == "request_body"
    common = response.request_body.response
    assert common.status == common.CONTINUE
    assert not common.HasField("body_mutation")
    assert not common.header_mutation.set_headers


def test_encode_replaced_body_sets_content_length_as_raw_value():
    response = encode(ContinueBody(b'{"a":1}'))
    common = response.request_body.response
    assert common.status == common.CONTINUE_AND_REPLACE
    assert common.body_mutation.body == b'{"a":1}'
    (option,) = common.header_mutation.set_headers
    assert option.header.key == "content-length"
    assert option.header.raw_value == b"7"
    assert option.header.value == ""


def test_encode_replaced_body_of_skipped_headers_has_no_header_mutation():
    response = encode(ContinueBody(b'{"a":1}', length_header=False))
    common = response.request_body.response
    assert common.status == common.CONTINUE_AND_REPLACE
    assert common.body_mutation.body == b'{"a":1}'
    assert not common.HasField("header_mutation")


def test_encode_reject():
    response = encode(Reject(400, b'{"error":{}}', "token_policy_x"))
    immediate = response.immediate_response
    assert immediate.status.code == 400
    assert immediate.body == b'{"error":{}}'
    assert immediate.details == "token_policy_x"
    (option,) = immediate.headers.set_headers
    assert (option.header.key, option.header.raw_value) == ("content-type", b"application/json")


def test_round_trip_through_wire_bytes():
    response = encode(ContinueBody(b"x" * 10))
    again = pb.ProcessingResponse.FromString(response.SerializeToString())
    assert again == response


def test_first_body_message_carries_a_preamble_from_attributes():
    request = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}", end_of_stream=True))
    request.protocol_config.request_body_mode = 2
    struct = struct_pb2.Struct()
    struct.update(
        {
            "request.headers['content-type']": "application/json",
            "request.headers['x-request-id']": "r-9",
            KEYS.fields["action"]: "deny",
            KEYS.size: 1,
            "xds.route_name": "r",
            "request.url_path": "/v1/chat/completions",
        }
    )
    request.attributes["envoy.filters.http.ext_proc"].CopyFrom(struct)
    event = decode(request, KEYS)
    assert event == RequestBody(
        b"{}",
        True,
        RequestHeaders(
            headers=(("content-type", b"application/json"), ("x-request-id", b"r-9")),
            end_of_stream=False,
            body_mode=BodyMode.BUFFERED,
            route=RouteMetadata({"action": "deny"}, 1.0, "r"),
            path="/v1/chat/completions",
            response_body_mode=BodyMode.NONE,
        ),
    )


def test_first_trailers_message_carries_a_preamble_from_attributes():
    request = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    request.protocol_config.request_body_mode = 2
    event = decode(request, KEYS)
    assert isinstance(event, RequestTrailers)
    assert event.preamble is not None
    assert event.preamble.body_mode is BodyMode.BUFFERED
    assert decode(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()), KEYS) == (
        RequestTrailers(None)
    )


def test_later_body_messages_carry_no_preamble():
    request = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}", end_of_stream=True))
    assert decode(request, KEYS) == RequestBody(b"{}", True, None)


def test_decision_metadata_names_what_was_decided_never_the_ids():
    strip = Strip(("prompt_token_ids",), "stripped_by_policy", 3)
    outcome = Outcome(strip, audit=False, route="r", body_size=10, request_id="id")
    assert MessageToDict(decision_metadata("ns", outcome)) == {
        "ns": {"action": "strip", "reason": "stripped_by_policy", "id_count": 3, "mode": "enforce"}
    }
    deny = Deny(bad_request("x", reason="ids_malformed"), 2)
    outcome = Outcome(deny, audit=True, route="r", body_size=10, request_id="id")
    assert MessageToDict(decision_metadata("ns", outcome)) == {
        "ns": {"action": "deny", "reason": "ids_malformed", "id_count": 2, "mode": "audit"}
    }
    minted = Outcome(Mint("minted", 3), False, "r", 10, "id", phase="response")
    assert MessageToDict(decision_metadata("ns", minted)) == {
        "ns": {
            "response_action": "mint",
            "response_reason": "minted",
            "response_id_count": 3,
            "response_mode": "enforce",
        }
    }


def _headerless_body(attrs: dict[str, object], *, filter_name: str = "f") -> pb.ProcessingRequest:
    """A first body message with headers skipped: the preamble from ``attrs``."""
    request = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}", end_of_stream=True))
    request.protocol_config.request_body_mode = 2
    request.attributes[filter_name].update(attrs)
    return request


ROUTE_ATTRS = {
    KEYS.fields["action"]: "strip",
    KEYS.size: 1,
    "xds.route_name": "aggregated",
    attributes.HEADERS["content-type"]: "application/json",
}
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACED = {
    attributes.HEADERS["x-request-id"]: "req-1",
    attributes.TRACE_HEADERS["traceparent"]: TRACEPARENT,
    attributes.TRACE_HEADERS["tracestate"]: "vendor=1",
    attributes.TRACE_HEADERS["x-client-request-id"]: "client-1",
}


def test_trace_headers_come_as_headers_of_the_preamble():
    event = decode(_headerless_body({**ROUTE_ATTRS, **TRACED}), KEYS)
    assert event.preamble.headers[-4:] == (
        ("x-request-id", b"req-1"),
        ("traceparent", TRACEPARENT.encode()),
        ("tracestate", b"vendor=1"),
        ("x-client-request-id", b"client-1"),
    )


def test_decoder_memo_holds_one_entry_whatever_the_trace_context():
    """Each request's trace context is new: kept out of the memo's key, every request of
    a route is a hit, and each reads its own."""
    decoder = Decoder(KEYS)
    for n in range(5):
        parent = f"00-{n:032x}-{n + 1:016x}-01"
        attrs = {**ROUTE_ATTRS, **TRACED, attributes.TRACE_HEADERS["traceparent"]: parent}
        event = decoder(_headerless_body(attrs))
        assert event == decode(_headerless_body(attrs), KEYS)
        assert event.preamble.values("traceparent") == [parent.encode()]
    assert len(decoder._memo) == 1


@pytest.mark.parametrize(
    "attrs",
    [
        {**ROUTE_ATTRS, attributes.HEADERS["x-request-id"]: "req-1"},
        ROUTE_ATTRS,
        {**ROUTE_ATTRS, attributes.HEADERS["x-request-id"]: 7},  # not a string: no header
        {**ROUTE_ATTRS, attributes.HEADERS["x-request-id"]: "caf\u00e9 \u2603"},
        {attributes.HEADERS["x-request-id"]: "only-the-id"},
        {},
        {**ROUTE_ATTRS, **TRACED},
        {**ROUTE_ATTRS, attributes.TRACE_HEADERS["traceparent"]: TRACEPARENT},
        {attributes.TRACE_HEADERS["tracestate"]: "a=1", attributes.HEADERS["x-request-id"]: "r"},
    ],
)
def test_decoder_reads_what_decode_reads(attrs):
    decoder = Decoder(KEYS)
    for _ in range(3):  # a miss, then hits of the memo
        assert decoder(_headerless_body(attrs)) == decode(_headerless_body(attrs), KEYS)


def test_a_requested_tenant_header_is_read_with_the_checked_ones():
    tenant = attributes.header("x-auth-tenant")
    attrs = {**ROUTE_ATTRS, tenant: "team-a", "request.headers['Bad Name']": "x"}
    decoder = Decoder(KEYS)
    for teams in ("team-a", "team-b"):  # the memo tells tenants apart
        event = decoder(_headerless_body({**attrs, tenant: teams}))
        assert isinstance(event, RequestBody)
        assert event.preamble is not None
        assert event.preamble.headers == (
            ("content-type", b"application/json"),
            ("x-auth-tenant", teams.encode()),
        )
    # A header attribute that is not a string names nothing.
    event = decode(_headerless_body({**attrs, tenant: 3}), KEYS)
    assert isinstance(event, RequestBody)
    assert event.preamble is not None
    assert event.preamble.values("x-auth-tenant") == []


def test_decoder_memo_tells_apart_what_differs_and_shares_the_rest():
    decoder = Decoder(KEYS)
    first = decoder(_headerless_body({**ROUTE_ATTRS, attributes.HEADERS["x-request-id"]: "a"}))
    second = decoder(_headerless_body({**ROUTE_ATTRS, attributes.HEADERS["x-request-id"]: "b"}))
    assert first.preamble.values("x-request-id") == [b"a"]
    assert second.preamble.values("x-request-id") == [b"b"]
    assert first.preamble.route is second.preamble.route  # one reading per route
    other = {**ROUTE_ATTRS, KEYS.fields["action"]: "deny"}
    assert decoder(_headerless_body(other)).preamble.route.values == {"action": "deny"}
    responds = _headerless_body(ROUTE_ATTRS)
    responds.protocol_config.response_body_mode = 2
    assert decoder(responds).preamble.response_body_mode is BodyMode.BUFFERED
    assert decoder(_headerless_body(ROUTE_ATTRS)).preamble.response_body_mode is BodyMode.NONE
    gzip = {**ROUTE_ATTRS, attributes.HEADERS["content-encoding"]: "gzip"}
    assert decoder(_headerless_body(gzip)).preamble.values("content-encoding") == [b"gzip"]
    # The same attributes under another filter name read the same, keyed apart.
    renamed = decoder(_headerless_body(ROUTE_ATTRS, filter_name="g"))
    assert renamed == decode(_headerless_body(ROUTE_ATTRS, filter_name="g"), KEYS)


def test_decoder_reads_the_last_group_like_decode():
    def two_groups() -> pb.ProcessingRequest:
        request = _headerless_body({**ROUTE_ATTRS, attributes.HEADERS["x-request-id"]: "a"})
        request.attributes["z"].update({attributes.HEADERS["x-request-id"]: "z"})
        return request

    assert Decoder(KEYS)(two_groups()) == decode(two_groups(), KEYS)


def test_decoder_memo_is_bounded():
    decoder = Decoder(KEYS, size=4)
    for n in range(10):
        attrs = {**ROUTE_ATTRS, attributes.HEADERS["content-type"]: f"application/json; v={n}"}
        assert decoder(_headerless_body(attrs)) == decode(_headerless_body(attrs), KEYS)
        assert len(decoder._memo) <= 4


def test_decoder_later_messages_are_not_memoized():
    decoder = Decoder(KEYS)
    body = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"x", end_of_stream=False))
    assert decoder(body) == RequestBody(b"x", False)
    assert not decoder._memo


def test_decoder_keeps_no_large_attributes():
    decoder = Decoder(KEYS)
    large = {**ROUTE_ATTRS, attributes.HEADERS["content-type"]: "application/json" + " " * 4096}
    for _ in range(2):
        assert decoder(_headerless_body(large)) == decode(_headerless_body(large), KEYS)
    assert not decoder._memo


def test_answers_without_bytes_are_shared_only_with_the_same_decision():
    namespace = "ext_proc.token_policy"
    encoder = Encoder(namespace)

    def outcome(decision, request_id="r"):
        return Outcome(decision, False, "route", 10, request_id, "request")

    def answered(answer, settled):
        (response,) = encoder(Step([answer], settled))
        expected = encode(answer)
        if settled is not None:
            expected.dynamic_metadata.CopyFrom(decision_metadata(namespace, settled))
        # whatever is shared, it is what would be built
        assert pb.ProcessingResponse.FromString(response) == expected
        return response

    plain = answered(ContinueBody(None), outcome(Allow("no_transfer_params")))
    assert answered(ContinueBody(None), outcome(Allow("no_transfer_params"), "s")) is plain
    other = answered(ContinueBody(None), outcome(Allow("no_body")))
    assert other is not plain
    audited = Outcome(Allow("no_transfer_params"), True, "route", 10, "r", "request")
    assert answered(ContinueBody(None), audited) != plain  # the mode differs
    assert answered(ContinueHeaders(), None) is answered(ContinueHeaders(), None)
    # A replacement body is built for its request alone, behind the shared head.
    stripped = outcome(Strip(None, "stripped_by_policy", 0))
    assert answered(ContinueBody(b"{}"), stripped) is not answered(ContinueBody(b"{}"), stripped)
    # A decision with ids is shared with the same decision (the same count) only.
    honored = outcome(Allow("trusted_proof", 3))
    assert answered(ContinueBody(None), honored) is answered(ContinueBody(None), honored)
    assert answered(ContinueBody(None), outcome(Allow("trusted_proof", 4))) is not plain
    refused = Reject(400, b'{"error":{}}', "token_policy_x")
    denied = outcome(Deny(bad_request("x", reason="ids_malformed"), 2))
    assert answered(refused, denied) is answered(
        Reject(400, b'{"error":{}}', "token_policy_x"), denied
    )


@pytest.mark.parametrize(
    "answer",
    [
        ContinueBody(b'{"a":1}'),
        ContinueBody(b""),
        ContinueBody(b"x" * 300, length_header=False),
        ContinueResponseBody(b"{}"),
        StreamedBody(b"{", False),
        StreamedBody(b"", True),
        StreamedBody(b"y" * 200, True),
    ],
)
def test_a_spliced_body_answer_is_the_bytes_upb_writes(answer):
    """The prebuilt head, the body, the decision: byte for byte what upb serializes."""
    settled = Outcome(Strip(None, "stripped_by_policy", 2), False, "route", 10, "r", "request")
    bare, decided = Encoder("ns")(Step([answer], None)), Encoder("ns")(Step([answer], settled))
    assert bare == [encode(answer).SerializeToString()]
    expected = encode(answer)
    expected.dynamic_metadata.CopyFrom(decision_metadata("ns", settled))
    assert pb.ProcessingResponse.FromString(decided[0]) == expected


@pytest.mark.parametrize("value", ["研究所", "???", "team-€", "caf\u00e9 \u2603", "plain"])
def test_a_header_attribute_reads_as_the_bytes_the_headers_message_carries(value):
    """Envoy's CEL makes a string of the header's bytes; its UTF-8 is those bytes, as the
    headers message carries them: both arrangements read one value, and no two collide."""
    tenant = attributes.header("x-auth-tenant")
    attrs = {**ROUTE_ATTRS, tenant: value, attributes.HEADERS["x-request-id"]: value}
    for read in (decode(_headerless_body(attrs), KEYS), Decoder(KEYS)(_headerless_body(attrs))):
        assert read.preamble.values("x-auth-tenant") == [value.encode()]
        assert read.preamble.values("x-request-id") == [value.encode()]


FAIRNESS = "x-llm-d-inference-fairness-id"


def test_a_headers_answer_removes_every_copy_then_sets_one():
    response = encode(ContinueHeaders((FAIRNESS,), ((FAIRNESS, b"p4rt1t10n"),)))
    mutation = response.request_headers.response.header_mutation
    assert list(mutation.remove_headers) == [FAIRNESS]
    (option,) = mutation.set_headers
    assert (option.header.key, option.header.raw_value) == (FAIRNESS, b"p4rt1t10n")
    assert option.append_action == option.OVERWRITE_IF_EXISTS_OR_ADD
    # Without either, the answer changes nothing.
    plain = encode(ContinueHeaders())
    assert plain.HasField("request_headers")
    assert not plain.request_headers.response.HasField("header_mutation")


def test_the_partition_is_reported_only_when_the_request_names_a_tenant():
    named = Outcome(Allow("no_transfer_params"), False, "r", 10, "id", partition="p4rt")
    assert MessageToDict(decision_metadata("ns", named))["ns"]["partition"] == "p4rt"
    minted = Outcome(Mint("minted", 3), False, "r", 10, "id", "response", "p4rt")
    assert MessageToDict(decision_metadata("ns", minted))["ns"]["partition"] == "p4rt"
    unnamed = Outcome(Allow("no_transfer_params"), False, "r", 10, "id")
    assert "partition" not in MessageToDict(decision_metadata("ns", unnamed))["ns"]


def test_every_answer_of_a_settling_step_carries_the_decision():
    """A streamed body's answers (the withheld headers, then the pieces) each carry it:
    whichever Envoy continues the filter chain on, a rate limit keyed on the partition
    after this filter finds it."""
    encoder = Encoder("ns")
    settled = Outcome(Allow("no_transfer_params"), False, "r", 10, "id", partition="p4rt")
    step = Step([ContinueHeaders(), StreamedBody(b"{", False), StreamedBody(b"}", True)], settled)
    for response in map(pb.ProcessingResponse.FromString, encoder(step)):
        assert MessageToDict(response.dynamic_metadata)["ns"]["partition"] == "p4rt"
    (headers_only,) = encoder(Step([ContinueHeaders()], None))
    assert not pb.ProcessingResponse.FromString(headers_only).HasField("dynamic_metadata")


def test_answers_are_never_shared_across_tenants():
    encoder = Encoder("ns")

    def answered(partition):
        settled = Outcome(Allow("no_body"), False, "r", 0, "id", partition=partition)
        (response,) = encoder(Step([ContinueHeaders()], settled))
        return pb.ProcessingResponse.FromString(response)

    a, b = answered("aaaa"), answered("bbbb")
    assert MessageToDict(a.dynamic_metadata)["ns"]["partition"] == "aaaa"
    assert MessageToDict(b.dynamic_metadata)["ns"]["partition"] == "bbbb"
    assert MessageToDict(answered("aaaa").dynamic_metadata)["ns"]["partition"] == "aaaa"


@pytest.mark.parametrize("number", [1, 2, 3, 4, 8, 15, 16, 17, 2047, 2048])
@pytest.mark.parametrize(
    "size", [0, 1, 0x7F, 0x80, 0x81, 0x3FFF, 0x4000, 0x4001, 0x1FFFFF, 0x200000, 2**32]
)
def test_an_answers_field_head_is_the_wires(number, size):
    assert codec._head(number, size) == wire.field_head(number, size)


@pytest.mark.parametrize(
    "reader", [wire.read, codec.compiled_reader()], ids=["reference", "compiled"]
)
def test_each_message_left_to_upb_is_told_and_none_else(reader) -> None:
    if reader is None:
        pytest.skip("edge._wire is not built")
    told: list[None] = []
    decoder = Decoder(KEYS, reader=reader, left_to_upb=lambda: told.append(None))
    message = headers_request({})  # as Envoy sends it: an empty metadata_context
    assert isinstance(decoder(message.SerializeToString()), RequestHeaders)
    assert told == []
    message.metadata_context.filter_metadata["ns"].update({"k": "v"})
    assert isinstance(decoder(message.SerializeToString()), RequestHeaders)
    assert decoder(b"\x42\x01") == Unexpected("malformed")  # upb refuses it too
    assert len(told) == 2
