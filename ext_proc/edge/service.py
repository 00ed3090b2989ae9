"""The thin grpc.aio servicer: decode, hand to the stream machine, encode; log, count.

``Process`` is registered without a deserializer or serializer (``add_to_server``): it
reads each message's bytes and writes each answer's bytes, which the codec reads and
writes itself (``codec.Decoder``, ``codec.Encoder``).

Every message gets its answers from the stream machine. A protocol error or any
unexpected exception ends the RPC with an error status, which Envoy
(``failure_mode_allow: false``) turns into a 5xx: the original request never passes
uninspected.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import grpc

from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.core.budget import Budget
from ext_proc.core.config import Config, ConfigError
from ext_proc.core.decisions import Allow, Deny
from ext_proc.core.errors import ProtocolError
from ext_proc.core.events import (
    Event,
    Outcome,
    RequestBody,
    RequestHeaders,
    RequestTrailers,
    Step,
    TimedOut,
)
from ext_proc.core.proof import Trust
from ext_proc.core.replay import Record
from ext_proc.core.stream import Stream
from ext_proc.edge import logs, tracing
from ext_proc.edge.attributes import attribute_keys
from ext_proc.edge.codec import Decoder, Encoder
from ext_proc.edge.keys import KeyRing, tenant_key
from ext_proc.edge.metrics import Metrics
from ext_proc.edge.record import LocalRecord
from ext_proc.edge.tracing import Spans

log = logging.getLogger("ext_proc.decision")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ExternalProcessor"].full_name
# The call's context: messages in and out as their bytes.
Context: TypeAlias = "grpc.aio.ServicerContext[bytes, bytes]"


@dataclass(slots=True)
class _Usage:
    """What one stream cost, for the processing-time histogram."""

    outcome: Outcome | None = None
    busy: float = 0.0  # processor time spent on this request
    request_id: str = ""  # the request's x-request-id once its headers are in (for logs)
    # With tracing on: the request's headers and route, and when its first message came.
    request: RequestHeaders | None = None
    call: tracing.Carrier = field(default_factory=dict)  # the trace context of the gRPC call
    started_ns: int = 0


class ExternalProcessor:
    def __init__(
        self,
        config: Config,
        budget: Budget | None = None,
        metrics: Metrics | None = None,
        record: Record | None = None,
        spans: Spans | None = None,
    ) -> None:
        self._config = config
        # None with tracing off: a request then pays one test for it.
        self.spans = spans
        self._encode = Encoder(config.route_metadata_namespace)
        self.metrics = metrics if metrics is not None else Metrics()
        self._decode = Decoder(
            attribute_keys(config.route_metadata_namespace),
            left_to_upb=self.metrics.parsed_by_upb.inc,
        )
        # Without one given, this process's own table (a worker is given the shared one).
        self.record = (
            record
            if record is not None
            else LocalRecord.anonymous(config.proof.record_slots, terms=config.proof.terms)
        )
        # The record is held for the process's life: bodies get the rest of the budget
        # (the configuration leaves room for both).
        limit = config.inflight_budget_bytes - self.record.size
        if limit <= 0:
            raise ConfigError(
                f"inflight_budget_bytes {config.inflight_budget_bytes} cannot hold the "
                f"record of spent proofs ({self.record.size} bytes)"
            )
        self.budget = budget if budget is not None else Budget(limit)
        self.open_streams = 0  # sampled into the metrics (see sample_metrics)
        # Every stream ever begun: a draining server tells Envoy still sending from idle.
        self.streams_begun = 0
        # Envoy cancels a stream whenever a client goes away: counted without a lookup.
        self._cancelled = self.metrics.stream_errors.labels("cancelled")
        # Set by the server as it stops: every stream still open is ended by the stop,
        # and one that fails from now on because its call is over was ended, not broken.
        self.stopping = False
        self._trust = Trust(
            keys=KeyRing(config.proof.keys).current,
            tenant_key=tenant_key(config.tenants.key_file),
        )

    def sample_metrics(self) -> None:
        """The in-flight gauges, now."""
        self.metrics.sample(self.open_streams, self.budget.used, self.budget.limit)

    async def _next(
        self,
        context: Context,
        deadline: float | None,
    ) -> Event | None:
        """The next message's event; ``TimedOut`` once the body takes longer than
        allowed; None at the end of the stream."""
        try:
            if deadline is None:  # no timer to arm and cancel for every other message
                request = await context.read()
            else:
                # Unlike wait_for, timeout_at creates no task.
                async with asyncio.timeout_at(deadline):
                    request = await context.read()
        except TimeoutError:
            return TimedOut()
        if request is grpc.aio.EOF:
            return None
        # The message is dropped on return: a stream whose route processes the response
        # stays open after its decision (for the whole upstream response) and must not
        # keep the body alive until then.
        return self._decode(request)

    async def Process(  # noqa: N802 - name fixed by the gRPC service
        self,
        request_iterator: AsyncIterator[bytes],
        context: Context,
    ) -> None:
        """One request's stream, counted while open and by how it ended; its bytes are
        always released. Messages are read and answers written through ``context``
        (one coroutine, no generator layers): ``request_iterator`` stays unread."""
        stream = Stream(self._config, self.budget, self._trust)
        metrics = self.metrics
        self.open_streams += 1
        self.streams_begun += 1
        usage = _Usage()
        if self.spans is not None:
            usage.call = tracing.call_context(context.invocation_metadata())
        try:
            await self._converse(context, stream, usage)
        except asyncio.CancelledError:
            if self.stopping:
                self._ended(usage)
            else:
                self._cancelled.inc()
            raise
        except grpc.aio.AbortError:
            raise  # an error status this servicer chose; already counted
        except grpc.aio.InternalError:
            # An answer or status gRPC could not send because the call is over.
            if not self.stopping:
                self._internal(usage)
                raise
            self._ended(usage)  # nothing is left to send it on
        except Exception:
            self._internal(usage)
            raise
        finally:
            stream.close()
            self.open_streams -= 1
            if usage.outcome is not None:
                metrics.observe_processing(usage.outcome.route, usage.busy)

    def _internal(self, usage: _Usage) -> None:
        """Count and log the exception being handled, with its traceback."""
        self.metrics.stream_errors.labels("internal").inc()
        log.exception("internal error", extra={"request_id": usage.request_id})
        if self.spans is not None:
            self.spans.failed("internal", usage.call, usage.request, usage.started_ns)

    def _ended(self, usage: _Usage) -> None:
        """A stream the server's stop ended: one line, no traceback (not a fault here;
        a stop that ends streams means the grace was shorter than they lasted)."""
        self.metrics.stream_errors.labels("shutdown").inc()
        log.warning("stream ended at shutdown", extra={"request_id": usage.request_id})
        if self.spans is not None:
            self.spans.failed("shutdown", usage.call, usage.request, usage.started_ns)

    async def _converse(
        self,
        context: Context,
        stream: Stream,
        usage: _Usage,
    ) -> None:
        """Receive loop: every event goes to the stream machine; its answers go back.
        Everything the loop needs to know comes with the step."""
        deadline: float | None = None
        waiting = False
        while True:
            # The body timer runs from the first message that waits for a body until the
            # body is decided; after that a stream whose route processes the response
            # stays open for the whole upstream response, as long as it takes.
            if not waiting:
                deadline = None
            elif deadline is None:
                deadline = asyncio.get_running_loop().time() + self._config.body_timeout_seconds
            event = await self._next(context, deadline)
            if event is None and self.stopping:
                self._ended(usage)  # the stop closed the call, not Envoy
                return
            if event is None:
                break
            try:
                responses, step = await self._answer(stream, event, usage)
            except ProtocolError as exc:
                usage.request_id = exc.request_id
                await self._abort(context, usage, str(exc))
                return
            waiting, held, final = step.waiting_for_body, step.held, step.final
            del event, step  # nothing of the body outlives its answers
            await self._send(context, responses, held)
            if final:
                # Nothing is left to process: the request was refused (Envoy ended it with
                # the local reply; late chunks Envoy had read are not read), or every
                # message Envoy sends was answered and no response phase follows. The RPC
                # ends now, status OK after the answers on the same HTTP/2 stream, rather
                # than stay open until Envoy closes it at the end of the HTTP response.
                return
        if waiting:
            # Envoy closed its side mid-body. Ending the RPC cleanly now could let a held
            # request through; end it with an error instead.
            await self._abort(context, usage, "stream ended before the end of the body")

    async def _answer(
        self, stream: Stream, event: Event, usage: _Usage
    ) -> tuple[list[bytes], Step]:
        """The stream's step for ``event`` (the record of spent proofs asked first where
        the step says so) and its encoded answers; its outcome is counted. The
        processor's time goes to ``usage``, the record's round trip does not. Raises
        ``ProtocolError``."""
        spans = self.spans
        if spans is not None and usage.request is None:
            if not usage.started_ns:
                usage.started_ns = tracing.now_ns()
            usage.request = tracing.request_of(event)
        # A route without a policy gets the default one (strip), counted.
        head = event.preamble if isinstance(event, (RequestBody, RequestTrailers)) else event
        if isinstance(head, RequestHeaders) and head.route.unstated:
            self.metrics.default_policy.labels(head.route.name).inc()
        started = time.perf_counter()
        step = stream.handle(event)
        if step.ask is not None:
            usage.busy += time.perf_counter() - started
            verdict = await self.record.spend(step.ask)
            started = time.perf_counter()
            step = stream.spent(verdict)
        responses = self._encode(step)
        if step.outcome is not None:
            usage.outcome = step.outcome
            self._record(step.outcome)
        usage.busy += time.perf_counter() - started
        if spans is not None and step.outcome is not None:
            spans.decided(step.outcome, usage.call, usage.request, usage.started_ns)
        usage.request_id = step.request_id
        return responses, step

    async def _send(
        self,
        context: Context,
        responses: list[bytes],
        held: int,
    ) -> None:
        """Write ``responses`` in order. Once gRPC took the last one (or the RPC ended),
        the ``held`` bytes they carried are released."""
        try:
            while responses:
                await context.write(responses.pop(0))
        finally:
            self.budget.release(held)

    async def _abort(
        self,
        context: Context,
        usage: _Usage,
        reason: str,
    ) -> None:
        """End the RPC with an error status: Envoy fails the request closed. A call
        already over (Envoy cancelled it: its client went away, or its message timeout
        ran out) takes no status: that stream was cancelled, not a protocol error."""
        try:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, reason)
        except grpc.aio.AbortError:
            self.metrics.stream_errors.labels("protocol_violation").inc()
            log.warning("protocol error", extra={"request_id": usage.request_id, "reason": reason})
            if self.spans is not None:
                self.spans.failed("protocol_violation", usage.call, usage.request, usage.started_ns)
            raise
        except grpc.aio.InternalError:
            if self.stopping or not context.done():
                raise  # the stop ended it (counted as shutdown), or a fault here
            self._cancelled.inc()
            log.info("stream cancelled", extra={"request_id": usage.request_id, "reason": reason})

    def _record(self, outcome: Outcome) -> None:
        """Count every outcome; log every one but an allow without ids (never the ids,
        never any text)."""
        decision = outcome.decision
        # Each read once (properties, on some decisions): the count and the line agree.
        action, reason, mode, phase = decision.action, decision.reason, outcome.mode, outcome.phase
        size = outcome.body_size if phase == "request" else 0
        self.metrics.decided(outcome.route, action, reason, mode, size)
        if isinstance(decision, Allow) and decision.id_count == 0:
            return
        fields = {
            "request_id": outcome.request_id,
            "route": outcome.route,
            "action": action,
            "reason": reason,
            "id_count": decision.id_count,
            "mode": mode,
            "phase": phase,
        }
        if isinstance(decision, Deny) and decision.refusal.detail is not None:
            fields["detail"] = decision.refusal.detail
        logs.info(log, "decision", fields)


def add_to_server(
    process: Callable[..., Any],
    server: grpc.Server | grpc.aio.Server,
    *,
    deserializer: Callable[[bytes], Any] | None = None,
    serializer: Callable[[Any], bytes] | None = None,
) -> None:
    """Serve ``process`` (``ExternalProcessor.Process``) as the ext_proc service's one
    method. The service's messages are handed over and taken back as bytes (no
    deserializer, no serializer); a processor outside the package may give protobuf's
    (``bench/grpc_api.py``)."""
    handlers = {
        "Process": grpc.stream_stream_rpc_method_handler(
            process, request_deserializer=deserializer, response_serializer=serializer
        )
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
