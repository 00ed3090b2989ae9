"""End to end: real Envoy binary → real processor process → recording stub upstream."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack import envoy_config, processes
from tests.e2e import certs
from tests.e2e.conftest import BODY_MODES
from tests.e2e.stack import Received, Stack

REPO = Path(__file__).resolve().parents[2]
JSON = {"content-type": "application/json"}
KV = "kv_transfer_params"
POLICED = ("prompt_token_ids", "prompt_features")
# Test routes (tests/e2e/stack.py): /trusted/v1/ validates and honors any caller's ids
# (trust_any_caller), /keep/v1/ strips only the policed keys (keep_other_keys). The
# shipped /v1/ removes a client's whole kv_transfer_params, and the shipped /pd/v1/
# honors only proven ones (docs/trust.md).
TRUSTED = "/trusted/v1/"
KEEP = "/keep/v1/"
# Both ways a strip route removes a client's parameters: the whole object (the
# default) and only the policed keys, the others kept in place (keep_other_keys).
STRIP_ROUTES = pytest.mark.parametrize("prefix", ["/v1/", KEEP], ids=["whole", "keep"])
PD_KEYS = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[1, 2, 3]],
    "remote_engine_id": "engine-0",
    "remote_host": "10.0.0.7",
    "remote_port": 5600,
    "tp_size": 1,
}


def chat(params: dict | None = None, **extra) -> dict:
    document = {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "Be careful. Ünïcödé ✓"},
            {"role": "user", "content": "hello"},
        ],
        "temperature": 0.25,
        "max_tokens": 7,
        **extra,
    }
    if params is not None:
        document["kv_transfer_params"] = params
    return document


def dechunk(data: bytes) -> bytes:
    """Decode an HTTP/1.1 chunked body, requiring it to end exactly at the last chunk."""
    out = bytearray()
    while True:
        size_line, sep, data = data.partition(b"\r\n")
        assert sep, "truncated chunk size"
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            assert data == b"\r\n", f"bytes after the last chunk: {data[:40]!r}"
            return bytes(out)
        assert data[size : size + 2] == b"\r\n", "chunk not terminated"
        out += data[:size]
        data = data[size + 2 :]


def assert_framing(received: Received) -> None:
    """The upstream read one well-framed request whose framing matches the body exactly:
    either a content-length equal to the body, or chunked encoding and no content-length."""
    assert received.protocol == "HTTP/1.1"
    _head, sep, rest = received.raw.partition(b"\r\n\r\n")
    assert sep, "no end of headers on the wire"
    if received.header("transfer-encoding") == ["chunked"]:
        assert received.header("content-length") == []
        assert dechunk(rest) == received.body
        return
    assert received.header("transfer-encoding") == []
    assert rest == received.body, "bytes on the wire after the headers differ from the body"
    assert received.header("content-length") == [str(len(received.body))]


def only_request(stack: Stack) -> Received:
    (received,) = stack.received()
    assert_framing(received)
    return received


def kept_by(prefix: str, params: dict) -> dict | None:
    """What a strip route at ``prefix`` (one of STRIP_ROUTES) leaves of a client's
    kv_transfer_params: nothing, or the keys other than the policed ones."""
    if prefix == KEEP:
        return {k: v for k, v in params.items() if k not in POLICED}
    return None


def assert_stripped(document: dict, sent: dict, kept: dict | None = None) -> None:
    """``document`` is ``sent`` with its kv_transfer_params removed whole (``kept`` None)
    or replaced by ``kept``; every other key keeps its value and its position."""
    expected = json.loads(json.dumps(sent))
    if kept is None:
        del expected[KV]
    else:
        expected[KV] = kept
    assert document == expected
    assert list(document) == list(expected)
    if kept is not None:
        assert list(document[KV]) == list(kept)


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=20) as c:
        yield c


@pytest.fixture
def h2_client() -> Iterator[httpx.Client]:
    # HTTP/2 with prior knowledge (h2c): the gateway listener speaks both.
    with httpx.Client(http1=False, http2=True, timeout=20) as c:
        yield c


ENDPOINTS = ["chat/completions", "responses", "messages"]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("key", POLICED)
def test_aggregated_route_strips_ids_keeps_everything_else(gateway, client, endpoint, key):
    # The client's connector keys go with its ids: the whole object is removed.
    path = f"/v1/{endpoint}"
    sent = chat({key: [11, 12, 13], **PD_KEYS})
    reply = client.post(gateway.url + path, json=sent)
    assert reply.status_code == 200, reply.text
    received = only_request(gateway)
    assert received.target == path
    assert_stripped(json.loads(received.body), sent)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("key", POLICED)
def test_keep_other_keys_route_strips_only_the_ids_in_place(gateway, client, endpoint, key):
    sent = chat({key: [11, 12, 13], **PD_KEYS})
    reply = client.post(gateway.url + KEEP + endpoint, json=sent)
    assert reply.status_code == 200, reply.text
    received = only_request(gateway)
    assert received.target == f"/v1/{endpoint}"
    assert_stripped(json.loads(received.body), sent, kept=PD_KEYS)


@STRIP_ROUTES
def test_strip_over_http2(gateway, h2_client, prefix):
    sent = chat({"prompt_token_ids": [1], "x": 2})
    reply = h2_client.post(gateway.url + prefix + "chat/completions", json=sent)
    assert reply.http_version == "HTTP/2"
    assert reply.status_code == 200, reply.text
    document = json.loads(only_request(gateway).body)
    assert_stripped(document, sent, kept_by(prefix, sent[KV]))


@STRIP_ROUTES
@pytest.mark.parametrize("http2", [False, True])
def test_strip_chunked_upload(gateway, http2, prefix):
    sent = chat({"prompt_token_ids": list(range(5000)), "x": 1})
    data = json.dumps(sent).encode()

    def pieces() -> Iterator[bytes]:
        for start in range(0, len(data), 1000):
            yield data[start : start + 1000]

    with httpx.Client(http1=not http2, http2=http2, timeout=20) as c:
        reply = c.post(gateway.url + prefix + "chat/completions", content=pieces(), headers=JSON)
    if not http2:
        assert reply.request.headers["transfer-encoding"] == "chunked"
    assert reply.status_code == 200, reply.text
    document = json.loads(only_request(gateway).body)
    assert_stripped(document, sent, kept_by(prefix, sent[KV]))


# A long prompt: no spelling of kv_transfer_params in its bytes (spelling.spelled), so it is
# not parsed.
LONG_PROMPT = json.dumps(
    {
        "model": "tiny",
        "messages": [{"role": "user", "content": 'Résumé: "q" \\ C:\\t\n\t🙂 ' * 40_000}],
    }
).encode()


@pytest.mark.parametrize(
    "data",
    [
        b'{"model": "tiny",  "messages": [{"role": "user", "content": "hi"}], "n": 1.50}',
        LONG_PROMPT,
        # Unreadable, but nothing in it could be judged or rewritten: vLLM answers it.
        b'{"messages": [}',
    ],
    ids=["small", "long_prompt", "unreadable_object"],
)
def test_a_body_without_the_key_passes_byte_for_byte(gateway, client, data):
    reply = client.post(gateway.url + "/v1/chat/completions", content=data, headers=JSON)
    assert reply.status_code == 200
    assert only_request(gateway).body == data


def test_an_escaped_key_is_read_and_stripped(gateway, client):
    sent = chat({"prompt_token_ids": [1, 2], "k": 0})
    escaped = json.dumps(sent).replace(f'"{KV}"', '"kv\\u005ftransfer_params"')
    assert KV not in escaped
    reply = client.post(gateway.url + "/v1/chat/completions", content=escaped, headers=JSON)
    assert reply.status_code == 200
    assert_stripped(json.loads(only_request(gateway).body), sent)


@pytest.mark.parametrize("http2", [False, True])
def test_disaggregated_route_honors_valid_ids_untouched(gateway, http2):
    sent = chat({"prompt_token_ids": [5, 6, 7, 0], **PD_KEYS})
    data = json.dumps(sent).encode() + b"  "
    with httpx.Client(http1=not http2, http2=http2, timeout=20) as c:
        reply = c.post(gateway.url + TRUSTED + "chat/completions", content=data, headers=JSON)
        assert reply.status_code == 200, reply.text
        received = only_request(gateway)
        assert received.target == "/v1/chat/completions"
        assert received.body == data
        # The same request, unproven, on the shipped decode route: not honored.
        gateway.clear()
        reply = c.post(gateway.url + "/pd/v1/chat/completions", content=data, headers=JSON)
    assert reply.status_code == 200, reply.text
    assert_stripped(json.loads(only_request(gateway).body), sent)


def error_of(reply: httpx.Response) -> dict:
    assert reply.headers["content-type"] == "application/json"
    payload = reply.json()
    assert set(payload) == {"error"}
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["code"] == reply.status_code
    return payload["error"]


@pytest.mark.parametrize(
    ("path", "ids", "reason"),
    [
        ("/trusted/v1/chat/completions", [1, True], "prompt_token_ids[1] is not a non-negative"),
        ("/trusted/v1/chat/completions", [], "must be a non-empty list"),
        ("/trusted/v1/responses", [-1], "prompt_token_ids[0] is not a non-negative"),
        ("/trusted/v1/messages", "1 2 3", "must be a non-empty list"),
        ("/vocab/v1/chat/completions", [999, 1000], "[1] = 1000 is outside the vocabulary"),
        ("/deny/v1/chat/completions", [1, 2], "not accepted on this route"),
    ],
)
def test_denials_reach_the_client_as_json_400(gateway, client, path, ids, reason):
    sent = chat({"prompt_token_ids": ids})
    reply = client.post(gateway.url + path, json=sent)
    assert reply.status_code == 400
    error = error_of(reply)
    assert reason in error["message"]
    assert error["param"] == "kv_transfer_params.prompt_token_ids"
    assert error["type"] == "BadRequestError"
    assert gateway.received() == []
    if path.startswith(TRUSTED):
        # The shipped decode route does not judge unproven ids: it removes them.
        reply = client.post(gateway.url + path.replace(TRUSTED, "/pd/v1/"), json=sent)
        assert reply.status_code == 200, reply.text
        assert_stripped(json.loads(only_request(gateway).body), sent)


def test_denial_over_http2(gateway, h2_client):
    reply = h2_client.post(
        gateway.url + "/deny/v1/chat/completions", json=chat({"prompt_token_ids": [1]})
    )
    assert reply.status_code == 400
    assert error_of(reply)["param"] == "kv_transfer_params.prompt_token_ids"
    assert gateway.received() == []


@pytest.mark.parametrize(
    ("headers", "content", "status", "text"),
    [
        ({"content-type": "text/plain"}, b'{"kv_transfer_params": {}}', 415, "content-type"),
        ({}, b'{"kv_transfer_params": {}}', 415, "content-type"),
        ({**JSON, "content-encoding": "gzip"}, b"\x1f\x8b\x08\x00", 415, "content-encoding"),
        (JSON, b'{"kv_transfer_params": [1]}', 400, "must be a JSON object"),
        (JSON, b'{"messages": [', 400, "not valid JSON"),
        (JSON, b"[1, 2]", 400, "JSON object"),
    ],
)
def test_unreadable_bodies_denied(gateway, client, headers, content, status, text):
    reply = client.post(gateway.url + "/v1/chat/completions", content=content, headers=headers)
    assert reply.status_code == status
    assert text in error_of(reply)["message"]
    assert gateway.received() == []


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/bad-action/v1/chat/completions", "ext_proc.token_policy.action"),
        ("/bad-field/v1/chat/completions", "ext_proc.token_policy"),
        ("/bad-type/v1/chat/completions", "ext_proc.token_policy.max_ids"),
    ],
)
def test_invalid_route_metadata_fails_closed(gateway, client, path, field):
    reply = client.post(gateway.url + path, json=chat())
    assert reply.status_code == 500
    # vLLM's shape with the reason only: nothing of the gateway's internals (the
    # metadata namespace, its fields, the processor's Python types) reaches a client.
    assert error_of(reply) == {
        "message": "invalid_route_policy",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
    for internal in ("ext_proc", "token_policy", "metadata", "CelMap", "<class", "None"):
        assert internal not in reply.text
    assert gateway.received() == []
    # The operator's log names the field (decision lines are written each second).
    detail = f'"detail":"invalid route policy metadata: field \'{field}'
    if path.startswith("/bad-field/"):
        detail = f'"detail":"invalid route policy metadata: namespace \'{field}\''
    deadline = time.monotonic() + 5
    while detail not in gateway.logs("processor") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert detail in gateway.logs("processor")


def test_route_without_metadata_strips(gateway, client):
    sent = chat({"prompt_token_ids": [1], "k": 0})
    reply = client.post(gateway.url + "/plain/v1/chat/completions", json=sent)
    assert reply.status_code == 200
    assert_stripped(json.loads(only_request(gateway).body), sent)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions?stream=false",
        "/v1//chat/completions",
        "/v1/chat/./completions",
        "/v1/chat/completions/",
        "/V1/chat/completions",
        "/invocations",
        "/tokenize",
        "/pd/v1/../../v1/chat/completions",
        # Normalised to /v1/ before routing: on /trusted/v1/ the ids would be honored.
        "/trusted/v1/../../v1/chat/completions",
    ],
)
def test_path_variants_are_inspected(gateway, path):
    sent = chat({"prompt_token_ids": [1], "k": 0})
    # http.client sends the target as written (httpx would resolve dot segments itself).
    connection = http.client.HTTPConnection(gateway.gateway.host, gateway.gateway.port, timeout=20)
    try:
        connection.request("POST", path, json.dumps(sent).encode(), JSON)
        reply = connection.getresponse()
        assert reply.status == 200, reply.read()
    finally:
        connection.close()
    assert_stripped(json.loads(only_request(gateway).body), sent)


def test_get_without_body_passes(gateway, client):
    reply = client.get(gateway.url + "/v1/models")
    assert reply.status_code == 200
    (received,) = gateway.received()
    assert (received.method, received.target) == ("GET", "/v1/models")


def test_every_shipped_envoy_config_validates_and_passes_check_envoy(tmp_path):
    configs = sorted((REPO / "envoy").glob("*.yaml"))
    assert len(configs) >= 6
    cert_dir = certs.make(tmp_path / "certs")  # the TLS variants name certificate files
    for config in configs:
        text = config.read_text().replace(envoy_config.CERT_DIR, f"{cert_dir}/")
        local = tmp_path / config.name
        local.write_text(text)
        result = subprocess.run(
            [
                processes.envoy_binary(),
                "--mode",
                "validate",
                "-c",
                str(local),
                "--disable-hot-restart",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, f"{config.name}: {result.stdout}{result.stderr}"
        assert "OK" in result.stdout + result.stderr
        checked = subprocess.run(
            # The copy naming real certificates: check-envoy runs Envoy's validation too.
            [sys.executable, "-m", "ext_proc", "check-envoy", str(local)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "0 errors, 0 warnings" in checked.stdout


def logged_details(stack: Stack, request_id: str) -> str:
    """The ``details`` field (%RESPONSE_CODE_DETAILS%) of Envoy's access log line."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for line in stack.logs("envoy").splitlines():
            if line.startswith("{") and request_id in line:
                return str(json.loads(line)["details"])
        time.sleep(0.1)
    raise AssertionError(f"no access log line for {request_id}")


@pytest.mark.parametrize("mode", list(BODY_MODES))
def test_processor_stopped_means_5xx_and_nothing_upstream(tmp_path, mode):
    stack = Stack(tmp_path, source=BODY_MODES[mode]).start()
    try:
        with httpx.Client(timeout=20) as c:
            ok = c.post(stack.url + "/v1/chat/completions", json=chat())
            assert ok.status_code == 200
            stack.clear()
            stack.stop_processor()
            for leg, path in enumerate(("/v1/chat/completions", "/pd/v1/chat/completions")):
                request_id = f"stopped-{mode}-{leg}"
                reply = c.post(
                    stack.url + path,
                    json=chat({"prompt_token_ids": [1]}),
                    headers={"x-request-id": request_id},
                )
                # Nothing was forwarded: a retry is safe, and the answer says so.
                assert reply.status_code == 503, reply.text
                assert reply.headers["retry-after"] == "1"
                error = error_of(reply)
                # The access log has Envoy's details; the client gets fixed text only.
                details = logged_details(stack, request_id)
                assert details.startswith("ext_proc_error_")
                assert details not in reply.text
                assert error["message"] == (
                    "the policy processor is unavailable; the request was not processed, retry it"
                )
            reply = c.get(stack.url + "/v1/models")
            if mode == "one-message":
                # No body, so no message to the processor at all (a documented
                # trade-off of one message per request): the request cannot carry ids.
                assert reply.status_code == 200
                assert [(r.method, r.body) for r in stack.received()] == [("GET", b"")]
                return
            assert 500 <= reply.status_code < 600
            error_of(reply)
        assert stack.received() == []
    finally:
        stack.stop()
