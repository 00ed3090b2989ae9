"""The header step runs before this processor's filter on every route, and no route's
header additions write a guarded header back from the request."""

import copy

import pytest

from ext_proc.tools import carrier_headers
from ext_proc.tools.check_envoy.rules.header_step import GUARDED, faults
from ext_proc.tools.router_headers import ROUTER_HEADERS
from tests.tools.check_envoy.shipped import (
    FILTER_CONFIG,
    HCM,
    SHIPPED,
    ext_proc_index,
    filter_names,
    found,
    hcm,
    mutated,
    route,
)

STEP = carrier_headers.FILTER


def _step(config):
    return hcm(config)["http_filters"][filter_names(config).index(STEP)]


def _step_mutations(config):
    return _step(config)["typed_config"]["mutations"]["request_mutations"]


def _drop_removal(name):
    def change(config):
        mutations = _step_mutations(config)
        mutations[:] = [m for m in mutations if m.get("remove") != name]

    return change


def _request_id_mutation(config):
    (written,) = [
        m
        for m in _step_mutations(config)
        if m.get("append", {}).get("header", {}).get("key") == carrier_headers.REQUEST_ID
    ]
    return written["append"]


def _request_id_kept(config):
    _request_id_mutation(config)["header"]["value"] = "%REQ(x-request-id)%"


def _re_added(config):
    _step_mutations(config).append(
        {"append": {"header": {"key": "x-prefiller-host-port", "value": "%REQ(x-mine)%"}}}
    )


def _after_ours(config):
    filters = hcm(config)["http_filters"]
    filters.insert(ext_proc_index(config), filters.pop(filter_names(config).index(STEP)))


KEEPS_ID = (
    f"it keeps a client's {carrier_headers.REQUEST_ID} (its last mutation must set "
    f"{carrier_headers.NEW_ID} with append_action OVERWRITE_IF_EXISTS_OR_ADD, after moving "
    f"the incoming one to {carrier_headers.CLIENT_REQUEST_ID})"
)


def test_the_shipped_step_has_no_fault():
    assert faults(_step(SHIPPED)) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (_drop_removal("x-prefiller-host-port"), ["it keeps a client's x-prefiller-host-port"]),
        (_drop_removal("x-worker-instance-id"), ["it keeps a client's x-worker-instance-id"]),
        (_request_id_kept, [KEEPS_ID]),
        # The default append action appends to the client's id: "<client's>,<fresh>".
        (lambda c: _request_id_mutation(c).pop("append_action"), [KEEPS_ID]),
        (lambda c: _request_id_mutation(c).update(append_action="ADD_IF_ABSENT"), [KEEPS_ID]),
        (_re_added, ["it writes x-prefiller-host-port after removing it"]),
        (
            lambda c: _step(c)["typed_config"].update(most_specific_header_mutations_wins=True),
            ["most_specific_header_mutations_wins lets a route's mutations replace it"],
        ),
    ],
    ids=[
        "llm-d",
        "dynamo",
        "request-id",
        "default-action",
        "add-if-absent",
        "re-added",
        "route-wins",
    ],
)
def test_a_step_that_lets_a_client_header_through_is_no_step(change, expected):
    config = copy.deepcopy(SHIPPED)
    change(config)
    assert faults(_step(config)) == expected
    assert found(mutated(change)) == [("header-step-missing", HCM)]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda c: hcm(c)["http_filters"].pop(filter_names(c).index(STEP)), []),
        # After ours, it changes headers of a decided request too.
        (_after_ours, [("filter-after-decision", HCM)]),
    ],
    ids=["absent", "after-ours"],
)
def test_a_chain_without_a_step_before_ours_is_an_error(change, expected):
    assert found(mutated(change)) == [("header-step-missing", HCM), *expected]


def _disabled(config):
    _step(config).update(disabled=True)


def _enabled_on_every_host(config):
    for vhost in hcm(config)["route_config"]["virtual_hosts"]:
        vhost.setdefault("typed_per_filter_config", {})[STEP] = {
            "@type": FILTER_CONFIG,
            "config": {},
        }


def test_a_step_disabled_by_default_and_not_enabled_where_ours_runs_is_an_error():
    errors = found(mutated(_disabled))
    assert errors
    assert {code for code, _ in errors} == {"header-step-missing"}
    assert all(place.startswith(f"{HCM} route ") for _, place in errors)


def test_a_step_disabled_by_default_and_enabled_where_ours_runs_is_the_step():
    """A shared gateway's wiring: the step enabled only where this processor polices, by
    a FilterConfig whose empty config configures nothing of its own."""

    def change(config):
        _disabled(config)
        _enabled_on_every_host(config)

    assert found(mutated(change)) == []


def test_a_route_that_configures_the_step_is_an_error():
    def change(config):
        route(config, "aggregated")["typed_per_filter_config"][STEP] = {
            "@type": FILTER_CONFIG,
            "disabled": True,
        }

    assert found(mutated(change)) == [("header-step-per-route", HCM)]


def _added_by_the_router(config):
    vhost = hcm(config)["route_config"]["virtual_hosts"][0]
    vhost["request_headers_to_add"] = [
        {
            "header": {"key": carrier_headers.REQUEST_ID, "value": "%REQ(x-client-request-id)%"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }
    ]


def test_a_route_that_hands_a_client_header_back_is_an_error():
    # The router adds it after every filter. A filter's writes are rules/writers'.
    assert found(mutated(_added_by_the_router)) == [("header-rewritten-by-route", HCM)]


def test_the_shipped_header_step_removes_every_routing_and_router_header_and_renews_the_id():
    mutations = _step_mutations(SHIPPED)
    assert [m["remove"] for m in mutations if "remove" in m] == [
        *carrier_headers.ROUTING_HEADERS,
        *ROUTER_HEADERS,
    ]
    first, last = mutations[0]["append"]["header"], mutations[-1]["append"]["header"]
    assert first == {"key": carrier_headers.CLIENT_REQUEST_ID, "value": "%REQ(x-request-id)%"}
    assert last == {"key": carrier_headers.REQUEST_ID, "value": "%UNIQUE_ID%"}


def test_header_names_with_underscores_passing_is_a_warning():
    report = mutated(lambda c: hcm(c).pop("common_http_protocol_options"))
    assert (found(report), found(report, "warning")) == ([], [("underscore-headers", HCM)])


def _underscores_removed(keep=None):
    """Underscore headers pass the connection manager; the step removes each guarded
    header's underscore spelling (but ``keep``'s)."""

    def change(config):
        hcm(config).pop("common_http_protocol_options")
        mutations = _step_mutations(config)
        spelt = {name.replace("-", "_") for name in GUARDED} - {keep}
        mutations[-1:-1] = [{"remove": name} for name in sorted(spelt)]

    return change


def test_a_step_removing_every_guarded_headers_underscore_spelling_keeps_them_out():
    assert mutated(_underscores_removed()).findings == ()
    report = mutated(_underscores_removed(keep="x_request_id"))
    assert found(report, "warning") == [("underscore-headers", HCM)]
