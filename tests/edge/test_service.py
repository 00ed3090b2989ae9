"""A real grpc.aio server on port 0, driven by a real client stream."""

import asyncio
import gc
import json
import time
import tracemalloc
import types
from collections.abc import Iterable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import grpc_api
from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.core import proof
from ext_proc.core.config import Config
from ext_proc.core.stream import Stream
from ext_proc.edge import attributes, server
from ext_proc.edge.record import LocalRecord
from ext_proc.edge.server import SERVICE_NAME, build, loop_factory
from tests.driver import DAY
from tests.messages import headers_request, route_attributes

MiB = 1024 * 1024


def headers(route: dict[str, object] | None = None, *, eos: bool = False) -> pb.ProcessingRequest:
    return headers_request(
        route_attributes(route),
        headers=(("content-type", b"application/json"), ("x-request-id", b"req-1")),
        eos=eos,
    )


def body(data: bytes, eos: bool = True) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=eos))


async def exchange(messages, config=None):
    """Send ``messages`` on one stream; return the responses and the final status."""
    config = config or Config.load(listen="127.0.0.1:0")
    running = await build(config)
    server, port = running.server, running.port
    try:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}",
            options=[("grpc.max_send_message_length", 64 * MiB)],
        ) as channel:
            call = grpc_api.Stub(channel).Process(iter(messages))
            responses = []
            try:
                async for response in call:
                    responses.append(response)
            except grpc.aio.AioRpcError as exc:
                return responses, exc.code(), exc.details()
            return responses, await call.code(), await call.details()
    finally:
        await server.stop(None)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_strip_over_a_real_stream():
    payload = {"messages": [], "kv_transfer_params": {"prompt_token_ids": [1], "k": "v"}}
    responses, code, _ = run(
        exchange([headers({"action": "strip"}), body(json.dumps(payload).encode())])
    )
    assert code == grpc.StatusCode.OK
    assert [r.WhichOneof("response") for r in responses] == ["request_headers", "request_body"]
    common = responses[1].request_body.response
    # Untrusted on every route: the whole kv_transfer_params object goes.
    assert json.loads(common.body_mutation.body) == {"messages": []}
    assert (
        common.header_mutation.set_headers[0].header.raw_value
        == str(len(common.body_mutation.body)).encode()
    )


def test_deny_over_a_real_stream():
    payload = {"kv_transfer_params": {"prompt_token_ids": [1, True]}}
    responses, code, _ = run(
        exchange(
            [
                headers({"topology": "disaggregated", "trust_any_caller": True}),
                body(json.dumps(payload).encode()),
            ]
        )
    )
    assert code == grpc.StatusCode.OK
    immediate = responses[1].immediate_response
    assert immediate.status.code == 400
    assert json.loads(immediate.body)["error"]["param"] == "kv_transfer_params.prompt_token_ids"


def test_protocol_error_ends_the_stream_with_an_error_not_a_continue():
    # One message only: a later write would race with the abort on the client side.
    responses, code, details = run(exchange([body(b"{}")]))
    assert responses == []
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "request body before request headers" in details


def test_protocol_error_after_valid_messages_answers_only_what_was_valid():
    responses, code, _ = run(exchange([headers(), headers()]))
    assert [r.WhichOneof("response") for r in responses] == ["request_headers"]
    assert code == grpc.StatusCode.FAILED_PRECONDITION


def test_bodies_larger_than_grpc_default_4_mib_are_received():
    ids = list(range(800_000))  # ~5.9 MB of JSON
    payload = json.dumps({"kv_transfer_params": {"prompt_token_ids": ids}}).encode()
    assert len(payload) > 4 * MiB
    responses, code, _ = run(
        exchange([headers({"topology": "disaggregated", "trust_any_caller": True}), body(payload)])
    )
    assert code == grpc.StatusCode.OK
    assert responses[1].request_body.response.status == 0  # CONTINUE, unchanged


def test_body_over_processor_limit_gets_413():
    config = Config.load(listen="127.0.0.1:0", max_body_bytes=100)
    responses, _, _ = run(exchange([headers(), body(b'{"a": "' + b"x" * 200 + b'"}')], config))
    immediate = responses[1].immediate_response
    assert immediate.status.code == 413
    assert json.loads(immediate.body)["error"]["code"] == 413


@pytest.mark.parametrize("service", ["", SERVICE_NAME])
def test_health_serving_then_not_serving_on_shutdown(service):
    async def scenario():
        running = await build(Config.load(listen="127.0.0.1:0"))
        server, health, port = running.server, running.health, running.port
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                request = health_pb2.HealthCheckRequest(service=service)
                before = (await stub.Check(request)).status
                await health.enter_graceful_shutdown()
                after = (await stub.Check(request)).status
                return before, after
        finally:
            await server.stop(None)

    before, after = run(scenario())
    assert before == health_pb2.HealthCheckResponse.SERVING
    assert after == health_pb2.HealthCheckResponse.NOT_SERVING


def test_body_timeout_answers_408_on_the_stream():
    async def scenario():
        config = Config.load(listen="127.0.0.1:0", body_timeout_seconds=0.3)
        running = await build(config)
        server, port = running.server, running.port
        release = asyncio.Event()

        async def messages():
            yield headers()
            await release.wait()  # the body never comes

        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = grpc_api.Stub(channel).Process(messages())
                responses = [r async for r in call]
                release.set()
                return responses
        finally:
            await server.stop(None)

    responses = run(scenario())
    assert [r.WhichOneof("response") for r in responses] == [
        "request_headers",
        "immediate_response",
    ]
    assert responses[1].immediate_response.status.code == 408


def test_a_decided_stream_stays_open_past_the_body_timeout():
    """Envoy keeps a stream open for the whole upstream response once the body is
    decided; the body timeout ends with the body, not with the stream (a long
    generation must not be failed closed after the request was forwarded)."""

    async def scenario():
        config = Config.load(listen="127.0.0.1:0", body_timeout_seconds=0.3)
        running = await build(config)
        server, port = running.server, running.port

        async def messages():
            yield headers()
            yield body(b'{"messages": []}')
            await asyncio.sleep(1.0)  # the upstream response takes its time

        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = grpc_api.Stub(channel).Process(messages())
                responses = [r async for r in call]
                return responses, await call.code()
        finally:
            await server.stop(None)

    responses, code = run(scenario())
    assert code == grpc.StatusCode.OK
    assert [r.WhichOneof("response") for r in responses] == ["request_headers", "request_body"]


def test_streamed_mode_over_a_real_stream():
    first = headers()
    first.protocol_config.request_body_mode = 4  # FULL_DUPLEX_STREAMED
    payload = json.dumps({"kv_transfer_params": {"prompt_token_ids": [1], "k": 2}}).encode()
    responses, code, _ = run(exchange([first, body(payload[:10], False), body(payload[10:])]))
    assert code == grpc.StatusCode.OK
    kinds = [r.WhichOneof("response") for r in responses]
    assert kinds == ["request_headers", "request_body"]
    streamed = responses[1].request_body.response.body_mutation.streamed_response
    assert streamed.end_of_stream
    assert json.loads(streamed.body) == {}  # untrusted: the whole object goes


def test_stream_closed_mid_body_ends_with_an_error_not_cleanly():
    first = headers()
    first.protocol_config.request_body_mode = 4  # FULL_DUPLEX_STREAMED: chunks are held
    responses, code, details = run(exchange([first, body(b'{"messages": [', False)]))
    assert responses == []
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "before the end of the body" in details


STREAM_ERROR_KINDS = ("protocol_violation", "internal", "cancelled", "shutdown")


def decision_lines(caplog) -> list[tuple[str, str, bool]]:
    """The processor's log lines: level, message, whether a traceback came with it."""
    return [
        (r.levelname, r.getMessage(), r.exc_info is not None)
        for r in caplog.records
        if r.name == "ext_proc.decision"
    ]


@pytest.mark.parametrize("mode", [2, 4], ids=["buffered", "streamed"])
def test_a_stream_envoy_cancels_mid_body_is_cancelled_not_a_protocol_error(mode, caplog):
    """Envoy cancels the stream of a client gone mid-upload (or past its message
    timeout): the read ends mid-body and the call is over. One line, no traceback,
    counted as cancelled; nothing is decided, so nothing is forwarded."""
    caplog.set_level("INFO", "ext_proc.decision")

    async def scenario():
        running = await build(Config.load(listen="127.0.0.1:0"))
        processor = running.processor
        sent = asyncio.Event()

        async def messages():
            first = headers()
            first.protocol_config.request_body_mode = mode  # BUFFERED or FULL_DUPLEX_STREAMED
            yield first
            if mode == 4:
                yield body(b'{"messages": [', eos=False)
            await sent.wait()  # the client's upload never ends

        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                call = grpc_api.Stub(channel).Process(messages())
                if mode == 4:
                    while processor.budget.used == 0:  # the first chunk is held
                        await asyncio.sleep(0.01)
                else:
                    assert (await call.read()).WhichOneof("response") == "request_headers"
                call.cancel()
                sent.set()
            while processor.open_streams:
                await asyncio.sleep(0.01)
        finally:
            await running.server.stop(None)
        errors = processor.metrics.stream_errors
        return {kind: errors.labels(kind)._value.get() for kind in STREAM_ERROR_KINDS}

    counted = run(scenario())
    assert counted == {"protocol_violation": 0, "internal": 0, "cancelled": 1, "shutdown": 0}
    assert decision_lines(caplog) == [("INFO", "stream cancelled", False)]


async def failed_stream(
    running, messages: list[pb.ProcessingRequest], kinds: Iterable[str]
) -> tuple[grpc.StatusCode, dict[str, float]]:
    """Send ``messages`` on one stream of the running server, which must end it with an
    error status; then stop the server: the status and the stream errors counted by kind."""
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            call = grpc_api.Stub(channel).Process(iter(messages))
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                async for _ in call:
                    pass
    finally:
        await running.server.stop(None)
    errors = running.processor.metrics.stream_errors
    return failed.value.code(), {kind: errors.labels(kind)._value.get() for kind in kinds}


def test_a_live_peer_that_ends_its_side_mid_body_is_a_protocol_error(caplog):
    """Envoy's side closed mid-body while the call is live: the error status goes out
    (Envoy fails the request closed), logged and counted as a protocol violation."""
    caplog.set_level("INFO", "ext_proc.decision")

    async def scenario():
        running = await build(Config.load(listen="127.0.0.1:0"))
        first = headers()
        first.protocol_config.request_body_mode = 4  # FULL_DUPLEX_STREAMED: chunks are held
        return await failed_stream(
            running, [first, body(b'{"messages": [', False)], STREAM_ERROR_KINDS
        )

    code, counted = run(scenario())
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert counted == {"protocol_violation": 1, "internal": 0, "cancelled": 0, "shutdown": 0}
    assert decision_lines(caplog) == [("WARNING", "protocol error", False)]


def test_protocol_errors_are_counted_as_such_not_as_internal_errors():
    async def scenario():
        running = await build(Config.load(listen="127.0.0.1:0"))
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                call = grpc_api.Stub(channel).Process(iter([body(b"{}")]))
                with pytest.raises(grpc.aio.AioRpcError):
                    async for _ in call:
                        pass
        finally:
            await running.server.stop(None)
        errors = running.processor.metrics.stream_errors
        return (
            errors.labels("protocol_violation")._value.get(),
            errors.labels("internal")._value.get(),
        )

    assert run(scenario()) == (1.0, 0.0)


def test_an_internal_error_while_the_server_stops_stays_an_internal_error(caplog):
    """Only a stream whose call the stop ended is "ended at shutdown": a fault in the
    processor meanwhile is logged with its traceback and counted as internal."""
    caplog.set_level("INFO", "ext_proc.decision")

    async def scenario():
        running = await build(Config.load(listen="127.0.0.1:0"))
        running.processor.stopping = True

        def broken(request: pb.ProcessingRequest) -> None:
            raise RuntimeError("broken")

        running.processor._decode = broken
        return await failed_stream(running, [headers(eos=True)], ("internal", "shutdown"))

    code, counted = run(scenario())
    assert code == grpc.StatusCode.UNKNOWN
    assert counted == {"internal": 1, "shutdown": 0}
    (record,) = [r for r in caplog.records if r.name == "ext_proc.decision"]
    assert (record.levelname, record.getMessage()) == ("ERROR", "internal error")
    assert record.exc_info is not None
    assert record.exc_info[0] is RuntimeError


def test_chunks_after_a_streamed_rejection_are_dropped_and_the_stream_ends_ok():
    # Envoy keeps sending the chunks it had read when the ImmediateResponse reaches it.
    first = headers()
    first.protocol_config.request_body_mode = 4  # FULL_DUPLEX_STREAMED
    config = Config.load(
        listen="127.0.0.1:0",
        max_body_bytes=16,
        max_json_values=4,
        inflight_budget_bytes=2048,
        proof={"record_slots": 32},
    )
    late = [body(b'{"messages": [', False), body(b"1, 2, 3, 4, 5], ", False), body(b"}")]
    responses, code, _ = run(exchange([first, *late], config))
    assert code == grpc.StatusCode.OK
    assert [r.WhichOneof("response") for r in responses] == ["immediate_response"]
    assert responses[0].immediate_response.status.code == 413


def _streamed_rejection():
    first = headers()
    first.protocol_config.request_body_mode = 4
    config = Config.load(
        listen="127.0.0.1:0",
        max_body_bytes=16,
        max_json_values=4,
        inflight_budget_bytes=2048,
        proof={"record_slots": 32},
    )
    return [first, body(b'{"messages": [', False), body(b"1, 2, 3], }")], config


def _audited_refusals():
    # Audit mode keeps the refusals it does not enforce: a wrong media type (held from
    # the headers) and an unparseable body.
    plain = headers_request(route_attributes(None), headers=(("content-type", b"text/plain"),))
    config = Config.load(listen="127.0.0.1:0", audit=True)
    return [plain, body(b'{"messages": [')], config


@pytest.mark.parametrize("scenario", [_streamed_rejection, _audited_refusals])
def test_a_refusal_leaves_no_reference_cycle_holding_the_request(scenario):
    # A cycle through a kept traceback would hold the stream and its body bytes until
    # a full collection, which the server's GC tuning makes rare: memory grows with
    # every refused large body.
    messages, config = scenario()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run(exchange(messages, config))
        gc.collect()
        ours = [
            o
            for o in gc.garbage
            if isinstance(o, Stream)
            or (isinstance(o, types.FrameType) and "/ext_proc/" in o.f_code.co_filename)
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert ours == []


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
def test_the_service_runs_on_each_event_loop(event_loop):
    config = Config.load(listen="127.0.0.1:0", event_loop=event_loop)
    payload = {"messages": [], "kv_transfer_params": {"prompt_token_ids": [1], "k": "v"}}
    with asyncio.Runner(loop_factory=loop_factory(config)) as runner:
        kind = type(runner.get_loop()).__module__
        responses, code, _ = runner.run(
            exchange([headers({"action": "strip"}), body(json.dumps(payload).encode())], config)
        )
    assert kind.startswith("uvloop" if event_loop == "uvloop" else "asyncio")
    assert code == grpc.StatusCode.OK
    mutation = responses[1].request_body.response.body_mutation
    assert json.loads(mutation.body) == {"messages": []}  # untrusted: the whole object goes


def test_nothing_of_a_body_is_held_once_it_is_answered():
    # The stream stays open after its decision (in a deployment, for the whole upstream
    # response); the body and its rewrite are out of the budget by then and must not be
    # kept alive by the servicer either.
    async def held_while_open() -> int:
        running = await build(Config.load(listen="127.0.0.1:0"))
        queue: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()

        async def requests():
            while (message := await queue.get()) is not None:
                yield message
                del message

        try:
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{running.port}",
                options=[("grpc.max_send_message_length", 64 * MiB)],
            ) as channel:
                call = grpc_api.Stub(channel).Process(requests())
                tracemalloc.start()
                payload = {"messages": [], "kv_transfer_params": {}, "pad": "x" * (8 * MiB)}
                await queue.put(headers({"action": "strip"}))
                await queue.put(body(json.dumps(payload).encode()))
                del payload
                kinds = [(await call.read()).WhichOneof("response") for _ in range(2)]
                assert kinds == ["request_headers", "request_body"]
                await asyncio.sleep(0.2)
                gc.collect()
                held = tracemalloc.get_traced_memory()[0]
                tracemalloc.stop()
                await queue.put(None)
                assert await call.code() == grpc.StatusCode.OK
        finally:
            await running.server.stop(None)
        return held

    assert run(held_while_open()) < MiB


def test_the_in_flight_gauges_read_open_streams_and_held_bytes_when_sampled():
    async def scenario():
        running = await build(Config.load(listen="127.0.0.1:0"))
        processor, registry = running.processor, running.processor.metrics.registry
        release = asyncio.Event()

        async def messages():
            first = headers()
            first.protocol_config.request_body_mode = 4  # FULL_DUPLEX_STREAMED: chunks held
            yield first
            yield body(b'{"a": ', eos=False)
            await release.wait()

        def gauges() -> tuple[float | None, float | None]:
            processor.sample_metrics()
            return (
                registry.get_sample_value("ext_proc_inflight_streams"),
                registry.get_sample_value("ext_proc_inflight_body_bytes"),
            )

        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                call = grpc_api.Stub(channel).Process(messages())
                while processor.budget.used == 0:
                    await asyncio.sleep(0.01)
                during = gauges()
                release.set()
                call.cancel()
            while processor.open_streams:
                await asyncio.sleep(0.01)
            return during, gauges()
        finally:
            await running.server.stop(None)

    during, after = run(scenario())
    assert during[0] == 1
    assert during[1] > 0
    assert after == (0, 0)


def test_after_a_refusal_the_rpc_ends_without_waiting_for_envoy():
    # Envoy ends the request with the local reply and would cancel the stream: the
    # servicer ends it first, cleanly, and counts no error.
    async def scenario():
        running = await build(Config.load(listen="127.0.0.1:0"))
        release = asyncio.Event()
        payload = {"kv_transfer_params": {"prompt_token_ids": [1, True]}}

        async def messages():
            yield headers({"topology": "disaggregated", "trust_any_caller": True})
            yield body(json.dumps(payload).encode())
            await release.wait()  # Envoy's side stays open

        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                call = grpc_api.Stub(channel).Process(messages())
                responses = [r async for r in call]
                code = await call.code()
                release.set()
            errors = running.processor.metrics.stream_errors
            return (
                responses,
                code,
                sum(
                    errors.labels(kind)._value.get()
                    for kind in ("cancelled", "internal", "protocol_violation")
                ),
            )
        finally:
            await running.server.stop(None)

    responses, code, errors = run(scenario())
    assert code == grpc.StatusCode.OK
    assert [r.WhichOneof("response") for r in responses] == [
        "request_headers",
        "immediate_response",
    ]
    assert errors == 0


def test_a_long_proven_body_is_verified_and_forwarded_unchanged(tmp_path, monkeypatch):
    # A processor that has run for a day: its record began before the proof was minted.
    monkeypatch.setattr(
        server,
        "open_record",
        lambda config, *_: LocalRecord.anonymous(
            config.proof.record_slots, began=time.time() - DAY
        ),
    )
    secret = tmp_path / "k1"
    secret.write_bytes(b"k" * 32)
    config = Config.load(listen="127.0.0.1:0", proof={"keys": [{"id": "k1", "file": str(secret)}]})
    prompt = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    params = {"prompt_token_ids": list(range(100_000, 160_000)), "remote_engine_id": "e"}
    digest = proof.prompt_digest(prompt, True, "/v1/chat/completions")
    keys = proof.KeySet({"k1": b"k" * 32}, "k1")
    token = proof.mint(keys, params, digest, int(time.time()) + 10, minted=int(time.time()))
    raw = json.dumps({**prompt, "kv_transfer_params": {**params, proof.PROOF_KEY: token}})
    route = {"topology": "disaggregated", "action": "honor"}
    started = headers_request(
        {**route_attributes(route), attributes.PATH: "/v1/chat/completions"},
        headers=(("content-type", b"application/json"),),
    )
    responses, code, _ = run(exchange([started, body(raw.encode())], config))
    assert code == grpc.StatusCode.OK
    answer = responses[1]
    common = answer.request_body.response
    # Honored as sent: no body mutation, the proof goes on with the parameters.
    assert common.status == common.CONTINUE
    assert not common.HasField("body_mutation")
    decision = answer.dynamic_metadata.fields["ext_proc.token_policy"].struct_value.fields
    assert decision["action"].string_value == "honor"
    assert decision["reason"].string_value == "trusted_proof"
