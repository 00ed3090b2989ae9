"""The ext_proc stream as a sans-IO state machine.

One ``Stream`` per HTTP request. ``handle`` takes each event Envoy sends and returns
exactly one action to answer it, or raises ``ProtocolError``; after a protocol error
the stream stays in error. The legal message order is the table ``_TRANSITIONS``;
anything not in it is a protocol violation.

Invariants (fail closed):
- a request with a body is let through only after the whole body was parsed and the
  policy returned Allow or Strip;
- every ``HttpError`` becomes a ``Reject`` here and nowhere else;
- a body mode this machine cannot inspect is a protocol error, never a pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import Enum, auto
from typing import Final

from ext_proc import body, policy, route_policy
from ext_proc.errors import BadRequest, HttpError, PayloadTooLarge, ProtocolError
from ext_proc.events import (
    Action,
    BodyMode,
    ContinueBody,
    ContinueHeaders,
    ContinueTrailers,
    Event,
    Reject,
    RequestBody,
    RequestHeaders,
    RequestTrailers,
)


class State(Enum):
    EXPECT_HEADERS = auto()
    EXPECT_BODY = auto()
    EXPECT_TRAILERS = auto()
    DONE = auto()
    ERROR = auto()


def reject(error: HttpError) -> Reject:
    """vLLM's error shape, so OpenAI clients parse the denial like any vLLM 400."""
    payload = {
        "error": {
            "message": error.message,
            "type": error.error_type,
            "param": error.param,
            "code": error.status,
        }
    }
    return Reject(error.status, json.dumps(payload).encode(), f"ext_proc_{error.reason}")


class Stream:
    """Processes one HTTP request's ext_proc messages."""

    def __init__(self, *, max_body_bytes: int, namespace: str = route_policy.DEFAULT_NAMESPACE):
        self.state = State.EXPECT_HEADERS
        self.decision: policy.Decision | None = None
        self._max_body_bytes = max_body_bytes
        self._namespace = namespace
        self._policy = route_policy.DEFAULT_POLICY

    def handle(self, event: Event) -> Action:
        handler = _TRANSITIONS.get((self.state, type(event)))
        if handler is None:
            state, self.state = self.state, State.ERROR
            raise ProtocolError(
                f"unexpected {type(event).__name__} in state {state.name}",
                reason="protocol_violation",
            )
        try:
            return handler(self, event)
        except HttpError as exc:
            self.state = State.DONE
            self.decision = policy.Deny(exc)
            return reject(exc)
        except ProtocolError:
            self.state = State.ERROR
            raise

    def _on_headers(self, event: Event) -> Action:
        assert isinstance(event, RequestHeaders)
        self._policy = route_policy.parse(event.route.values, event.route.size, self._namespace)
        if event.end_of_stream:
            self.state = State.DONE
            self.decision = policy.Allow("no_body")
            return ContinueHeaders()
        if event.body_mode is not BodyMode.BUFFERED:
            raise ProtocolError(
                f"request body mode {event.body_mode.name} cannot be inspected; "
                "configure request_body_mode BUFFERED",
                reason="unsupported_body_mode",
            )
        body.check_headers(event.values("content-type"), event.values("content-encoding"))
        self.state = State.EXPECT_BODY
        return ContinueHeaders()

    def _on_body(self, event: Event) -> Action:
        assert isinstance(event, RequestBody)
        # BUFFERED mode: this one message is the whole body; end_of_stream is false
        # only when trailers follow.
        self.state = State.DONE if event.end_of_stream else State.EXPECT_TRAILERS
        return self._decide(event.chunk)

    def _on_trailers_without_body(self, event: Event) -> Action:
        # Headers promised a body but trailers came first: the body is empty, which
        # vLLM cannot parse either.
        raise BadRequest("request body is empty", reason="body_not_json")

    def _on_trailers(self, event: Event) -> Action:
        self.state = State.DONE
        return ContinueTrailers()

    def _decide(self, raw: bytes) -> ContinueBody | Reject:
        if len(raw) > self._max_body_bytes:
            raise PayloadTooLarge(
                f"request body of {len(raw)} bytes exceeds the limit of "
                f"{self._max_body_bytes} bytes",
                reason="body_too_large",
            )
        document = body.parse(raw)
        decision = policy.decide(self._policy, document)
        self.decision = decision
        if isinstance(decision, policy.Deny):
            self.state = State.DONE
            return reject(decision.error)
        if isinstance(decision, policy.Strip):
            return ContinueBody(body.without(document, decision.keys))
        return ContinueBody()


_Handler = Callable[[Stream, Event], Action]
_TRANSITIONS: Final[dict[tuple[State, type], _Handler]] = {
    (State.EXPECT_HEADERS, RequestHeaders): Stream._on_headers,
    (State.EXPECT_BODY, RequestBody): Stream._on_body,
    (State.EXPECT_BODY, RequestTrailers): Stream._on_trailers_without_body,
    (State.EXPECT_TRAILERS, RequestTrailers): Stream._on_trailers,
}
