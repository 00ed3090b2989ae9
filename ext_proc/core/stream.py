"""The ext_proc stream as a sans-IO state machine.

One ``Stream`` per HTTP request. ``handle`` takes each event Envoy sends and returns a
``Step``: the answers to send (possibly none yet, possibly several), once per phase the
``Outcome`` (decision, mode, route, body size, request id) that the edge logs, counts
and exports, and what the edge must know next (a body still arriving, budget bytes to
release once the answers are sent). It raises ``ProtocolError`` instead when Envoy
breaks the message order; after that the stream stays in error.

The legal message order is the table ``TRANSITIONS``, the whole diagram: each event is
first named as a ``Message`` (its type, and where that decides the next state, its end
of stream or body mode), and for each legal (state, message) the table gives the
handler that does the work and the target state. A handler never moves the stream: it
returns answers (the stream moves to the target), a refusal (to ``REJECTED``) or raises
``ProtocolError`` (to ``ERROR``); anything not in the table is a protocol violation.

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
  validation raise become refusals in ``errors.attempt`` only, and every refusal
  becomes a ``Reject`` answer in ``handle`` and nowhere else;
- a body mode this machine cannot inspect is a protocol error, never a pass;
- what a stream holds is charged to the shared budget (in ``memory``'s units) before
  it is parsed (``admission``); the charge for a decided body is handed over with the
  answers that carry its rewrite, and the rest is refunded by ``close``; nothing is
  charged for bytes that have not arrived, so announcing a large body costs nothing;
- audit mode (global, or the route's ``audit: true``) computes and records the same
  decision but forwards the request unchanged; it relaxes only refusals that come from
  inspecting the request (``Refusal.auditable``), never protocol errors, limits,
  timeouts or invalid route metadata, and only in ``_enforced``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum, auto
from typing import Final, NoReturn

from ext_proc.core import admission, memory, mint, policy, proof, route_policy, vllm_request
from ext_proc.core.budget import Account, Budget
from ext_proc.core.config import Config
from ext_proc.core.content_headers import check_headers
from ext_proc.core.decisions import NO_PARAMS, Allow, Decision, Deny, Strip
from ext_proc.core.errors import (
    BadRequest,
    ProtocolError,
    Refusal,
    RequestTimeout,
    RoutePolicyError,
    attempt,
)
from ext_proc.core.events import (
    CHECKED_HEADERS,
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
    Unexpected,
)
from ext_proc.core.reading import Parsed
from ext_proc.core.reasons import Reason
from ext_proc.core.replay import Ticket, Verdict
from ext_proc.core.route_policy import Action
from ext_proc.core.spelling import spelled
from ext_proc.core.vllm_request import CARRIER_NAMES, EC_KEY, KV_KEY, only_kv_params

# Size of each StreamedBody piece: well under every gRPC message limit on both sides.
STREAM_CHUNK: Final = 1024 * 1024
_INSPECTABLE: Final = (BodyMode.BUFFERED, BodyMode.FULL_DUPLEX_STREAMED)


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


class Message(IntEnum):
    """An event as the table reads it."""

    HEADERS = auto()  # request headers, a BUFFERED body follows
    HEADERS_STREAMED = auto()  # request headers, a FULL_DUPLEX_STREAMED body follows
    HEADERS_ONLY = auto()  # request headers, no body
    HEADERS_UNREADABLE = auto()  # request headers, a body in a mode not inspected
    FIRST_BODY = auto()  # headers skipped: the whole BUFFERED body, the request's end
    FIRST_BODY_TRAILED = auto()  # headers skipped: the whole body, trailers follow
    FIRST_BODY_UNREADABLE = auto()  # headers skipped: a body mode not inspected
    FIRST_TRAILERS = auto()  # headers skipped: trailers, no body
    FIRST_TRAILERS_UNREADABLE = auto()  # headers skipped, trailers, a mode not inspected
    BODY = auto()  # a body message, more follows
    BODY_END = auto()  # the body's last message
    TRAILERS = auto()
    TIMED_OUT = auto()
    RESPONSE_HEADERS = auto()  # the response's headers, a body follows
    RESPONSE_HEADERS_ONLY = auto()  # the response's headers, no body
    RESPONSE_BODY = auto()  # the whole response body (BUFFERED)
    RESPONSE_BODY_PART = auto()  # part of a response body: not a mode processed here
    UNEXPECTED = auto()  # a message never asked for


def message(event: Event) -> Message:
    """How the table reads ``event``."""
    return _READERS[type(event)](event)


def _headers(event: Event) -> Message:
    assert isinstance(event, RequestHeaders)
    if event.end_of_stream:
        return Message.HEADERS_ONLY
    if event.body_mode is BodyMode.BUFFERED:
        return Message.HEADERS
    if event.body_mode is BodyMode.FULL_DUPLEX_STREAMED:
        return Message.HEADERS_STREAMED
    return Message.HEADERS_UNREADABLE


def _body(event: Event) -> Message:
    assert isinstance(event, RequestBody)
    if event.preamble is None:
        return Message.BODY_END if event.end_of_stream else Message.BODY
    if event.preamble.body_mode is not BodyMode.BUFFERED:
        return Message.FIRST_BODY_UNREADABLE
    return Message.FIRST_BODY if event.end_of_stream else Message.FIRST_BODY_TRAILED


def _trailers(event: Event) -> Message:
    assert isinstance(event, RequestTrailers)
    if event.preamble is None:
        return Message.TRAILERS
    if event.preamble.body_mode not in _INSPECTABLE:
        return Message.FIRST_TRAILERS_UNREADABLE
    return Message.FIRST_TRAILERS


def _response_headers(event: Event) -> Message:
    assert isinstance(event, ResponseHeaders)
    return Message.RESPONSE_HEADERS_ONLY if event.end_of_stream else Message.RESPONSE_HEADERS


def _response_body(event: Event) -> Message:
    assert isinstance(event, ResponseBody)
    return Message.RESPONSE_BODY if event.end_of_stream else Message.RESPONSE_BODY_PART


_READERS: Final[dict[type, Callable[[Event], Message]]] = {
    RequestHeaders: _headers,
    RequestBody: _body,
    RequestTrailers: _trailers,
    ResponseHeaders: _response_headers,
    ResponseBody: _response_body,
    TimedOut: lambda _: Message.TIMED_OUT,
    Unexpected: lambda _: Message.UNEXPECTED,
}


class Stream:
    """Processes one HTTP request's ext_proc messages."""

    __slots__ = (
        "_account",
        "_asking",
        "_audit",
        "_body_size",
        "_chunks",
        "_config",
        "_decision",
        "_endpoint",
        "_held",
        "_last_chunk",
        "_peer",
        "_pending",
        "_policy",
        "_received",
        "_reported",
        "_request_id",
        "_response_decision",
        "_route",
        "_trust",
        "state",
    )

    def __init__(self, config: Config, budget: Budget, trust: proof.Trust | None = None) -> None:
        self.state = State.EXPECT_HEADERS
        self._config = config
        self._account = Account(budget)
        self._trust = trust if trust is not None else proof.Trust()
        self._decision: Decision | None = None
        self._reported = False
        # Effective audit mode: the global setting, or the route's, once headers are in.
        self._audit = config.audit
        self._route = ""
        self._request_id = ""
        self._body_size = 0
        # A decision made before the body arrived, enforced (audit: reported) with it.
        self._held: Deny | None = None
        self._policy = route_policy.DEFAULT_POLICY
        self._chunks: list[bytes] = []
        self._received = 0
        self._last_chunk: bytes | None = None
        self._peer = NO_PEER
        # The API the upstream serves the request on (the path after the route's
        # rewrite, as vLLM routes it); a proof binds it.
        self._endpoint = ""
        self._pending = mint.NOTHING
        self._response_decision: Decision | None = None
        # A proof to spend before the body's decision stands (``spent``).
        self._asking: _Asking | None = None

    def handle(self, event: Event) -> Step:
        if self._asking is not None:
            self._fail(ProtocolError(f"{message(event).name} before the proof record answered"))
        entry = TRANSITIONS.get((self.state, message(event)))
        if entry is None:
            self._fail(_violation(self.state, event))
        handler, target = entry
        try:
            result = handler(self, event)
        except ProtocolError as exc:
            self._fail(exc)
        if isinstance(result, Refusal):
            return self._rejected(result)
        self.state = target
        if self._asking is not None:
            # Nothing is answered, reported or handed over before the verdict.
            return Step([], request_id=self._request_id, ask=self._asking.ticket)
        return self._step(result)

    def spent(self, verdict: Verdict) -> Step:
        """The record's verdict on the proof the last step asked about: the decision
        stands (``FIRST``), or the request is decided again with the proof unproven
        for the verdict's reason (its parameters removed, or refused on a route that
        denies unproven ones), and the body's answers go out."""
        asking = self._asking
        if asking is None:
            self._fail(ProtocolError("no proof was asked about"))
        self._asking = None
        decision = self._decision
        assert decision is not None, "decided before asking"
        if verdict is not Verdict.FIRST:
            evidence = dataclasses.replace(asking.evidence, spent=verdict.reason)
            decision = policy.decide(
                self._policy, asking.parsed.document, evidence, asking.carriers
            )
            self._decision = decision
        replacement = self._enforce(decision, asking.parsed)
        if isinstance(replacement, Refusal):
            return self._rejected(replacement)
        return self._step(asking.answer(replacement))

    def _rejected(self, refusal: Refusal) -> Step:
        """Into REJECTED: the refusal is answered, its decision reported, all released."""
        self.state = State.REJECTED
        decision = self._decision
        if not (isinstance(decision, Deny) and decision.refusal is refusal):
            self._decision = Deny(refusal)
        self.close()
        return self._step([Reject.of(refusal)])

    def _fail(self, exc: ProtocolError) -> NoReturn:
        """Into ERROR for good, everything released, and ``exc`` raised."""
        self.state = State.ERROR
        self.close()
        exc.request_id = self._request_id
        raise exc

    def _step(self, answers: list[Answer]) -> Step:
        waiting = self.state in (State.EXPECT_BODY, State.STREAMING)
        # Once decided, what the stream holds is what its answers carry.
        held = 0 if waiting else self._account.hand_over()
        outcome: Outcome | None = None
        if self._response_decision is not None:
            outcome = self._outcome(self._response_decision, "response")
            self._response_decision = None
        elif self._decision is not None and not self._reported:
            self._reported = True
            outcome = self._outcome(self._decision, "request")
        final = self.state is State.REJECTED
        return Step(answers, outcome, waiting, held, self._request_id, final)

    def _outcome(self, decision: Decision, phase: str) -> Outcome:
        return Outcome(decision, self._audit, self._route, self._body_size, self._request_id, phase)

    def close(self) -> None:
        """Refund everything held and drop held chunks; safe to call twice."""
        self._account.release()
        self._chunks.clear()

    def _enforced(self, decision: Decision) -> Refusal | bool:
        """Whether ``decision`` is enforced: its refusal, or True when what it forwards
        (a rewrite, a signed response) replaces the original; False: the original is
        forwarded unchanged. The one place audit mode relaxes anything: it forwards
        unchanged, except refusals that do not come from inspecting the request."""
        if isinstance(decision, Deny):
            if self._audit and decision.refusal.auditable:
                return False
            return decision.refusal
        return not self._audit

    # --- request headers ---------------------------------------------------------------

    def _on_headers_only(self, event: Event) -> list[Answer] | Refusal:
        assert isinstance(event, RequestHeaders)
        begun = self._begin(event)
        if begun is not None:
            return begun
        self._decision = Allow(Reason.NO_BODY)
        return [ContinueHeaders()]

    def _on_headers(self, event: Event) -> list[Answer] | Refusal:
        """Headers before a body: BUFFERED answers them now, FULL_DUPLEX_STREAMED with
        the body."""
        assert isinstance(event, RequestHeaders)
        refused = self._begin(event) or self._expect_body(event)
        if refused is not None:
            return refused
        return [ContinueHeaders()] if event.body_mode is BodyMode.BUFFERED else []

    def _on_first_body(self, event: Event) -> list[Answer] | Refusal:
        """request_header_mode SKIP: one message per request, the whole body, with the
        headers and route metadata rebuilt from CEL attributes."""
        assert isinstance(event, RequestBody)
        assert event.preamble is not None
        refused = self._begin(event.preamble) or self._expect_body(event.preamble)
        if refused is not None:
            return refused
        return self._on_buffered_body(event)

    def _on_first_trailers(self, event: Event) -> list[Answer] | Refusal:
        """request_header_mode SKIP and trailers without a body (HTTP/2): the route is
        judged from the attributes, then the empty body like any other."""
        assert isinstance(event, RequestTrailers)
        assert event.preamble is not None
        refused = self._begin(event.preamble) or self._expect_body(event.preamble)
        if refused is not None:
            return refused
        if event.preamble.body_mode is BodyMode.FULL_DUPLEX_STREAMED:
            return self._on_streamed_trailers(event)
        return self._on_trailers_without_body(event)

    def _begin(self, event: RequestHeaders) -> Refusal | None:
        """The route, its policy and the endpoint; a refusal when the route's metadata
        is invalid."""
        route = event.route
        self._route = route.name
        self._peer = event.peer
        found = _checked_headers(event.headers)
        self._request_id = b"".join(found["x-request-id"]).decode("latin-1")
        config = self._config
        parsed = attempt(
            route_policy.parse_items, route.items, route.size, config.route_metadata_namespace
        )
        if isinstance(parsed, Refusal):
            return parsed
        self._policy = parsed
        self._audit = self._audit or parsed.audit
        upstream = parsed.upstream_path(event.path)
        if upstream is None:
            return RoutePolicyError(
                f"invalid route policy metadata: the request path does not begin with the "
                f"route's match_prefix {parsed.match_prefix!r}",
                reason=Reason.INVALID_ROUTE_POLICY,
                param=f"{config.route_metadata_namespace}.match_prefix",
            ).refusal()
        self._endpoint = vllm_request.endpoint(upstream)
        return None

    def _expect_body(self, event: RequestHeaders) -> Refusal | None:
        """The headers of a request with a body: its media type and encoding, and an
        announced size."""
        found = _checked_headers(event.headers)
        checked = attempt(check_headers, found["content-type"], found["content-encoding"])
        if isinstance(checked, Refusal):
            enforced = self._enforced(Deny(checked))
            if isinstance(enforced, Refusal):
                return enforced
            self._held = Deny(checked)  # audit: reported at the end of the body
        declared = found["content-length"]
        if len(declared) == 1 and declared[0].isdigit():
            # Refuse an announced oversized body before it is sent. Nothing is charged
            # for it: an announcement is not bytes held.
            too_large = attempt(admission.check_size, int(declared[0]), self._config.max_body_bytes)
            if too_large is not None:
                return too_large
        return None

    # --- request body ------------------------------------------------------------------

    def _on_buffered_body(self, event: Event) -> list[Answer] | Refusal:
        """The whole body in one message; end_of_stream is false only when trailers
        follow."""
        assert isinstance(event, RequestBody)
        too_large = attempt(admission.check_size, len(event.chunk), self._config.max_body_bytes)
        if too_large is not None:
            return too_large
        answer = functools.partial(_buffered, length_header=event.preamble is None)
        return self._answered(self._decide(event.chunk), answer)

    def _on_chunk(self, event: Event) -> list[Answer] | Refusal:
        assert isinstance(event, RequestBody)
        self._received += len(event.chunk)
        refused = attempt(admission.check_size, self._received, self._config.max_body_bytes)
        refused = refused or attempt(self._account.hold, memory.held(self._received))
        if refused is not None:
            return refused
        self._chunks.append(event.chunk)
        return []

    def _on_last_chunk(self, event: Event) -> list[Answer] | Refusal:
        assert isinstance(event, RequestBody)
        accumulated = self._on_chunk(event)
        if isinstance(accumulated, Refusal):
            return accumulated
        self._last_chunk = event.chunk
        raw = b"".join(self._chunks)
        self._chunks.clear()
        return self._answered(self._decide(raw), functools.partial(_streamed, raw))

    def _answered(
        self, replacement: bytes | Refusal | _Ask | None, answer: _Answerer
    ) -> list[Answer] | Refusal:
        """The answers that forward a decided body (``answer`` of its replacement), its
        refusal, or none yet while its proof is asked about (``answer`` is kept)."""
        if isinstance(replacement, _Ask):
            assert self._asking is not None
            self._asking.answer = answer
            return []
        if isinstance(replacement, Refusal):
            return replacement
        return answer(replacement)

    def _on_repeated_chunk(self, event: Event) -> list[Answer] | Refusal:
        assert isinstance(event, RequestBody)
        # Envoy can send the final chunk a second time on large bodies (envoy#46237).
        # The request was already decided and answered; an exact repeat of a streamed
        # body's last chunk adds nothing.
        if self._last_chunk is not None and event.chunk == self._last_chunk:
            return []
        raise ProtocolError("request body after the end of the stream")

    def _after_rejection(self, event: Event) -> list[Answer] | Refusal:
        # In FULL_DUPLEX_STREAMED mode Envoy keeps sending the chunks (and trailers) it
        # had already read when our ImmediateResponse reaches it; the local reply has
        # ended the request, so they are dropped unanswered. Nothing is held or reserved:
        # close() ran on rejection. Headers or any other message stay protocol errors.
        return []

    def _on_streamed_trailers(self, event: Event) -> list[Answer] | Refusal:
        return BadRequest(
            "request trailers are not accepted on this route", reason=Reason.TRAILERS_UNSUPPORTED
        ).refusal()

    def _on_trailers_without_body(self, event: Event) -> list[Answer] | Refusal:
        # Headers promised a body but trailers came first: the body is empty, which
        # vLLM cannot parse either.
        return BadRequest("request body is empty", reason=Reason.BODY_NOT_JSON).refusal()

    def _on_trailers(self, event: Event) -> list[Answer] | Refusal:
        return [ContinueTrailers()]

    def _on_timeout(self, event: Event) -> list[Answer] | Refusal:
        return RequestTimeout(
            "the request body did not arrive in time", reason=Reason.BODY_TIMEOUT
        ).refusal()

    def _decide(self, raw: bytes) -> bytes | Refusal | _Ask | None:
        """The body to forward instead of ``raw`` (None: unchanged), a refusal, or
        ``_ASK``: its proof must be spent first (``_asking``)."""
        self._body_size = len(raw)
        parsed: Parsed | None = None
        if self._held is not None:
            decision: Decision = self._held
        else:
            inspected = attempt(self._inspect, raw)
            decision, parsed = (
                (Deny(inspected), None) if isinstance(inspected, Refusal) else inspected
            )
        self._decision = decision
        if self._asking is not None:
            return _ASK
        return self._enforce(decision, parsed)

    def _enforce(self, decision: Decision, parsed: Parsed | None) -> bytes | Refusal | None:
        """What enforcing ``decision`` forwards instead of the body (None: unchanged), or
        its refusal."""
        enforced = self._enforced(decision)
        if isinstance(enforced, Refusal):
            return enforced
        if enforced and isinstance(decision, Strip) and parsed is not None:
            # Rewriting may refuse: a body too deep to write back, or json.dumps's extra
            # beyond the budget.
            connector = None if decision.connector is None else dict(decision.connector)
            return attempt(admission.without, parsed, decision.paths, self._account, connector)
        return None

    def _inspect(self, raw: bytes) -> tuple[Decision, Parsed | None]:
        """The policy's decision, and the document it was made on (None: not parsed).
        Charging, parsing and the prompt digest (a body too deep, or json.dumps's extra
        beyond its limits or the budget) raise their refusals."""
        account = self._account
        # How often the bytes name each carrier (None: they cannot tell).
        named = spelled(raw, CARRIER_NAMES)
        if self._policy.action is not Action.MINT and named is not None and not any(named.values()):
            # Nothing to judge or rewrite: the body is forwarded as it came, unparsed
            # (a mint route parses every request for its prompt digest).
            account.hold(memory.held(len(raw)))
            return NO_PARAMS, None
        shape = admission.admit(raw, account, self._config.max_json_values)
        parsed = admission.parse(raw, shape, account, lift_ids=True)
        # No member but the top-level kv_transfer_params (and its policed keys) is named
        # as a carrier when the bytes spell no other name of one: then no carrier is
        # looked for.
        alone = named is not None and only_kv_params(named, parsed.document)
        # Nor any member of a name vLLM reads transfer parameters from, that its
        # response could carry back (a mint route signs only then: mint.judged).
        echo_free = alone or (
            named is not None and named[KV_KEY] <= (KV_KEY in parsed.document) and not named[EC_KEY]
        )
        return self._judge(parsed, alone, echo_free), parsed

    def _judge(self, parsed: Parsed, alone: bool, echo_free: bool) -> Decision:
        """The policy's decision; the prompt digest is rendered only when needed (a
        proof to check) or kept for the response (a mint route on an endpoint it may
        sign). ``alone``: no member but the top-level kv_transfer_params is named as a
        carrier; ``echo_free``: none of a name vLLM reads transfer parameters from.
        Rendering the digest may raise ``BadRequest`` for a body too deep, and
        ``PayloadTooLarge`` or ``ServiceUnavailable`` where only json.dumps renders it
        (``admission.digest``)."""
        carriers = () if alone else None
        if self._policy.action not in policy.WEIGHS_EVIDENCE:
            return policy.decide(self._policy, parsed.document, policy.NO_EVIDENCE, carriers)
        digest = _Once(functools.partial(admission.digest, parsed, self._endpoint, self._account))
        minting = self._policy.action is Action.MINT
        pending = mint.expect(self._endpoint, digest) if minting else mint.NOTHING
        trust = self._trust
        settings = self._config.proof
        evidence = policy.Evidence(
            digest,
            self._peer,
            trust.keys(),
            trust.clock(),
            settings.clock_skew_seconds,
            settings.ttl_seconds,
        )
        decision = policy.decide(self._policy, parsed.document, evidence, carriers)
        self._pending = mint.judged(pending, decision, echo_free)
        if decision.reason == policy.HONORED_PROOF and not isinstance(decision, Deny):
            params = parsed.document[KV_KEY]
            self._asking = _Asking(
                proof.ticket(params, evidence.skew), parsed, evidence, carriers, _no_answer
            )
        return decision

    # --- response ----------------------------------------------------------------------

    def _on_response_headers(self, event: Event) -> list[Answer] | Refusal:
        """A mint route's response headers: they may add a reason not to sign."""
        assert isinstance(event, ResponseHeaders)
        self._pending = mint.checked(self._pending, event)
        return [ContinueResponseHeaders()]

    def _on_response_headers_only(self, event: Event) -> list[Answer] | Refusal:
        assert isinstance(event, ResponseHeaders)
        pending = mint.checked(self._pending, event)
        self._response_decision = Allow(pending.unsigned)
        return [ContinueResponseHeaders()]

    def _on_response_body(self, event: Event) -> list[Answer] | Refusal:
        assert isinstance(event, ResponseBody)
        config, trust = self._config, self._trust
        signing = mint.Signing(
            self._account,
            config.max_body_bytes,
            config.max_json_values,
            trust.keys(),
            int(trust.clock()) + config.proof.ttl_seconds,
        )
        decision, signed = mint.sign(self._pending, event.chunk, signing)
        self._response_decision = decision
        # A response is never refused: its decision is an Allow or a Mint.
        return [ContinueResponseBody(signed if self._enforced(decision) is True else None)]


_UNCHANGED: Final = ContinueBody()
_Answerer = Callable[[bytes | None], list[Answer]]


def _buffered(replacement: bytes | None, *, length_header: bool) -> list[Answer]:
    """A buffered body's answer: unchanged, or replaced."""
    if replacement is None:
        return [_UNCHANGED]
    return [ContinueBody(replacement, length_header=length_header)]


def _streamed(raw: bytes, replacement: bytes | None) -> list[Answer]:
    """A streamed body's answers: the withheld headers, then the body in pieces."""
    out = raw if replacement is None else replacement
    pieces = [out[i : i + STREAM_CHUNK] for i in range(0, len(out), STREAM_CHUNK)] or [b""]
    return [
        ContinueHeaders(),
        *(StreamedBody(piece, i == len(pieces) - 1) for i, piece in enumerate(pieces)),
    ]


def _no_answer(replacement: bytes | None) -> list[Answer]:
    raise AssertionError("the body handler sets the answer before the stream asks")


class _Ask:
    """The marker ``_decide`` returns while a proof waits for the record's verdict."""

    __slots__ = ()


_ASK: Final = _Ask()


@dataclass(slots=True)
class _Asking:
    """A decision that honors a proof, held until the record says it was not spent:
    what deciding again and answering need."""

    ticket: Ticket
    parsed: Parsed
    evidence: policy.Evidence
    carriers: tuple[vllm_request.Path, ...] | None
    answer: _Answerer


_CHECKED: Final = CHECKED_HEADERS


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


def _violation(state: State, event: Event) -> ProtocolError:
    """The protocol error for ``event`` in ``state``, which the table does not allow."""
    kind = message(event)
    if kind is Message.HEADERS_UNREADABLE:
        assert isinstance(event, RequestHeaders)
        return ProtocolError(
            f"request body mode {event.body_mode.name} cannot be inspected; "
            "configure request_body_mode BUFFERED or FULL_DUPLEX_STREAMED"
        )
    if kind in (Message.FIRST_BODY_UNREADABLE, Message.FIRST_TRAILERS_UNREADABLE):
        return ProtocolError(
            "request_header_mode SKIP is supported with request_body_mode BUFFERED only"
        )
    if kind is Message.RESPONSE_BODY_PART:
        return ProtocolError("response bodies are processed in response_body_mode BUFFERED only")
    if state is State.EXPECT_HEADERS and kind in (Message.BODY, Message.BODY_END):
        return ProtocolError("request body before request headers")
    if state is State.EXPECT_HEADERS and kind is Message.TRAILERS:
        return ProtocolError("request trailers before request headers")
    return ProtocolError(f"unexpected {kind.name} in state {state.name}")


_Handler = Callable[[Stream, Event], "list[Answer] | Refusal"]
S, M = State, Message
# (state, message) -> (handler, target state): the whole diagram. A refusal moves the
# stream to REJECTED instead, a ProtocolError to ERROR; ERROR, RESPONSE_DONE and every
# pair not listed accept nothing.
TRANSITIONS: Final[dict[tuple[State, Message], tuple[_Handler, State]]] = {
    (S.EXPECT_HEADERS, M.HEADERS): (Stream._on_headers, S.EXPECT_BODY),
    (S.EXPECT_HEADERS, M.HEADERS_STREAMED): (Stream._on_headers, S.STREAMING),
    (S.EXPECT_HEADERS, M.HEADERS_ONLY): (Stream._on_headers_only, S.DONE),
    (S.EXPECT_HEADERS, M.FIRST_BODY): (Stream._on_first_body, S.DONE),
    (S.EXPECT_HEADERS, M.FIRST_BODY_TRAILED): (Stream._on_first_body, S.EXPECT_TRAILERS),
    (S.EXPECT_HEADERS, M.FIRST_TRAILERS): (Stream._on_first_trailers, S.REJECTED),
    (S.EXPECT_BODY, M.BODY_END): (Stream._on_buffered_body, S.DONE),
    (S.EXPECT_BODY, M.BODY): (Stream._on_buffered_body, S.EXPECT_TRAILERS),
    (S.EXPECT_BODY, M.TRAILERS): (Stream._on_trailers_without_body, S.REJECTED),
    (S.EXPECT_BODY, M.TIMED_OUT): (Stream._on_timeout, S.REJECTED),
    (S.STREAMING, M.BODY): (Stream._on_chunk, S.STREAMING),
    (S.STREAMING, M.BODY_END): (Stream._on_last_chunk, S.DONE),
    (S.STREAMING, M.TRAILERS): (Stream._on_streamed_trailers, S.REJECTED),
    (S.STREAMING, M.TIMED_OUT): (Stream._on_timeout, S.REJECTED),
    (S.EXPECT_TRAILERS, M.TRAILERS): (Stream._on_trailers, S.DONE),
    # A mint route's response to a request the processor was never sent: one without a
    # body (one message per request), or an answer of Envoy's own or of a filter before
    # this one (a buffer limit's 413, a route header stated twice). Nothing of it was
    # judged, so nothing is signed (mint.NOTHING); it passes unchanged.
    (S.EXPECT_HEADERS, M.RESPONSE_HEADERS): (Stream._on_response_headers, S.EXPECT_RESPONSE_BODY),
    (S.EXPECT_HEADERS, M.RESPONSE_HEADERS_ONLY): (
        Stream._on_response_headers_only,
        S.RESPONSE_DONE,
    ),
    (S.DONE, M.BODY_END): (Stream._on_repeated_chunk, S.DONE),
    (S.DONE, M.RESPONSE_HEADERS): (Stream._on_response_headers, S.EXPECT_RESPONSE_BODY),
    (S.DONE, M.RESPONSE_HEADERS_ONLY): (Stream._on_response_headers_only, S.RESPONSE_DONE),
    (S.EXPECT_RESPONSE_BODY, M.RESPONSE_BODY): (Stream._on_response_body, S.RESPONSE_DONE),
    (S.EXPECT_RESPONSE_BODY, M.BODY_END): (Stream._on_repeated_chunk, S.EXPECT_RESPONSE_BODY),
    (S.REJECTED, M.BODY): (Stream._after_rejection, S.REJECTED),
    (S.REJECTED, M.BODY_END): (Stream._after_rejection, S.REJECTED),
    (S.REJECTED, M.TRAILERS): (Stream._after_rejection, S.REJECTED),
}
del S, M
