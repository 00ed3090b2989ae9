"""The internal listener (envoy/envoy-internal-mtls.yaml) with the real Envoy: a client
with a certificate from the clients' CA gets through the TLS handshake; a client without
one, with one from another CA, or without TLS at all, gets no HTTP exchange."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e import certs
from tests.e2e.envoy_alone import REPO, Gateway, Reply, request, running

SOURCE = REPO / "envoy" / "envoy-internal-mtls.yaml"
NOT_FOUND = {"error": {"message": "not found", "type": "NotFoundError", "param": None, "code": 404}}


@pytest.fixture(scope="module")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return certs.make(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def gateway(cert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running(SOURCE, tmp_path_factory.mktemp("internal"), cert_dir) as running_:
        yield running_


def client(cert_dir: Path, name: str | None, version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client that verifies the gateway (ca.crt) and presents ``name``.crt, if any."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cert_dir / "ca.crt")
    context.maximum_version = version
    if name is not None:
        context.load_cert_chain(cert_dir / f"{name}.crt", cert_dir / f"{name}.key")
    return context


VERSIONS = [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3]


@pytest.mark.parametrize("version", VERSIONS, ids=["tls1.2", "tls1.3"])
def test_a_client_of_the_clients_ca_is_served(
    gateway: Gateway, cert_dir: Path, version: ssl.TLSVersion
) -> None:
    # A token endpoint: Envoy answers it alone, so the exchange shows the handshake and
    # the HTTP that followed without a processor.
    reply = gateway.exchange(request("POST", "/render", b"{}"), client(cert_dir, "router", version))
    assert reply.status == 404
    assert json.loads(reply.body) == NOT_FOUND
    assert gateway.forwarded() == []


def refused(gateway: Gateway, tls: ssl.SSLContext | None) -> bool:
    """Whether the gateway ended the connection without an HTTP response. With TLS 1.3
    the client's side of the handshake completes first; the refusal then arrives as an
    alert (or a reset) on the first read."""
    try:
        reply: Reply = gateway.exchange(request("POST", "/render", b"{}"), tls)
    except (ssl.SSLError, ConnectionError):
        return True
    raise AssertionError(f"served: {reply}")


@pytest.mark.parametrize("version", VERSIONS, ids=["tls1.2", "tls1.3"])
@pytest.mark.parametrize(
    "name",
    [None, "envoy"],  # no certificate; a certificate from ca.crt, not the clients' CA
    ids=["no-certificate", "other-ca"],
)
def test_other_clients_are_refused(
    gateway: Gateway, cert_dir: Path, name: str | None, version: ssl.TLSVersion
) -> None:
    assert refused(gateway, client(cert_dir, name, version))
    assert gateway.forwarded() == []


def test_plain_http_is_refused(gateway: Gateway) -> None:
    assert refused(gateway, None)
