"""Every HTTP filter of a chain this processor polices is of a type the check knows: the
one table (``TABLE``) of what each type can write into a request (its headers, the route
or cluster the router picks, its body), and which per-route configurations it reads,
field by field. A type not in it is an error wherever it runs, before the processor's
filter or after: a Wasm module, a ``composite`` filter, one from ECDS or any type added
to Envoy later may write anything, send the body elsewhere or change the route, and no
rule here can tell. A per-route configuration may set only the fields the table allows
its filter's type (``PerRoute``); what a field does is judged by the rule that reads it
(``writes``, ``rules.hold``, ``rules.filters``...).

Each reason cites Envoy 1.40's documentation or protos for the type. Whether a known
type's writes are harmless where it runs is the other rules' business: after the
header step (``rules.writers``), after this processor's decision (``rules.after_decision``:
only types that keep the request, ``KEEPS_THE_REQUEST``)."""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

from ext_proc.tools.check_envoy.findings import Finding, error
from ext_proc.tools.check_envoy.reader import FILTER_CONFIG, Chain, filter_levels

_TYPES: Final = "type.googleapis.com/"
_T: Final = _TYPES + "envoy.extensions.filters.http."
ROUTER: Final = _T + "router.v3.Router"
LOCAL_RATELIMIT: Final = _T + "local_ratelimit.v3.LocalRateLimit"
# Per-route fields: a path allows everything under it; ``EVERY`` allows every field.
EVERY: Final = frozenset({""})
Headers = Literal["none", "stated", "chosen"]


@dataclass(frozen=True)
class Kind:
    """What one filter type can write into a request. ``headers``: none; ``stated``, the
    ones its configuration spells out (``writes`` reads them); ``chosen``, any a server
    or a script picks at run time. ``route``: whether it can change the route or the
    cluster the router takes (it clears the route cache or picks the host). ``body``:
    whether it can change the body. ``per_route``: each per-route configuration type
    it reads, with the fields a route may set."""

    reason: str
    headers: Headers = "none"
    route: bool = False
    body: bool = False
    per_route: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def keeps_the_request(self) -> bool:
        return self.headers == "none" and not self.route and not self.body


TABLE: Final[Mapping[str, Kind]] = MappingProxyType(
    {
        ROUTER: Kind("router.proto: forwards the request as the filters before it left it"),
        _T + "upstream_codec.v3.UpstreamCodec": Kind(
            "upstream_codec.proto: ends an upstream filter chain, writes the request out"
        ),
        _T + "buffer.v3.Buffer": Kind(
            "buffer filter docs: holds the body until complete; adds content-length only "
            "to a body that has none (framing, not content)",
            per_route={_T + "buffer.v3.BufferPerRoute": frozenset({"disabled", "buffer"})},
        ),
        _T + "cors.v3.Cors": Kind(
            "cors filter docs: answers preflights itself, writes response headers only",
            per_route={_T + "cors.v3.CorsPolicy": EVERY},
        ),
        _T + "rbac.v3.RBAC": Kind(
            "rbac filter docs: allows or refuses (403), changes nothing",
            per_route={_T + "rbac.v3.RBACPerRoute": frozenset({"rbac"})},
        ),
        _T + "fault.v3.HTTPFault": Kind(
            "fault filter docs: delays or aborts with a local reply, changes nothing it forwards",
            per_route={_T + "fault.v3.HTTPFault": EVERY},
        ),
        _T + "health_check.v3.HealthCheck": Kind(
            "health_check filter docs: answers health checks itself; pass-through mode "
            "forwards them unchanged"
        ),
        LOCAL_RATELIMIT: Kind(
            "local_ratelimit filter docs: refuses (429) over the limit; adds "
            "request_headers_to_add_when_not_enforced",
            headers="stated",
            # A route's own additions are not read (``writes`` reads the filter's).
            per_route={
                LOCAL_RATELIMIT: frozenset(
                    {
                        "stat_prefix",
                        "status",
                        "token_bucket",
                        "filter_enabled",
                        "filter_enforced",
                        "response_headers_to_add",
                        "descriptors",
                        "stage",
                        "local_rate_limit_per_downstream_connection",
                        "local_cluster_rate_limit",
                        "enable_x_ratelimit_headers",
                        "vh_rate_limits",
                        "always_consume_default_token_bucket",
                        "rate_limited_as_resource_exhausted",
                        "rate_limits",
                        "max_dynamic_descriptors",
                    }
                )
            },
        ),
        _T + "decompressor.v3.Decompressor": Kind(
            "decompressor filter docs: rewrites the body and its framing headers "
            "(content-encoding, content-length) only",
            body=True,
        ),
        _T + "header_mutation.v3.HeaderMutation": Kind(
            "header_mutation.proto: the request mutations and query parameter mutations "
            "its configuration and each route's HeaderMutationPerRoute state",
            headers="stated",
            route=True,
            per_route={_T + "header_mutation.v3.HeaderMutationPerRoute": frozenset({"mutations"})},
        ),
        _T + "ext_proc.v3.ExternalProcessor": Kind(
            "ext_proc filter docs: its server may write headers within mutation_rules, "
            "replace the body and clear the route cache",
            headers="chosen",
            route=True,
            body=True,
            # Not async_mode (nothing waits for the decision), request_attributes (the
            # policy's attributes replaced) nor processing_request_modifier (an
            # extension nothing here reads).
            per_route={
                _T + "ext_proc.v3.ExtProcPerRoute": frozenset(
                    {
                        "disabled",
                        "overrides.processing_mode",
                        "overrides.failure_mode_allow",
                        "overrides.grpc_service",
                        "overrides.metadata_options",
                        "overrides.grpc_initial_metadata",
                    }
                )
            },
        ),
        _T + "ext_authz.v3.ExtAuthz": Kind(
            "ext_authz filter docs: its server may write headers within "
            "decoder_header_mutation_rules and clear the route cache; the body is read only",
            headers="chosen",
            route=True,
            per_route={
                _T + "ext_authz.v3.ExtAuthzPerRoute": frozenset(
                    {
                        "disabled",
                        "check_settings.context_extensions",
                        "check_settings.disable_request_body_buffering",
                        "check_settings.with_request_body",
                    }
                )
            },
        ),
        _T + "jwt_authn.v3.JwtAuthentication": Kind(
            "jwt_authn filter docs: writes the claims and payload headers from a "
            "verified token, may remove the token, clears the route cache on request",
            headers="chosen",
            route=True,
            per_route={
                _T + "jwt_authn.v3.PerRouteConfig": frozenset({"disabled", "requirement_name"})
            },
        ),
        _T + "lua.v3.Lua": Kind(
            "lua filter docs: the script may write any header, replace the body and "
            "clear the route cache",
            headers="chosen",
            route=True,
            body=True,
            per_route={_T + "lua.v3.LuaPerRoute": EVERY},
        ),
    }
)
# Types met in gateways that no table entry can bound, each for its reason.
REFUSED: Final[Mapping[str, str]] = MappingProxyType(
    {
        _T + "wasm.v3.Wasm": "a Wasm module may write anything and send requests of its own",
        _T + "composite.v3.Composite": "runs filters of any type, chosen at run time",
        _T + "on_demand.v3.OnDemand": (
            "discovers clusters (ODCDS) and virtual hosts on demand: a route's cluster from "
            "outside the bootstrap"
        ),
        _T + "cache.v3.CacheConfig": "answers requests from stored responses",
    }
)
KEEPS_THE_REQUEST: Final = frozenset(k for k, kind in TABLE.items() if kind.keeps_the_request)
WRITES_NO_HEADER: Final = frozenset(k for k, kind in TABLE.items() if kind.headers == "none")
_WRAPPER: Final = frozenset({"config", "is_optional", "disabled"})


def filter_types(chain: Chain) -> Iterator[Finding]:
    """Each HTTP filter of ``chain`` (and each of the router's upstream filters) is of
    a known type, and each per-route configuration of one sets only what its type
    allows."""
    kinds: dict[str, Kind] = {}
    for entry in chain.filters:
        kind = yield from _known(chain.place, entry)
        if kind is not None:
            kinds[str(entry.get("name"))] = kind
        config = entry.get("typed_config", {})
        if config.get("@type") == ROUTER:
            for upstream in config.get("upstream_http_filters", []):
                if isinstance(upstream, dict):
                    yield from _known(f"{chain.place} filter {entry.get('name')}", upstream)
    for place, configs in filter_levels(chain):
        for name, given in sorted(configs.items()):
            if name in kinds and isinstance(given, dict):
                yield from _per_route(f"{place} {name}", kinds[name], given)


def _known(place: str, entry: dict[str, Any]) -> Generator[Finding, None, Kind | None]:
    """The filter's kind, or None after its finding."""
    name = entry.get("name")
    if "config_discovery" in entry:
        yield error(
            "filter-type-unknown",
            place,
            f"filter {name} comes from ECDS (config_discovery): its type and configuration "
            "arrive at run time, unchecked. Configure it inline",
        )
        return None
    url = entry.get("typed_config", {}).get("@type", "no typed_config")
    kind = TABLE.get(url)
    if kind is None:
        why = REFUSED.get(url, "not in the table of HTTP filters the check knows")
        yield error(
            "filter-type-unknown",
            place,
            f"filter {name} ({url}): {why}; what it can write into a request policed here "
            "cannot be told. Remove it",
        )
    return kind


def _per_route(place: str, kind: Kind, given: dict[str, Any]) -> Iterator[Finding]:
    config = given
    if given.get("@type") == FILTER_CONFIG:
        extra = sorted(set(given) - _WRAPPER - {"@type"})
        if extra:
            yield _refused(place, f"FilterConfig fields {', '.join(extra)}")
        inner = given.get("config")
        if not isinstance(inner, dict) or not inner:
            # No configuration: the wrapper only enables or disables the filter.
            return
        config = inner
    url = config.get("@type")
    allowed = kind.per_route.get(str(url))
    if allowed is None:
        yield _refused(place, f"a configuration of type {url}, which the filter does not read")
        return
    unallowed = [] if allowed == EVERY else list(_unallowed(config, allowed, ""))
    if unallowed:
        yield _refused(place, f"{', '.join(unallowed)} of {url}")


def _unallowed(config: dict[str, Any], allowed: frozenset[str], prefix: str) -> Iterator[str]:
    for key, value in config.items():
        path = f"{prefix}{key}"
        if key == "@type" or path in allowed:
            continue
        if isinstance(value, dict) and any(a.startswith(f"{path}.") for a in allowed):
            yield from _unallowed(value, allowed, f"{path}.")
        else:
            yield path


def _refused(place: str, what: str) -> Finding:
    return error(
        "per-route-field-refused",
        place,
        f"typed_per_filter_config sets {what}: not among the per-route settings the "
        "check reads for this filter's type, so what it changes on the route is unchecked. "
        "Remove it",
    )
