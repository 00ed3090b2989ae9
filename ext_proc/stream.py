"""The ext_proc stream as a sans-IO state machine.

One ``Stream`` per HTTP request. ``handle`` takes each event Envoy sends and returns the
actions that answer it (possibly none yet, possibly several), or raises
``ProtocolError``; after a protocol error the stream stays in error. The legal message
order is the table ``_TRANSITIONS``; anything not in it is a protocol violation.

Two body modes, detected from Envoy's ``protocol_config`` on the first message:
- BUFFERED: the headers are answered at once; Envoy holds the body and sends it whole
  in one message, answered with ``ContinueBody``.
- FULL_DUPLEX_STREAMED: chunks are accumulated; nothing is answered, not even the
  headers, until the last chunk, so the upstream sees nothing before the decision. Then
  the headers answer and the body as ``StreamedBody`` pieces go out together. A stream
  in this mode never answers with ``ContinueBody``, and vice versa.

Invariants (fail closed):
- a request with a body is let through only after the whole body was parsed and the
  policy returned Allow or Strip;
- every ``HttpError`` becomes a ``Reject`` here and nowhere else;
- a body mode this machine cannot inspect is a protocol error, never a pass;
- bytes held for a stream are reserved in the shared budget first and returned by
  ``close``;
- audit mode (global, or the route's ``audit: true``) computes and records the same
  decision but forwards the request unchanged; it relaxes only refusals that come from
  inspecting the request (``HttpError.auditable``), never protocol errors, limits,
  timeouts or invalid route metadata.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import Enum, auto
from typing import Final

from ext_proc import body, policy, route_policy
from ext_proc.budget import Budget
from ext_proc.errors import (
    BadRequest,
    HttpError,
    PayloadTooLarge,
    ProtocolError,
    RequestTimeout,
    ServiceUnavailable,
)
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
    StreamedBody,
    TimedOut,
)

# Size of each StreamedBody piece: well under every gRPC message limit on both sides.
STREAM_CHUNK: Final = 1024 * 1024


class State(Enum):
    EXPECT_HEADERS = auto()
    EXPECT_BODY = auto()  # BUFFERED: the whole body comes in one message
    STREAMING = auto()  # FULL_DUPLEX_STREAMED: accumulating chunks
    EXPECT_TRAILERS = auto()
    DONE = auto()
    REJECTED = auto()  # answered with an ImmediateResponse: Envoy ends the request
    ERROR = auto()


def reject(error: HttpError) -> Reject:
    """vLLM's error shape, so OpenAI clients parse the denial like any vLLM error."""
    payload = {
        "error": {
            "message": error.message,
            "type": error.error_type,
            "param": error.param,
            "code": error.status,
        }
    }
    headers: tuple[tuple[str, bytes], ...] = ()
    if isinstance(error, ServiceUnavailable):
        headers = (("retry-after", str(error.retry_after_seconds).encode()),)
    return Reject(
        error.status, json.dumps(payload).encode(), f"token_policy_{error.reason}", headers
    )


class Stream:
    """Processes one HTTP request's ext_proc messages."""

    def __init__(
        self,
        *,
        max_body_bytes: int,
        budget: Budget | None = None,
        namespace: str = route_policy.DEFAULT_NAMESPACE,
        audit: bool = False,
    ) -> None:
        self.state = State.EXPECT_HEADERS
        self.decision: policy.Decision | None = None
        # Effective audit mode: the global setting, or the route's, once headers are in.
        self.audit = audit
        self.route_name = ""
        self.body_size = 0
        self._held_refusal: HttpError | None = None
        self._max_body_bytes = max_body_bytes
        self._budget = budget if budget is not None else Budget(max_body_bytes)
        self._namespace = namespace
        self._policy = route_policy.DEFAULT_POLICY
        self._mode = BodyMode.NONE
        self._chunks: list[bytes] = []
        self._received = 0
        self._reserved = 0
        self._last_chunk: bytes | None = None

    @property
    def waiting_for_body(self) -> bool:
        return self.state in (State.EXPECT_BODY, State.STREAMING)

    def handle(self, event: Event) -> list[Action]:
        handler = _TRANSITIONS.get((self.state, type(event)))
        if handler is None:
            state, self.state = self.state, State.ERROR
            self.close()
            raise ProtocolError(
                f"unexpected {type(event).__name__} in state {state.name}",
                reason="protocol_violation",
            )
        try:
            return handler(self, event)
        except HttpError as exc:
            self.state = State.REJECTED
            if not (isinstance(self.decision, policy.Deny) and self.decision.error is exc):
                self.decision = policy.Deny(exc)
            self.close()
            return [reject(exc)]
        except ProtocolError:
            self.state = State.ERROR
            self.close()
            raise
        finally:
            self._drop_tracebacks()

    def _drop_tracebacks(self) -> None:
        """Errors this stream keeps (the decision's, an audited refusal) must not keep
        their tracebacks: the frames reference this stream and the body bytes, a cycle
        only the cyclic collector (run rarely here, see server.py) would free."""
        if isinstance(self.decision, policy.Deny):
            self.decision.error.__traceback__ = None
        if self._held_refusal is not None:
            self._held_refusal.__traceback__ = None

    def close(self) -> None:
        """Give back every reserved byte and drop held chunks; safe to call twice."""
        self._budget.release(self._reserved)
        self._reserved = 0
        self._chunks.clear()

    def _reserve(self, total: int) -> None:
        """Make sure ``total`` body bytes are reserved (413 or 503 when impossible)."""
        if total > self._max_body_bytes:
            raise PayloadTooLarge(
                f"request body of {total} bytes or more exceeds the limit of "
                f"{self._max_body_bytes} bytes",
                reason="body_too_large",
            )
        extra = total - self._reserved
        if extra > 0:
            if not self._budget.try_acquire(extra):
                raise ServiceUnavailable(
                    "the gateway is holding too many request bodies; retry shortly",
                    reason="inflight_budget_exhausted",
                )
            self._reserved = total

    def _on_headers(self, event: Event) -> list[Action]:
        assert isinstance(event, RequestHeaders)
        return self._begin(event)

    def _on_headerless_body(self, event: Event) -> list[Action]:
        """request_header_mode SKIP: one message per request, the whole body, with the
        headers and route metadata rebuilt from CEL attributes."""
        assert isinstance(event, RequestBody)
        if event.preamble is None:
            raise ProtocolError("request body before request headers", reason="protocol_violation")
        if event.preamble.body_mode is not BodyMode.BUFFERED:
            raise ProtocolError(
                "request_header_mode SKIP is supported with request_body_mode BUFFERED only",
                reason="unsupported_body_mode",
            )
        self._begin(event.preamble)
        return self._on_buffered_body(event)

    def _begin(self, event: RequestHeaders) -> list[Action]:
        self.route_name = event.route.name
        self._policy = route_policy.parse(event.route.values, event.route.size, self._namespace)
        self.audit = self.audit or self._policy.audit
        if event.end_of_stream:
            self.state = State.DONE
            self.decision = policy.Allow("no_body")
            return [ContinueHeaders()]
        if event.body_mode not in (BodyMode.BUFFERED, BodyMode.FULL_DUPLEX_STREAMED):
            raise ProtocolError(
                f"request body mode {event.body_mode.name} cannot be inspected; "
                "configure request_body_mode BUFFERED or FULL_DUPLEX_STREAMED",
                reason="unsupported_body_mode",
            )
        self._mode = event.body_mode
        try:
            body.check_headers(event.values("content-type"), event.values("content-encoding"))
        except HttpError as exc:
            if not (self.audit and exc.auditable):
                raise
            self._held_refusal = exc  # reported at the end of the body, not enforced
        declared = event.values("content-length")
        if len(declared) == 1 and declared[0].isdigit():
            # Refuse an announced oversized or unaffordable body before it is sent.
            self._reserve(int(declared[0]))
        if self._mode is BodyMode.BUFFERED:
            self.state = State.EXPECT_BODY
            return [ContinueHeaders()]
        self.state = State.STREAMING
        return []

    def _on_buffered_body(self, event: Event) -> list[Action]:
        assert isinstance(event, RequestBody)
        self._reserve(len(event.chunk))
        # This one message is the whole body; end_of_stream is false only when
        # trailers follow.
        self.state = State.DONE if event.end_of_stream else State.EXPECT_TRAILERS
        replacement = self._decide(event.chunk)
        self.close()
        return [ContinueBody(replacement)]

    def _on_chunk(self, event: Event) -> list[Action]:
        assert isinstance(event, RequestBody)
        self._received += len(event.chunk)
        self._reserve(max(self._received, self._reserved))
        self._chunks.append(event.chunk)
        if not event.end_of_stream:
            return []
        self._last_chunk = event.chunk
        self.state = State.DONE
        raw = b"".join(self._chunks)
        replacement = self._decide(raw)
        self.close()
        out = raw if replacement is None else replacement
        pieces = [out[i : i + STREAM_CHUNK] for i in range(0, len(out), STREAM_CHUNK)] or [b""]
        return [
            ContinueHeaders(),
            *(StreamedBody(piece, i == len(pieces) - 1) for i, piece in enumerate(pieces)),
        ]

    def _on_chunk_after_done(self, event: Event) -> list[Action]:
        assert isinstance(event, RequestBody)
        # Envoy can send the final chunk a second time on large bodies (envoy#46237).
        # The request was already decided and answered; an exact repeat adds nothing.
        if (
            self._mode is BodyMode.FULL_DUPLEX_STREAMED
            and event.end_of_stream
            and event.chunk == self._last_chunk
        ):
            return []
        raise ProtocolError("request body after the end of the stream", reason="protocol_violation")

    def _after_rejection(self, event: Event) -> list[Action]:
        # In FULL_DUPLEX_STREAMED mode Envoy keeps sending the chunks (and trailers) it
        # had already read when our ImmediateResponse reaches it; the local reply has
        # ended the request, so they are dropped unanswered. Nothing is held or reserved:
        # close() ran on rejection. Headers or any other message stay protocol errors.
        return []

    def _on_trailers_without_body(self, event: Event) -> list[Action]:
        if self._mode is BodyMode.FULL_DUPLEX_STREAMED:
            raise BadRequest(
                "request trailers are not accepted on this route", reason="trailers_unsupported"
            )
        # Headers promised a body but trailers came first: the body is empty, which
        # vLLM cannot parse either.
        raise BadRequest("request body is empty", reason="body_not_json")

    def _on_trailers(self, event: Event) -> list[Action]:
        self.state = State.DONE
        return [ContinueTrailers()]

    def _on_timeout(self, event: Event) -> list[Action]:
        raise RequestTimeout("the request body did not arrive in time", reason="body_timeout")

    def _decide(self, raw: bytes) -> bytes | None:
        """The body to forward instead of ``raw`` (None: unchanged), or raise a denial."""
        self.body_size = len(raw)
        try:
            if self._held_refusal is not None:
                raise self._held_refusal
            parsed = body.parse(raw)
        except HttpError as exc:
            if not (self.audit and exc.auditable):
                raise
            self.decision = policy.Deny(exc)
            return None
        decision = policy.decide(self._policy, parsed.document)
        self.decision = decision
        if self.audit:
            return None
        if isinstance(decision, policy.Deny):
            raise decision.error
        if isinstance(decision, policy.Strip):
            return body.without(parsed, decision.keys)
        return None


_Handler = Callable[[Stream, Event], list[Action]]
_TRANSITIONS: Final[dict[tuple[State, type], _Handler]] = {
    (State.EXPECT_HEADERS, RequestHeaders): Stream._on_headers,
    (State.EXPECT_HEADERS, RequestBody): Stream._on_headerless_body,
    (State.EXPECT_BODY, RequestBody): Stream._on_buffered_body,
    (State.EXPECT_BODY, RequestTrailers): Stream._on_trailers_without_body,
    (State.EXPECT_BODY, TimedOut): Stream._on_timeout,
    (State.STREAMING, RequestBody): Stream._on_chunk,
    (State.STREAMING, RequestTrailers): Stream._on_trailers_without_body,
    (State.STREAMING, TimedOut): Stream._on_timeout,
    (State.EXPECT_TRAILERS, RequestTrailers): Stream._on_trailers,
    (State.DONE, RequestBody): Stream._on_chunk_after_done,
    (State.REJECTED, RequestBody): Stream._after_rejection,
    (State.REJECTED, RequestTrailers): Stream._after_rejection,
}
