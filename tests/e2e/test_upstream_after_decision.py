"""The upstream opens only after the decision, in every shipped arrangement: a refused
request leaves no byte at the upstream, and slow uploads hold no upstream request.

The stand-in upstream sits behind a TCP recorder that keeps every byte Envoy sent its
way, whether or not a whole request followed (a request opened and then reset leaves its
headers there)."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Iterator

import httpx
import pytest

from devstack import processes
from ext_proc.core.address import HostPort
from tests.e2e.conftest import BODY_MODES, ENVOY
from tests.e2e.stack import BODY_LIMIT, LOCAL, Stack, start_stand_in
from tests.recorder import Recorder

ARRANGEMENTS = {**BODY_MODES, "decompress": ENVOY / "envoy-decompress.yaml"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
SLOW_UPLOADS = 100
# In each slow upload's body, never sent whole: it must not reach the upstream.
SLOW_MARKER = b"slow-upload-marker"


class Recorded:
    """The stack, and the recorder between its Envoy and the stand-in upstream."""

    def __init__(self, stack: Stack, recorder: Recorder) -> None:
        self.stack = stack
        self.recorder = recorder

    @property
    def url(self) -> str:
        return self.stack.url

    def upstream_requests_active(self) -> int:
        """Envoy's open requests to every upstream cluster but the processor's."""
        url = f"http://{self.stack.admin}/stats?filter=upstream_rq_active$"
        with urllib.request.urlopen(url, timeout=5) as reply:
            lines = reply.read().decode().splitlines()
        return sum(
            int(line.rsplit(": ", 1)[1])
            for line in lines
            if line.startswith("cluster.") and not line.startswith("cluster.ext_proc.")
        )


@pytest.fixture(scope="module", params=list(ARRANGEMENTS))
def recorded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Recorded]:
    workdir = tmp_path_factory.mktemp(request.param)
    stub = HostPort(LOCAL, processes.free_port())
    upstream = start_stand_in(stub, workdir / "upstream.log")
    try:
        with Recorder(stub).running() as recorder:
            assert recorder.address is not None
            source = ARRANGEMENTS[request.param]
            with Stack(workdir, source=source, real_upstream=recorder.address) as stack:
                yield Recorded(stack, recorder)
    finally:
        processes.stop(upstream)


def post(url: str, content: bytes, content_type: str = "application/json") -> httpx.Response:
    with httpx.Client(timeout=30) as client:
        return client.post(url, content=content, headers={"content-type": content_type})


def oversized() -> Iterator[bytes]:
    """A chunked body past the routes' buffer limit, sent in pieces."""
    yield b'{"model": "m", "x": "'
    piece = b"y" * (1 << 20)
    for _ in range(BODY_LIMIT // len(piece) + 1):
        yield piece
    yield b'"}'


REFUSED = {
    "415-content-type": ("/v1/chat/completions", b'{"a": 1}', "text/plain", 415),
    "400-not-json": ("/v1/chat/completions", b'{"model": 1', "application/json", 400),
    "400-deny-route": (
        "/deny/v1/chat/completions",
        json.dumps({**CHAT, "kv_transfer_params": {"prompt_token_ids": [1, 2]}}).encode(),
        "application/json",
        400,
    ),
    "404-token-in": ("/inference/v1/generate", b'{"token_ids": [1]}', "application/json", 404),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_refused_request_leaves_no_trace_upstream(recorded, case):
    path, body, content_type, status = REFUSED[case]
    recorded.recorder.clear()
    reply = post(recorded.url + path, body, content_type)
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["code"] == status
    time.sleep(0.2)  # anything Envoy sent would have reached the recorder by now
    assert recorded.recorder.received() == b""
    # The recorder sees what a let-through request sends: the check above can fail.
    allowed = post(recorded.url + "/v1/chat/completions", json.dumps(CHAT).encode())
    assert allowed.status_code == 200, allowed.text
    assert b"POST /v1/chat/completions" in recorded.recorder.received()


def test_an_oversized_body_leaves_no_trace_upstream(recorded):
    recorded.recorder.clear()
    with httpx.Client(timeout=60) as client:
        reply = client.post(
            recorded.url + "/v1/chat/completions",
            content=oversized(),
            headers={"content-type": "application/json"},
        )
    assert reply.status_code == 413
    time.sleep(0.2)
    assert recorded.recorder.received() == b""


def open_slow_upload(gateway: HostPort) -> socket.socket:
    """Headers announcing a 4 KiB body, then only its first bytes."""
    sock = socket.create_connection((gateway.host, gateway.port), timeout=30)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        b"content-type: application/json\r\ncontent-length: 4096\r\n\r\n"
        b'{"model": "' + SLOW_MARKER
    )
    return sock


def test_slow_uploads_hold_no_upstream_request(recorded):
    recorded.recorder.clear()
    uploads = [open_slow_upload(recorded.stack.gateway) for _ in range(SLOW_UPLOADS)]
    try:
        time.sleep(1.0)  # Envoy has read every upload's headers and first bytes
        assert recorded.upstream_requests_active() == 0
        assert recorded.recorder.received() == b""
        # Legitimate requests are served meanwhile, each opening its own upstream request.
        for _ in range(5):
            reply = post(recorded.url + "/v1/chat/completions", json.dumps(CHAT).encode())
            assert reply.status_code == 200, reply.text
        assert recorded.recorder.received().count(b"POST /v1/chat/completions") == 5
        assert recorded.upstream_requests_active() == 0
    finally:
        for sock in uploads:
            sock.close()
    time.sleep(0.2)
    assert SLOW_MARKER not in recorded.recorder.received()


def test_a_held_body_reaches_an_http1_upstream_with_its_length(recorded):
    # The buffer filter (one message) adds the content-length of the body it let
    # through; the other arrangements frame it as before (docs/body-modes.md).
    if recorded.stack.source not in (ARRANGEMENTS["one-message"], ARRANGEMENTS["decompress"]):
        pytest.skip("no buffer filter in this arrangement")
    stripped = {**CHAT, "kv_transfer_params": {"prompt_token_ids": [1, 2, 3]}}
    for sent, forwarded in [(CHAT, CHAT), (stripped, CHAT)]:
        recorded.recorder.clear()
        reply = post(recorded.url + "/v1/chat/completions", json.dumps(sent).encode())
        assert reply.status_code == 200, reply.text
        head, _, body = recorded.recorder.received().partition(b"\r\n\r\n")
        headers = [line.lower() for line in head.split(b"\r\n")[1:]]
        assert f"content-length: {len(body)}".encode() in headers
        assert not [h for h in headers if h.startswith(b"transfer-encoding")]
        assert json.loads(body) == forwarded


def test_a_request_refused_with_the_processor_down_leaves_no_trace(recorded):
    # Last in the module: the processor does not come back.
    recorded.recorder.clear()
    recorded.stack.stop_processor()
    reply = post(recorded.url + "/v1/chat/completions", json.dumps(CHAT).encode())
    assert reply.status_code >= 500
    time.sleep(0.2)
    assert recorded.recorder.received() == b""
