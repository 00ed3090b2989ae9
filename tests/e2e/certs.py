"""A throw-away CA, processor certificate (ext-proc.local) and Envoy client certificate;
for the gateway's own mutual-TLS listener a second CA for its clients, the gateway's
certificate and the orchestrator's client certificate (a SPIFFE id)."""

from __future__ import annotations

import subprocess
from pathlib import Path

NAME = "ext-proc.local"
# Another server of the same CA (a public site's certificate, another mesh workload's).
IMPOSTOR = "impostor.local"
# The gateway's name, and the orchestrator the internal listener's routes list as a peer
# (envoy/inputs/envoy-internal-mtls.yaml).
GATEWAY = "gateway.local"
ROUTER = "spiffe://cluster.local/ns/llm-d/sa/router"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(directory: Path, name: str, subject: str, extension: str, ca: str = "ca") -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
             f"{name}.csr", "-subj", subject, cwd=directory)  # fmt: skip
    (directory / f"{name}.ext").write_text(extension)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile",
             f"{name}.ext", cwd=directory)  # fmt: skip


def make(directory: Path) -> Path:
    """Write ca.crt, processor.crt/.key, envoy.crt/.key, gateway.crt/.key,
    clients-ca.crt and router.crt/.key (clients-ca's client, URI SAN ``ROUTER``) into
    ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout",
             "ca.key", "-out", "ca.crt", "-subj", "/CN=test-ca", cwd=directory)  # fmt: skip
    _issue(directory, "processor", f"/CN={NAME}",
           f"subjectAltName=DNS:{NAME}\nextendedKeyUsage=serverAuth\n")  # fmt: skip
    _issue(directory, "envoy", "/CN=envoy", "extendedKeyUsage=clientAuth\n")
    # The gateway's listener: its certificate (from ca.crt) and its clients' CA.
    _issue(directory, "gateway", f"/CN={GATEWAY}",
           f"subjectAltName=DNS:{GATEWAY}\nextendedKeyUsage=serverAuth\n")  # fmt: skip
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout",
             "clients-ca.key", "-out", "clients-ca.crt", "-subj", "/CN=test-clients-ca",
             cwd=directory)  # fmt: skip
    _issue(directory, "router", "/CN=router",
           f"subjectAltName=URI:{ROUTER}\nextendedKeyUsage=clientAuth\n",
           ca="clients-ca")  # fmt: skip
    return directory


def impostor(directory: Path) -> Path:
    """Write impostor.crt/.key into ``directory`` (made by ``make``): a server
    certificate ``ca.crt`` signed for another name than the processor's."""
    _issue(directory, "impostor", f"/CN={IMPOSTOR}",
           f"subjectAltName=DNS:{IMPOSTOR}\nextendedKeyUsage=serverAuth\n")  # fmt: skip
    return directory
