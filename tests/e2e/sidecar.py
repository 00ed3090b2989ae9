"""llm-d's P/D routing sidecar, emulated: what it sends to a prefill pod and to its own
decoder, from llm-d/llm-d-router pkg/sidecar/proxy (HEAD ebab6879; --kv-connector=nixlv2,
no TLS, no data parallelism, no chunked decode, no MoRI-IO, no P2P pull, no encoder).

- ``POST`` /v1/chat/completions, /v1/completions, /v1/messages, /v1/responses and
  /inference/v1/generate: the header ``x-prefiller-host-port`` is read and deleted (one
  value is split at commas; the first, trimmed, is taken). Without one the request goes
  to the decoder unchanged (decoder only). With one, the NIXL v2 protocol
  (connector_nixlv2.go ``handleNIXLV2``):

  prefill leg, to ``http://<host:port>`` + the same path: the body's
  ``kv_transfer_params`` replaced by the connector request below, ``stream: false``,
  ``stream_options`` deleted, the API's token limits set to 1; header ``x-request-id``
  added (a UUID). A response that is not 2xx goes back to the client as it came.

  decode leg, to the decoder + the same path: the client's body with its ``stream``,
  ``stream_options`` and token limits as they were, and ``kv_transfer_params`` set to the
  prefill response's ``kv_transfer_params`` verbatim (``null`` when it had none); the
  same ``x-request-id`` added.
- ``GET /health``: answered here (200).
- Anything else: to the decoder unchanged.

Bodies are re-encoded as Go's ``json.Marshal`` encodes a ``map[string]any`` decoded by
``json.Unmarshal``: keys sorted, numbers as float64, ``<``, ``>``, ``&``, U+2028 and
U+2029 escaped. Both hops are ``httputil.ReverseProxy``: hop-by-hop headers dropped,
``X-Forwarded-For`` extended, ``Accept-Encoding: gzip`` added when the request has none
(Go's transport then decodes a gzip response itself). Not emulated: the decode response's
``usage`` rewrite (cached tokens of the prefill), which changes nothing that reaches a
model server.
"""

from __future__ import annotations

import json
import math
import threading
import uuid
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from ext_proc.core.address import HostPort
from tests.e2e.test_handoff import PREFILL_REQUEST_PARAMS

PREFILL_HEADER = "x-prefiller-host-port"
REQUEST_ID = "x-request-id"
CHAT = ("/v1/chat/completions", "/v1/completions", "/v1/messages")
RESPONSES = "/v1/responses"
GENERATE = "/inference/v1/generate"
DISAGGREGATED = (*CHAT, RESPONSES, GENERATE)
# The prefill leg's kv_transfer_params (READ mode: the decode side pulls the blocks), the
# same as every P/D proxy's.
CONNECTOR_REQUEST: dict[str, Any] = PREFILL_REQUEST_PARAMS
TOKEN_LIMITS = {
    "chat": ("max_tokens", "max_completion_tokens", "min_tokens"),
    "responses": ("max_output_tokens",),
    "generate": ("max_tokens", "min_tokens"),
}
# A field the request did not carry (Go: the map lookup's ok is false).
_ABSENT: Any = object()
# RFC 7230 hop-by-hop headers, which httputil.ReverseProxy removes in both directions.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def _go_float(value: float) -> str:
    """encoding/json's float64: shortest digits, positional between 1e-6 and 1e21."""
    if not math.isfinite(value):
        raise ValueError("json: unsupported value")  # Go refuses it too
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    if 1e-6 <= abs(value) < 1e21:
        text = format(Decimal(repr(value)), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa, exponent = repr(value).split("e")
    return f"{mantissa}e{exponent[0]}{exponent[1:].lstrip('0') or '0'}"


def _go_string(text: str) -> str:
    out = json.dumps(text, ensure_ascii=False)
    for char, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        out = out.replace(char, escaped)
    return out


def _go_json(value: Any) -> Iterator[str]:
    if value is None:
        yield "null"
    elif value is True:
        yield "true"
    elif value is False:
        yield "false"
    elif isinstance(value, int | float):
        yield _go_float(float(value))  # Unmarshal into any holds every number as float64
    elif isinstance(value, str):
        yield _go_string(value)
    elif isinstance(value, list):
        yield "["
        for index, item in enumerate(value):
            if index:
                yield ","
            yield from _go_json(item)
        yield "]"
    else:
        yield "{"
        for index, key in enumerate(sorted(value)):
            if index:
                yield ","
            yield _go_string(key)
            yield ":"
            yield from _go_json(value[key])
        yield "}"


def go_marshal(value: Any) -> bytes:
    """``json.Marshal`` of what ``json.Unmarshal`` into ``any`` made of the document."""
    return "".join(_go_json(value)).encode()


def _api(path: str) -> str:
    if path == RESPONSES:
        return "responses"
    return "generate" if path == GENERATE else "chat"


class RoutingSidecar:
    """The sidecar listening on ``listen``, its decoder at ``decoder`` (the sidecar's
    ``http://localhost:<--model-server-port>``)."""

    def __init__(self, listen: HostPort, decoder: str) -> None:
        self.listen = listen
        self.decoder = decoder.rstrip("/")
        # Edits the decode leg's kv_transfer_params before it is sent: a compromised
        # sidecar, for the tests that show what the decode pod's Envoy does with it.
        self.tamper: Any = None
        self._client = httpx.Client(timeout=30)
        handler = type("Handler", (_Handler,), {"sidecar": self})
        self._server = ThreadingHTTPServer((listen.host, listen.port), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.listen}"

    def __enter__(self) -> RoutingSidecar:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def forward(
        self, method: str, url: str, headers: list[tuple[str, str]], body: bytes, peer: str
    ) -> httpx.Response:
        """One hop of httputil.ReverseProxy (and Go's http.Transport)."""
        out = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]
        out = [(k, v) for k, v in out if k.lower() not in ("content-length", "host")]
        forwarded = [v for k, v in out if k.lower() == "x-forwarded-for"]
        out = [(k, v) for k, v in out if k.lower() != "x-forwarded-for"]
        out.append(("X-Forwarded-For", ", ".join([*forwarded, peer])))
        if not any(k.lower() == "accept-encoding" for k, _ in out):
            out.append(("Accept-Encoding", "gzip"))
        host = [v for k, v in headers if k.lower() == "host"]
        if host:
            out.append(("Host", host[0]))  # the Director keeps the incoming Host
        return self._client.request(method, url, headers=out, content=body)


class _Handler(BaseHTTPRequestHandler):
    sidecar: RoutingSidecar
    protocol_version = "HTTP/1.1"

    def log_message(self, *_: object) -> None:
        pass

    def _body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _reply(self, reply: httpx.Response) -> None:
        self.send_response(reply.status_code)
        for key, value in reply.headers.multi_items():
            if key.lower() not in (*HOP_BY_HOP, "content-length", "content-encoding"):
                self.send_header(key, value)
        self.send_header("content-length", str(len(reply.content)))
        self.end_headers()
        self.wfile.write(reply.content)

    def _error(self, status: int, message: str) -> None:
        data = message.encode()
        self.send_response(status)
        self.send_header("content-type", "text/plain; charset=utf-8")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _to_decoder(self, headers: list[tuple[str, str]], body: bytes) -> None:
        url = self.sidecar.decoder + self.path
        peer = self.client_address[0]
        self._reply(self.sidecar.forward(self.command, url, headers, body, peer))

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == "/health":
            self._error(200, "")
            return
        self._to_decoder(list(self.headers.items()), self._body())

    def do_POST(self) -> None:
        headers = list(self.headers.items())
        body = self._body()
        path = self.path.split("?", 1)[0]
        if path not in DISAGGREGATED:
            self._to_decoder(headers, body)
            return
        values = [v for k, v in headers if k.lower() == PREFILL_HEADER]
        headers = [(k, v) for k, v in headers if k.lower() != PREFILL_HEADER]
        if len(values) == 1:
            values = values[0].split(",")
        prefill = values[0].strip() if values else ""
        if not prefill:
            self._to_decoder(headers, body)
            return
        self._nixl_v2(headers, body, prefill.removeprefix("http://"), _api(path))

    def _nixl_v2(self, headers: list[tuple[str, str]], body: bytes, prefill: str, api: str) -> None:
        try:
            request = json.loads(body)
        except ValueError as exc:
            self._error(400, str(exc))
            return
        if not isinstance(request, dict):
            self._error(400, "json: cannot unmarshal into map[string]any")
            return
        rid = str(uuid.uuid1())
        peer = self.client_address[0]
        stream = request.get("stream", _ABSENT)
        stream_options = request.get("stream_options", _ABSENT)
        created = api == "generate" and not isinstance(request.get("sampling_params"), dict)
        if api == "generate" and created:
            request["sampling_params"] = {}
        limits = request["sampling_params"] if api == "generate" else request
        saved = {field: limits.get(field, _ABSENT) for field in TOKEN_LIMITS[api]}

        request["kv_transfer_params"] = dict(CONNECTOR_REQUEST)
        request["stream"] = False
        request.pop("stream_options", None)
        for field in TOKEN_LIMITS[api]:
            limits[field] = 1
        prefill_headers = [*headers, (REQUEST_ID, rid)]
        reply = self.sidecar.forward(
            "POST", f"http://{prefill}{self.path}", prefill_headers, go_marshal(request), peer
        )
        if not 200 <= reply.status_code < 300:
            self._reply(reply)
            return
        try:
            answer = json.loads(reply.content)
        except ValueError as exc:
            self._error(400, str(exc))
            return
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None

        request.pop("stream", None)
        if stream is not _ABSENT:
            request["stream"] = stream
        if stream_options is not _ABSENT:
            request["stream_options"] = stream_options
        for field, value in saved.items():
            limits.pop(field, None)
            if value is not _ABSENT:
                limits[field] = value
        if created and not limits:
            del request["sampling_params"]
        if self.sidecar.tamper is not None:
            params = self.sidecar.tamper(params)
        request["kv_transfer_params"] = params
        decode_headers = [*headers, (REQUEST_ID, rid)]
        url = self.sidecar.decoder + self.path
        self._reply(self.sidecar.forward("POST", url, decode_headers, go_marshal(request), peer))
