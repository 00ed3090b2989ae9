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
handler that does the work and the target state. The table is kept by event class, so
each handler is typed for the event it is given. A handler never moves the stream: it
returns a value (answers; a ``Decided`` phase; a ``Deny``, which moves the stream to
``REJECTED`` instead; a proof to ask about) or raises ``ProtocolError`` (to ``ERROR``);
``_moved`` acts on it. Anything not in the table is a protocol violation. What a request
is and what its body decides are ``inspection``'s and ``mint``'s values: the stream
keeps what its headers said, accumulates the body and moves.

Two body modes, detected from Envoy's ``protocol_config`` on the first message:
- BUFFERED: the headers are answered at once; Envoy holds the body and sends it whole
  in one message, answered with ``ContinueBody``.
- FULL_DUPLEX_STREAMED: chunks are accumulated; nothing is answered, not even the
  headers, until the last chunk, so the upstream sees nothing before the decision. Then
  the headers answer and the body as ``StreamedBody`` pieces go out together. A stream
  in this mode never answers with ``ContinueBody``, and vice versa.

Invariants (fail closed):
- a request with a body is let through only after the whole body was parsed and the
  policy returned Allow, Honor or Strip;
- a refusal is a value (a ``Deny``); the exceptions that parsing and validation raise
  become refusals in ``errors.attempt`` only, and every refusal becomes a ``Reject``
  answer in ``_moved`` and nowhere else;
- a body mode this machine cannot inspect is a protocol error, never a pass;
- what a stream holds is charged to the shared budget (in ``memory``'s units) before
  it is parsed (``admission``); the charge for a decided body is handed over with the
  answers that carry its rewrite, and the rest is refunded by ``close``; nothing is
  charged for bytes that have not arrived, so announcing a large body costs nothing;
- audit mode relaxes refusals only in ``inspection.enforced``;
- a step is ``final`` (nothing left to process: the edge ends the RPC) only in REJECTED
  or in DONE where no response phase can follow, so only with the answer to the last
  message Envoy sends: Envoy lets a request through unprocessed when the RPC ends
  cleanly with a message unanswered, and skips every phase after the RPC's end.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum, auto
from typing import Any, Final, Generic, NoReturn, TypeVar

from ext_proc.core import admission, inspection, memory, mint, proof, route_policy, tenants
from ext_proc.core.budget import Account, Budget
from ext_proc.core.config import Config
from ext_proc.core.decisions import Allow, Decision, Deny
from ext_proc.core.errors import BadRequest, ProtocolError, RequestTimeout, attempt
from ext_proc.core.events import (
    Answer,
    Body,
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
from ext_proc.core.inspection import Inspection
from ext_proc.core.reasons import Reason
from ext_proc.core.replay import Verdict
from ext_proc.core.route_policy import Action

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


# The states in which a body is still arriving.
_WAITING: Final = frozenset({State.EXPECT_BODY, State.STREAMING})


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
    table: _Table[Any] = TRANSITIONS[type(event)]
    return table.read(event)


def _headers(event: RequestHeaders) -> Message:
    if event.end_of_stream:
        return Message.HEADERS_ONLY
    if event.body_mode is BodyMode.BUFFERED:
        return Message.HEADERS
    if event.body_mode is BodyMode.FULL_DUPLEX_STREAMED:
        return Message.HEADERS_STREAMED
    return Message.HEADERS_UNREADABLE


def _body(event: RequestBody) -> Message:
    if event.preamble is None:
        return Message.BODY_END if event.end_of_stream else Message.BODY
    if event.preamble.body_mode is not BodyMode.BUFFERED:
        return Message.FIRST_BODY_UNREADABLE
    return Message.FIRST_BODY if event.end_of_stream else Message.FIRST_BODY_TRAILED


def _trailers(event: RequestTrailers) -> Message:
    if event.preamble is None:
        return Message.TRAILERS
    if event.preamble.body_mode not in _INSPECTABLE:
        return Message.FIRST_TRAILERS_UNREADABLE
    return Message.FIRST_TRAILERS


def _response_headers(event: ResponseHeaders) -> Message:
    return Message.RESPONSE_HEADERS_ONLY if event.end_of_stream else Message.RESPONSE_HEADERS


def _response_body(event: ResponseBody) -> Message:
    return Message.RESPONSE_BODY if event.end_of_stream else Message.RESPONSE_BODY_PART


def _timed_out(event: TimedOut) -> Message:
    return Message.TIMED_OUT


def _unexpected(event: Unexpected) -> Message:
    return Message.UNEXPECTED


@dataclass(slots=True)  # made and read in one step (events.Outcome says why not frozen)
class Decided:
    """A handler's answers that settle a phase, with the decision they report."""

    answers: list[Answer]
    decision: Decision
    phase: str = "request"  # or "response": what a mint route did with the response


_Answerer = Callable[[bytes | None], list[Answer]]


@dataclass(frozen=True, slots=True)
class _Asking:
    """A body's decision that honors a proof, waiting for the record's verdict, and how
    its answers are written once it stands."""

    proof: inspection.Proof
    answer: _Answerer


# What a handler returns: answers that settle nothing, a settled phase, the refusal that
# moves the stream to REJECTED, or a proof to ask about before the body's answers.
Result = list[Answer] | Decided | Deny | _Asking


class Stream:
    """Processes one HTTP request's ext_proc messages."""

    __slots__ = (
        "_account",
        "_asking",
        "_body_size",
        "_chunks",
        "_config",
        "_continue",
        "_last_chunk",
        "_partition",
        "_pending",
        "_reads",
        "_received",
        "_request",
        "_request_id",
        "_responds",
        "_trust",
        "state",
    )

    def __init__(
        self,
        config: Config,
        budget: Budget,
        trust: proof.Trust | None = None,
        reads: Reads | None = None,
    ) -> None:
        self.state = State.EXPECT_HEADERS
        self._config = config
        self._account = Account(budget)
        self._trust = trust if trust is not None else proof.Trust()
        self._reads = reads if reads is not None else _READS
        # What the request's headers said (before them, the global audit mode only),
        # and its x-request-id: the stream's own, as the request it reads is shared.
        self._request = inspection.unseen(config.audit)
        self._request_id = ""
        self._body_size = 0
        self._chunks: list[Body] = []
        self._received = 0
        self._last_chunk: Body | None = None
        # The tenant's partition id once the headers named one (``Outcome.partition``),
        # and what the answer letting the headers through writes (``tenants``).
        self._partition: str | None = None
        self._continue = _CONTINUE
        # What the request left for its response (a mint route's prompt digest).
        self._pending = mint.NOTHING
        # A proof to spend before the body's decision stands (``spent``).
        self._asking: _Asking | None = None
        # Whether Envoy may send this request's response (``_read``): until the headers
        # say otherwise, it may.
        self._responds = True

    def handle(self, event: Event) -> Step:
        if self._asking is not None:
            self._fail(ProtocolError(f"{message(event).name} before the proof record answered"))
        # Keyed by the event's own class: the reader and handlers take that class.
        table: _Table[Any] = TRANSITIONS[type(event)]
        kind = table.read(event)
        row = table.rows.get((self.state, kind))
        if row is None:
            self._fail(_violation(self.state, kind, event))
        handler, target = row
        try:
            result = handler(self, event)
        except ProtocolError as exc:
            self._fail(exc)
        return self._moved(result, target)

    def spent(self, verdict: Verdict) -> Step:
        """The record's verdict on the proof the last step asked about: the decision
        stands (``FIRST``), the request is refused (``UNAVAILABLE``), or it is decided
        again with the proof unproven for the verdict's reason; and the body's answers
        go out (``inspection.settle``)."""
        asking = self._asking
        if asking is None:
            self._fail(ProtocolError("no proof was asked about"))
        self._asking = None
        settled = inspection.settle(asking.proof, verdict, self._request, self._account)
        return self._moved(self._forwarded(settled, asking.answer), self.state)

    def _moved(self, result: Result, target: State) -> Step:
        """Into ``target`` with a handler's result (into REJECTED with a Deny, whose
        refusal is answered and everything released), and the step that tells the edge."""
        if isinstance(result, list):
            self.state = target
            return self._step(result)
        if isinstance(result, Deny):
            self.state = State.REJECTED
            self.close()
            return self._step([Reject.of(result.refusal)], result)
        self.state = target
        if isinstance(result, _Asking):
            self._asking = result
            # Nothing is answered, reported or handed over before the verdict.
            return Step([], request_id=self._request_id, ask=result.proof.ticket)
        return self._step(result.answers, result.decision, result.phase)

    def _fail(self, exc: ProtocolError) -> NoReturn:
        """Into ERROR for good, everything released, and ``exc`` raised."""
        self.state = State.ERROR
        self.close()
        exc.request_id = self._request_id
        raise exc

    def _step(
        self, answers: list[Answer], decision: Decision | None = None, phase: str = "request"
    ) -> Step:
        waiting = self.state in _WAITING
        # Once decided, what the stream holds is what its answers carry.
        held = 0 if waiting else self._account.hand_over()
        request = self._request
        outcome: Outcome | None = None
        if decision is not None:
            outcome = Outcome(
                decision,
                request.audit,
                request.route,
                self._body_size,
                self._request_id,
                phase,
                self._partition,
            )
        final = self.state is State.REJECTED or (self.state is State.DONE and not self._responds)
        return Step(answers, outcome, waiting, held, self._request_id, final)

    def close(self) -> None:
        """Refund everything held and drop held chunks; safe to call twice."""
        self._account.release()
        self._chunks.clear()

    # --- request headers ---------------------------------------------------------------

    def _read(
        self, headers: RequestHeaders, *, with_body: bool = True, sent: bool = True
    ) -> Deny | None:
        """What the headers say (kept for the request), and the refusal that ends the
        request at them. ``sent``: Envoy sent the headers message (else they were
        rebuilt from attributes, and no answer can write headers)."""
        found, self._request_id = self._reads(
            headers, self._config, self._trust.tenant_key, with_body=with_body, sent=sent
        )
        self._request = found.request
        self._responds = found.responds
        self._partition = found.partition
        self._continue = found.answer
        return found.refused

    def _on_headers_only(self, event: RequestHeaders) -> Result:
        refused = self._read(event, with_body=False)
        if refused is not None:
            return refused
        return Decided([self._continue], Allow(Reason.NO_BODY))

    def _on_headers(self, event: RequestHeaders) -> Result:
        """Headers before a body: BUFFERED answers them now, FULL_DUPLEX_STREAMED with
        the body."""
        refused = self._read(event)
        if refused is not None:
            return refused
        return [self._continue] if event.body_mode is BodyMode.BUFFERED else []

    def _on_first_body(self, event: RequestBody) -> Result:
        """request_header_mode SKIP: one message per request, the whole body, with the
        headers and route metadata rebuilt from CEL attributes."""
        assert event.preamble is not None  # FIRST_BODY: the table read it
        refused = self._read(event.preamble, sent=False)
        if refused is not None:
            return refused
        return self._on_buffered_body(event)

    def _on_first_trailers(self, event: RequestTrailers) -> Result:
        """request_header_mode SKIP and trailers without a body (HTTP/2): the route is
        judged from the attributes, then the empty body like any other."""
        assert event.preamble is not None  # FIRST_TRAILERS: the table read it
        refused = self._read(event.preamble, sent=False)
        if refused is not None:
            return refused
        if event.preamble.body_mode is BodyMode.FULL_DUPLEX_STREAMED:
            return self._on_streamed_trailers(event)
        return self._on_trailers_without_body(event)

    # --- request body ------------------------------------------------------------------

    def _on_buffered_body(self, event: RequestBody) -> Result:
        """The whole body in one message; end_of_stream is false only when trailers
        follow."""
        too_large = attempt(admission.check_size, len(event.chunk), self._config.max_body_bytes)
        if too_large is not None:
            return Deny(too_large)
        answer = functools.partial(_buffered, length_header=event.preamble is None)
        return self._inspected(event.chunk, answer)

    def _accumulate(self, chunk: Body) -> Deny | None:
        """``chunk`` held with the others, or the refusal when the body outgrows its
        limit or the budget."""
        self._received += len(chunk)
        refused = attempt(admission.check_size, self._received, self._config.max_body_bytes)
        refused = refused or attempt(self._account.hold, memory.held(self._received))
        if refused is not None:
            return Deny(refused)
        self._chunks.append(chunk)
        return None

    def _on_chunk(self, event: RequestBody) -> Result:
        return self._accumulate(event.chunk) or []

    def _on_last_chunk(self, event: RequestBody) -> Result:
        refused = self._accumulate(event.chunk)
        if refused is not None:
            return refused
        self._last_chunk = event.chunk
        raw = b"".join(self._chunks)
        self._chunks.clear()
        return self._inspected(raw, functools.partial(_streamed, raw, self._continue))

    def _inspected(self, raw: Body, answer: _Answerer) -> Result:
        """The whole body's answers (``answer`` of what is forwarded) and decision, its
        refusal, or the proof to ask about first (``answer`` is kept for then)."""
        self._body_size = len(raw)
        found = inspection.inspect(raw, self._request, self._account, self._config, self._trust)
        if found.proof is not None:
            return _Asking(found.proof, answer)
        return self._forwarded(found, answer)

    def _forwarded(self, found: Inspection, answer: _Answerer) -> Decided | Deny:
        if found.refused is not None:
            return found.refused
        self._pending = found.pending
        return Decided(answer(found.replacement), found.decision)

    def _on_repeated_chunk(self, event: RequestBody) -> Result:
        # Envoy can send the final chunk a second time on large bodies (envoy#46237).
        # The request was already decided and answered; an exact repeat of a streamed
        # body's last chunk adds nothing.
        if self._last_chunk is not None and _same(event.chunk, self._last_chunk):
            return []
        raise ProtocolError("request body after the end of the stream")

    def _after_rejection(self, event: Event) -> Result:
        # In FULL_DUPLEX_STREAMED mode Envoy keeps sending the chunks (and trailers) it
        # had already read when our ImmediateResponse reaches it; the local reply has
        # ended the request, so they are dropped unanswered. Nothing is held or reserved:
        # close() ran on rejection. Headers or any other message stay protocol errors.
        return []

    def _on_streamed_trailers(self, event: RequestTrailers) -> Result:
        return Deny(
            BadRequest(
                "request trailers are not accepted on this route",
                reason=Reason.TRAILERS_UNSUPPORTED,
            ).refusal()
        )

    def _on_trailers_without_body(self, event: RequestTrailers) -> Result:
        # Headers promised a body but trailers came first: the body is empty, which
        # vLLM cannot parse either.
        return Deny(BadRequest("request body is empty", reason=Reason.BODY_NOT_JSON).refusal())

    def _on_trailers(self, event: RequestTrailers) -> Result:
        return [ContinueTrailers()]

    def _on_timeout(self, event: TimedOut) -> Result:
        return Deny(
            RequestTimeout(
                "the request body did not arrive in time", reason=Reason.BODY_TIMEOUT
            ).refusal()
        )

    # --- response ----------------------------------------------------------------------

    def _on_response_headers(self, event: ResponseHeaders) -> Result:
        """A mint route's response headers: they may add a reason not to sign."""
        self._pending = mint.checked(self._pending, event)
        return [ContinueResponseHeaders()]

    def _on_response_headers_only(self, event: ResponseHeaders) -> Result:
        pending = mint.checked(self._pending, event)
        decision = Allow(pending.unsigned)
        return Decided([ContinueResponseHeaders()], decision, "response")

    def _on_response_body(self, event: ResponseBody) -> Result:
        config, trust = self._config, self._trust
        # Rounded down: the minter's clock had reached the minting time it states.
        now = int(trust.clock())
        signing = mint.Signing(
            self._account,
            config.max_body_bytes,
            config.max_json_values,
            trust.keys(),
            now,
            now + config.proof.ttl_seconds,
            now + config.proof.turn_ttl_seconds,
        )
        decision, signed = mint.sign(self._pending, event.chunk, signing)
        # A response is never refused: its decision is an Allow or a Mint.
        forwarded = signed if inspection.enforced(decision, self._request.audit) else None
        return Decided([ContinueResponseBody(forwarded)], decision, "response")


def _same(one: Body, other: Body) -> bool:
    """Whether two bodies hold the same bytes. memoryview's == compares item by item
    (milliseconds a MiB); bytes compare by memcmp, a view copied to them (bytes of bytes
    is the same object)."""
    return len(one) == len(other) and bytes(one) == bytes(other)


_UNCHANGED: Final = ContinueBody()
_CONTINUE: Final = ContinueHeaders()


@dataclass(frozen=True, slots=True)
class Read:
    """What a request's headers say, as the stream keeps it (``read``)."""

    # Read through ``Reads``, its ``request_id`` is blank: a Read is shared by the
    # requests whose headers say the same; the id is each stream's own.
    request: inspection.Request
    responds: bool  # whether a response phase can follow (``_responds``)
    partition: str | None  # the tenant's partition id, where the headers name one
    answer: ContinueHeaders  # what the answer letting the headers through writes
    refused: Deny | None  # the refusal that ends the request at its headers


def read(
    headers: RequestHeaders,
    config: Config,
    tenant_key: bytes | None,
    *,
    with_body: bool,
    sent: bool,
) -> Read:
    """What ``headers`` say (``inspection.read``), for a request ``with_body`` or not.
    ``sent``: Envoy sent the headers message (else they were rebuilt from attributes,
    and no answer can write headers: a route that sets the fairness id refuses it)."""
    request = inspection.read(headers, config, with_body=with_body, tenant_key=tenant_key)
    partition = None if request.partition is None else request.tag
    refused = request.refused
    if refused is None and not sent and request.policy.fairness_id:
        refused = Deny(tenants.headers_skipped().refusal())
    return Read(
        request,
        _responds(headers, request),
        partition,
        tenants.headers_answer(request.policy, partition),
        refused,
    )


# The one header a reading depends on that the memo is not keyed by: the request's id
# for the logs, which ``inspection.read`` joins from every value (Latin-1 maps each byte
# to one character).
_REQUEST_ID: Final = "x-request-id"
# The announced size, keyed as ``_WITHIN`` when it is one size within the limit: the
# reading refuses a larger one (``inspection.read``: one value, all digits, above
# ``max_body_bytes``) and reads it for nothing else, so every size within reads alike
# and bodies of every size share an entry. Any other values are keyed as they are.
_LENGTH: Final = "content-length"
_WITHIN: Final = "within the limit"  # never equal to a tuple of values
# Digits of the largest limit (``config.max_body_bytes``), with room: a longer value is
# keyed as it is, and never converted.
_SIZE_DIGITS: Final = 18


def _within(lengths: list[bytes], limit: int) -> bool:
    if len(lengths) != 1:
        return False
    value = lengths[0]
    return len(value) <= _SIZE_DIGITS and value.isdigit() and int(value) <= limit


# Entries kept, and the most bytes of path, keyed header values and peer identities
# an entry is kept for: a client chooses the path and those headers.
READ_MEMO: Final = 1024
READ_MEMO_BYTES: Final = 1024


class Reads:
    """``read`` with a bounded memo, shared by the streams of a process.

    What the headers say is a function of the route's metadata (its items, with each
    value's type, its size and name), the path, the peer, the response body mode, the
    configuration, the tenant key, ``with_body``, ``sent`` and the values, in order, of
    the headers the route reads (``route_policy.read_headers``: the checked headers
    and the tenant's; the announced size as ``_within`` reads it), all of which are the
    key; every other header, the request id included, is read by nothing that it
    returns. The configuration is keyed by identity, the entry holding it so that no
    other can take its id. What is shared is frozen all through (``Read``,
    ``inspection.Request``, the refusals), and read from the headers without the
    request id, which each stream keeps as its own.
    Keys are client-chosen (the path, the media type, the announced size): the memo
    is emptied when full, and a request whose keyed bytes pass ``READ_MEMO_BYTES`` is
    read without it, so a miss costs the uncached reading and its key, and memory
    stays bounded.
    """

    __slots__ = ("_memo", "_size")

    def __init__(self, size: int = READ_MEMO) -> None:
        self._size = size
        self._memo: dict[tuple[object, ...], tuple[Config, Read]] = {}

    def __len__(self) -> int:
        return len(self._memo)

    def __call__(
        self,
        headers: RequestHeaders,
        config: Config,
        tenant_key: bytes | None,
        *,
        with_body: bool,
        sent: bool,
    ) -> tuple[Read, str]:
        """What ``headers`` say (``read``), and the request's id."""
        route = headers.route
        named = route_policy.read_headers(route.items, route.size, config.route_metadata_namespace)
        ids: list[bytes] = []
        keyed: list[object] = [
            id(config),
            route.items,
            route.size,
            route.name,
            headers.path,
            # The peer's fields: its own hash is a Python call.
            headers.peer.mtls,
            headers.peer.identities,
            headers.response_body_mode,
            tenant_key,
            with_body,
            sent,
        ]
        lengths: list[bytes] = []
        size = len(headers.path)
        for pair in headers.headers:
            name = pair[0]
            if name == _REQUEST_ID:
                ids.append(pair[1])
            elif name == _LENGTH:
                lengths.append(pair[1])
            elif name in named:
                keyed.append(pair)
                size += len(pair[1])
        request_id = b"".join(ids).decode("latin-1")
        if _within(lengths, config.max_body_bytes):
            keyed.append(_WITHIN)
        else:
            keyed.append(tuple(lengths))
            size += sum(map(len, lengths))
        key = tuple(keyed)
        entry = self._memo.get(key)
        if entry is not None and entry[0] is config:
            return entry[1], request_id
        found = read(_anonymous(headers), config, tenant_key, with_body=with_body, sent=sent)
        for _, identity in headers.peer.identities:
            size += len(identity)
        if size <= READ_MEMO_BYTES:
            if len(self._memo) >= self._size:
                self._memo.clear()
            self._memo[key] = (config, found)
        return found, request_id


def _anonymous(headers: RequestHeaders) -> RequestHeaders:
    """``headers`` without the request id: what a shared Read is read from."""
    return RequestHeaders(
        tuple(pair for pair in headers.headers if pair[0] != _REQUEST_ID),
        headers.end_of_stream,
        headers.body_mode,
        headers.route,
        headers.peer,
        headers.path,
        headers.response_body_mode,
    )


# The memo every stream reads through unless given its own.
_READS: Final = Reads()


def _responds(headers: RequestHeaders, request: inspection.Request) -> bool:
    """Whether a response phase can follow the request's. Envoy's ``protocol_config``
    states the response body mode only: any mode but NONE, or none stated, may bring the
    response; a mint route is always taken to (its response headers are what it checks
    before signing). On other routes a response headers phase with no body phase would
    only pass the headers on, so nothing is lost where it is not waited for."""
    return headers.response_body_mode is not BodyMode.NONE or request.policy.action is Action.MINT


def _buffered(replacement: bytes | None, *, length_header: bool) -> list[Answer]:
    """A buffered body's answer: unchanged, or replaced."""
    if replacement is None:
        return [_UNCHANGED]
    return [ContinueBody(replacement, length_header=length_header)]


def _streamed(raw: bytes, headers: ContinueHeaders, replacement: bytes | None) -> list[Answer]:
    """A streamed body's answers: the withheld headers (``headers``), then the body in
    pieces."""
    out = raw if replacement is None else replacement
    pieces = [out[i : i + STREAM_CHUNK] for i in range(0, len(out), STREAM_CHUNK)] or [b""]
    return [
        headers,
        *(StreamedBody(piece, i == len(pieces) - 1) for i, piece in enumerate(pieces)),
    ]


def _violation(state: State, kind: Message, event: Event) -> ProtocolError:
    """The protocol error for ``event`` (read as ``kind``) in ``state``, which the table
    does not allow."""
    if kind is Message.HEADERS_UNREADABLE and isinstance(event, RequestHeaders):
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


E = TypeVar("E")
# (state, message) -> (handler, target state), for the messages of one event class.
_Rows = Mapping[tuple[State, Message], tuple[Callable[[Stream, E], Result], State]]


@dataclass(frozen=True, slots=True)
class _Table(Generic[E]):
    """The table's part for one event class: how it reads an event, and its rows."""

    read: Callable[[E], Message]
    rows: _Rows[E]


S, M = State, Message
# The whole diagram, by the class of the event Envoy sent. A Deny moves the stream to
# REJECTED instead of the target, a ProtocolError to ERROR; ERROR, RESPONSE_DONE and
# every pair not listed accept nothing.
_ON_HEADERS: Final[_Rows[RequestHeaders]] = {
    (S.EXPECT_HEADERS, M.HEADERS): (Stream._on_headers, S.EXPECT_BODY),
    (S.EXPECT_HEADERS, M.HEADERS_STREAMED): (Stream._on_headers, S.STREAMING),
    (S.EXPECT_HEADERS, M.HEADERS_ONLY): (Stream._on_headers_only, S.DONE),
}
_ON_BODY: Final[_Rows[RequestBody]] = {
    (S.EXPECT_HEADERS, M.FIRST_BODY): (Stream._on_first_body, S.DONE),
    (S.EXPECT_HEADERS, M.FIRST_BODY_TRAILED): (Stream._on_first_body, S.EXPECT_TRAILERS),
    (S.EXPECT_BODY, M.BODY_END): (Stream._on_buffered_body, S.DONE),
    (S.EXPECT_BODY, M.BODY): (Stream._on_buffered_body, S.EXPECT_TRAILERS),
    (S.STREAMING, M.BODY): (Stream._on_chunk, S.STREAMING),
    (S.STREAMING, M.BODY_END): (Stream._on_last_chunk, S.DONE),
    (S.DONE, M.BODY_END): (Stream._on_repeated_chunk, S.DONE),
    (S.EXPECT_RESPONSE_BODY, M.BODY_END): (Stream._on_repeated_chunk, S.EXPECT_RESPONSE_BODY),
    (S.REJECTED, M.BODY): (Stream._after_rejection, S.REJECTED),
    (S.REJECTED, M.BODY_END): (Stream._after_rejection, S.REJECTED),
}
_ON_TRAILERS: Final[_Rows[RequestTrailers]] = {
    (S.EXPECT_HEADERS, M.FIRST_TRAILERS): (Stream._on_first_trailers, S.REJECTED),
    (S.EXPECT_BODY, M.TRAILERS): (Stream._on_trailers_without_body, S.REJECTED),
    (S.STREAMING, M.TRAILERS): (Stream._on_streamed_trailers, S.REJECTED),
    (S.EXPECT_TRAILERS, M.TRAILERS): (Stream._on_trailers, S.DONE),
    (S.REJECTED, M.TRAILERS): (Stream._after_rejection, S.REJECTED),
}
_ON_TIMEOUT: Final[_Rows[TimedOut]] = {
    (S.EXPECT_BODY, M.TIMED_OUT): (Stream._on_timeout, S.REJECTED),
    (S.STREAMING, M.TIMED_OUT): (Stream._on_timeout, S.REJECTED),
}
# A mint route's response. From EXPECT_HEADERS: the response to a request the processor
# was never sent: one without a body (one message per request), or an answer of
# Envoy's own or of a filter before this one (a buffer limit's 413, a route header
# stated twice). Nothing of it was judged, so nothing is signed (mint.NOTHING); it
# passes unchanged.
_ON_RESPONSE_HEADERS: Final[_Rows[ResponseHeaders]] = {
    (S.EXPECT_HEADERS, M.RESPONSE_HEADERS): (Stream._on_response_headers, S.EXPECT_RESPONSE_BODY),
    (S.EXPECT_HEADERS, M.RESPONSE_HEADERS_ONLY): (
        Stream._on_response_headers_only,
        S.RESPONSE_DONE,
    ),
    (S.DONE, M.RESPONSE_HEADERS): (Stream._on_response_headers, S.EXPECT_RESPONSE_BODY),
    (S.DONE, M.RESPONSE_HEADERS_ONLY): (Stream._on_response_headers_only, S.RESPONSE_DONE),
}
_ON_RESPONSE_BODY: Final[_Rows[ResponseBody]] = {
    (S.EXPECT_RESPONSE_BODY, M.RESPONSE_BODY): (Stream._on_response_body, S.RESPONSE_DONE),
}
del S, M

TRANSITIONS: Final[dict[type, _Table[Any]]] = {
    RequestHeaders: _Table(_headers, _ON_HEADERS),
    RequestBody: _Table(_body, _ON_BODY),
    RequestTrailers: _Table(_trailers, _ON_TRAILERS),
    TimedOut: _Table(_timed_out, _ON_TIMEOUT),
    ResponseHeaders: _Table(_response_headers, _ON_RESPONSE_HEADERS),
    ResponseBody: _Table(_response_body, _ON_RESPONSE_BODY),
    Unexpected: _Table(_unexpected, {}),
}
