"""A stand-in for vLLM that records exactly what reached it.

It answers every request in the OpenAI response shape (chat, completions, responses,
messages), with the request it received shown as the reply text and under
``stub_received``, and the token ids and transfer parameters vLLM adds (see
``devstack.tokens``). It speaks HTTP/1.1 and HTTP/2 with prior knowledge (h2c). It keeps
every request, including the raw bytes read from the socket for it (HTTP/1.1) or its
DATA payload as framed (HTTP/2), and serves them as JSON at ``GET /__stub__/requests``
(``DELETE`` clears them), so tests can assert on the exact bytes Envoy forwarded.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import h11

from devstack import tokens
from ext_proc.core.address import HostPort

ADMIN_PATH = "/__stub__/requests"
# A request with this header is answered as by a decode server whose NIXL connector runs
# with bidirectional_kv_xfer (devstack.tokens.TURN_REPLY).
BIDIRECTIONAL_HEADER = "x-stub-bidirectional"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclass
class Recorded:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    raw: bytes
    protocol: str = "HTTP/1.1"

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "target": self.target,
            "headers": self.headers,
            "body_b64": base64.b64encode(self.body).decode(),
            "raw_b64": base64.b64encode(self.raw).decode(),
            "protocol": self.protocol,
        }


@dataclass
class Recorder:
    requests: list[Recorded] = field(default_factory=list)
    # Requests whose connection ended before their body did (never recorded, never
    # answered): what a gateway that stops mid-request leaves an upstream with.
    incomplete: int = 0


def _reply_text(record: Recorded) -> str:
    try:
        shown: Any = json.loads(record.body) if record.body else None
    except ValueError:
        shown = record.body.decode("utf-8", "replace")
    return json.dumps({"path": record.target, "body": shown})


def _document(record: Recorded) -> dict[str, Any]:
    """The request body as vLLM would read it, or an empty one if it is not an object."""
    try:
        document = json.loads(record.body) if record.body else None
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def openai_response(record: Recorded) -> dict[str, Any]:
    """The reply vLLM 0.32 would give, its fields placed as vLLM places them.

    Chat: ``prompt_token_ids`` at the top level and ``token_ids`` per choice, both only
    when the request asked ``return_token_ids: true`` (``null`` otherwise), and
    ``kv_transfer_params`` at the top level (``null`` unless a KV connector answered).
    Completions carry the ids per choice; responses only ``kv_transfer_params``.
    """
    text = _reply_text(record)
    received = {
        "method": record.method,
        "path": record.target,
        "headers": record.headers,
        "body": record.body.decode("utf-8", "replace"),
    }
    path = record.target.split("?", 1)[0]
    document = _document(record)
    ids = tokens.prompt_ids(path, document)
    asked = document.get("return_token_ids") is True
    shown_ids = ids if asked else None
    generated = list(tokens.GENERATED) if asked else None
    bidirectional = any(name.lower() == BIDIRECTIONAL_HEADER for name, _ in record.headers)
    computed = len(ids) + len(tokens.GENERATED) - 1
    params = tokens.transfer_params(document, computed, bidirectional=bidirectional)
    created = int(time.time())
    usage = {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}
    if path.endswith("/chat/completions"):
        payload: dict[str, Any] = {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": created,
            "model": "stub",
            "usage": usage,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": text},
                    "token_ids": generated,
                }
            ],
            "prompt_token_ids": shown_ids,
            "kv_transfer_params": params,
        }
    elif path.endswith("/completions"):
        payload = {
            "id": "cmpl-stub",
            "object": "text_completion",
            "created": created,
            "model": "stub",
            "usage": usage,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "finish_reason": "stop",
                    "prompt_token_ids": shown_ids,
                    "token_ids": generated,
                }
            ],
            "kv_transfer_params": params,
        }
    elif path.endswith("/responses"):
        payload = {
            "id": "resp-stub",
            "object": "response",
            "created_at": created,
            "model": "stub",
            "status": "completed",
            "usage": {"input_tokens": len(ids), "output_tokens": 1, "total_tokens": len(ids) + 1},
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                }
            ],
            "kv_transfer_params": params,
        }
    elif path.endswith("/messages"):
        payload = {
            "id": "msg-stub",
            "type": "message",
            "role": "assistant",
            "model": "stub",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": len(ids), "output_tokens": 1},
        }
    else:
        payload = {"object": "stub"}
    payload["stub_received"] = received
    return payload


def _respond(recorder: Recorder, record: Recorded) -> tuple[int, Any]:
    """Record a request (or serve the admin path) and build the reply."""
    if record.target.split("?", 1)[0] == ADMIN_PATH:
        if record.method == "DELETE":
            recorder.requests.clear()
            recorder.incomplete = 0
        if record.target.endswith("?count"):  # without the bodies: cheap for many
            return 200, {"count": len(recorder.requests), "incomplete": recorder.incomplete}
        return 200, [r.to_json() for r in recorder.requests]
    recorder.requests.append(record)
    shown = record.body[:2000].decode("utf-8", "replace")
    print(
        f"stub upstream: {record.method} {record.target} {len(record.body)} bytes: {shown}",
        flush=True,
    )
    return 200, openai_response(record)


# A request header that makes the stand-in answer that many seconds late (at most a
# minute): an upstream response slower than the processor's timeouts.
DELAY_HEADER = "x-stub-delay-seconds"


def _delay(record: Recorded) -> float:
    values = [v for k, v in record.headers if k.lower() == DELAY_HEADER]
    try:
        return min(60.0, max(0.0, float(values[0]))) if values else 0.0
    except ValueError:
        return 0.0


# Request headers that make the stand-in fail the first copy of a request (one whose
# method, target and body it has not recorded before) and answer any later copy as
# usual: an upstream that fails once, for a gateway's retries to act on. The first
# names the first copy's status, the second a grpc-status header to answer it with.
FIRST_STATUS_HEADER = "x-stub-first-status"
FIRST_GRPC_STATUS_HEADER = "x-stub-first-grpc-status"


def _first_copy(recorder: Recorder, record: Recorded) -> tuple[int | None, list[tuple[str, str]]]:
    """The status (None: the usual one) and the further headers of the reply to
    ``record``, before it is recorded."""
    asked = {k.lower(): v.strip() for k, v in record.headers}
    status = asked.get(FIRST_STATUS_HEADER, "")
    grpc = asked.get(FIRST_GRPC_STATUS_HEADER, "")
    key = (record.method, record.target, record.body)
    if not (status or grpc) or any((r.method, r.target, r.body) == key for r in recorder.requests):
        return None, []
    code = int(status) if status.isdigit() and 200 <= int(status) <= 599 else None
    return code, [("grpc-status", grpc)] if grpc.isdigit() else []


async def _serve_http1(
    recorder: Recorder, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes
) -> None:
    started = [False]  # a request whose end has not arrived yet
    try:
        await _serve_http1_requests(recorder, reader, writer, raw, started)
    finally:
        recorder.incomplete += started[0]


async def _serve_http1_requests(
    recorder: Recorder,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    raw: bytes,
    started: list[bool],
) -> None:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    pending = bytearray(raw)
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            pending += data
            conn.receive_data(data)
        elif isinstance(event, h11.Request):
            request, body = event, bytearray()
            started[0] = True
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage) and request is not None:
            started[0] = False
            record = Recorded(
                method=request.method.decode("latin-1"),
                target=request.target.decode("latin-1"),
                headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers],
                body=bytes(body),
                raw=bytes(pending),
            )
            pending.clear()
            first, extra = _first_copy(recorder, record)
            status, payload = _respond(recorder, record)
            await asyncio.sleep(_delay(record))
            data = json.dumps(payload).encode()
            headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
            status, headers = first or status, headers + extra
            writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
            writer.write(conn.send(h11.Data(data=data)))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
            if conn.our_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
        elif isinstance(event, h11.ConnectionClosed):
            return


async def _serve_http2(
    recorder: Recorder, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes
) -> None:
    """HTTP/2 with prior knowledge. ``raw`` of a request is its DATA payload as framed:
    the concatenated DATA frame contents, to compare with the declared content-length."""
    streams: dict[int, tuple[list[tuple[str, str]], bytearray]] = {}
    try:
        await _serve_http2_streams(recorder, reader, writer, raw, streams)
    finally:
        recorder.incomplete += len(streams)


async def _serve_http2_streams(
    recorder: Recorder,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    raw: bytes,
    streams: dict[int, tuple[list[tuple[str, str]], bytearray]],
) -> None:
    import h2.config  # noqa: PLC0415 - only this path needs h2
    import h2.connection  # noqa: PLC0415
    import h2.events  # noqa: PLC0415

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    data = raw
    while data:
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                headers = [(k.decode(), v.decode()) for k, v in event.headers]
                streams[event.stream_id] = (headers, bytearray())
            elif isinstance(event, h2.events.DataReceived):
                streams[event.stream_id][1].extend(event.data)
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                headers, body = streams.pop(event.stream_id)
                pseudo = dict(h for h in headers if h[0].startswith(":"))
                record = Recorded(
                    method=pseudo[":method"],
                    target=pseudo[":path"],
                    headers=[h for h in headers if not h[0].startswith(":")],
                    body=bytes(body),
                    raw=bytes(body),
                    protocol="HTTP/2",
                )
                first, extra = _first_copy(recorder, record)
                status, payload = _respond(recorder, record)
                reply = json.dumps(payload).encode()
                conn.send_headers(
                    event.stream_id,
                    [
                        (":status", str(first or status)),
                        ("content-type", "application/json"),
                        ("content-length", str(len(reply))),
                        *extra,
                    ],
                )
                size = conn.max_outbound_frame_size
                for start in range(0, len(reply), size):
                    conn.send_data(event.stream_id, reply[start : start + size])
                conn.end_stream(event.stream_id)
        writer.write(conn.data_to_send())
        await writer.drain()
        data = await reader.read(65536)


async def _handle(
    recorder: Recorder, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        first = await reader.read(65536)
        while first and len(first) < len(H2_PREFACE) and H2_PREFACE.startswith(first):
            first += await reader.read(65536)
        if first.startswith(H2_PREFACE):
            await _serve_http2(recorder, reader, writer, first)
        elif first:
            await _serve_http1(recorder, reader, writer, first)
    except (h11.RemoteProtocolError, ConnectionError) as exc:
        print(f"stub upstream: connection error: {exc}", file=sys.stderr, flush=True)
    finally:
        writer.close()


async def serve_forever(address: HostPort) -> None:
    recorder = Recorder()
    server = await asyncio.start_server(
        lambda r, w: _handle(recorder, r, w), address.host, address.port
    )
    print(f"stub upstream: listening on {address} (HTTP/1.1 and h2c)", flush=True)
    async with server:
        await server.serve_forever()
