"""Only a failure that forwarded nothing says retry: the shipped envoy/envoy.yaml on the
real Envoy answers a processor it cannot reach 503 with retry-after in vLLM's error
shape, nothing reaching the upstream; the processor's own refusal keeps its 400; an
upstream that resets a request it received gets no retry-after."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack import processes
from devstack import upstream as upstream_stub
from ext_proc.core.address import HostPort
from tests.e2e.stack import Stack, new_key, static_cluster

SHIPPED = Path(__file__).resolve().parents[2] / "envoy" / "envoy.yaml"
BODY = {"model": "m", "prompt": "hi", "kv_transfer_params": {"do_remote_decode": True}}


class ResettingUpstream:
    """Reads each request's first bytes, counts it, then resets the connection (RST):
    an upstream that received the request and failed before answering."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = HostPort("127.0.0.1", self._server.getsockname()[1])
        self.arrived = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                if conn.recv(65536):
                    self.arrived += 1
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def close(self) -> None:
        self._server.close()


def _resetting_route(address: HostPort) -> Any:
    def edit(config: dict[str, Any]) -> None:
        config["static_resources"]["clusters"].append(static_cluster("resetting", address, "1s"))
        hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        (vhost,) = hcm["typed_config"]["route_config"]["virtual_hosts"]
        first = next(i for i, r in enumerate(vhost["routes"]) if "direct_response" not in r)
        vhost["routes"].insert(
            first,
            {
                "name": "resetting",
                "match": {"prefix": "/resetting/"},
                "route": {"cluster": "resetting"},
            },
        )

    return edit


@pytest.fixture(scope="module")
def upstream() -> Iterator[ResettingUpstream]:
    server = ResettingUpstream()
    yield server
    server.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, upstream: ResettingUpstream) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("unavailable")
    with Stack(
        workdir,
        source=SHIPPED,
        edit=_resetting_route(upstream.address),
        proof_keys={"e2e": new_key()},
    ) as running:
        yield running


def _post(stack: Stack, path: str, body: bytes) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return httpx.post(f"{stack.url}{path}", content=body, headers=headers, timeout=20)


def test_a_processor_refusal_keeps_its_status(stack: Stack) -> None:
    stack.clear()
    reply = _post(stack, "/deny/v1/completions", json.dumps(BODY).encode())
    assert reply.status_code == 400
    assert "retry-after" not in reply.headers
    assert reply.json()["error"]["code"] == 400
    assert stack.received_count() == 0


def test_an_upstream_reset_after_the_request_arrived_says_no_retry(
    stack: Stack, upstream: ResettingUpstream
) -> None:
    before = upstream.arrived
    reply = _post(stack, "/resetting/v1/completions", json.dumps({"prompt": "hi"}).encode())
    assert upstream.arrived == before + 1
    assert reply.status_code == 503
    assert "retry-after" not in reply.headers
    assert reply.json()["error"]["type"] == "GatewayError"


def test_a_processor_lost_after_the_upstream_was_chosen_says_no_retry(stack: Stack) -> None:
    # A mint route's response goes to the processor: killed while the upstream holds
    # the request, the filter fails after the router chose an upstream. The upstream
    # may have run it, so no retry-after, and not a 503 a proxy would retry.
    stack.clear()
    replies: list[httpx.Response] = []
    body = json.dumps({"model": "m", "prompt": "hi"}).encode()
    headers = {"content-type": "application/json", upstream_stub.DELAY_HEADER: "3"}
    sender = threading.Thread(
        target=lambda: replies.append(
            httpx.post(
                f"{stack.url}/pd/prefill/v1/completions", content=body, headers=headers, timeout=20
            )
        )
    )
    sender.start()
    for _ in range(100):
        if stack.received_count():
            break
        time.sleep(0.05)
    assert stack.received_count() == 1
    os.kill(stack.children["processor"].pid, signal.SIGKILL)
    sender.join(30)
    (reply,) = replies
    assert reply.status_code == 500
    assert "retry-after" not in reply.headers
    assert reply.json()["error"]["type"] == "GatewayError"


def test_an_unreachable_processor_answers_503_with_retry_after(stack: Stack) -> None:
    # Last in this module: the processor is not started again.
    stack.stop_processor()
    assert processes.port_is_free(stack.processor.port)
    stack.clear()
    for path in ("/v1/completions", "/deny/v1/completions", "/pd/prefill/v1/completions"):
        reply = _post(stack, path, json.dumps(BODY).encode())
        assert reply.status_code == 503, path
        assert reply.headers["retry-after"] == "1"
        assert reply.headers["content-type"] == "application/json"
        error = reply.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "ServiceUnavailableError",
            503,
            None,
        )
        assert "not processed" in error["message"]
    assert stack.received_count() == 0
