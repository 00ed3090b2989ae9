"""Envoy's ext_proc message order, stated here as this test's own data, against the
stream: every sequence Envoy can send is accepted, with the answers Envoy waits for,
and any other message after any of them is a protocol error for good. Nothing here is
derived from the stream's table; the stream's states and its reading of messages are
used only to show that the walk reaches every (state, message) pair.

The order, per processing mode the processor supports (shared/notes/envoy-ext-proc.md):
- headers SEND, body BUFFERED: the headers, then the whole body in one message (with
  end_of_stream false when trailers follow, then the trailers); each message answered;
- headers SKIP, body BUFFERED (one message per request): the whole body, carrying the
  attributes; or, for a request with trailers and no body, the trailers first;
- body FULL_DUPLEX_STREAMED: the headers, chunks with end_of_stream false, the last one
  with end_of_stream true (often empty); nothing is answered until the last one, then
  the headers and the body together; the last chunk can come again (envoy#46237), also
  once the response began;
- a route that processes its response (mint): the response's headers (end_of_stream:
  no body), then its whole body (BUFFERED); also for a request the processor never saw;
- the processor's body timer (``TimedOut``) while a body is awaited, trailers where no
  body or no trailers can be read, and a first message of trailers are refused; after
  a refusal, Envoy may still send the chunks and trailers it had read: dropped.
- never: a body mode not inspected (STREAMED and the like), part of a response body, a
  message the processor did not ask for.

Where Envoy declares no response body mode (NONE) on a route that does not mint, nothing
follows a request's last message: only its answer ends the stream (``final``).
"""

import dataclasses
import itertools

import pytest

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
from ext_proc.core.stream import Message, State, message
from tests.driver import Driven

JSON = (("content-type", b"application/json"), ("x-request-id", b"r1"))
ROUTE = RouteMetadata({"action": "strip"}, 1.0)
VALID = b'{"messages": [], "kv_transfer_params": {"prompt_token_ids": [1]}}'
OK_RESPONSE = ((":status", b"200"), ("content-type", b"application/json"))


def headers(mode=BodyMode.BUFFERED, *, eos=False):
    return RequestHeaders(JSON, eos, mode, ROUTE, path="/v1/chat/completions")


# What Envoy can send, by name.
SENT = {
    "headers": headers(),
    "headers, streamed body": headers(BodyMode.FULL_DUPLEX_STREAMED),
    "headers, no body": headers(eos=True),
    "headers, STREAMED body": headers(BodyMode.STREAMED),
    "whole body, headers skipped": RequestBody(VALID, True, headers()),
    "whole body, headers skipped, trailers follow": RequestBody(VALID, False, headers()),
    "body, headers skipped, streamed": RequestBody(
        VALID, True, headers(BodyMode.FULL_DUPLEX_STREAMED)
    ),
    "trailers, headers skipped": RequestTrailers(headers()),
    "trailers, headers skipped, STREAMED body": RequestTrailers(headers(BodyMode.STREAMED)),
    "body, more follows": RequestBody(VALID, False),
    "last body": RequestBody(VALID, True),
    "empty last body": RequestBody(b"", True),
    "trailers": RequestTrailers(),
    "body timeout": TimedOut(),
    "response headers": ResponseHeaders(OK_RESPONSE, False),
    "response headers, no body": ResponseHeaders(OK_RESPONSE, True),
    "response body": ResponseBody(b"{}", True),
    "response body, more follows": ResponseBody(b"{}", False),
    "response trailers": Unexpected("response_trailers"),
}

# --- Envoy's message order, each message with the answers Envoy waits for -------------

REFUSED = [Reject]
NOTHING: list[type] = []


def buffered(last):
    """Headers SEND, body BUFFERED: the headers answered at once, then the whole body."""
    return [("headers", [ContinueHeaders]), (last, [ContinueBody])]


def streamed(chunks, last):
    """Body FULL_DUPLEX_STREAMED: nothing answered before the last chunk, then the
    headers and the body together."""
    return [
        ("headers, streamed body", NOTHING),
        *[("body, more follows", NOTHING)] * chunks,
        (last, [ContinueHeaders, StreamedBody]),
    ]


RESPONSE_HEADERS = ("response headers", [ContinueResponseHeaders])
RESPONSE_BODY = ("response body", [ContinueResponseBody])
RESPONSES = [
    [RESPONSE_HEADERS, RESPONSE_BODY],
    [("response headers, no body", [ContinueResponseHeaders])],
]
LAST = ("last body", "empty last body")
# After a refusal: the chunks and trailers Envoy had read, any of them, dropped.
LATE = ("body, more follows", "last body", "empty last body", "trailers")


def requests(times):
    """The requests Envoy sends, with up to ``times`` chunks before the last."""
    return [
        [("headers, no body", [ContinueHeaders])],
        *(buffered(last) for last in LAST),
        [
            ("headers", [ContinueHeaders]),
            ("body, more follows", [ContinueBody]),
            ("trailers", [ContinueTrailers]),
        ],
        [("whole body, headers skipped", [ContinueBody])],
        [
            ("whole body, headers skipped, trailers follow", [ContinueBody]),
            ("trailers", [ContinueTrailers]),
        ],
        *(streamed(chunks, last) for chunks in range(times + 1) for last in LAST),
    ]


def repeated(times):
    """A streamed body's last chunk sent again (envoy#46237), up to ``times`` times,
    right after it and once the response began."""
    sequences = []
    for chunks, last, after, during in itertools.product(
        range(times + 1), LAST, range(times + 1), range(times + 1)
    ):
        request = [*streamed(chunks, last), *[(last, NOTHING)] * after]
        sequences += [
            request,
            [*request, ("response headers, no body", [ContinueResponseHeaders])],
            [*request, RESPONSE_HEADERS, *[(last, NOTHING)] * during, RESPONSE_BODY],
        ]
    return sequences


def refusals(times):
    """Where a body is awaited, the refusals Envoy's messages (or the processor's timer)
    get, each followed by up to ``times`` late messages."""
    refused = [
        [("headers", [ContinueHeaders]), ("body timeout", REFUSED)],
        [("headers", [ContinueHeaders]), ("trailers", REFUSED)],
        *(
            [*streamed(chunks, "last body")[:-1], (name, REFUSED)]
            for chunks in range(times + 1)
            for name in ("body timeout", "trailers")
        ),
        [("trailers, headers skipped", REFUSED)],
    ]
    late = [
        [(name, NOTHING) for name in names]
        for n in range(times + 1)
        for names in itertools.product(LATE, repeat=n)
    ]
    return [[*refusal, *after] for refusal in refused for after in late]


def envoy_sends(times):
    """Every sequence Envoy sends, each repetition up to ``times`` long."""
    return [
        *requests(times),
        *([*request, *response] for request in requests(times) for response in RESPONSES),
        *RESPONSES,  # a response to a request the processor never saw
        *repeated(times),
        *refusals(times),
    ]


def answers_by_prefix(sequences):
    """For every prefix of every sequence (as names), the answers its last message gets."""
    found = {}
    for sequence in sequences:
        names = tuple(name for name, _ in sequence)
        for end, (_, answers) in enumerate(sequence, 1):
            assert found.setdefault(names[:end], answers) == answers, names[:end]
    return found


# The walk starts from every sequence of repetitions up to 2 long and sends one message
# more: every sequence it may then have sent is among those up to 3 long.
ANSWERS = answers_by_prefix(envoy_sends(3))
PREFIXES = sorted({(), *answers_by_prefix(envoy_sends(2))})


def replay(prefix):
    """A stream that was sent ``prefix``. In audit mode: what a body holds never refuses
    it, so each refusal here is the message order's (or the body timer's)."""
    budget = Budget(1 << 30)
    stream = Driven(max_body_bytes=1 << 20, budget=budget, audit=True)
    for name in prefix:
        stream.handle(SENT[name])
    return stream, budget


def test_the_sequences_name_only_messages_envoy_sends():
    assert {name for prefix in ANSWERS for name in prefix} <= set(SENT)


@pytest.mark.parametrize("prefix", PREFIXES, ids=lambda prefix: " / ".join(prefix) or "start")
def test_after_every_sequence_envoy_sends_each_message_is_answered_or_a_protocol_error(prefix):
    for name, event in SENT.items():
        stream, budget = replay(prefix)
        sent = (*prefix, name)
        if sent in ANSWERS:
            answers = stream.handle(event)
            assert [type(answer) for answer in answers] == ANSWERS[sent], sent
            continue
        with pytest.raises(ProtocolError):  # no step: nothing is answered, nothing forwarded
            stream.handle(event)
        assert stream.state is State.ERROR, sent
        assert budget.used == 0, sent
        for later in SENT.values():  # and it stays in error
            with pytest.raises(ProtocolError):
                stream.handle(later)


def test_the_walk_reaches_every_state_and_message():
    reached = {replay(prefix)[0].state for prefix in PREFIXES} | {State.ERROR}
    assert reached == set(State)
    assert {message(event) for event in SENT.values()} == set(Message)


def declaring(event, response):
    """``event`` as Envoy sends it when it declares ``response`` as the response body
    mode (on the request's first message, which carries the headers or the preamble)."""
    if isinstance(event, RequestHeaders):
        return dataclasses.replace(event, response_body_mode=response)
    if isinstance(event, RequestBody | RequestTrailers) and event.preamble is not None:
        preamble = dataclasses.replace(event.preamble, response_body_mode=response)
        return dataclasses.replace(event, preamble=preamble)
    return event


@pytest.mark.parametrize(
    "sequence", requests(2), ids=lambda sequence: " / ".join(name for name, _ in sequence)
)
@pytest.mark.parametrize("response", [BodyMode.NONE, None, BodyMode.BUFFERED])
def test_only_the_answer_to_a_requests_last_message_ends_the_stream(sequence, response):
    # Where Envoy declared no response body mode (NONE) on a route that does not mint,
    # the answer to the request's last message leaves nothing to process; where it
    # declared none at all, or one that brings the response, no request answer does.
    # In audit mode, as in ``replay``: no body is refused, every one is answered.
    stream = Driven(max_body_bytes=1 << 20, audit=True)
    finals = []
    for name, _ in sequence:
        stream.handle(declaring(SENT[name], response))
        finals.append(stream.last.final)
    last = response is BodyMode.NONE
    assert finals == [False] * (len(sequence) - 1) + [last]
