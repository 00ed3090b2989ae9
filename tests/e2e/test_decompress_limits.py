"""End to end through envoy/envoy-decompress.yaml: Envoy's gzip decompressor runs before
ext_proc, and the route's buffer limit bounds the decompressed body (413), however far
the body inflates. Envoy's gzip decompressor truncates a read that inflates more than
its max_inflate_ratio and passes the rest on; the generated configuration sets deflate's
largest expansion (1032), so no body is truncated into one the processor refuses as
not JSON (400)."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.stack import BODY_LIMIT, Stack
from tests.e2e.test_gateway import PD_KEYS, assert_stripped, chat, error_of, only_request

MiB = 1 << 20
GZIP_JSON = {"content-type": "application/json", "content-encoding": "gzip"}
PREFIX, SUFFIX = b'{"x":"', b'"}'


def gzip_of_run(size: int) -> bytes:
    """gzip of the JSON document ``{"x":"aaa...a"}`` of ``size`` bytes, compressed in
    pieces (a run of one byte inflates about 1000 times: the largest bodies here are a
    few hundred KiB on the wire)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip member
    out = [compressor.compress(PREFIX)]
    left = size - len(PREFIX) - len(SUFFIX)
    piece = b"a" * MiB
    while left > 0:
        out.append(compressor.compress(piece[: min(left, MiB)]))
        left -= MiB
    out += [compressor.compress(SUFFIX), compressor.flush()]
    return b"".join(out)


def run_document(size: int) -> bytes:
    return PREFIX + b"a" * (size - len(PREFIX) - len(SUFFIX)) + SUFFIX


@pytest.fixture
def gateway(decompressing: Stack) -> Stack:
    decompressing.clear()
    return decompressing


@pytest.fixture(params=[False, True], ids=["http1", "http2"])
def client(request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    with httpx.Client(http1=not request.param, http2=request.param, timeout=60) as c:
        yield c


@pytest.mark.parametrize(
    "size", [BODY_LIMIT + 1, 17 * MiB, 256 * MiB], ids=["limit+1", "17MiB", "256MiB"]
)
def test_gzip_body_inflating_past_the_limit_gets_413(gateway, size):
    body = gzip_of_run(size)
    assert size > 100 * len(body)  # past the decompressor's default max_inflate_ratio
    with httpx.Client(timeout=60) as c:
        try:
            reply = c.post(gateway.url + "/v1/chat/completions", content=body, headers=GZIP_JSON)
        except httpx.RemoteProtocolError:
            pytest.fail("the gateway closed the connection instead of answering 413")
    assert reply.status_code == 413, reply.text
    assert error_of(reply)["type"] == "PayloadTooLargeError"
    assert gateway.received() == []


def test_gzip_body_inflating_past_the_limit_gets_413_over_http2(gateway):
    body = gzip_of_run(17 * MiB)  # whole within the stream's flow control window
    with httpx.Client(http1=False, http2=True, timeout=60) as c:
        reply = c.post(gateway.url + "/v1/chat/completions", content=body, headers=GZIP_JSON)
    assert reply.status_code == 413, reply.text
    assert error_of(reply)["type"] == "PayloadTooLargeError"
    assert gateway.received() == []


def test_gzip_body_just_under_the_limit_reaches_the_upstream_whole(gateway, client):
    # Inflating about 1000 times: past the decompressor's default max_inflate_ratio
    # (100), which would truncate it into a body that is not JSON (400).
    size = BODY_LIMIT - 1024
    body = gzip_of_run(size)
    assert size > 1000 * len(body)
    reply = client.post(gateway.url + "/v1/chat/completions", content=body, headers=GZIP_JSON)
    assert reply.status_code == 200, reply.text
    (received,) = gateway.received()
    assert received.body == run_document(size)
    assert received.header("content-encoding") == []


def test_normal_gzip_body_is_decompressed_and_policed(gateway, client):
    sent = chat({"prompt_token_ids": [1, 2, 3], **PD_KEYS})
    body = zlib.compress(json.dumps(sent).encode(), 6, wbits=31)
    reply = client.post(gateway.url + "/v1/chat/completions", content=body, headers=GZIP_JSON)
    assert reply.status_code == 200, reply.text
    received = only_request(gateway)
    assert received.header("content-encoding") == []
    # The upstream gets the decompressed JSON, the client's parameters removed.
    assert_stripped(json.loads(received.body), sent)
