"""Peer identity through the real Envoy: on the internal mutual-TLS listener
(envoy/envoy-internal-mtls.yaml) a listed orchestrator's kv_transfer_params are honored;
another client of the same CA is untrusted like anyone else (docs/trust.md)."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e import certs
from tests.e2e.stack import Stack
from tests.e2e.test_operations import access_log

SOURCE = Path(__file__).resolve().parents[2] / "envoy" / "envoy-internal-mtls.yaml"
PARAMS = {"prompt_token_ids": [1, 2, 3], "remote_port": 5600}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = certs.make(tmp_path_factory.mktemp("certs"))
    # A client of the same CA whose identity no route lists.
    certs._issue(
        directory,
        "stranger",
        "/CN=stranger",
        "subjectAltName=URI:spiffe://cluster.local/ns/llm-d/sa/stranger\n"
        "extendedKeyUsage=clientAuth\n",
        ca="clients-ca",
    )
    return directory


@pytest.fixture(scope="module")
def internal(cert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(tmp_path_factory.mktemp("peer"), source=SOURCE, cert_dir=cert_dir).start()
    try:
        yield stack
    finally:
        stack.stop()


def post(stack: Stack, cert_dir: Path, name: str, path: str, request_id: str) -> httpx.Response:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cert_dir / "ca.crt")
    context.check_hostname = False  # the certificate names gateway.local; we dial 127.0.0.1
    context.load_cert_chain(cert_dir / f"{name}.crt", cert_dir / f"{name}.key")
    with httpx.Client(verify=context, timeout=20) as client:
        return client.post(
            f"https://{stack.gateway}{path}",
            content=json.dumps({**CHAT, "kv_transfer_params": PARAMS}),
            headers={"content-type": "application/json", "x-request-id": request_id},
        )


@pytest.mark.parametrize("path", ["/pd/v1/chat/completions", "/pd/prefill/v1/chat/completions"])
def test_a_listed_peer_is_honored_and_another_client_is_not(internal, cert_dir, path):
    internal.clear()
    reply = post(internal, cert_dir, "router", path, "peer-router")
    assert reply.status_code == 200, reply.text
    (received,) = internal.received()
    assert json.loads(received.body)["kv_transfer_params"] == PARAMS
    assert access_log(internal, "peer-router")["policy_reason"] == "trusted_peer"

    internal.clear()
    reply = post(internal, cert_dir, "stranger", path, "peer-stranger")
    assert reply.status_code == 200, reply.text
    (received,) = internal.received()
    assert "kv_transfer_params" not in json.loads(received.body)
    assert access_log(internal, "peer-stranger")["policy_reason"] == "peer_not_listed"
