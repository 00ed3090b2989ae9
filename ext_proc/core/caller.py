"""Who sent a request, as its route sees it: trusted or not, and why (docs/trust.md).

Decided once per request (``inspection``, which hands it to every ``policy.decide`` of
the request, a second decision after the record's verdict included) from the route and
the connection's peer; a proof is another matter (it covers parameters, not the caller).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ext_proc.core.events import Peer
from ext_proc.core.reasons import TRUSTED, Reason
from ext_proc.core.route_policy import Action, RoutePolicy


@dataclass(frozen=True, slots=True)
class Caller:
    """``reason``: why the caller is trusted (``trusted_peer``, ``trusted_any_caller``),
    or why not (``stripped_by_policy``, ``denied_by_policy``, ``peer_not_listed``,
    ``unproven``): whatever it sends is then trusted only where a proof covers it."""

    reason: Reason

    @property
    def trusted(self) -> bool:
        return self.reason in TRUSTED


# One caller per reason, shared: a Caller is frozen and holds nothing but its reason,
# so every request with the same reason may hold the same one (none is made per request).
_BY_REASON: Final = {
    reason: Caller(reason)
    for reason in (
        Reason.DENIED_BY_POLICY,
        Reason.STRIPPED_BY_POLICY,
        Reason.TRUSTED_ANY_CALLER,
        Reason.TRUSTED_PEER,
        Reason.PEER_NOT_LISTED,
        Reason.UNPROVEN,
    )
}


def of(policy: RoutePolicy, peer: Peer) -> Caller:
    """The caller of a request on a route with ``policy``, over a connection from
    ``peer``."""
    if policy.action not in (Action.HONOR, Action.MINT):
        denied = policy.action is Action.DENY
        return _BY_REASON[Reason.DENIED_BY_POLICY if denied else Reason.STRIPPED_BY_POLICY]
    if policy.action is Action.HONOR and policy.trust_any_caller:
        return _BY_REASON[Reason.TRUSTED_ANY_CALLER]
    # An identity matches only one of its own type (a DNS SAN never stands for a URI SAN).
    if policy.peers and peer.mtls and not policy.peers.isdisjoint(peer.identities):
        return _BY_REASON[Reason.TRUSTED_PEER]
    return _BY_REASON[Reason.PEER_NOT_LISTED if policy.peers else Reason.UNPROVEN]
