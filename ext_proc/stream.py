"""The ext_proc stream as a sans-IO state machine.

One ``Stream`` per HTTP request. ``handle`` takes each event Envoy sends and returns a
``Step``: the answers to send (possibly none yet, possibly several) and, exactly once
per request, the ``Outcome`` (decision, mode, route, body size, request id) that the
edge logs, counts and exports. It raises ``ProtocolError`` instead when Envoy breaks
the message order; after that the stream stays in error. The legal message order is
the table ``_TRANSITIONS``: for each (state, event) the handler that does the work and,
where the event alone decides it, the target state; anything not in the table is a
protocol violation.

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
- a refusal is a value (``errors.Refusal``); the exceptions that parsing and
  validation raise become refusals in ``_attempt`` and nowhere else, and every refusal
  becomes a ``Reject`` answer in ``handle`` and nowhere else;
- a body mode this machine cannot inspect is a protocol error, never a pass;
- what a stream holds is charged to the shared budget (in ``memory``'s units) before
  it is parsed and refunded by ``close``; nothing is charged for bytes that have not
  arrived, so announcing a large body costs the gateway nothing;
- audit mode (global, or the route's ``audit: true``) computes and records the same
  decision but forwards the request unchanged; it relaxes only refusals that come from
  inspecting the request (``Refusal.auditable``), never protocol errors, limits,
  timeouts or invalid route metadata.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum, auto
from typing import Final, ParamSpec, TypeVar

from ext_proc import attributes, body, memory, policy, proof, route_policy, vllm_request
from ext_proc.budget import Budget
from ext_proc.errors import (
    BadRequest,
    HttpError,
    PayloadTooLarge,
    ProtocolError,
    Refusal,
    RequestTimeout,
    RoutePolicyError,
    ServiceUnavailable,
)
from ext_proc.events import (
    NO_PEER,
    Answer,
    BodyMode,
    ContinueBody,
    ContinueHeaders,
    ContinueResponseBody,
    ContinueResponseHeaders,
    ContinueTrailers,
    Event,
    Outcome,
    Reject,
    RequestBody,
    RequestHeaders,
    RequestTrailers,
    ResponseBody,
    ResponseHeaders,
    Step,
    StreamedBody,
    TimedOut,
)
from ext_proc.route_policy import Action
from ext_proc.vllm_request import CARRIER_NAMES, EC_KEY, KV_KEY

# Size of each StreamedBody piece: well under every gRPC message limit on both sides.
STREAM_CHUNK: Final = 1024 * 1024
# The reason of the refusal when the in-flight budget cannot hold a body.
_BUDGET_EXHAUSTED: Final = "inflight_budget_exhausted"

P = ParamSpec("P")
T = TypeVar("T")


class State(IntEnum):  # hashed in C: the transition table is keyed by it
    EXPECT_HEADERS = auto()
    EXPECT_BODY = auto()  # BUFFERED: the whole body comes in one message
    STREAMING = auto()  # FULL_DUPLEX_STREAMED: accumulating chunks
    EXPECT_TRAILERS = auto()
    DONE = auto()
    REJECTED = auto()  # answered with an ImmediateResponse: Envoy ends the request
    ERROR = auto()
    EXPECT_RESPONSE_BODY = auto()  # a route that processes the response (mint)
    RESPONSE_DONE = auto()


@dataclass(frozen=True, slots=True)
class Trust:
    """What proofs need from outside the stream: the current keys, the clock, limits."""

    keys: Callable[[], proof.KeySet] = lambda: policy.NO_KEYS
    clock: Callable[[], float] = time.time
    ttl_seconds: int = 60
    clock_skew_seconds: float = 5.0


def _attempt(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | Refusal:
    """``call``'s result, or the refusal it raised: the one place an ``HttpError``
    becomes a value. The exception is dropped here, so no traceback (which references
    the stream and the body) outlives the call."""
    try:
        return call(*args, **kwargs)
    except HttpError as exc:
        return exc.refusal()


class Stream:
    """Processes one HTTP request's ext_proc messages."""

    __slots__ = (
        "_audit",
        "_body_size",
        "_budget",
        "_charged",
        "_chunks",
        "_decision",
        "_digest",
        "_endpoint",
        "_held_refusal",
        "_last_chunk",
        "_max_body_bytes",
        "_max_json_values",
        "_mint_refused",
        "_mode",
        "_namespace",
        "_peer",
        "_policy",
        "_received",
        "_reported",
        "_request_id",
        "_response_decision",
        "_route",
        "_trust",
        "state",
    )

    def __init__(
        self,
        *,
        max_body_bytes: int,
        max_json_values: int = memory.MAX_JSON_VALUES,
        budget: Budget | None = None,
        namespace: str = route_policy.DEFAULT_NAMESPACE,
        audit: bool = False,
        trust: Trust | None = None,
    ) -> None:
        self.state = State.EXPECT_HEADERS
        self._decision: policy.Decision | None = None
        self._reported = False
        # Effective audit mode: the global setting, or the route's, once headers are in.
        self._audit = audit
        self._route = ""
        self._request_id = ""
        self._body_size = 0
        self._held_refusal: Refusal | None = None
        self._max_body_bytes = max_body_bytes
        self._max_json_values = max_json_values
        if budget is None:
            budget = Budget(memory.largest(max_body_bytes, max_json_values))
        self._budget = budget
        self._namespace = namespace
        self._policy = route_policy.DEFAULT_POLICY
        self._mode = BodyMode.NONE
        self._chunks: list[bytes] = []
        self._received = 0
        self._charged = 0
        self._last_chunk: bytes | None = None
        self._trust = trust if trust is not None else Trust()
        self._peer = NO_PEER
        # The API the upstream serves the request on (the path after the route's
        # rewrite, as vLLM routes it); a proof binds it.
        self._endpoint = ""
        # The request's prompt digest, kept on a mint route for the response.
        self._digest: bytes | None = None
        self._response_decision: policy.Decision | None = None
        self._mint_refused: str | None = None

    @property
    def waiting_for_body(self) -> bool:
        return self.state in (State.EXPECT_BODY, State.STREAMING)

    @property
    def request_id(self) -> str:
        """The request's x-request-id once its headers are in (for protocol-error logs)."""
        return self._request_id

    def handle(self, event: Event) -> Step:
        entry = _TRANSITIONS.get((self.state, type(event)))
        if entry is None:
            state, self.state = self.state, State.ERROR
            self.close()
            raise ProtocolError(
                f"unexpected {type(event).__name__} in state {state.name}",
                reason="protocol_violation",
            )
        handler, target = entry
        try:
            result = handler(self, event)
        except ProtocolError:
            self.state = State.ERROR
            self.close()
            raise
        if isinstance(result, Refusal):
            self.state = State.REJECTED
            decision = self._decision
            if not (isinstance(decision, policy.Deny) and decision.refusal is result):
                self._decision = policy.Deny(result)
            self.close()
            return self._step([Reject.of(result)])
        if target is not None:
            self.state = target
        return self._step(result)

    def _step(self, answers: list[Answer]) -> Step:
        if self._response_decision is not None:
            decision, self._response_decision = self._response_decision, None
            return Step(answers, self._outcome(decision, "response"))
        if self._decision is None or self._reported:
            return Step(answers)
        self._reported = True
        return Step(answers, self._outcome(self._decision, "request"))

    def _outcome(self, decision: policy.Decision, phase: str) -> Outcome:
        return Outcome(decision, self._audit, self._route, self._body_size, self._request_id, phase)

    def sent(self) -> None:
        """The edge has sent the answers of the last step. The charge for a body covers
        its rewrite until then (the rewritten body and its protobuf message are held
        while gRPC sends them); it is refunded now unless a body is still arriving."""
        if not self.waiting_for_body:
            self.close()

    def close(self) -> None:
        """Refund everything charged and drop held chunks; safe to call twice."""
        self._budget.release(self._charged)
        self._charged = 0
        self._chunks.clear()

    def _too_large(self, size: int) -> Refusal | None:
        if size <= self._max_body_bytes:
            return None
        return PayloadTooLarge(
            f"request body of {size} bytes or more exceeds the limit of "
            f"{self._max_body_bytes} bytes",
            reason="body_too_large",
        ).refusal()

    def _charge(self, total: int) -> None:
        """Make sure ``total`` is charged to the budget (``ServiceUnavailable`` when it
        cannot be)."""
        extra = total - self._charged
        if extra > 0:
            if not self._budget.try_acquire(extra):
                raise ServiceUnavailable(
                    "the gateway is holding too many request bodies; retry shortly",
                    reason=_BUDGET_EXHAUSTED,
                )
            self._charged = total

    def _slow_path(self, raw: bytes, shape: body.Shape) -> Callable[[], None]:
        """Charges what json.loads or json.dumps costs on top, before either runs."""
        total = memory.cost(len(raw), shape.values) + memory.slow_extra(len(raw))
        return functools.partial(self._charge, total)

    def _admit(self, raw: bytes) -> body.Shape:
        """The shape of a whole body, once its parsed cost is charged (raises
        ``PayloadTooLarge`` for too many values, ``ServiceUnavailable`` when the budget
        cannot hold it)."""
        shape = body.scan(raw, self._max_json_values)
        if shape.values > self._max_json_values:
            raise PayloadTooLarge(
                f"request body holds more than {self._max_json_values} JSON values",
                reason="body_too_complex",
            )
        self._charge(memory.cost(len(raw), shape.values))
        return shape

    def _on_headers(self, event: Event) -> list[Answer] | Refusal:
        assert isinstance(event, RequestHeaders)
        return self._begin(event)

    def _on_headerless_body(self, event: Event) -> list[Answer] | Refusal:
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
        begun = self._begin(event.preamble)
        if isinstance(begun, Refusal):
            return begun
        return self._on_buffered_body(event)

    def _on_headerless_trailers(self, event: Event) -> list[Answer] | Refusal:
        """request_header_mode SKIP and trailers without a body (HTTP/2): the route is
        judged from the attributes, then the empty body like any other."""
        assert isinstance(event, RequestTrailers)
        if event.preamble is None:
            raise ProtocolError(
                "request trailers before request headers", reason="protocol_violation"
            )
        begun = self._begin(event.preamble)
        if isinstance(begun, Refusal):
            return begun
        return self._on_trailers_without_body(event)

    def _begin(self, event: RequestHeaders) -> list[Answer] | Refusal:
        route = event.route
        self._route = route.name
        self._peer = event.peer
        found = _checked_headers(event.headers)
        self._request_id = b"".join(found["x-request-id"]).decode("latin-1")
        parsed = _attempt(route_policy.parse_items, route.items, route.size, self._namespace)
        if isinstance(parsed, Refusal):
            return parsed
        self._policy = parsed
        self._audit = self._audit or parsed.audit
        upstream = parsed.upstream_path(event.path, event.routed)
        if upstream is None:
            field = "prefix_rewrite" if event.routed else "match_prefix"
            return RoutePolicyError(
                f"invalid route policy metadata: the request path does not begin with the "
                f"route's {field} {getattr(parsed, field)!r}",
                reason="invalid_route_policy",
                param=f"{self._namespace}.{field}",
            ).refusal()
        self._endpoint = vllm_request.endpoint(upstream)
        if event.end_of_stream:
            self.state = State.DONE
            self._decision = policy.Allow("no_body")
            return [ContinueHeaders()]
        if event.body_mode not in (BodyMode.BUFFERED, BodyMode.FULL_DUPLEX_STREAMED):
            raise ProtocolError(
                f"request body mode {event.body_mode.name} cannot be inspected; "
                "configure request_body_mode BUFFERED or FULL_DUPLEX_STREAMED",
                reason="unsupported_body_mode",
            )
        self._mode = event.body_mode
        checked = _attempt(body.check_headers, found["content-type"], found["content-encoding"])
        if isinstance(checked, Refusal):
            if not (self._audit and checked.auditable):
                return checked
            self._held_refusal = checked  # reported at the end of the body, not enforced
        declared = found["content-length"]
        if len(declared) == 1 and declared[0].isdigit():
            # Refuse an announced oversized body before it is sent. Nothing is charged
            # for it: an announcement is not bytes held.
            refused = self._too_large(int(declared[0]))
            if refused is not None:
                return refused
        if self._mode is BodyMode.BUFFERED:
            self.state = State.EXPECT_BODY
            return [ContinueHeaders()]
        self.state = State.STREAMING
        return []

    def _on_buffered_body(self, event: Event) -> list[Answer] | Refusal:
        assert isinstance(event, RequestBody)
        refused = self._too_large(len(event.chunk))
        if refused is not None:
            return refused
        # This one message is the whole body; end_of_stream is false only when
        # trailers follow.
        self.state = State.DONE if event.end_of_stream else State.EXPECT_TRAILERS
        replacement = self._decide(event.chunk)
        if isinstance(replacement, Refusal):
            return replacement
        if replacement is None:
            return [_UNCHANGED]
        return [ContinueBody(replacement, length_header=event.preamble is None)]

    def _on_chunk(self, event: Event) -> list[Answer] | Refusal:
        assert isinstance(event, RequestBody)
        self._received += len(event.chunk)
        refused = self._too_large(self._received) or _attempt(
            self._charge, memory.held(self._received)
        )
        if refused is not None:
            return refused
        self._chunks.append(event.chunk)
        if not event.end_of_stream:
            return []
        self._last_chunk = event.chunk
        self.state = State.DONE
        raw = b"".join(self._chunks)
        self._chunks.clear()
        replacement = self._decide(raw)
        if isinstance(replacement, Refusal):
            return replacement
        out = raw if replacement is None else replacement
        pieces = [out[i : i + STREAM_CHUNK] for i in range(0, len(out), STREAM_CHUNK)] or [b""]
        return [
            ContinueHeaders(),
            *(StreamedBody(piece, i == len(pieces) - 1) for i, piece in enumerate(pieces)),
        ]

    def _on_chunk_after_done(self, event: Event) -> list[Answer] | Refusal:
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

    def _after_rejection(self, event: Event) -> list[Answer] | Refusal:
        # In FULL_DUPLEX_STREAMED mode Envoy keeps sending the chunks (and trailers) it
        # had already read when our ImmediateResponse reaches it; the local reply has
        # ended the request, so they are dropped unanswered. Nothing is held or reserved:
        # close() ran on rejection. Headers or any other message stay protocol errors.
        return []

    def _on_trailers_without_body(self, event: Event) -> list[Answer] | Refusal:
        if self._mode is BodyMode.FULL_DUPLEX_STREAMED:
            return BadRequest(
                "request trailers are not accepted on this route", reason="trailers_unsupported"
            ).refusal()
        # Headers promised a body but trailers came first: the body is empty, which
        # vLLM cannot parse either.
        return BadRequest("request body is empty", reason="body_not_json").refusal()

    def _on_trailers(self, event: Event) -> list[Answer] | Refusal:
        return [ContinueTrailers()]

    def _on_timeout(self, event: Event) -> list[Answer] | Refusal:
        return RequestTimeout(
            "the request body did not arrive in time", reason="body_timeout"
        ).refusal()

    def _decide(self, raw: bytes) -> bytes | Refusal | None:
        """The body to forward instead of ``raw`` (None: unchanged), or a refusal."""
        self._body_size = len(raw)
        if self._held_refusal is not None:
            return self._refused(self._held_refusal)
        result = _attempt(self._inspect, raw)
        return self._refused(result) if isinstance(result, Refusal) else result

    def _inspect(self, raw: bytes) -> bytes | Refusal | None:
        """``_decide``'s work: the policy's refusal is returned, the refusals of
        charging, parsing, the prompt digest (a body too deep) and rewriting (a body too
        deep to write back) are raised."""
        # How often the bytes name each carrier (None: they cannot tell).
        named = body.spelled(raw, CARRIER_NAMES)
        if self._policy.action is not Action.MINT and named is not None and not any(named.values()):
            # Nothing to judge or rewrite: the body is forwarded as it came, unparsed
            # (a mint route parses every request for its prompt digest).
            self._charge(memory.held(len(raw)))
            self._decision = policy.NO_PARAMS
            return None
        shape = self._admit(raw)
        slow = self._slow_path(raw, shape)
        parsed = body.parse(raw, shape, slow, lift_ids=True)
        # No member but the top-level kv_transfer_params is named as a carrier when the
        # bytes spell no other name of one (then no carrier is looked for).
        alone = (
            named is not None and named[KV_KEY] <= (KV_KEY in parsed.document) and not named[EC_KEY]
        )
        decision = self._judge(parsed, alone)
        self._decision = decision
        if self._audit:
            return None
        if isinstance(decision, policy.Deny):
            return decision.refusal
        if isinstance(decision, policy.Strip):
            return body.without(parsed, decision.paths, slow)
        return None

    def _refused(self, refusal: Refusal) -> Refusal | None:
        """``refusal``, or in audit mode, when it comes from inspecting the request, the
        decision it records while the body passes unchanged (None)."""
        if self._audit and refusal.auditable:
            self._decision = policy.Deny(refusal)
            return None
        return refusal

    def _judge(self, parsed: body.Parsed, alone: bool) -> policy.Decision:
        """The policy's decision; the prompt digest is rendered only when needed (a
        proof to check) or kept for the response (a mint route on an endpoint it may
        sign). ``alone``: no member but the top-level kv_transfer_params is named as a
        carrier. Rendering the digest may raise ``BadRequest`` for a body too deep."""
        digest = _Once(
            functools.partial(
                proof.prompt_digest, parsed.document, parsed.orjson_safe, self._endpoint
            )
        )
        if self._policy.action is Action.MINT:
            if self._endpoint in vllm_request.MINT_ENDPOINTS:
                self._digest = digest()
            else:
                self._mint_refused = "endpoint_not_mintable"
        trust = self._trust
        evidence = policy.Evidence(
            digest, self._peer, trust.keys(), trust.clock(), trust.clock_skew_seconds
        )
        decision = policy.decide(self._policy, parsed.document, evidence, () if alone else None)
        if self._digest is not None and not alone and not decision.reason.startswith("trusted_"):
            # A member named as a carrier somewhere else in a caller's request: its
            # content could come back in the response's parameters (docs/trust.md).
            self._digest, self._mint_refused = None, "request_may_echo"
        return decision

    def _on_response_headers(self, event: Event) -> list[Answer] | Refusal:
        """A mint route's response: its body is signed when it can be (see
        ``_mint_blocker``); any other response passes unchanged."""
        assert isinstance(event, ResponseHeaders)
        blocker = self._mint_blocker(event)
        if event.end_of_stream:
            self.state = State.RESPONSE_DONE
            self._response_decision = policy.Allow(blocker or "response_without_body")
        else:
            self.state = State.EXPECT_RESPONSE_BODY
            self._mint_refused = blocker
        return [ContinueResponseHeaders()]

    def _mint_blocker(self, event: ResponseHeaders) -> str | None:
        if self._policy.action is not Action.MINT:
            return "not_minted_on_this_route"
        if self._mint_refused is not None:
            return self._mint_refused  # decided with the request (its endpoint)
        if self._digest is None:
            return "not_minted_on_this_route"
        if event.values(":status") != [b"200"]:
            return "response_not_ok"
        types = event.values("content-type")
        if len(types) != 1 or body.media_type(types[0]) != "application/json":
            return "response_not_json"
        if any(
            v.strip().lower() not in (b"", b"identity") for v in event.values("content-encoding")
        ):
            return "response_encoded"
        return None

    def _on_response_body(self, event: Event) -> list[Answer] | Refusal:
        assert isinstance(event, ResponseBody)
        if not event.end_of_stream:
            raise ProtocolError(
                "response bodies are processed in response_body_mode BUFFERED only",
                reason="unsupported_body_mode",
            )
        decision, replacement = self._mint(event.chunk)
        self._response_decision = decision
        return [ContinueResponseBody(None if self._audit else replacement)]

    def _mint(self, raw: bytes) -> tuple[policy.Decision, bytes | None]:
        """The response's decision and its signed body; what it holds stays charged
        until ``sent``."""
        if self._mint_refused is not None:
            return policy.Allow(self._mint_refused), None
        assert self._digest is not None
        too_large = self._too_large(len(raw))
        shape = too_large if too_large is not None else _attempt(self._admit, raw)
        if isinstance(shape, Refusal):
            return policy.Allow("response_not_affordable"), None
        slow = self._slow_path(raw, shape)
        parsed = _attempt(body.parse, raw, shape, slow)
        if isinstance(parsed, Refusal):
            return policy.Allow("response_not_json"), None
        trust = self._trust
        expiry = int(trust.clock()) + trust.ttl_seconds
        decision, params = policy.mint_response(parsed.document, self._digest, trust.keys(), expiry)
        if params is None:
            return decision, None
        written = _attempt(body.write, parsed, {**parsed.document, KV_KEY: params}, slow)
        if isinstance(written, Refusal):
            # Too deep for orjson's writer and past what json.dumps may write, or the
            # budget cannot hold json.dumps's extra.
            affordable = written.reason != _BUDGET_EXHAUSTED
            return policy.Allow(
                "response_too_deep" if affordable else "response_not_affordable"
            ), None
        return decision, written


_UNCHANGED: Final = ContinueBody()
# The request headers the stream reads: those the attribute contract names.
_CHECKED: Final = tuple(attributes.HEADERS)


def _checked_headers(headers: tuple[tuple[str, bytes], ...]) -> dict[str, list[bytes]]:
    """The values of each of ``_CHECKED`` in order, in one pass over the headers."""
    found: dict[str, list[bytes]] = {name: [] for name in _CHECKED}
    for key, value in headers:
        if key in found:
            found[key].append(value)
    return found


class _Once:
    """``make()`` computed on the first call only (functools.cache builds a whole LRU
    wrapper, too costly for one call per request)."""

    __slots__ = ("_make", "_value")

    def __init__(self, make: Callable[[], bytes]) -> None:
        self._make = make
        self._value: bytes | None = None

    def __call__(self) -> bytes:
        if self._value is None:
            self._value = self._make()
        return self._value


_Handler = Callable[[Stream, Event], "list[Answer] | Refusal"]
# (state, event type) -> (handler, target state). A target of None: the handler moves
# the stream itself, because the event's content decides (end of stream, body mode).
# Any refusal moves the stream to REJECTED, any ProtocolError to ERROR.
_TRANSITIONS: Final[dict[tuple[State, type], tuple[_Handler, State | None]]] = {
    (State.EXPECT_HEADERS, RequestHeaders): (Stream._on_headers, None),
    (State.EXPECT_HEADERS, RequestBody): (Stream._on_headerless_body, None),
    (State.EXPECT_HEADERS, RequestTrailers): (Stream._on_headerless_trailers, None),
    (State.EXPECT_BODY, RequestBody): (Stream._on_buffered_body, None),
    (State.EXPECT_BODY, RequestTrailers): (Stream._on_trailers_without_body, State.REJECTED),
    (State.EXPECT_BODY, TimedOut): (Stream._on_timeout, State.REJECTED),
    (State.STREAMING, RequestBody): (Stream._on_chunk, None),
    (State.STREAMING, RequestTrailers): (Stream._on_trailers_without_body, State.REJECTED),
    (State.STREAMING, TimedOut): (Stream._on_timeout, State.REJECTED),
    (State.EXPECT_TRAILERS, RequestTrailers): (Stream._on_trailers, State.DONE),
    (State.DONE, RequestBody): (Stream._on_chunk_after_done, State.DONE),
    (State.DONE, ResponseHeaders): (Stream._on_response_headers, None),
    (State.EXPECT_RESPONSE_BODY, ResponseBody): (Stream._on_response_body, State.RESPONSE_DONE),
    (State.EXPECT_RESPONSE_BODY, RequestBody): (Stream._on_chunk_after_done, None),
    (State.REJECTED, RequestBody): (Stream._after_rejection, State.REJECTED),
    (State.REJECTED, RequestTrailers): (Stream._after_rejection, State.REJECTED),
}
