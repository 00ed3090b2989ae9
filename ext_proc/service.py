"""The thin grpc.aio servicer: decode, hand to the stream machine, encode; log, count.

Every message gets its answers from the stream machine. A protocol error or any
unexpected exception ends the RPC with an error status, which Envoy
(``failure_mode_allow: false``) turns into a 5xx: the original request never passes
uninspected.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc

from ext_proc import policy
from ext_proc._pb import external_processor_pb2 as pb
from ext_proc._pb import external_processor_pb2_grpc as pb_grpc
from ext_proc.attributes import attribute_keys
from ext_proc.budget import Budget
from ext_proc.codec import decision_metadata, decode, encode
from ext_proc.config import Config
from ext_proc.errors import ProtocolError
from ext_proc.events import Event, RequestBody, RequestHeaders, TimedOut
from ext_proc.metrics import Metrics
from ext_proc.stream import Stream

log = logging.getLogger("ext_proc.decision")


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(
        self, config: Config, budget: Budget | None = None, metrics: Metrics | None = None
    ) -> None:
        self._config = config
        self._keys = attribute_keys(config.route_metadata_namespace)
        self.budget = budget if budget is not None else Budget(config.inflight_budget_bytes)
        self.metrics = metrics if metrics is not None else Metrics()

    async def _events(
        self, requests: AsyncIterator[pb.ProcessingRequest], stream: Stream
    ) -> AsyncIterator[Event]:
        """Decoded events; ``TimedOut`` once the body takes longer than allowed."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            if deadline is None and stream.waiting_for_body:
                deadline = loop.time() + self._config.body_timeout_seconds
            try:
                if stream.waiting_for_body:
                    # Unlike wait_for, timeout_at creates no task.
                    async with asyncio.timeout_at(deadline):
                        request = await anext(requests)
                else:  # no timer to arm and cancel for every other message
                    request = await anext(requests)
            except TimeoutError:
                yield TimedOut()
                return
            except StopAsyncIteration:
                return
            yield decode(request, self._keys)

    async def Process(  # noqa: N802 - name fixed by the gRPC service
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext[pb.ProcessingRequest, pb.ProcessingResponse],
    ) -> AsyncIterator[pb.ProcessingResponse]:
        stream = Stream(
            max_body_bytes=self._config.max_body_bytes,
            budget=self.budget,
            namespace=self._config.route_metadata_namespace,
            audit=self._config.audit,
        )
        metrics = self.metrics
        metrics.inflight_streams.inc()
        request_id = ""
        busy = 0.0  # processor time spent on this request
        try:
            async for event in self._events(aiter(request_iterator), stream):
                first = event.preamble if isinstance(event, RequestBody) else event
                if isinstance(first, RequestHeaders):
                    request_id = b"".join(first.values("x-request-id")).decode("latin-1")
                decided = stream.decision
                started = time.perf_counter()
                try:
                    actions = stream.handle(event)
                except ProtocolError as exc:
                    metrics.stream_errors.labels("protocol_violation").inc()
                    log.warning(
                        "protocol error", extra={"request_id": request_id, "reason": str(exc)}
                    )
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                    return
                responses = [encode(action) for action in actions]
                if stream.decision is not decided and stream.decision is not None:
                    if responses:
                        responses[-1].dynamic_metadata.CopyFrom(
                            decision_metadata(
                                self._config.route_metadata_namespace, stream.decision, stream.audit
                            )
                        )
                    self._report(stream, request_id)
                busy += time.perf_counter() - started
                metrics.inflight_bytes.set(self.budget.used)
                for response in responses:
                    yield response
            if stream.waiting_for_body:
                # Envoy closed its side mid-body. Ending the RPC cleanly now could let a
                # held request through; end it with an error instead.
                metrics.stream_errors.labels("protocol_violation").inc()
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION, "stream ended before the end of the body"
                )
        except asyncio.CancelledError:
            metrics.stream_errors.labels("cancelled").inc()
            raise
        except grpc.aio.AbortError:
            raise  # an error status this servicer chose; already counted
        except Exception:
            metrics.stream_errors.labels("internal").inc()
            log.exception("internal error", extra={"request_id": request_id})
            raise
        finally:
            stream.close()
            metrics.inflight_streams.dec()
            metrics.inflight_bytes.set(self.budget.used)
            if stream.decision is not None:
                metrics.observe_processing(stream.route_name, busy)

    def _report(self, stream: Stream, request_id: str) -> None:
        decision = stream.decision
        assert decision is not None
        action = type(decision).__name__.lower()
        mode = "audit" if stream.audit else "enforce"
        self.metrics.decided(stream.route_name, action, decision.reason, mode)
        if stream.body_size:
            self.metrics.observe_body(stream.route_name, stream.body_size)
        if isinstance(decision, policy.Allow) and decision.id_count == 0:
            return
        # Never the ids, never any prompt text: only what was decided and why.
        log.info(
            "decision",
            extra={
                "request_id": request_id,
                "route": stream.route_name,
                "action": action,
                "reason": decision.reason,
                "id_count": decision.id_count,
                "mode": mode,
            },
        )
