"""Typed values exchanged between the codec and the stream state machine.

Events are what Envoy said; answers are what the processor sends back; a ``Step`` is
the stream machine's reply to one event (answers, and once per request the
``Outcome``). None of them refers to grpc or protobuf, so the core runs and is tested
on plain values.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import orjson

from ext_proc.core import route_policy
from ext_proc.core.decisions import Decision
from ext_proc.core.errors import Refusal
from ext_proc.core.replay import Ticket
from ext_proc.core.route_policy import Scalar


class BodyMode(IntEnum):
    """Envoy's ProcessingMode.BodySendMode, as reported in ``protocol_config``."""

    NONE = 0
    STREAMED = 1
    BUFFERED = 2
    BUFFERED_PARTIAL = 3
    FULL_DUPLEX_STREAMED = 4
    GRPC = 5


@dataclass(frozen=True, slots=True)
class RouteMetadata:
    """The policy fields Envoy sent for the matched route (see ``route_policy``)."""

    values: Mapping[str, Scalar] = field(default_factory=dict)
    size: float | None = None
    name: str = ""  # the route's name, for metrics and logs
    # ``values`` as ``route_policy.parse_items`` reads them, made once per reading.
    items: route_policy.Items = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", route_policy.items_of(self.values))

    @property
    def unstated(self) -> bool:
        """No policy metadata at all: the route gets ``route_policy.DEFAULT_POLICY``."""
        return self.size is None and not self.values


@dataclass(frozen=True, slots=True)
class Peer:
    """The downstream peer's certificate, as Envoy reports it (docs/trust.md)."""

    mtls: bool = False
    # The first URI SAN, the first DNS SAN and the subject, each with its type, where
    # the certificate has them (what Envoy's CEL exposes; docs/trust.md).
    identities: tuple[route_policy.Identity, ...] = ()


# The peer of a connection that is not mutual TLS: it identifies nobody.
NO_PEER = Peer()


@dataclass(frozen=True, slots=True)
class RequestHeaders:
    headers: tuple[tuple[str, bytes], ...]
    end_of_stream: bool
    body_mode: BodyMode
    route: RouteMetadata
    peer: Peer = Peer()
    # The request's path without its query (Envoy's ``request.url_path``), as the
    # client sent it: Envoy evaluates the attributes before its router applies the
    # route's rewrite, with the headers message and without it (one message: the buffer
    # filter after ext_proc keeps the headers from the router until the decision).
    path: str = ""
    # The response body mode Envoy declared for this request (``protocol_config``); None
    # when it declared none, which rules out no response phase.
    response_body_mode: BodyMode | None = None

    def values(self, name: str) -> list[bytes]:
        return [value for key, value in self.headers if key == name]


# A body as the codec hands it over: bytes (upb's copy), or a read-only memoryview of
# its span of the gRPC message's bytes (the wire reader's, no copy). The message is
# immutable bytes of which nothing else is kept, so the view reads fixed bytes. It keeps
# the whole message alive as long as the body: the body plus its field heads and, on a
# first message, the route's attributes (a few KB, never charged: they are there
# whichever reader reads the message). memory.COPIES charges the message and the body
# copied out of it at the body's size each; the view stands in for that copy, so the
# bytes held for the body are one copy fewer than charged.
Body = bytes | memoryview


@dataclass(frozen=True, slots=True)
class RequestBody:
    chunk: Body
    end_of_stream: bool
    # Set on the first message when Envoy skips the headers message: the headers and
    # route metadata it would have carried, rebuilt from CEL attributes.
    preamble: RequestHeaders | None = None


@dataclass(frozen=True, slots=True)
class RequestTrailers:
    # Set when the trailers are the first message (headers skipped, no body): the
    # headers and route rebuilt from CEL attributes, as on RequestBody.
    preamble: RequestHeaders | None = None


@dataclass(frozen=True, slots=True)
class ResponseHeaders:
    """The upstream's response headers (routes that process the response: ``mint``)."""

    headers: tuple[tuple[str, bytes], ...]
    end_of_stream: bool

    def values(self, name: str) -> list[bytes]:
        return [value for key, value in self.headers if key == name]


@dataclass(frozen=True, slots=True)
class ResponseBody:
    """The whole response body (response_body_mode BUFFERED)."""

    chunk: Body
    end_of_stream: bool


@dataclass(frozen=True, slots=True)
class TimedOut:
    """The body did not arrive completely within the processor's body timeout."""


@dataclass(frozen=True, slots=True)
class Unexpected:
    """A message this processor never asks Envoy for (response phases, or empty)."""

    kind: str


Event = (
    RequestHeaders
    | RequestBody
    | RequestTrailers
    | ResponseHeaders
    | ResponseBody
    | TimedOut
    | Unexpected
)


@dataclass(frozen=True, slots=True)
class ContinueHeaders:
    """Let the headers through: ``removed`` taken out (every copy), then ``written`` set
    (one copy each)."""

    removed: tuple[str, ...] = ()
    written: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class ContinueBody:
    """Let the body through; ``replacement`` when rewritten, with its content-length
    unless ``length_header`` is false: Envoy applies no header mutation to a body whose
    headers it skipped (request_header_mode SKIP), and drops content-length itself."""

    replacement: bytes | None = None
    length_header: bool = True


@dataclass(frozen=True, slots=True)
class StreamedBody:
    """One piece of the body sent back in FULL_DUPLEX_STREAMED mode."""

    chunk: bytes
    end_of_stream: bool


@dataclass(frozen=True, slots=True)
class ContinueTrailers:
    pass


@dataclass(frozen=True, slots=True)
class ContinueResponseHeaders:
    pass


@dataclass(frozen=True, slots=True)
class ContinueResponseBody:
    """Let the response through; ``replacement`` (with its content-length) when rewritten."""

    replacement: bytes | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """Answer the client directly; the request never reaches the upstream."""

    status: int
    body: bytes
    details: str
    headers: tuple[tuple[str, bytes], ...] = ()

    @classmethod
    def of(cls, refusal: Refusal) -> Reject:
        """vLLM's error shape, so OpenAI clients parse the denial like any vLLM error;
        compact JSON in UTF-8, as vLLM's own error responses are written. A Reject is a
        frozen value of its refusal alone, so requests refused alike share one (built
        once; a bounded cache, as ``errors.bad_request``'s: a client varying its
        refusal's message only replaces entries)."""
        return _reject(refusal)


@functools.lru_cache(maxsize=1024)
def _reject(refusal: Refusal) -> Reject:
    payload = {
        "error": {
            "message": refusal.message,
            "type": refusal.error_type,
            "param": refusal.param,
            "code": refusal.status,
        }
    }
    headers: tuple[tuple[str, bytes], ...] = ()
    if refusal.retry_after is not None:
        headers = (("retry-after", str(refusal.retry_after).encode()),)
    return Reject(refusal.status, _json(payload), f"token_policy_{refusal.reason}", headers)


def _json(payload: dict[str, Any]) -> bytes:
    """``payload`` as JSON. A message may quote a member's name as json.loads read it,
    which can hold a lone surrogate (a ``\\udXXX`` escape, a UTF-16 body): orjson
    refuses to write one, json.dumps writes it escaped (ASCII), compact as orjson's."""
    try:
        return orjson.dumps(payload)
    except TypeError:
        return json.dumps(payload, separators=(",", ":")).encode()


Answer = (
    ContinueHeaders
    | ContinueBody
    | StreamedBody
    | ContinueTrailers
    | ContinueResponseHeaders
    | ContinueResponseBody
    | Reject
)


# Outcome and Step are made for one request's step and only read after it: plain
# slotted classes, as a frozen dataclass sets each field through object.__setattr__,
# which costs several times the assignment on every request.
@dataclass(slots=True)
class Outcome:
    """What happened to one request, reported once per phase by ``Stream.handle``."""

    decision: Decision
    audit: bool
    route: str
    body_size: int
    request_id: str
    # "request", or "response" for what a mint route did with the response.
    phase: str = "request"
    # The authenticated tenant's partition id (tenants.tag), for the filters after this
    # one to key on; None when the request names no tenant (or its route reads none).
    partition: str | None = None

    @property
    def mode(self) -> str:
        return "audit" if self.audit else "enforce"


@dataclass(slots=True)
class Step:
    """Everything the edge learns from one event: the answers, the outcome when this
    event settled a phase, and what to do next."""

    answers: list[Answer]
    outcome: Outcome | None = None
    # A body is still arriving: the edge times it, and ending the RPC now must not let
    # the request through.
    waiting_for_body: bool = False
    # Budget bytes the answers carry, handed over by the stream: the edge releases them
    # (``Budget.release``) once the answers are sent, or the RPC ends.
    held: int = 0
    # The request's x-request-id once its headers are in (for logs).
    request_id: str = ""
    # Nothing is left to process: the request was answered for good (an
    # ImmediateResponse), or its last phase was answered and no response phase can
    # follow. Nothing more is read; the edge ends the RPC once the answers are sent.
    final: bool = False
    # A proof to spend before the decision stands: the edge asks the record of spent
    # proofs and hands its verdict to ``Stream.spent``; nothing is answered until then.
    ask: Ticket | None = None
