"""A route that names a tenant: the processor is sent its request headers, and where
the tenant comes from a header, a filter before the processor leaves no client's copy
of it."""

import pytest

from ext_proc.tools import carrier_headers
from tests.tools.check_envoy.shipped import (
    EXT_PROC,
    FILTER_CONFIG,
    at,
    ext_proc,
    ext_proc_index,
    found,
    hcm,
    mutated,
    per_route,
    policy,
    route,
    split,
)

TENANT = "x-auth-tenant"


def guard(*mutations, disabled=False):
    return {
        "name": "tenant-guard",
        "disabled": disabled,
        "typed_config": {
            "@type": carrier_headers.FILTER_TYPE,
            "mutations": {"request_mutations": list(mutations)},
        },
    }


REMOVE = {"remove": TENANT}
OVERWRITE = {
    "append": {
        "header": {"key": TENANT, "value": "team-a"},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
    }
}
APPEND = {"append": {"header": {"key": TENANT, "value": "team-a"}}}
# The client's own header, copied: what a write "from the request" looks like.
COPY = {
    "append": {
        "header": {"key": TENANT, "value": "%REQ(x-my-tenant)%"},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
    }
}
# Envoy writes no empty value unless keep_empty_value: the client's copy stays.
EMPTY = {
    "append": {
        "header": {"key": TENANT, "value": ""},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
    }
}
HM_PER_ROUTE = (
    "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutationPerRoute"
)
LOCAL_RATELIMIT = (
    "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit"
)
EXT_AUTHZ = "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz"
DISABLED = {"@type": FILTER_CONFIG, "disabled": True}


def sending_headers(config):
    """The shipped filter's processing mode (one message per request), with the
    request headers sent."""
    return per_route(overrides={"processing_mode": {**ext_proc(config)["processing_mode"], **SEND}})


SEND = {"request_header_mode": "SEND"}


def name_tenant(config, source, name="aggregated"):
    """Route ``name`` names ``source`` as its tenant, its request headers sent."""
    policy(config, name)["tenant"] = source
    route(config, name).setdefault("typed_per_filter_config", {}).update(sending_headers(config))


def tenant_route(*filters, position=0):
    def change(config):
        name_tenant(config, f"header:{TENANT}")
        chain = hcm(config)["http_filters"]
        for offset, entry in enumerate(filters):
            index = position + offset if position >= 0 else ext_proc_index(config) + 1
            chain.insert(index, entry)

    return change


@pytest.mark.parametrize("mutations", [(REMOVE,), (OVERWRITE,), (APPEND, REMOVE)])
def test_a_tenant_header_removed_or_overwritten_before_the_processor_passes(mutations):
    assert found(mutated(tenant_route(guard(*mutations)))) == []


@pytest.mark.parametrize(
    "change",
    [
        tenant_route(),
        tenant_route(guard(APPEND)),
        tenant_route(guard(REMOVE, APPEND)),
        tenant_route(guard(REMOVE, disabled=True)),
        tenant_route(guard(REMOVE), position=-1),  # after the processor
    ],
    ids=["none", "appended", "written-back", "disabled", "after"],
)
def test_a_tenant_header_a_client_can_send_is_refused(change):
    tenant = [item for item in found(mutated(change)) if item[0].startswith("tenant-")]
    assert tenant == [("tenant-header-unguarded", at("aggregated"))]


def named(entry, name):
    return {**entry, "name": name}


def per_route_mutations(*mutations):
    return {"@type": HM_PER_ROUTE, "mutations": {"request_mutations": list(mutations)}}


def guard_on(level, given, *filters):
    """The guard that removes the header, with ``given`` as its route-level
    configuration at ``level`` (the tenant route, its virtual host, the route
    configuration)."""
    base = tenant_route(*(filters or (guard(REMOVE),)))

    def change(config):
        base(config)
        node = {
            "route": route(config, "aggregated"),
            "virtual_host": hcm(config)["route_config"]["virtual_hosts"][0],
            "route_config": hcm(config)["route_config"],
        }[level]
        node.setdefault("typed_per_filter_config", {})["tenant-guard"] = given

    return change


def weighted(given):
    """The tenant route split over two weighted clusters, the second configuring the
    guard with ``given``."""

    def change(config):
        split(config, "aggregated", {"tenant-guard": given})

    return change


def both(*changes):
    def change(config):
        for each in changes:
            each(config)

    return change


def unguarded(change):
    """The messages of the tenant route's tenant-header-unguarded findings."""
    report = mutated(change)
    tenant = [f for f in report.findings if f.code.startswith("tenant-")]
    assert [(f.code, f.place) for f in tenant] == [("tenant-header-unguarded", at("aggregated"))]
    return tenant[0].message


@pytest.mark.parametrize("level", ["route", "virtual_host", "route_config"])
@pytest.mark.parametrize(
    "given", [DISABLED, {"@type": FILTER_CONFIG, "disabled": True, "config": {}}]
)
def test_a_guard_a_route_level_filter_config_disables_is_refused(level, given):
    message = unguarded(guard_on(level, given))
    assert "tenant-guard does not run on this route" in message


@pytest.mark.parametrize("given", [DISABLED, per_route_mutations(COPY)])
def test_a_guard_undone_on_one_weighted_cluster_is_refused(given):
    message = unguarded(both(tenant_route(guard(REMOVE)), weighted(given)))
    assert "tenant-guard" in message
    assert "weighted cluster" in message


@pytest.mark.parametrize("level", ["route", "virtual_host", "route_config"])
@pytest.mark.parametrize(
    "given",
    [
        per_route_mutations(COPY),
        {"@type": FILTER_CONFIG, "config": per_route_mutations(COPY)},
        per_route_mutations(APPEND),
    ],
    ids=["copied", "copied-wrapped", "appended"],
)
def test_a_guard_a_route_level_mutation_writes_back_is_refused(level, given):
    message = unguarded(guard_on(level, given))
    assert "tenant-guard" in message


def test_a_route_level_copy_is_refused_though_a_later_level_removes_it():
    # The route's copy comes first and the route configuration's removal last, in
    # Envoy's order; a route-level write from the request is refused wherever it is.
    def change(config):
        guard_on("route", per_route_mutations(COPY))(config)
        table = hcm(config)["route_config"]
        table["typed_per_filter_config"] = {"tenant-guard": per_route_mutations(REMOVE)}

    assert "writes it from the request" in unguarded(change)


@pytest.mark.parametrize(
    "filters",
    [
        (guard(COPY),),
        (guard(REMOVE, COPY),),
        (guard(EMPTY),),
        (guard(REMOVE), named(guard(APPEND), "later")),
        (guard(REMOVE), named(guard(COPY), "later")),
        (guard(REMOVE), named(guard(REMOVE, APPEND), "later")),
    ],
    ids=[
        "guard-copies",
        "guard-removes-then-copies",
        "guard-writes-empty",
        "later-appends",
        "later-copies",
        "later-writes-back",
    ],
)
def test_a_write_before_the_processor_that_is_no_removal_or_overwrite_is_refused(filters):
    message = unguarded(tenant_route(*filters))
    assert filters[-1]["name"] in message


def test_a_later_filters_stated_write_from_the_request_is_refused():
    ratelimit = {
        "name": "limit",
        "typed_config": {
            "@type": LOCAL_RATELIMIT,
            "stat_prefix": "limit",
            "request_headers_to_add_when_not_enforced": [
                {"header": {"key": TENANT, "value": "%REQ(x-my-tenant)%"}}
            ],
        },
    }
    assert "limit writes it" in unguarded(tenant_route(guard(REMOVE), ratelimit))


def test_the_message_names_the_guard_that_copies_and_the_value():
    message = unguarded(tenant_route(guard(COPY)))
    assert "tenant-guard writes it from the request ('%REQ(x-my-tenant)%')" in message


EXT_AUTHZ_FILTER = {
    "name": "envoy.filters.http.ext_authz",
    "typed_config": {
        "@type": EXT_AUTHZ,
        "grpc_service": {"envoy_grpc": {"cluster_name": "ext_proc"}},
    },
}


@pytest.mark.parametrize(
    "change",
    [
        tenant_route(guard(REMOVE), EXT_AUTHZ_FILTER),
        guard_on("route", per_route_mutations(REMOVE)),
        guard_on(
            "virtual_host", {"@type": FILTER_CONFIG, "config": per_route_mutations(OVERWRITE)}
        ),
        tenant_route(guard(COPY, REMOVE)),
        tenant_route(guard(REMOVE), named(guard(OVERWRITE), "later")),
        tenant_route(guard(REMOVE), named(guard(COPY, disabled=True), "later")),
        guard_on("route", per_route_mutations(REMOVE), guard(APPEND)),
        both(tenant_route(guard(REMOVE)), weighted(per_route_mutations(REMOVE))),
    ],
    ids=[
        "then-ext-authz",
        "route-removes-again",
        "host-overwrites",
        "copy-then-remove",
        "later-overwrites",
        "later-copier-disabled",
        "route-removes-the-append",
        "route-removes-weighted",
    ],
)
def test_a_tenant_header_left_clean_at_the_processor_passes(change):
    assert found(mutated(change)) == []


def test_a_guard_disabled_on_another_route_leaves_the_tenant_route_clean():
    def change(config):
        tenant_route(guard(REMOVE))(config)
        route(config, "default").setdefault("typed_per_filter_config", {})["tenant-guard"] = (
            DISABLED
        )

    assert found(mutated(change)) == []


@pytest.mark.parametrize("source", [f"header:{TENANT}", "route:team-a", "peer_san"])
def test_a_tenant_route_that_skips_the_request_headers_is_refused(source):
    """One message per request: a request without a body (a stored response read by its
    id) would be forwarded naming no tenant."""

    def change(config):
        tenant_route(guard(REMOVE))(config)
        policy(config, "aggregated")["tenant"] = source
        del route(config, "aggregated")["typed_per_filter_config"][EXT_PROC]

    assert found(mutated(change)) == [("tenant-headers-skipped", at("aggregated"))]


def test_a_weighted_cluster_that_skips_the_request_headers_is_refused():
    def change(config):
        tenant_route(guard(REMOVE))(config)
        skipping = {"processing_mode": ext_proc(config)["processing_mode"]}
        split(config, "aggregated", per_route(overrides=skipping))

    assert found(mutated(change)) == [("tenant-headers-skipped", at("aggregated"))]


def test_routes_without_a_header_source_need_no_guard():
    def change(config):
        name_tenant(config, "route:team-a")

    assert found(mutated(change)) == []


def test_a_tenant_route_in_audit_mode_is_warned_of():
    def change(config):
        name_tenant(config, "route:team-a")
        policy(config, "aggregated")["audit"] = True

    report = mutated(change)
    assert found(report, "warning") == [("tenant-route-audited", at("aggregated"))]
    assert found(report) == []


def tenant_rewrite(match, rewrite):
    def change(config):
        name_tenant(config, "route:team-a")
        entry = route(config, "aggregated")
        entry["match"] = match
        entry["route"]["prefix_rewrite"] = rewrite

    return change


def test_a_tenant_route_with_an_unstated_rewrite_is_an_error():
    """The processor serves a tenant route's endpoint by its upstream path: an unstated
    rewrite sends a path judged salted (/v1/generate, SGLang's /generate) to one that is
    not (/api/generate, Ollama's, which reads no cache_salt)."""
    change = tenant_rewrite({"prefix": "/v1/"}, "/api/")
    assert ("rewrite-unstated", at("aggregated")) in found(mutated(change))


def test_a_tenant_header_guard_the_route_disables_is_refused_at_the_route():
    def change(config):
        tenant_route(guard(REMOVE))(config)
        per_filter = route(config, "aggregated").setdefault("typed_per_filter_config", {})
        per_filter["tenant-guard"] = {"@type": FILTER_CONFIG, "disabled": True}

    tenant = [item for item in found(mutated(change)) if item[0].startswith("tenant-")]
    assert tenant == [("tenant-header-unguarded", at("aggregated"))]


def _json_name(field):
    """A proto field's JSON name (lowerCamelCase), which Envoy's config parser takes as
    well as the field's own name."""
    head, *rest = field.split("_")
    return head + "".join(part.title() for part in rest)


def test_a_weighted_cluster_that_skips_the_request_headers_by_json_names_is_refused():
    """Envoy parses typed configs with protobuf's JSON parser, which reads a field by its
    JSON name too: a weighted cluster's ``overrides.processingMode`` is its processing
    mode, and this one skips the request headers (the filter's own SKIP mode)."""

    def change(config):
        tenant_route(guard(REMOVE))(config)
        mode = {_json_name(k): v for k, v in ext_proc(config)["processing_mode"].items()}
        split(config, "aggregated", per_route(overrides={"processingMode": mode}))

    assert ("tenant-headers-skipped", at("aggregated")) in found(mutated(change))


def test_a_tenant_route_that_skips_the_request_headers_by_enum_number_is_refused():
    """protobuf's JSON parser takes an enum by its number as well as its name:
    ``request_header_mode: 2`` is SKIP."""

    def change(config):
        tenant_route(guard(REMOVE))(config)
        mode = {**ext_proc(config)["processing_mode"], "request_header_mode": 2}
        route(config, "aggregated")["typed_per_filter_config"].update(
            per_route(overrides={"processing_mode": mode})
        )

    assert ("tenant-headers-skipped", at("aggregated")) in found(mutated(change))


@pytest.mark.parametrize("level", ["route", "virtual_host", "route_config"])
def test_a_guard_a_route_level_mutation_by_json_names_writes_back_is_refused(level):
    """The same write-back as ``COPY``, its fields spelt by their JSON names
    (``requestMutations``, ``appendAction``), which Envoy parses alike: the client's
    own value of the tenant header reaches the processor, so any client names any
    tenant."""
    copy = {
        "append": {
            "header": {"key": TENANT, "value": "%REQ(x-my-tenant)%"},
            "appendAction": "OVERWRITE_IF_EXISTS_OR_ADD",
        }
    }
    given = {"@type": HM_PER_ROUTE, "mutations": {"requestMutations": [copy]}}
    message = unguarded(guard_on(level, given))
    assert "tenant-guard" in message


def test_a_tenant_route_that_skips_the_request_headers_in_a_typed_struct_is_refused():
    """Envoy takes a per-route configuration inside an ``xds.type.v3.TypedStruct`` as
    the message its ``type_url`` names: the route's own override, more specific than
    its virtual host's, skips the request headers."""

    def change(config):
        tenant_route(guard(REMOVE))(config)
        configs = route(config, "aggregated")["typed_per_filter_config"]
        hcm(config)["route_config"]["virtual_hosts"][0]["typed_per_filter_config"] = {
            EXT_PROC: configs[EXT_PROC]
        }
        configs[EXT_PROC] = {
            "@type": "type.googleapis.com/xds.type.v3.TypedStruct",
            "type_url": per_route()[EXT_PROC]["@type"],
            "value": {"overrides": {"processing_mode": ext_proc(config)["processing_mode"]}},
        }

    assert ("tenant-headers-skipped", at("aggregated")) in found(mutated(change))
