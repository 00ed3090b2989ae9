"""HTTP-level inputs: compression and expect: 100-continue."""

from __future__ import annotations

import gzip
import json
import socket

import httpx
import pytest

from tests.e2e.stack import read_past_head
from tests.e2e.test_gateway import assert_framing, assert_stripped, chat, error_of

JSON = {"content-type": "application/json"}


def test_gzip_body_is_decompressed_before_inspection(decompressing):
    decompressing.clear()
    sent = chat({"prompt_token_ids": [1, 2], "remote_port": 7})
    data = gzip.compress(json.dumps(sent).encode())
    with httpx.Client(timeout=20) as client:
        reply = client.post(
            decompressing.url + "/v1/chat/completions",
            content=data,
            headers={**JSON, "content-encoding": "gzip"},
        )
    assert reply.status_code == 200, reply.text
    (received,) = decompressing.received()
    assert_framing(received)
    assert received.header("content-encoding") == []
    assert_stripped(json.loads(received.body), sent)


@pytest.mark.parametrize("encoding", ["br", "deflate", "zstd", "gzip, br"])
def test_encodings_the_gateway_cannot_decode_are_refused(decompressing, encoding):
    decompressing.clear()
    with httpx.Client(timeout=20) as client:
        reply = client.post(
            decompressing.url + "/v1/chat/completions",
            content=b"\x00\x01binary",
            headers={**JSON, "content-encoding": encoding},
        )
    assert reply.status_code == 415, reply.text
    assert "content-encoding" in error_of(reply)["message"]
    assert decompressing.received() == []


def test_gzip_refused_without_the_decompressor(gateway):
    data = gzip.compress(json.dumps(chat({"prompt_token_ids": [1]})).encode())
    with httpx.Client(timeout=20) as client:
        reply = client.post(
            gateway.url + "/v1/chat/completions",
            content=data,
            headers={**JSON, "content-encoding": "gzip"},
        )
    assert reply.status_code == 415
    assert "content-encoding" in error_of(reply)["message"]
    assert gateway.received() == []


def test_expect_100_continue(gateway):
    sent = chat({"prompt_token_ids": [4, 5], "k": 1})
    body = json.dumps(sent).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nexpect: 100-continue\r\n\r\n"
    ).encode()
    with socket.create_connection((gateway.gateway.host, gateway.gateway.port), timeout=10) as s:
        s.sendall(head)
        interim = read_past_head(s)
        assert interim.startswith(b"HTTP/1.1 100 Continue"), interim
        s.sendall(body)
        final = interim.partition(b"\r\n\r\n")[2] or read_past_head(s)
        assert final.startswith(b"HTTP/1.1 200"), final
    (received,) = gateway.received()
    assert_framing(received)
    assert_stripped(json.loads(received.body), sent)


def _request(path: str, body: bytes, extra: str = "") -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


def _whole_response(sock: socket.socket) -> bytes:
    """One response, headers and content-length body; b"" if the connection ended."""
    data = read_past_head(sock)
    head, _, rest = data.partition(b"\r\n\r\n")
    lengths = [
        line.split(b":", 1)[1]
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    ]
    size = int(lengths[0]) if lengths else 0
    while len(rest) < size:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return data and head + b"\r\n\r\n" + rest


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_denial_keeps_the_http1_connection(gateway):
    """A denial is a local 400 of Envoy, which closes an HTTP/1.1 connection unless the
    shipped keep_alive_after_denial is set: the client goes on on the same connection."""
    denied = json.dumps(chat({"prompt_token_ids": [1, 2]})).encode()
    allowed = json.dumps(chat()).encode()
    with socket.create_connection((gateway.gateway.host, gateway.gateway.port), timeout=10) as s:
        s.sendall(_request("/deny/v1/chat/completions", denied))
        first = _whole_response(s)
        assert first.startswith(b"HTTP/1.1 400"), first
        assert b"not accepted on this route" in first
        assert b"connection: close" not in first.lower()
        s.sendall(_request("/v1/chat/completions", allowed))
        second = _whole_response(s)
        assert second.startswith(b"HTTP/1.1 200"), second
    (received,) = gateway.received()
    assert json.loads(received.body) == json.loads(allowed)


@pytest.mark.parametrize(
    "framing",
    [
        "content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        "content-length: 2\r\ncontent-length: 3\r\n\r\n{}",
        "transfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        "bad header: x\r\ncontent-length: 2\r\n\r\n{}",
    ],
    ids=["length-and-chunked", "two-lengths", "bad-chunk-size", "bad-header-name"],
)
def test_a_framing_error_closes_the_http1_connection(gateway, framing):
    """Only whole, well-framed requests keep their connection after a 400: a request
    whose end cannot be known for sure ends it."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    with socket.create_connection((gateway.gateway.host, gateway.gateway.port), timeout=10) as s:
        s.sendall(head + framing.encode())
        reply = _whole_response(s)
        assert reply.startswith(b"HTTP/1.1 400"), reply
        assert b"connection: close" in reply.lower()
        assert _closed(s)
    assert gateway.received() == []
