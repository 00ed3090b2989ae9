"""The check: every connection manager (of the named listeners), its filter chain, then
each virtual host's routes, the rules applied in that order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ext_proc.core.route_policy import DEFAULT_NAMESPACE
from ext_proc.tools.check_envoy import reader
from ext_proc.tools.check_envoy.coverage import coverage
from ext_proc.tools.check_envoy.effective import running
from ext_proc.tools.check_envoy.findings import Finding, Report, error
from ext_proc.tools.check_envoy.rules import closure, filters, manager, replay, retry, token_paths
from ext_proc.tools.check_envoy.rules.after_decision import after_decision
from ext_proc.tools.check_envoy.rules.filter_types import filter_types
from ext_proc.tools.check_envoy.rules.header_step import header_step
from ext_proc.tools.check_envoy.rules.pairs import tenant_pairs
from ext_proc.tools.check_envoy.rules.processor_connection import processor_connection
from ext_proc.tools.check_envoy.rules.processor_tls import Demand, processor_tls
from ext_proc.tools.check_envoy.rules.route import route_rules, scoped_out
from ext_proc.tools.check_envoy.rules.writers import writers
from ext_proc.tools.check_envoy.spelling import canonical


def check(
    config: Any,
    namespace: str = DEFAULT_NAMESPACE,
    listeners: frozenset[str] | None = None,
    declared: frozenset[str] = frozenset(),
    processor: Demand = "none",
) -> Report:
    """``listeners``: check only these listeners' connection managers (the ones in front
    of model servers), not an admin or readiness listener beside them. ``declared``: the
    names of filters after this processor's that the deployment trusts to change the
    request (llm-d's endpoint picker). ``processor``: what the processor demands of
    its callers (``processor_tls.demand`` of its configuration). The rules read
    ``config`` in one spelling (``spelling.canonical``), whichever Envoy was given."""
    config, twice = canonical(config)
    found, missing = reader.managers(config, listeners)
    clusters = reader.http_options(config)
    known = reader.clusters(config)
    findings = list(_unreadable(twice, missing, found=bool(found)))
    findings.extend(coverage(config, namespace))
    findings.extend(closure.listeners(config, listeners, namespace))
    routes = 0
    for index, entry in enumerate(found):
        chain = reader.read_chain(index, entry, namespace)
        findings.extend(_chain(chain))
        for ours in chain.ours:
            place = f"{chain.place} filter {ours.get('name')}"
            findings.extend(filters.processor_cluster(place, ours, known))
            findings.extend(processor_tls(place, ours, config, processor))
            findings.extend(processor_connection(place, ours, clusters, known))
        if chain.ours:
            findings.extend(after_decision(chain, declared, clusters))
            decides = False
            for vhost in reader.virtual_hosts(chain):
                routes += len(vhost.routes)
                findings.extend(_virtual_host(vhost, chain, clusters, known))
                decides = decides or any(replay.decided(r, chain) is not None for r in vhost.routes)
            if decides:
                findings.extend(replay.trusted(chain))
            findings.extend(writers(chain, declared, decides))
    findings.extend(tenant_pairs(found, namespace))
    return Report(tuple(findings), routes)


def _unreadable(twice: list[str], missing: list[str], *, found: bool) -> Iterator[Finding]:
    """What keeps the rules from reading the configuration as Envoy does: a field spelt
    twice (by the names of what holds it), a named listener ``missing``, no connection
    manager ``found``."""
    for where in twice:
        yield error(
            "field-spelt-twice",
            where,
            "a field given by its proto name and its JSON name in one message: which "
            "Envoy reads cannot be checked; give it once",
        )
    if missing:
        yield error("listener-missing", "", f"no listener named {', '.join(missing)}")
    if not found:
        yield error("no-connection-manager", "", "no HTTP connection manager found")


def _chain(chain: reader.Chain) -> Iterator[Finding]:
    if not chain.ours:
        others = any(reader.is_ext_proc(f) for f in chain.filters)
        yield error(
            "ext-proc-missing",
            chain.place,
            "no ext_proc filter of this processor (none requests its route attributes"
            f"{', though other ext_proc filters run' if others else ''}); no request is "
            "inspected",
        )
        return
    yield from filter_types(chain)
    yield from filters.other_filters(chain)
    yield from header_step(chain)
    for entry in chain.ours:
        place = f"{chain.place} filter {entry.get('name')}"
        yield from filters.filter_settings(place, entry, chain.namespace)
        yield from retry.error_status(place, entry["typed_config"])
    yield from manager.path_handling(chain)
    yield from filters.per_route_names(chain)
    yield from filters.override_services(chain)
    yield from manager.upgrades(chain)
    yield from manager.unseen_routes(chain)
    top = chain.manager.get("route_config", {}).get("typed_per_filter_config", {})
    for name, config in reader.per_route(top):
        yield from filters.override(f"{chain.place} route_config", name, config, chain.requested)


def _virtual_host(
    vhost: reader.VirtualHost,
    chain: reader.Chain,
    clusters: dict[str, dict[str, Any]],
    known: reader.Clusters | None,
) -> Iterator[Finding]:
    yield from manager.matcher_tree(vhost)
    for name, config in reader.per_route(vhost.entry.get("typed_per_filter_config", {})):
        yield from filters.override(vhost.place, name, config, chain.requested)
    mapped = retry.mapped(chain)
    for route in vhost.routes:
        yield from route_rules(route, chain)
        if not mapped and route.forwards and running(chain, route.levels):
            yield from retry.retry_after(route, vhost.entry, chain)
        yield from closure.decided_clusters(route, chain, known)
        yield from replay.replays(route, vhost, chain, clusters)
    # A virtual host of a shared gateway whose routes this processor does not police.
    if not all(scoped_out(r, chain) for r in vhost.routes if r.forwards):
        yield from token_paths.token_paths(vhost, chain.namespace)
