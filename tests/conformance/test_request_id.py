"""The request id as a carrier, against a real vLLM: vLLM builds its request id from the
``X-Request-Id`` header (else the body's ``request_id``; ``/v1/responses`` takes the
body's), and its MoRIIO connector reads a peer's address from that id
(``get_peer_zmq_from_request_id``). The id a response carries (``id``) is the one vLLM
built; vLLM's own function, run in vLLM's environment, says what a connector would
read from it. Bare, the client's address comes out; through the gateway, none."""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any

import httpx

from tests.conformance import vllm_env
from tests.conformance.results import record
from tests.e2e.test_operations import access_log

PREFILL_ADDRESS = "10.0.0.66:7000"
DECODE_ADDRESS = "10.0.0.67:7001"
# The shape vLLM's MoRIIO proxy writes (moriio_common.py: _PREFILL_ZMQ_RE,
# _DECODE_ZMQ_RE): both peers' addresses, then 32 hex digits.
FORGED = f"x___prefill_addr_{PREFILL_ADDRESS}___decode_addr_{DECODE_ADDRESS}_{'0' * 32}"
JSON = {"content-type": "application/json"}
CHAT = {"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "tiny", "max_output_tokens": 1, "input": "hi"}
# (case, path, body, headers): each way a client can name vLLM's request id.
CASES = {
    "header, chat": ("/v1/chat/completions", CHAT, {"x-request-id": FORGED}),
    "body, chat": ("/v1/chat/completions", {**CHAT, "request_id": FORGED}, {}),
    "body, responses": ("/v1/responses", {**RESPONSES, "request_id": FORGED}, {}),
    "header, responses": ("/v1/responses", RESPONSES, {"x-request-id": FORGED}),
}

_PARSE = """
import json, sys
from vllm.distributed.kv_transfer.kv_connector.v1.moriio.moriio_common import (
    get_peer_zmq_from_request_id,
)
def peer(request_id, producer):
    try:
        return get_peer_zmq_from_request_id(request_id, producer)
    except ValueError:  # 0.27.x raises for an id that names no peer; later releases: None
        return None
ids = json.load(sys.stdin)
print(json.dumps([[peer(i, True), peer(i, False)] for i in ids]))
"""


def peers(request_ids: list[str]) -> list[list[str | None]]:
    """What vLLM's MoRIIO connector reads from each id: [decode peer, prefill peer]."""
    done = subprocess.run(
        [str(vllm_env.ensure_venv()), "-c", _PARSE],
        input=json.dumps(request_ids),
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    parsed: list[list[str | None]] = json.loads(done.stdout.strip().splitlines()[-1])
    return parsed


def vllm_id(base_url: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> str:
    reply = httpx.post(base_url + path, json=body, headers={**JSON, **headers}, timeout=120)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["id"])


def test_no_client_names_the_peer_a_connector_reads(vllm, gateway):
    bare = {case: vllm_id(vllm, *CASES[case]) for case in CASES}
    through = {case: vllm_id(gateway.url, *CASES[case]) for case in CASES}
    found = peers([*bare.values(), *through.values()])
    bare_peers = dict(zip(bare, found[: len(bare)], strict=True))
    gateway_peers = dict(zip(through, found[len(bare) :], strict=True))
    for case in CASES:
        record(f"request id ({case})", "peer read bare", bare_peers[case])
        record(f"request id ({case})", "peer read through the gateway", gateway_peers[case])
    # Bare, vLLM builds its id from the client's (the header first; the body's without
    # it, and always on /v1/responses), and the connector reads both forged peers.
    for case in ("header, chat", "body, chat", "body, responses"):
        assert bare_peers[case] == [DECODE_ADDRESS, PREFILL_ADDRESS], (case, bare[case])
    # Through the gateway, no id vLLM builds names a peer.
    assert all(value == [None, None] for value in gateway_peers.values()), gateway_peers


def test_vllm_builds_its_id_from_the_gateways(gateway):
    # The request and its log lines still join by one id: the gateway's, which vLLM
    # uses; the client's travels as x-client-request-id.
    client_id = f"{FORGED}-{uuid.uuid4().hex}"
    built = vllm_id(gateway.url, "/v1/chat/completions", CHAT, {"x-request-id": client_id})
    line = access_log(gateway, client_id)
    assert line["client_request_id"] == client_id
    assert built == f"chatcmpl-{line['request_id']}"
