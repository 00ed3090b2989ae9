"""The transition table is the whole diagram: every state x message pair, walked."""

import pytest

from ext_proc.core.budget import Budget
from ext_proc.core.errors import ProtocolError
from ext_proc.core.events import (
    BodyMode,
    RequestBody,
    RequestHeaders,
    RequestTrailers,
    ResponseBody,
    ResponseHeaders,
    RouteMetadata,
    TimedOut,
    Unexpected,
)
from ext_proc.core.stream import TRANSITIONS, Message, State, message
from tests.driver import Driven

# The rows of every event class's table, as one.
ROWS = {pair: row for table in TRANSITIONS.values() for pair, row in table.rows.items()}

JSON = (("content-type", b"application/json"), ("x-request-id", b"r1"))
ROUTE = RouteMetadata({"action": "strip"}, 1.0)
VALID = b'{"messages": [], "kv_transfer_params": {"prompt_token_ids": [1]}}'
OK_RESPONSE = ((":status", b"200"), ("content-type", b"application/json"))


def headers(mode=BodyMode.BUFFERED, *, eos=False):
    return RequestHeaders(JSON, eos, mode, ROUTE, path="/v1/chat/completions")


# One event of each kind, as the table reads it.
EVENTS = {
    Message.HEADERS: headers(),
    Message.HEADERS_STREAMED: headers(BodyMode.FULL_DUPLEX_STREAMED),
    Message.HEADERS_ONLY: headers(eos=True),
    Message.HEADERS_UNREADABLE: headers(BodyMode.STREAMED),
    Message.FIRST_BODY: RequestBody(VALID, True, headers()),
    Message.FIRST_BODY_TRAILED: RequestBody(VALID, False, headers()),
    Message.FIRST_BODY_UNREADABLE: RequestBody(VALID, True, headers(BodyMode.FULL_DUPLEX_STREAMED)),
    Message.FIRST_TRAILERS: RequestTrailers(headers()),
    Message.FIRST_TRAILERS_UNREADABLE: RequestTrailers(headers(BodyMode.STREAMED)),
    Message.BODY: RequestBody(VALID, False),
    Message.BODY_END: RequestBody(VALID, True),
    Message.TRAILERS: RequestTrailers(),
    Message.TIMED_OUT: TimedOut(),
    Message.RESPONSE_HEADERS: ResponseHeaders(OK_RESPONSE, False),
    Message.RESPONSE_HEADERS_ONLY: ResponseHeaders(OK_RESPONSE, True),
    Message.RESPONSE_BODY: ResponseBody(b"{}", True),
    Message.RESPONSE_BODY_PART: ResponseBody(b"{}", False),
    Message.UNEXPECTED: Unexpected("response_trailers"),
}

STREAMED_TO_THE_END = [headers(BodyMode.FULL_DUPLEX_STREAMED), RequestBody(VALID, True)]
# How a stream reaches each state, such that every message the table allows there is
# one it accepts (the streamed body's last chunk is VALID: repeating it is legal).
PATHS = {
    State.EXPECT_HEADERS: [],
    State.EXPECT_BODY: [headers()],
    State.STREAMING: [headers(BodyMode.FULL_DUPLEX_STREAMED)],
    State.EXPECT_TRAILERS: [headers(), RequestBody(VALID, False)],
    State.DONE: STREAMED_TO_THE_END,
    State.EXPECT_RESPONSE_BODY: [*STREAMED_TO_THE_END, ResponseHeaders(OK_RESPONSE, False)],
    State.RESPONSE_DONE: [
        *STREAMED_TO_THE_END,
        ResponseHeaders(OK_RESPONSE, False),
        ResponseBody(b"{}", True),
    ],
    State.REJECTED: [headers(), TimedOut()],
    State.ERROR: [Unexpected("response_trailers")],
}
PAIRS = [(state, kind) for state in State for kind in Message]


def test_every_state_and_message_is_walked():
    assert set(EVENTS) == set(Message)
    assert set(PATHS) == set(State)
    assert len(PAIRS) == len(State) * len(Message)
    for kind, event in EVENTS.items():
        assert message(event) is kind


def test_every_row_names_a_state_and_no_row_leaves_error_or_the_end():
    for (state, _), (_, target) in ROWS.items():
        assert isinstance(target, State)
        assert target is not State.ERROR
        assert state not in (State.ERROR, State.RESPONSE_DONE)


def reach(state):
    budget = Budget(1 << 30)
    stream = Driven(max_body_bytes=1 << 20, budget=budget)
    for event in PATHS[state]:
        try:
            stream.handle(event)
        except ProtocolError:
            assert state is State.ERROR
    assert stream.state is state
    return stream, budget


@pytest.mark.parametrize(("state", "kind"), PAIRS, ids=[f"{s.name}-{k.name}" for s, k in PAIRS])
def test_each_pair_goes_where_the_table_says_or_is_a_protocol_error(state, kind):
    stream, budget = reach(state)
    entry = ROWS.get((state, kind))
    if entry is not None:
        stream.handle(EVENTS[kind])
        assert stream.state is entry[1]
        return
    with pytest.raises(ProtocolError):  # no step: nothing is answered, nothing forwarded
        stream.handle(EVENTS[kind])
    assert stream.state is State.ERROR
    assert budget.used == 0
    for event in (headers(), RequestBody(VALID, True), RequestTrailers()):  # and it stays
        with pytest.raises(ProtocolError):
            stream.handle(event)
    assert stream.state is State.ERROR
