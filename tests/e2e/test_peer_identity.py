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

from devstack import tokens
from ext_proc.core.vllm_request import CONNECTOR_REQUESTS
from tests.e2e import certs
from tests.e2e.stack import Stack, new_key
from tests.e2e.test_handoff import PREFILL_REQUEST_PARAMS
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
    # The router's SPIFFE id as a DNS SAN: an identity of another type.
    certs._issue(
        directory,
        "dns-spoof",
        "/CN=spoof",
        f"subjectAltName=DNS:{certs.ROUTER}\nextendedKeyUsage=clientAuth\n",
        ca="clients-ca",
    )
    # The router's SPIFFE id as the second of two URI SANs.
    certs._issue(
        directory,
        "second-uri",
        "/CN=second",
        "subjectAltName=URI:spiffe://cluster.local/ns/llm-d/sa/other,"
        f"URI:{certs.ROUTER}\nextendedKeyUsage=clientAuth\n",
        ca="clients-ca",
    )
    return directory


@pytest.fixture(scope="module")
def internal(cert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(
        tmp_path_factory.mktemp("peer"),
        source=SOURCE,
        cert_dir=cert_dir,
        proof_keys={"e2e": new_key()},
    ).start()
    try:
        yield stack
    finally:
        stack.stop()


def post(
    stack: Stack,
    cert_dir: Path,
    name: str,
    path: str,
    request_id: str,
    body: dict[str, object] | None = None,
) -> httpx.Response:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cert_dir / "ca.crt")
    context.check_hostname = False  # the certificate names gateway.local; we dial 127.0.0.1
    context.load_cert_chain(cert_dir / f"{name}.crt", cert_dir / f"{name}.key")
    with httpx.Client(verify=context, timeout=20) as client:
        return client.post(
            f"https://{stack.gateway}{path}",
            content=json.dumps(body or {**CHAT, "kv_transfer_params": PARAMS}),
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
    # Nothing of the stranger's; on the prefill route, the route's connector request.
    assert json.loads(received.body).get("kv_transfer_params") == unlisted(path)
    assert access_log(internal, "peer-stranger")["policy_reason"] == "peer_not_listed"


def unlisted(path: str) -> dict[str, object] | None:
    """What an unlisted caller's request reaches the upstream with on ``path``."""
    return CONNECTOR_REQUESTS["nixl"] if path.startswith("/pd/prefill/") else None


@pytest.mark.parametrize("path", ["/pd/v1/chat/completions", "/pd/prefill/v1/chat/completions"])
@pytest.mark.parametrize(
    ("name", "reason"),
    [
        # A DNS SAN that reads like the router's URI SAN is not the router.
        ("dns-spoof", "peer_not_listed"),
        # Every URI SAN counts, not only the first Envoy's CEL names.
        ("second-uri", "trusted_peer"),
    ],
)
def test_identities_match_by_type_and_every_san_counts(internal, cert_dir, path, name, reason):
    internal.clear()
    reply = post(internal, cert_dir, name, path, f"peer-{name}")
    assert reply.status_code == 200, reply.text
    (received,) = internal.received()
    forwarded = json.loads(received.body).get("kv_transfer_params")
    assert forwarded == (PARAMS if reason == "trusted_peer" else unlisted(path))
    assert access_log(internal, f"peer-{name}")["policy_reason"] == reason


def test_a_listed_peers_prefill_leg_moves_connector_keys_signed(internal, cert_dir):
    # The orchestrator's prefill request keeps its connector keys (a listed peer), so the
    # upstream answers as a KV producer; the connector's reply is signed, honored on the
    # decode leg from any client, and void once a connector key is changed.
    internal.clear()
    ask = PREFILL_REQUEST_PARAMS
    prefill = {**CHAT, "max_tokens": 1, "return_token_ids": True, "kv_transfer_params": ask}
    reply = post(internal, cert_dir, "router", "/pd/prefill/v1/chat/completions", "pd-1", prefill)
    assert reply.status_code == 200, reply.text
    (received,) = internal.received()
    assert json.loads(received.body)["kv_transfer_params"] == ask
    params = reply.json()["kv_transfer_params"]
    assert {k: v for k, v in params.items() if k != "token_policy_proof"} == {
        **tokens.CONNECTOR_REPLY,
        "prompt_token_ids": reply.json()["prompt_token_ids"],
    }
    decode = {**CHAT, "kv_transfer_params": params}
    internal.clear()
    reply = post(internal, cert_dir, "stranger", "/pd/v1/chat/completions", "pd-2", decode)
    assert reply.status_code == 200, reply.text
    (received,) = internal.received()
    forwarded = json.loads(received.body)["kv_transfer_params"]
    assert forwarded == params  # as sent, the proof included
    assert access_log(internal, "pd-2")["policy_reason"] == "trusted_proof"
    internal.clear()
    redirected = {**CHAT, "kv_transfer_params": {**params, "remote_host": "169.254.169.254"}}
    reply = post(internal, cert_dir, "stranger", "/pd/v1/chat/completions", "pd-3", redirected)
    assert reply.status_code == 200, reply.text
    (received,) = internal.received()
    assert "kv_transfer_params" not in json.loads(received.body)
    assert access_log(internal, "pd-3")["policy_reason"] == "proof_bad_signature"


@pytest.mark.parametrize("path", ["/pd/v1/chat/completions", "/pd/prefill/v1/chat/completions"])
def test_a_listed_peers_connector_values_out_of_bounds_are_refused(internal, cert_dir, path):
    # vllm#51137: a tp_size the decode side allocates by. A listed peer is trusted to
    # have written its parameters, not to have written sane ones (docs/trust.md).
    huge = {**CHAT, "kv_transfer_params": {**PARAMS, "tp_size": 20_000_000}}
    internal.clear()
    reply = post(internal, cert_dir, "router", path, "bounds-out", huge)
    assert reply.status_code == 400, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert reply.json()["error"] == {
        "message": "kv_transfer_params.tp_size must be an integer from 1 to 1024",
        "type": "BadRequestError",
        "param": "kv_transfer_params.tp_size",
        "code": 400,
    }
    assert internal.received() == []  # nothing reached the upstream
    line = access_log(internal, "bounds-out")
    assert (line["policy_action"], line["policy_reason"]) == ("deny", "connector_out_of_bounds")
    assert line["details"] == "token_policy_connector_out_of_bounds"

    # The same parameters in bounds are honored as they are.
    fine = {**CHAT, "kv_transfer_params": {**PARAMS, "tp_size": 8}}
    reply = post(internal, cert_dir, "router", path, "bounds-in", fine)
    assert reply.status_code == 200, reply.text
    (received,) = internal.received()
    assert json.loads(received.body)["kv_transfer_params"] == fine["kv_transfer_params"]
    assert access_log(internal, "bounds-in")["policy_reason"] == "trusted_peer"
