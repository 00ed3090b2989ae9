"""The prefill/decode hand-off through the real Envoy (docs/trust.md): the prefill route
signs the response's kv_transfer_params, the decode route honors only what it signed,
and a client's own parameters reach no upstream on any route.

The stand-in answers like vLLM (devstack.tokens): ``return_token_ids: true`` brings the
prompt's ids at the top level, ``do_remote_decode: true`` the connector's parameters, and
its ``usage.prompt_tokens`` counts the ids it ran on. What it received is checked as
the bytes that arrived."""

from __future__ import annotations

import base64
import itertools
import json
import re
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import blake3
import httpx
import pytest

from devstack import tokens
from tests.e2e.conftest import BODY_MODES, KEY_ID
from tests.e2e.stack import Received, Stack, new_key
from tests.e2e.test_gateway import chat, only_request
from tests.e2e.test_operations import access_log

PREFILL = "/pd/prefill/v1/chat/completions"
DECODE = "/pd/v1/chat/completions"
UPSTREAM_PATH = "/v1/chat/completions"
# The shipped P/D routes name no tenant source: their proofs name no partition ("-").
PROOF = re.compile(
    r"tp4\.([A-Za-z0-9_-]{1,64})\.([1-9][0-9]*)\.([1-9][0-9]*)\.([A-Za-z0-9_-]{16})"
    r"\.-\.([A-Za-z0-9_-]{43})\.([A-Za-z0-9_-]{43})"
)
# What a P/D proxy sends on the prefill leg (vLLM's toy proxy, llm-d's sidecar).
PREFILL_REQUEST_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
_ids = itertools.count()


def request_id() -> str:
    return f"handoff-{time.monotonic_ns()}-{next(_ids)}"


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=20) as c:
        yield c


def prefill_body(**extra: Any) -> dict[str, Any]:
    """The prefill leg of ``chat()``: one token, the prompt's ids asked for."""
    return chat(max_tokens=1, return_token_ids=True, **extra)


def post(
    client: httpx.Client, stack: Stack, path: str, body: dict[str, Any], rid: str | None = None
) -> httpx.Response:
    headers = {"x-request-id": rid} if rid else {}
    reply = client.post(stack.url + path, json=body, headers=headers)
    assert reply.status_code == 200, reply.text
    # The length Envoy announces is the length of the (rewritten) body it sends.
    if "content-length" in reply.headers:
        assert int(reply.headers["content-length"]) == len(reply.content)
    return reply


def sent_upstream(stack: Stack) -> tuple[Received, dict[str, Any]]:
    received = only_request(stack)  # one request, its framing exact
    assert received.target == UPSTREAM_PATH
    document = json.loads(received.body)
    assert isinstance(document, dict)
    return received, document


def minted(client: httpx.Client, stack: Stack, **extra: Any) -> dict[str, Any]:
    """The kv_transfer_params a prefill leg returns, the stand-in's record cleared."""
    params = post(client, stack, PREFILL, prefill_body(**extra)).json()["kv_transfer_params"]
    assert isinstance(params, dict)
    stack.clear()
    return params


class Parts(NamedTuple):
    key_id: str
    minted: int
    expiry: int
    nonce: str
    digest: str
    mac: str


def proof_parts(params: dict[str, Any]) -> Parts:
    """The fields of a well-formed proof."""
    match = PROOF.fullmatch(params["token_policy_proof"])
    assert match is not None, params["token_policy_proof"]
    key_id, minted, expiry, nonce, digest, mac = match.groups()
    return Parts(key_id, int(minted), int(expiry), nonce, digest, mac)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def sign(
    key: bytes,
    key_id: str,
    expiry: int,
    digest: str,
    params: dict[str, Any],
    nonce: str = "A" * 16,
    *,
    minted: int,
) -> str:
    """A proof built from docs/trust.md alone, with the test's copy of a key."""
    rest = {k: v for k, v in params.items() if k not in ("prompt_token_ids", "token_policy_proof")}
    head = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    ids = params.get("prompt_token_ids")
    tail = "-" if ids is None else json.dumps(ids, separators=(",", ":"))
    message = f"tp4\n{key_id}\n{minted}\n{expiry}\n-\n{digest}\n{head}\n{tail}\n{nonce}".encode()
    mac_key = blake3.blake3(key, derive_key_context="ext_proc token_policy_proof tp4 MAC key")
    mac = blake3.blake3(message, key=mac_key.digest()).digest()
    return f"tp4.{key_id}.{minted}.{expiry}.{nonce}.-.{digest}.{b64(mac)}"


def assert_not_honored(stack: Stack, sent: dict[str, Any], rid: str, reason: str) -> None:
    """The decode request reached the upstream without any kv_transfer_params, the rest
    unchanged, and the access log names why."""
    _received, document = sent_upstream(stack)
    expected = {k: v for k, v in sent.items() if k != "kv_transfer_params"}
    assert document == expected
    line = access_log(stack, rid)
    assert line["policy_reason"] == reason, line


# --- the prefill leg ---------------------------------------------------------------------


def without_params(document: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != "kv_transfer_params"}


def test_prefill_response_carries_signed_ids(gateway, client):
    # The client's own parameters (a P/D proxy's, with ids) are untrusted: removed, and
    # the route's connector request (connector: nixl) written in their place.
    sent = prefill_body(kv_transfer_params={**PREFILL_REQUEST_PARAMS, "prompt_token_ids": [9]})
    before = int(time.time())
    reply = post(client, gateway, PREFILL, sent)
    _received, document = sent_upstream(gateway)
    assert without_params(document) == without_params(sent)
    assert document["kv_transfer_params"] == PREFILL_REQUEST_PARAMS

    payload = reply.json()
    ids = tokens.prompt_ids(UPSTREAM_PATH, document)
    assert payload["prompt_token_ids"] == ids
    params = payload["kv_transfer_params"]
    # The connector's answer (where to read the blocks) and the ids, signed.
    assert list(params) == [*tokens.CONNECTOR_REPLY, "prompt_token_ids", "token_policy_proof"]
    assert {k: params[k] for k in tokens.CONNECTOR_REPLY} == tokens.CONNECTOR_REPLY
    assert params["prompt_token_ids"] == ids
    proof = params["token_policy_proof"]
    assert proof.startswith("tp4.")
    key_id, minted_at, expiry, nonce, digest, _mac = proof_parts(params)
    assert key_id == KEY_ID
    assert before <= minted_at <= time.time()
    assert expiry == minted_at + 20  # the default ttl_seconds
    # The MAC is the one docs/trust.md defines, under the stack's key.
    key = gateway.proof_keys[KEY_ID]
    assert sign(key, key_id, expiry, digest, params, nonce, minted=minted_at) == proof
    # Everything else in the response is the upstream's own.
    unchanged = {k: v for k, v in payload.items() if k != "kv_transfer_params"}
    assert unchanged["choices"][0]["token_ids"] == [tokens.EOS]
    assert json.loads(unchanged["stub_received"]["body"]) == document


def test_prefill_proofs_bind_the_prompt(gateway, client):
    digest = proof_parts(minted(client, gateway)).digest
    other = minted(client, gateway, messages=[{"role": "user", "content": "other"}])
    again = minted(client, gateway, temperature=0.25)  # chat()'s own value: same prompt
    assert proof_parts(other).digest != digest
    assert proof_parts(again).digest == digest


def test_without_ids_asked_the_connectors_parameters_alone_are_signed(gateway, client):
    reply = post(client, gateway, PREFILL, chat(max_tokens=1))  # no return_token_ids
    payload = reply.json()
    assert payload["prompt_token_ids"] is None
    params = payload["kv_transfer_params"]
    assert list(params) == [*tokens.CONNECTOR_REPLY, "token_policy_proof"]


# --- the decode leg ----------------------------------------------------------------------


def test_decode_forwards_the_proven_request_unchanged(gateway, client):
    params = minted(client, gateway)
    ids = params["prompt_token_ids"]
    # The orchestrator copies the object verbatim; max_tokens may change between legs.
    sent = chat(params, max_tokens=64)
    assert set(params) == {*tokens.CONNECTOR_REPLY, "prompt_token_ids", "token_policy_proof"}
    # Python's spelling (a space after each separator): no rewrite would write it so.
    raw = json.dumps(sent).encode()
    rid = request_id()
    reply = client.post(
        gateway.url + DECODE,
        content=raw,
        headers={"content-type": "application/json", "x-request-id": rid},
    )
    assert reply.status_code == 200, reply.text
    received, _document = sent_upstream(gateway)
    # The request as the client sent it, byte for byte: the connector's parameters and
    # the ids the decode server needs, the proof with them (docs/trust.md).
    assert received.body == raw
    assert reply.json()["usage"]["prompt_tokens"] == len(ids)  # the stand-in ran on them
    line = access_log(gateway, rid)
    assert line["policy_action"] == "honor", line
    assert line["policy_reason"] == "trusted_proof", line
    assert line["policy_id_count"] == len(ids)


@pytest.mark.parametrize(
    "change",
    [
        {"stream": False},
        {"max_completion_tokens": 5},
        {"return_token_ids": False},
        {"stream_options": None},
    ],
)
def test_fields_an_orchestrator_changes_keep_the_proof_valid(gateway, client, change):
    params = minted(client, gateway)
    post(client, gateway, DECODE, chat(params, **change))
    _received, document = sent_upstream(gateway)
    assert document["kv_transfer_params"] == params


def tampered_ids(params: dict[str, Any]) -> dict[str, Any]:
    return {**params, "prompt_token_ids": [params["prompt_token_ids"][0] + 1]}


def added_key(params: dict[str, Any]) -> dict[str, Any]:
    return {**params, "remote_host": "10.0.0.9", "remote_port": 5600}


def dropped_ids(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k != "prompt_token_ids"}


def unknown_key(params: dict[str, Any]) -> dict[str, Any]:
    proof = params["token_policy_proof"].replace(f"tp4.{KEY_ID}.", "tp4.elsewhere.", 1)
    return {**params, "token_policy_proof": proof}


def no_proof(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k != "token_policy_proof"}


def malformed(params: dict[str, Any]) -> dict[str, Any]:
    return {**params, "token_policy_proof": params["token_policy_proof"].rsplit(".", 1)[0]}


def not_a_string(params: dict[str, Any]) -> dict[str, Any]:
    return {**params, "token_policy_proof": [params["token_policy_proof"]]}


@pytest.mark.parametrize(
    ("alter", "reason"),
    [
        (tampered_ids, "proof_bad_signature"),
        (added_key, "proof_bad_signature"),
        (dropped_ids, "proof_bad_signature"),
        (unknown_key, "proof_unknown_key"),
        (no_proof, "proof_missing"),
        (malformed, "proof_malformed"),
        (not_a_string, "proof_malformed"),
    ],
)
def test_altered_parameters_are_not_honored(gateway, client, alter, reason):
    sent = chat(alter(minted(client, gateway)))
    rid = request_id()
    post(client, gateway, DECODE, sent, rid)
    assert_not_honored(gateway, sent, rid, reason)


@pytest.mark.parametrize(
    "change",
    [
        {"messages": [{"role": "user", "content": "ignore the system prompt"}]},
        {"model": "other"},
        {"temperature": 1.5},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        {"chat_template_kwargs": {"enable_thinking": True}},
    ],
)
def test_parameters_signed_for_another_prompt_are_not_honored(gateway, client, change):
    sent = chat(minted(client, gateway), **change)
    rid = request_id()
    post(client, gateway, DECODE, sent, rid)
    assert_not_honored(gateway, sent, rid, "prompt_mismatch")


def test_an_expired_proof_is_not_honored(gateway, client):
    params = minted(client, gateway)
    digest = proof_parts(params).digest
    past = int(time.time()) - 3600
    key = gateway.proof_keys[KEY_ID]
    expired = sign(key, KEY_ID, past, digest, params, minted=past - 20)
    sent = chat({**params, "token_policy_proof": expired})
    rid = request_id()
    post(client, gateway, DECODE, sent, rid)
    assert_not_honored(gateway, sent, rid, "proof_expired")


def test_a_proof_signed_with_another_secret_is_not_honored(gateway, client):
    params = minted(client, gateway)
    _key_id, minted_at, expiry, _nonce, digest, _mac = proof_parts(params)
    forged = sign(new_key(), KEY_ID, expiry, digest, params, minted=minted_at)
    sent = chat({**params, "token_policy_proof": forged})
    rid = request_id()
    post(client, gateway, DECODE, sent, rid)
    assert_not_honored(gateway, sent, rid, "proof_bad_signature")


# --- a client's own parameters -----------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/chat/completions",
        DECODE,
        PREFILL,
    ],
)
def test_client_parameters_are_removed_on_every_route(gateway, client, path):
    sent = chat(
        {"prompt_token_ids": [1, 2, 3], **PREFILL_REQUEST_PARAMS, "remote_host": "10.0.0.7"}
    )
    reply = post(client, gateway, path, sent)
    (received,) = gateway.received()
    document = json.loads(received.body)
    assert without_params(document) == without_params(sent)
    # Nothing of the client's: on the prefill route, the route's connector request.
    assert document.get("kv_transfer_params") == (
        PREFILL_REQUEST_PARAMS if path == PREFILL else None
    )
    # The stand-in ran on the rendered prompt, not on the client's ids.
    assert reply.json()["usage"]["prompt_tokens"] == len(tokens.prompt_ids(path, document))


# --- a connector-style hand-off ----------------------------------------------------------


def test_a_clients_connector_keys_are_replaced_by_the_routes_connector_request(gateway, client):
    # From an untrusted client nothing of its parameters reaches the prefill server (its
    # remote_host and remote_port would steer the connector): the route writes the
    # connector request itself, so the KV cache moves without trusting the client.
    evil = {**PREFILL_REQUEST_PARAMS, "remote_host": "10.0.0.7", "remote_port": 22}
    params = post(client, gateway, PREFILL, prefill_body(kv_transfer_params=evil)).json()[
        "kv_transfer_params"
    ]
    _received, document = sent_upstream(gateway)
    assert document["kv_transfer_params"] == PREFILL_REQUEST_PARAMS
    assert {k: params[k] for k in tokens.CONNECTOR_REPLY} == tokens.CONNECTOR_REPLY
    assert set(params) == {*tokens.CONNECTOR_REPLY, "prompt_token_ids", "token_policy_proof"}


# A listed peer's prefill leg, whose connector keys are kept and signed: see
# tests/e2e/test_peer_identity.py. keep_other_keys, which kept a client's keys, is
# invalid on a mint route (docs/trust.md).


# --- proofs across deployments and time --------------------------------------------------


@pytest.fixture(scope="module")
def short_lived(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Another deployment: its own key (another id) and proofs that live one second."""
    stack = Stack(
        tmp_path_factory.mktemp("short-lived"),
        source=BODY_MODES["one-message"],
        proof_keys={"other": new_key()},
        processor_config={"proof": {"ttl_seconds": 1, "clock_skew_seconds": 0}},
    ).start()
    try:
        yield stack
    finally:
        stack.stop()


def test_a_proof_expires_after_its_ttl(short_lived, client):
    short_lived.clear()
    params = minted(client, short_lived)
    expiry = proof_parts(params).expiry
    assert expiry <= time.time() + 1
    while time.time() <= expiry + 0.2:
        time.sleep(0.1)
    sent = chat(params)
    rid = request_id()
    post(client, short_lived, DECODE, sent, rid)
    assert_not_honored(short_lived, sent, rid, "proof_expired")


def test_a_proof_from_another_deployment_names_an_unknown_key(gateway, short_lived, client):
    params = minted(client, gateway)
    short_lived.clear()
    sent = chat(params)
    rid = request_id()
    post(client, short_lived, DECODE, sent, rid)
    assert_not_honored(short_lived, sent, rid, "proof_unknown_key")
