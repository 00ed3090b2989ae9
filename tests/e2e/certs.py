"""A throw-away CA, processor certificate (ext-proc.local) and Envoy client certificate."""

from __future__ import annotations

import subprocess
from pathlib import Path

NAME = "ext-proc.local"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(directory: Path, name: str, subject: str, extension: str) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
             f"{name}.csr", "-subj", subject, cwd=directory)  # fmt: skip
    (directory / f"{name}.ext").write_text(extension)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile",
             f"{name}.ext", cwd=directory)  # fmt: skip


def make(directory: Path) -> Path:
    """Write ca.crt, processor.crt/.key, envoy.crt/.key and other.crt/.key (a second,
    untrusted CA's client) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout",
             "ca.key", "-out", "ca.crt", "-subj", "/CN=test-ca", cwd=directory)  # fmt: skip
    _issue(directory, "processor", f"/CN={NAME}",
           f"subjectAltName=DNS:{NAME}\nextendedKeyUsage=serverAuth\n")  # fmt: skip
    _issue(directory, "envoy", "/CN=envoy", "extendedKeyUsage=clientAuth\n")
    return directory
