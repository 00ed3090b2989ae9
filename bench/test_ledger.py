"""The cost ledger's processor rungs over a real gRPC stream: each does its piece and
answers as it says (bench/ledger.py)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from bench import bodies, grpc_api, ledger
from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.core.config import Config
from ext_proc.core.events import BodyMode
from ext_proc.edge import service
from ext_proc.edge.attributes import attribute_keys

KEYS = attribute_keys()
AGGREGATED = {"topology": "aggregated", "action": "strip"}


def _body(data: bytes) -> pb.ProcessingRequest:
    request = pb.ProcessingRequest()
    request.request_body.body = data
    request.request_body.end_of_stream = True
    request.protocol_config.request_body_mode = BodyMode.BUFFERED.value  # type: ignore[assignment]
    fields = request.attributes["envoy.filters.http.ext_proc"].fields
    for name, value in AGGREGATED.items():
        fields[KEYS.fields[name]].string_value = value
    fields[KEYS.size].number_value = len(AGGREGATED)
    fields["request.url_path"].string_value = "/v1/chat/completions"
    fields["request.headers['content-type']"].string_value = "application/json"
    return request


async def _answer(rung: str, data: bytes) -> pb.ProcessingResponse:
    config = Config.load(listen="127.0.0.1:0")
    server = grpc.aio.server()
    service.add_to_server(ledger.Rung(rung, config).Process, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = grpc_api.Stub(channel).Process(iter([_body(data)]))
            answers: list[pb.ProcessingResponse] = [a async for a in call]
            (answer,) = answers
            return answer
    finally:
        await server.stop(None)


@pytest.mark.parametrize("rung", ledger.RUNGS[:-1])
def test_a_rung_below_encode_answers_empty_and_from_encode_as_the_service(rung: str) -> None:
    strip = bodies.build("2k", "strip").data
    answer = asyncio.run(_answer(rung, strip))
    replaced = answer.request_body.response.body_mutation.body
    if ledger.RUNGS.index(rung) < ledger.RUNGS.index("encode"):
        assert answer == pb.ProcessingResponse(request_body=pb.BodyResponse())
    else:
        assert replaced
        assert b"prompt_token_ids" not in replaced
        assert answer.dynamic_metadata.fields  # the decision, for Envoy's log


def test_every_rung_says_what_it_adds() -> None:
    assert set(ledger.ADDS) == {*ledger.RUNGS, "service"}
    assert ledger.loop_factory("rw") is asyncio.new_event_loop
    assert ledger.loop_factory("uvloop") is not asyncio.new_event_loop
