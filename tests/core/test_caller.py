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


def test_a_caller_is_shared_by_reason_and_never_changed():
    # Shared between requests: sound only while a Caller holds its reason alone and
    # cannot be changed.
    first = caller.of(policy(Action.HONOR, peers=frozenset({ROUTER})), MTLS)
    again = caller.of(policy(Action.MINT, peers=frozenset({ROUTER, OTHER})), MTLS)
    assert first is again
    assert caller.Caller.__slots__ == ("reason",)
    with pytest.raises(AttributeError):
        first.reason = Reason.UNPROVEN  # type: ignore[misc]
    assert caller.of(policy(Action.HONOR, peers=frozenset({OTHER})), MTLS).reason is (
        Reason.PEER_NOT_LISTED
    )
    assert first.reason is Reason.TRUSTED_PEER


@pytest.mark.parametrize("action", list(Action))
@pytest.mark.parametrize("any_caller", [False, True])
@pytest.mark.parametrize("peers", [frozenset(), frozenset({ROUTER}), frozenset({OTHER})])
@pytest.mark.parametrize(
    "peer",
    [NO_PEER, MTLS, Peer(mtls=False, identities=(ROUTER,)), Peer(mtls=True, identities=(OTHER,))],
)
def test_every_route_and_peer_has_its_own_reason(action, any_caller, peers, peer):
    route = policy(action, peers=peers, trust_any_caller=any_caller)
    if action is Action.DENY:
        reason = Reason.DENIED_BY_POLICY
    elif action is Action.STRIP:
        reason = Reason.STRIPPED_BY_POLICY
    elif action is Action.HONOR and any_caller:
        reason = Reason.TRUSTED_ANY_CALLER
    elif peer.mtls and set(peer.identities) & peers:
        reason = Reason.TRUSTED_PEER
    else:
        reason = Reason.PEER_NOT_LISTED if peers else Reason.UNPROVEN
    assert caller.of(route, peer) == caller.Caller(reason)
