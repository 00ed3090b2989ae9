"""Nothing changes a request between this processor's decision and the upstream: every
HTTP filter after this processor's first ext_proc filter, every upstream filter of the
router and every upstream filter of a cluster is one known not to change the request,
or one the deployment declares (``declared``: llm-d's endpoint picker, an ext_proc
filter that picks the pod and may rewrite the body by design).

A declared ext_proc filter is still held to what keeps the processor's decision about
the route true: it may not change the path, the method, the authority or scheme
(``mutation_rules.disallow_system`` and no ``allow_all_routing``), nor write Envoy's
own ``x-envoy-*`` headers (``allow_envoy``: ``x-envoy-retry-on`` would make the router
resend the body). Its body changes are what it is declared for. Where it runs (after
this processor's filter and its hold) is ``filters.other_filters``'s rule."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ext_proc.tools.check_envoy.findings import Finding, error, warning
from ext_proc.tools.check_envoy.reader import Chain, is_ext_proc
from ext_proc.tools.check_envoy.rules.filter_types import (
    KEEPS_THE_REQUEST,
    LOCAL_RATELIMIT,
    ROUTER,
)


def _keeps(entry: dict[str, Any]) -> bool:
    """Whether the filter's type is one the table knows to keep the request (the
    upstream codec that ends an upstream chain among them), or a ``local_ratelimit``
    that adds no request header."""
    config = entry.get("typed_config", {})
    kind = config.get("@type")
    if kind == LOCAL_RATELIMIT:
        return not config.get("request_headers_to_add_when_not_enforced")
    return kind in KEEPS_THE_REQUEST


def after_decision(
    chain: Chain, declared: frozenset[str], clusters: dict[str, dict[str, Any]]
) -> Iterator[Finding]:
    filters = chain.filters
    first = next(i for i, f in enumerate(filters) if f.get("name") in chain.names)
    names = {str(f.get("name")) for f in filters}
    for entry in filters[first + 1 :]:
        if entry.get("name") not in chain.names:
            yield from _judge(chain.place, entry, declared)
        if entry.get("typed_config", {}).get("@type") == ROUTER:
            place = f"{chain.place} filter {entry.get('name')} upstream_http_filters"
            for upstream in entry["typed_config"].get("upstream_http_filters", []):
                yield from _judge(place, upstream, declared)
    for name, options in sorted(clusters.items()):
        for upstream in options.get("http_filters", []):
            yield from _judge(f"cluster {name!r} http_filters", upstream, declared)
    for name in sorted(declared - names):
        yield warning(
            "declared-filter-absent",
            chain.place,
            f"filter {name!r} is declared but not in the chain ({', '.join(sorted(names))})",
        )


def _judge(place: str, entry: Any, declared: frozenset[str]) -> Iterator[Finding]:
    if not isinstance(entry, dict) or _keeps(entry):
        return
    name = entry.get("name")
    kind = entry.get("typed_config", {}).get("@type", "no typed_config")
    if name not in declared:
        yield error(
            "filter-after-decision",
            place,
            f"filter {name} ({kind}) runs after this processor's decision and can change "
            "the request it decided (headers, path, body). Move it before the processor's "
            "filter, or declare it (--declared-filter) if the deployment trusts it",
        )
        return
    if is_ext_proc(entry):
        yield from _bounded(place, str(name), entry["typed_config"].get("mutation_rules", {}))


def _bounded(place: str, name: str, rules: Any) -> Iterator[Finding]:
    rules = rules if isinstance(rules, dict) else {}
    faults = []
    if not rules.get("disallow_system"):
        faults.append("it may change :path (mutation_rules.disallow_system is not true)")
    if rules.get("allow_all_routing"):
        faults.append("allow_all_routing lets it change host, :authority and :method")
    if rules.get("allow_envoy"):
        faults.append("allow_envoy lets it write x-envoy-* headers (x-envoy-retry-on)")
    if faults:
        yield error(
            "declared-filter-unbounded",
            place,
            f"declared ext_proc filter {name}: {'; '.join(faults)}. Give it mutation_rules "
            "{disallow_system: true}",
        )
