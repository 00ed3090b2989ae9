"""The thin grpc.aio servicer: decode, hand to the stream machine, encode, log.

Every message gets its answers from the stream machine. A protocol error or any
unexpected exception ends the RPC with an error status, which Envoy
(``failure_mode_allow: false``) turns into a 5xx: the original request never passes
uninspected.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from ext_proc import policy
from ext_proc._pb import external_processor_pb2 as pb
from ext_proc._pb import external_processor_pb2_grpc as pb_grpc
from ext_proc.budget import Budget
from ext_proc.codec import decode, encode
from ext_proc.config import Config
from ext_proc.errors import ProtocolError
from ext_proc.events import Event, RequestHeaders, TimedOut
from ext_proc.route_policy import attribute_keys
from ext_proc.stream import Stream

log = logging.getLogger("ext_proc.decision")


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, config: Config, budget: Budget | None = None) -> None:
        self._config = config
        self._keys = attribute_keys(config.route_metadata_namespace)
        self.budget = budget if budget is not None else Budget(config.inflight_budget_bytes)

    async def _events(
        self, requests: AsyncIterator[pb.ProcessingRequest], stream: Stream
    ) -> AsyncIterator[Event]:
        """Decoded events; ``TimedOut`` once the body takes longer than allowed."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            if stream.waiting_for_body:
                if deadline is None:
                    deadline = loop.time() + self._config.body_timeout_seconds
                try:
                    request = await asyncio.wait_for(anext(requests), deadline - loop.time())
                except TimeoutError:
                    yield TimedOut()
                    return
                except StopAsyncIteration:
                    return
            else:
                try:
                    request = await anext(requests)
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
        )
        request_id = ""
        try:
            async for event in self._events(aiter(request_iterator), stream):
                if isinstance(event, RequestHeaders):
                    request_id = b"".join(event.values("x-request-id")).decode("latin-1")
                    log.debug(
                        "stream",
                        extra={"request_id": request_id, "body_mode": event.body_mode.name},
                    )
                decided = stream.decision
                try:
                    actions = stream.handle(event)
                except ProtocolError as exc:
                    log.warning(
                        "protocol error", extra={"request_id": request_id, "reason": str(exc)}
                    )
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                    return
                if stream.decision is not decided:
                    _log_decision(stream.decision, request_id)
                for action in actions:
                    yield encode(action)
        finally:
            stream.close()


def _log_decision(decision: policy.Decision | None, request_id: str) -> None:
    if decision is None or (isinstance(decision, policy.Allow) and decision.id_count == 0):
        return
    action = type(decision).__name__.lower()
    log.info(
        "decision",
        extra={
            "request_id": request_id,
            "action": action,
            "reason": decision.reason,
            "id_count": decision.id_count,
        },
    )
