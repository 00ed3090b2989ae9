"""A prefill/decode pair knows its tenant: every proof binds the cache partition its mint
route put the prompt in, and an honor route refuses one of another partition
(docs/trust.md#a-pair-knows-its-tenant). So a ``mint`` route and an ``honor`` route that
name different tenant sources (one none) make no pair: each proof of one is refused on
the other and its decode recomputed, where honoring it would put the prompt in another
tenant's partition or in none. Turns pair the same routes the other way
(an honor route signs a turn, a mint route with a connector reads it back).

Which routes one client reaches is not read: a client that can reach one listener can
usually reach another, so every decided route of the connection managers checked is
paired with every other (``--listener`` narrows them)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ext_proc.core.reasons import Reason
from ext_proc.core.route_policy import Action, RoutePolicy, TenantSource
from ext_proc.tools.check_envoy import reader
from ext_proc.tools.check_envoy.findings import Finding, error
from ext_proc.tools.check_envoy.rules.replay import decided
from ext_proc.tools.check_envoy.rules.route import policy_of


def shown(source: TenantSource | None) -> str:
    return "no tenant source" if source is None else source.spelt


def tenant_pairs(found: Sequence[Any], namespace: str) -> Iterator[Finding]:
    """``found``: the connection managers checked (``reader.managers``)."""
    routes: dict[Action, list[tuple[str, TenantSource | None]]] = {
        Action.MINT: [],
        Action.HONOR: [],
    }
    for index, entry in enumerate(found):
        chain = reader.read_chain(index, entry, namespace)
        if not chain.ours:
            continue
        for vhost in reader.virtual_hosts(chain):
            for route in vhost.routes:
                action = decided(route, chain)
                policy = policy_of(route, namespace)
                if action is not None and isinstance(policy, RoutePolicy):
                    routes[action].append((route.place, policy.tenant))
    for place, source in routes[Action.HONOR]:
        other = next(((p, s) for p, s in routes[Action.MINT] if s != source), None)
        if other is None:
            continue
        yield error(
            "tenant-pair-mismatch",
            place,
            f"this honor route names {shown(source)} and the mint route {other[0]} names "
            f"{shown(other[1])}: a proof minted there is bound to another cache partition "
            f"than this route puts its requests in, refused here "
            f"({Reason.PROOF_PARTITION_MISMATCH.value}), its decode recomputed (and a turn "
            "signed here is refused there). Give a prefill/decode pair one tenant source",
        )
