"""caller.of: who sent a request, from the route's policy and the connection's peer."""

import pytest

from ext_proc.core import caller
from ext_proc.core.events import NO_PEER, Peer
from ext_proc.core.reasons import Reason
from ext_proc.core.route_policy import Action, IdentityType, RoutePolicy, Topology

ROUTER = (IdentityType.URI, "spiffe://cluster/router")
OTHER = (IdentityType.URI, "spiffe://cluster/other")
MTLS = Peer(mtls=True, identities=(ROUTER,))


def policy(action, **fields):
    return RoutePolicy(Topology.DISAGGREGATED, action, **fields)


@pytest.mark.parametrize(
    ("route", "peer", "reason"),
    [
        (policy(Action.STRIP), MTLS, Reason.STRIPPED_BY_POLICY),
        (policy(Action.DENY), MTLS, Reason.DENIED_BY_POLICY),
        (policy(Action.STRIP, peers=frozenset({ROUTER})), MTLS, Reason.STRIPPED_BY_POLICY),
        (policy(Action.HONOR, trust_any_caller=True), NO_PEER, Reason.TRUSTED_ANY_CALLER),
        # trust_any_caller is the decode leg's: a mint route signs for nobody by it.
        (policy(Action.MINT, trust_any_caller=True), NO_PEER, Reason.UNPROVEN),
        (policy(Action.HONOR, peers=frozenset({ROUTER})), MTLS, Reason.TRUSTED_PEER),
        (policy(Action.MINT, peers=frozenset({ROUTER})), MTLS, Reason.TRUSTED_PEER),
        (policy(Action.HONOR, peers=frozenset({OTHER})), MTLS, Reason.PEER_NOT_LISTED),
        # A listed identity over a connection that is not mutual TLS identifies nobody.
        (
            policy(Action.HONOR, peers=frozenset({ROUTER})),
            Peer(mtls=False, identities=(ROUTER,)),
            Reason.PEER_NOT_LISTED,
        ),
        # A DNS SAN of the same text never stands for a URI SAN.
        (
            policy(Action.HONOR, peers=frozenset({ROUTER})),
            Peer(mtls=True, identities=((IdentityType.DNS, ROUTER[1]),)),
            Reason.PEER_NOT_LISTED,
        ),
        (policy(Action.HONOR), MTLS, Reason.UNPROVEN),
    ],
)
def test_the_caller_by_route_and_peer(route, peer, reason):
    found = caller.of(route, peer)
    assert found.reason is reason
    assert found.trusted is (reason in {Reason.TRUSTED_PEER, Reason.TRUSTED_ANY_CALLER})
