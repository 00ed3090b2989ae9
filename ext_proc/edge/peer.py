"""A downstream peer's identities, from what Envoy reports about its certificate.

Envoy's CEL names only the first URI SAN and the first DNS SAN of a certificate
(``connection.uri_san_peer_certificate``, ``connection.dns_san_peer_certificate``);
``connection.peer_certificate`` carries the whole leaf certificate as PEM, so every SAN
is read from it here. The subject is taken as Envoy renders it (RFC 2253), the form
operators see in Envoy's logs. Identities are typed: a DNS SAN that reads like a SPIFFE
id is still a DNS SAN and never matches a ``uri:`` peer (docs/trust.md).
"""

from __future__ import annotations

import functools
from typing import Final

from cryptography import x509

from ext_proc.core.events import NO_PEER, Peer
from ext_proc.core.route_policy import Identity, IdentityType

# Distinct certificates whose SANs are remembered (each a few KiB of PEM at most).
_REMEMBERED: Final = 256


@functools.lru_cache(maxsize=_REMEMBERED)
def sans(pem: str) -> tuple[Identity, ...] | None:
    """Every URI and DNS SAN of the certificate ``pem``, typed, in certificate order;
    None when ``pem`` is not one readable certificate (then it identifies nobody)."""
    try:
        certificate = x509.load_pem_x509_certificate(pem.encode("ascii"))
        extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return ()
    except (ValueError, UnicodeEncodeError):
        return None
    names = extension.value
    uris = names.get_values_for_type(x509.UniformResourceIdentifier)
    dns = names.get_values_for_type(x509.DNSName)
    return (
        *((IdentityType.URI, uri) for uri in uris),
        *((IdentityType.DNS, name) for name in dns),
    )


def identify(mtls: object, validated: object, pem: object, subject: object) -> Peer:
    """The peer a connection's certificate attributes describe: nobody unless the
    connection is mutual TLS with a certificate Envoy validated and could hand over."""
    if mtls is not True or validated is not True or not isinstance(pem, str):
        return NO_PEER
    found = sans(pem)
    if found is None:
        return NO_PEER
    if isinstance(subject, str) and subject:
        found = (*found, (IdentityType.SUBJECT, subject))
    return Peer(True, found)
