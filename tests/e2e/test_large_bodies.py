"""Long prompts in both body modes, and every limit answered with a clean JSON error."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from devstack import upstream
from ext_proc.core import memory
from ext_proc.core.config import Config
from tests.e2e.conftest import BODY_MODES
from tests.e2e.stack import Stack
from tests.e2e.test_gateway import (
    KV,
    STRIP_ROUTES,
    TRUSTED,
    assert_framing,
    assert_stripped,
    chat,
    error_of,
    kept_by,
    only_request,
)

MiB = 1 << 20
JSON = {"content-type": "application/json"}


def decode_request(count: int) -> dict:
    """A decode-stage request carrying ``count`` reused ids (128k ids ≈ 1 MB)."""
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "continue"}],
        "max_tokens": 16,
        "kv_transfer_params": {
            "prompt_token_ids": [(i * 7919) % 128256 for i in range(count)],
            "do_remote_prefill": True,
            "remote_block_ids": [list(range(64))],
            "remote_engine_id": "e0",
            "remote_host": "10.0.0.1",
            "remote_port": 7000,
        },
    }


def chat_of_size(size: int) -> dict:
    turn = "The quick brown fox jumps over the lazy dog. " * 40
    messages = []
    while sum(len(m["content"]) for m in messages) < size:
        messages.append({"role": "user" if len(messages) % 2 else "assistant", "content": turn})
    return {
        "model": "tiny",
        "messages": messages,
        "kv_transfer_params": {"prompt_token_ids": list(range(1000)), "remote_port": 1},
    }


def expect_framing(received, mode: str) -> None:
    assert_framing(received)
    if mode == "streamed":  # Envoy drops content-length and chunks to HTTP/1 upstreams
        assert received.header("transfer-encoding") == ["chunked"]
    else:  # the processor sets it (two messages), the buffer filter adds it (one message)
        assert received.header("content-length") == [str(len(received.body))]


@pytest.fixture(params=[False, True], ids=["http1", "http2"])
def client(request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    with httpx.Client(http1=not request.param, http2=request.param, timeout=60) as c:
        yield c


def test_128k_ids_decode_request_honored_untouched(gateway, client, request):
    sent = decode_request(128 * 1024)
    data = json.dumps(sent).encode()
    assert 0.85 * MiB < len(data) < 1.5 * MiB  # about 1 MB
    reply = client.post(gateway.url + TRUSTED + "chat/completions", content=data, headers=JSON)
    assert reply.status_code == 200, reply.text
    received = only_request(gateway)
    assert received.body == data
    expect_framing(received, gateway.workdir.name.rstrip("0123456789"))
    # Unproven on the shipped decode route: the whole object removed, not honored.
    gateway.clear()
    reply = client.post(gateway.url + "/pd/v1/chat/completions", content=data, headers=JSON)
    assert reply.status_code == 200, reply.text
    assert_stripped(json.loads(only_request(gateway).body), sent)


@STRIP_ROUTES
@pytest.mark.parametrize("size", [2 * MiB, 8 * MiB], ids=["2MB", "8MB"])
def test_large_chat_bodies_stripped(gateway, client, size, prefix):
    sent = chat_of_size(size)
    data = json.dumps(sent).encode()
    started = time.perf_counter()
    reply = client.post(gateway.url + prefix + "chat/completions", content=data, headers=JSON)
    elapsed = time.perf_counter() - started
    assert reply.status_code == 200, reply.text
    received = only_request(gateway)
    expect_framing(received, gateway.workdir.name.rstrip("0123456789"))
    assert_stripped(json.loads(received.body), sent, kept_by(prefix, sent[KV]))
    print(f"\n{len(data)} bytes stripped end to end in {elapsed * 1000:.0f} ms")


@pytest.mark.parametrize("size", [64 * 1024, 2 * MiB], ids=["64KB", "2MB"])
def test_http2_upstream_gets_the_rewritten_body_whole(gateway, client, size):
    sent = chat_of_size(size)
    reply = client.post(gateway.url + "/h2up/v1/chat/completions", json=sent)
    assert reply.status_code == 200, reply.text
    (received,) = gateway.received()
    assert received.protocol == "HTTP/2"
    assert_stripped(json.loads(received.body), sent)
    # HTTP/2 frames the body itself; a declared length, if any, must match it.
    assert received.header("content-length") in ([], [str(len(received.body))])


def test_body_mode_chosen_per_route(gateway, client):
    """A route can override the filter's body mode (here: FULL_DUPLEX_STREAMED)."""
    sent = chat_of_size(100_000)
    reply = client.post(gateway.url + "/duplex/v1/chat/completions", json=sent)
    assert reply.status_code == 200, reply.text
    received = only_request(gateway)
    # Behind the buffer filter of the one-message arrangement the streamed answer is
    # held whole too, and goes on with its length.
    held = gateway.source == BODY_MODES["one-message"]
    expect_framing(received, "two-message" if held else "streamed")
    assert_stripped(json.loads(received.body), sent)


def chunks(data: bytes, size: int, pause: float = 0.0) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        if pause:
            time.sleep(pause)
        yield data[start : start + size]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_body_over_the_limit_gets_413_json(gateway, chunked):
    data = json.dumps({"messages": [], "x": "y" * (17 * MiB)}).encode()
    content = chunks(data, 256 * 1024) if chunked else data
    with httpx.Client(timeout=60) as c:
        try:
            reply = c.post(gateway.url + "/v1/chat/completions", content=content, headers=JSON)
        except httpx.RemoteProtocolError:
            pytest.fail("the gateway closed the connection instead of answering 413")
    assert reply.status_code == 413
    assert error_of(reply)["code"] == 413
    assert gateway.received() == []


def test_slow_chunked_upload_within_limits(gateway):
    sent = chat_of_size(64 * 1024)
    data = json.dumps(sent).encode()
    with httpx.Client(timeout=60) as c:
        reply = c.post(
            gateway.url + "/v1/chat/completions",
            content=chunks(data, 4096, pause=0.05),
            headers=JSON,
        )
    assert reply.status_code == 200, reply.text
    assert_stripped(json.loads(only_request(gateway).body), sent)


# --- processor limits: in-flight budget, body timeout, memory ------------------------

ROUNDS = 3
VALUES = 16_384
# The budget holds exactly one body of the largest admissible cost (ext_proc/core/memory.py)
# beside the record of spent proofs.
BUDGET = memory.largest(2 * MiB, VALUES) + Config().record_bytes
LIMITS = {
    "max_body_bytes": 2 * MiB,
    "max_json_values": VALUES,
    "inflight_budget_bytes": BUDGET,
    "body_timeout_seconds": 2,
}


# Early refusals from the headers (announced size, body timeout) need the processor to
# see the headers message: not in the one-message default.
@pytest.fixture(scope="module", params=["two-message", "streamed"])
def limited(request, tmp_path_factory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp(request.param)
    with Stack(workdir, source=BODY_MODES[request.param], processor_config=LIMITS) as stack:
        yield stack


def read_reply(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed without a reply: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(rest) < int(headers.get("content-length", "0")):
        rest += sock.recv(65536)
    return int(lines[0].split()[1]), headers, rest


def test_processor_body_limit_below_envoys_gets_413(limited):
    limited.clear()
    with httpx.Client(timeout=30) as c:
        reply = c.post(
            limited.url + "/v1/chat/completions",
            content=json.dumps({"x": "y" * (3 * MiB)}).encode(),
            headers=JSON,
        )
    assert reply.status_code == 413
    assert "exceeds the limit" in error_of(reply)["message"]
    assert limited.received() == []


def test_exhausted_inflight_budget_gets_503_with_retry_after(limited):
    if limited.source == BODY_MODES["two-message"]:
        pytest.skip("a buffered body reaches the processor whole: no upload can hold part")
    limited.clear()
    # An upload that stops half-way holds what arrived (Envoy forwards about 1 MiB of it
    # before flow control stops the client): at least held(512 KiB) of the budget.
    holder = limited.open_upload(2 * MiB, b'{"x": "' + b"y" * MiB)
    try:
        deadline = time.monotonic() + 10
        while limited.inflight() < memory.held(MiB // 2):
            assert time.monotonic() < deadline, limited.inflight()
            time.sleep(0.05)
        with httpx.Client(timeout=30) as c:
            # NaN: json.loads reads it, about 40 MiB, more than is left (the key makes
            # it parsed: a body without it would be forwarded unparsed).
            document = {"n": float("nan"), "x": "y" * (2 * MiB - 1024), KV: None}
            reply = c.post(
                limited.url + "/v1/chat/completions",
                content=json.dumps(document).encode(),
                headers=JSON,
            )
        assert reply.status_code == 503
        assert reply.headers["retry-after"] == "1"
        assert "retry" in error_of(reply)["message"]
    finally:
        holder.close()
    time.sleep(0.3)
    with httpx.Client(timeout=30) as c:  # the budget came back
        ok = c.post(limited.url + "/v1/chat/completions", json={"messages": []})
    assert ok.status_code == 200
    assert len(limited.received()) == 1


def test_slow_body_gets_408_and_nothing_upstream(limited):
    limited.clear()
    sock = limited.open_upload(100, b'{"messages": [')
    try:
        status, headers, body = read_reply(sock)  # the processor gives up after 2 s
    finally:
        sock.close()
    assert status == 408
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == 408
    assert limited.received() == []


def test_an_upstream_slower_than_the_body_timeout_is_answered(limited):
    """The body timeout (2 s here) covers the request's body alone: an upstream answer
    slower than it still reaches the client."""
    limited.clear()
    body = json.dumps(chat(kv_transfer_params={"prompt_token_ids": [1, 2]})).encode()
    reply = httpx.post(
        limited.url + "/v1/chat/completions",
        content=body,
        headers={**JSON, upstream.DELAY_HEADER: "3"},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    (received,) = limited.received()
    assert "kv_transfer_params" not in json.loads(received.body)


def test_concurrent_large_bodies_keep_processor_memory_bounded(limited):
    limited.clear()
    before = limited.processor_memory_kib()
    data = json.dumps(chat_of_size(int(1.8 * MiB))).encode()

    def send(_: int) -> int:
        with httpx.Client(timeout=60) as c:
            return c.post(
                limited.url + "/v1/chat/completions", content=data, headers=JSON
            ).status_code

    statuses: list[int] = []

    def round_peak_kib() -> int:
        limited.reset_processor_peak()
        with ThreadPoolExecutor(max_workers=16) as pool:
            statuses.extend(pool.map(send, range(48)))
        return limited.processor_memory_kib()["VmHWM"]

    # The first round grows gRPC's and the allocator's pools once (measured 60-120 MiB);
    # memory.py counts it in the baseline. Later rounds are measured from there.
    warm_up = (round_peak_kib() - before["VmRSS"]) / 1024
    warm = limited.processor_memory_kib()["VmRSS"]
    peaks = [(round_peak_kib() - warm) / 1024 for _ in range(ROUNDS)]
    print(
        f"\n{ROUNDS + 1} x 48 x {len(data) / MiB:.1f} MiB, 16 at a time: statuses "
        f"{ {s: statuses.count(s) for s in set(statuses)} }; processor RSS before "
        f"{before['VmRSS'] / 1024:.0f} MiB, warm-up {warm_up:.0f} MiB, then peak growth "
        f"per round {[round(p) for p in peaks]} MiB"
    )
    assert set(statuses) <= {200, 503}
    assert statuses.count(200) >= ROUNDS
    # Counted by the stub: fetching ~190 recorded 1.8 MiB bodies can outlast its timeout.
    assert limited.received_count() == statuses.count(200)
    assert warm_up < memory.WARM_UP / MiB, warm_up
    # What the processor may hold at once (ext_proc/core/memory.py): the budget, which covers
    # every admitted body from its parse until its rewrite was sent, plus the messages
    # gRPC received that the servicer has not charged yet (at most one per stream, about
    # its size each), plus allocator slack. 86 MiB are offered per round.
    bound = (BUDGET + 16 * len(data)) / MiB + 16
    assert max(peaks) < bound, (peaks, bound)
    # A rejected body kept alive by a reference cycle once added about 15 MiB per round;
    # rounds vary by more than that (the allocator's pools may still grow after the
    # first), so tests/edge/test_service.py pins that cause exactly instead.


def test_processor_too_slow_gets_503_json_with_retry_after(tmp_path):
    stack = Stack(tmp_path, source=BODY_MODES["one-message"]).start()
    processor = stack.children["processor"].pid
    try:
        os.kill(processor, signal.SIGSTOP)
        try:
            with httpx.Client(timeout=30) as c:
                reply = c.post(stack.url + "/v1/chat/completions", json={"messages": []})
        finally:
            os.kill(processor, signal.SIGCONT)
        # Envoy's 504 for a message timeout, mapped: nothing was forwarded, so retry.
        assert reply.status_code == 503
        assert reply.headers["retry-after"] == "1"
        error = error_of(reply)
        assert error["type"] == "ServiceUnavailableError"
        assert stack.received() == []
    finally:
        stack.stop()
