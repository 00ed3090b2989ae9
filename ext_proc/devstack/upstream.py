"""A stand-in for vLLM that records exactly what reached it.

It answers every request in the OpenAI response shape (chat, completions, responses,
messages), with the request it received shown as the reply text and under
``stub_received``. It keeps every request, including the raw bytes read from the
socket for it, and serves them as JSON at ``GET /__stub__/requests`` (``DELETE`` clears
them), so tests can assert on the exact bytes Envoy forwarded.
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

ADMIN_PATH = b"/__stub__/requests"


@dataclass
class Recorded:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    raw: bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "target": self.target,
            "headers": self.headers,
            "body_b64": base64.b64encode(self.body).decode(),
            "raw_b64": base64.b64encode(self.raw).decode(),
        }


@dataclass
class Recorder:
    requests: list[Recorded] = field(default_factory=list)


def _reply_text(record: Recorded) -> str:
    try:
        shown: Any = json.loads(record.body) if record.body else None
    except ValueError:
        shown = record.body.decode("utf-8", "replace")
    return json.dumps({"path": record.target, "body": shown})


def openai_response(record: Recorded) -> dict[str, Any]:
    text = _reply_text(record)
    received = {
        "method": record.method,
        "path": record.target,
        "headers": record.headers,
        "body": record.body.decode("utf-8", "replace"),
    }
    path = record.target.split("?", 1)[0]
    created = int(time.time())
    usage = {"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1}
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
                }
            ],
        }
    elif path.endswith("/completions"):
        payload = {
            "id": "cmpl-stub",
            "object": "text_completion",
            "created": created,
            "model": "stub",
            "usage": usage,
            "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
        }
    elif path.endswith("/responses"):
        payload = {
            "id": "resp-stub",
            "object": "response",
            "created_at": created,
            "model": "stub",
            "status": "completed",
            "usage": {"input_tokens": 0, "output_tokens": 1, "total_tokens": 1},
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                }
            ],
        }
    elif path.endswith("/messages"):
        payload = {
            "id": "msg-stub",
            "type": "message",
            "role": "assistant",
            "model": "stub",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 0, "output_tokens": 1},
        }
    else:
        payload = {"object": "stub"}
    payload["stub_received"] = received
    return payload


async def _send(
    writer: asyncio.StreamWriter, conn: h11.Connection, status: int, payload: Any
) -> None:
    data = json.dumps(payload).encode()
    headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
    writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
    writer.write(conn.send(h11.Data(data=data)))
    writer.write(conn.send(h11.EndOfMessage()))
    await writer.drain()


async def _handle(
    recorder: Recorder, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    conn = h11.Connection(h11.SERVER)
    raw = bytearray()
    request: h11.Request | None = None
    body = bytearray()
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                raw += data
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                request, body = event, bytearray()
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage) and request is not None:
                await _answer(recorder, writer, conn, request, body=bytes(body), raw=bytes(raw))
                raw.clear()
                if conn.our_state is h11.MUST_CLOSE:
                    break
                conn.start_next_cycle()
            elif isinstance(event, h11.ConnectionClosed):
                break
    except (h11.RemoteProtocolError, ConnectionError) as exc:
        print(f"stub upstream: connection error: {exc}", file=sys.stderr, flush=True)
    finally:
        writer.close()


async def _answer(
    recorder: Recorder,
    writer: asyncio.StreamWriter,
    conn: h11.Connection,
    request: h11.Request,
    *,
    body: bytes,
    raw: bytes,
) -> None:
    target = request.target.decode("latin-1")
    if request.target.split(b"?", 1)[0] == ADMIN_PATH:
        if request.method == b"DELETE":
            recorder.requests.clear()
        await _send(writer, conn, 200, [r.to_json() for r in recorder.requests])
        return
    record = Recorded(
        method=request.method.decode("latin-1"),
        target=target,
        headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers],
        body=body,
        raw=raw,
    )
    recorder.requests.append(record)
    print(
        f"stub upstream: {record.method} {target} {len(body)} bytes: "
        f"{body[:2000].decode('utf-8', 'replace')}",
        flush=True,
    )
    await _send(writer, conn, 200, openai_response(record))


async def serve_forever(host: str, port: int) -> None:
    recorder = Recorder()
    server = await asyncio.start_server(lambda r, w: _handle(recorder, r, w), host, port)
    print(f"stub upstream: listening on {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()
