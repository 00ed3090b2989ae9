from ext_proc.core.events import NO_PEER, Peer
from ext_proc.core.route_policy import IdentityType
from ext_proc.edge import peer
from tests.x509 import pem

ROUTER = "spiffe://cluster.local/ns/llm-d/sa/router"
URI, DNS, SUBJECT = IdentityType.URI, IdentityType.DNS, IdentityType.SUBJECT


def test_every_san_is_an_identity_of_its_type():
    certificate = pem(uris=("spiffe://td/other", ROUTER), dns=("a.local", "b.local"))
    found = peer.identify(True, True, certificate, "CN=peer")
    assert found == Peer(
        True,
        (
            (URI, "spiffe://td/other"),
            (URI, ROUTER),  # the second URI SAN counts as much as the first
            (DNS, "a.local"),
            (DNS, "b.local"),
            (SUBJECT, "CN=peer"),
        ),
    )


def test_a_dns_san_spelled_like_a_uri_stays_a_dns_san():
    found = peer.identify(True, True, pem(dns=(ROUTER,)), "")
    assert found.identities == ((DNS, ROUTER),)
    assert (URI, ROUTER) not in found.identities


def test_a_certificate_without_sans_has_only_its_subject():
    assert peer.identify(True, True, pem(), "CN=x").identities == ((SUBJECT, "CN=x"),)


def test_nobody_without_validated_mutual_tls_or_a_readable_certificate():
    certificate = pem(uris=(ROUTER,))
    assert peer.identify(False, True, certificate, "CN=x") is NO_PEER
    assert peer.identify(True, False, certificate, "CN=x") is NO_PEER  # not validated
    assert peer.identify(True, None, certificate, "CN=x") is NO_PEER  # attribute missing
    assert peer.identify(True, True, None, "CN=x") is NO_PEER
    assert peer.identify(True, True, "not a certificate", "CN=x") is NO_PEER
    assert peer.identify(True, True, certificate[:100], "CN=x") is NO_PEER
    assert peer.identify(True, True, "é" + certificate, "CN=x") is NO_PEER
