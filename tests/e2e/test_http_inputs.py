"""HTTP-level inputs: compression and expect: 100-continue."""

from __future__ import annotations

import gzip
import json
import socket

import httpx
import pytest

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


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_expect_100_continue(gateway):
    sent = chat({"prompt_token_ids": [4, 5], "k": 1})
    body = json.dumps(sent).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nexpect: 100-continue\r\n\r\n"
    ).encode()
    with socket.create_connection((gateway.gateway.host, gateway.gateway.port), timeout=10) as s:
        s.sendall(head)
        interim = _read_response(s)
        assert interim.startswith(b"HTTP/1.1 100 Continue"), interim
        s.sendall(body)
        final = interim.partition(b"\r\n\r\n")[2] or _read_response(s)
        assert final.startswith(b"HTTP/1.1 200"), final
    (received,) = gateway.received()
    assert_framing(received)
    assert_stripped(json.loads(received.body), sent)
