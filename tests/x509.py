"""Certificates made in-process for the unit tests of peer identities (EC keys: fast)."""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def pem(*, uris: tuple[str, ...] = (), dns: tuple[str, ...] = (), cn: str = "peer") -> str:
    """A self-signed certificate with these SANs, as PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri) for uri in uris]
    names += [x509.DNSName(name) for name in dns]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    certificate = builder.sign(key, hashes.SHA256())
    return certificate.public_bytes(serialization.Encoding.PEM).decode("ascii")
