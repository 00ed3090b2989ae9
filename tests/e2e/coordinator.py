"""llm-d's coordinator, as its sources describe it (llm-d-router ``pkg/coordinator``,
connector ``kv-nixl``, OpenAI-format legs), for tests of the gateway in front of it.

A client's chat or completion request arrives here. The coordinator sends the prefill
leg back through the gateway (same path, ``EPP-Profile: prefill``): the client's body
with the connector's prefill request as ``kv_transfer_params``, one output token, not
streamed. It then sends the decode leg (``EPP-Profile: decode``): the client's body with
the prefill response's ``kv_transfer_params``, ``do_remote_decode`` set false and
``do_remote_prefill`` true, and returns the decode response. Both legs carry the
coordinator's tokenization of the prompt as a top-level ``tokens`` member
(``{token_ids, features}``: pkg/coordinator/steps/prefill.go, decode.go), which its
docs say the endpoint picker consumes. Inbound ``EPP-Profile`` headers are not
forwarded. Every request it received is kept, as it arrived.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from ext_proc.core.address import HostPort

# kv-nixl's prefill request (nixl.go) is the same as every P/D proxy's.
from tests.e2e.test_handoff import PREFILL_REQUEST_PARAMS

PROFILE = "EPP-Profile"
# The coordinator's tokenization of a prompt, written into each leg (ids as its
# tokenizer would give them; nothing downstream reads them as the prompt).
TOKENS: dict[str, Any] = {"token_ids": [128000, 9906, 13], "features": None}


def prefill_body(document: dict[str, Any]) -> dict[str, Any]:
    """capSingleTokenOutput, then the prefill request."""
    body = dict(document)
    body["max_tokens"] = 1
    body.pop("min_tokens", None)
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    body["stream"] = False
    body.pop("stream_options", None)
    body["kv_transfer_params"] = dict(PREFILL_REQUEST_PARAMS)
    body["tokens"] = TOKENS
    return body


def decode_body(document: dict[str, Any], prefilled: dict[str, Any]) -> dict[str, Any]:
    """The client's body with the prefill response's parameters, as kv-nixl copies them."""
    params = dict(prefilled.get("kv_transfer_params") or {})
    params["do_remote_decode"] = False
    params["do_remote_prefill"] = True
    return {**document, "kv_transfer_params": params, "tokens": TOKENS}


class Coordinator:
    """Listens on 127.0.0.1 (``address``; ``port``, or any free one); sends both legs to
    ``gateway``."""

    def __init__(self, gateway: HostPort, edit: Any = None, port: int = 0) -> None:
        self.gateway = gateway
        self.port = port
        # Applied to each decode body before it is sent: a coordinator that tampers.
        self.edit = edit
        self.received: list[dict[str, Any]] = []
        self.address: HostPort | None = None

    def handle(self, path: str, document: dict[str, Any]) -> tuple[int, bytes]:
        self.received.append(document)
        url = f"http://{self.gateway}{path}"
        with httpx.Client(timeout=30) as client:
            prefill = client.post(url, json=prefill_body(document), headers={PROFILE: "prefill"})
            if prefill.status_code != 200:
                return prefill.status_code, prefill.content
            decode = decode_body(document, prefill.json())
            if self.edit is not None:
                self.edit(decode)
            reply = client.post(url, json=decode, headers={PROFILE: "decode"})
        return reply.status_code, reply.content

    @contextlib.contextmanager
    def running(self) -> Iterator[Coordinator]:
        coordinator = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                document = json.loads(self.rfile.read(length))
                status, body = coordinator.handle(self.path, document)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.address = HostPort("127.0.0.1", server.server_address[1])
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join(10)
