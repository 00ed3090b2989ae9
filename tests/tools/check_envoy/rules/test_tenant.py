"""A route whose tenant comes from a header: a filter before the processor must leave
no client's copy of it, and with one message the filter must request it."""

import pytest

from ext_proc.tools import carrier_headers
from tests.tools.check_envoy.shipped import (
    at,
    ext_proc,
    ext_proc_index,
    found,
    hcm,
    mutated,
    policy,
)

TENANT = "x-auth-tenant"
ATTRIBUTE = f"request.headers['{TENANT}']"


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


def tenant_route(*filters, position=0, requested=True):
    def change(config):
        policy(config, "aggregated")["tenant"] = f"header:{TENANT}"
        chain = hcm(config)["http_filters"]
        for offset, entry in enumerate(filters):
            index = position + offset if position >= 0 else ext_proc_index(config) + 1
            chain.insert(index, entry)
        if requested:
            ext_proc(config)["request_attributes"].append(ATTRIBUTE)

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


def test_a_tenant_header_not_requested_with_one_message_is_refused():
    report = mutated(tenant_route(guard(REMOVE), requested=False))
    assert found(report) == [("tenant-header-not-requested", at("aggregated"))]


def test_routes_without_a_header_source_need_no_guard():
    def change(config):
        policy(config, "aggregated")["tenant"] = "route:team-a"

    assert found(mutated(change)) == []
