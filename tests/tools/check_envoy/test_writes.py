"""What a filter can write into a request's headers, read from its configuration: the
values a header_mutation (and routes' configurations of it) or local_ratelimit states,
and what a server or a script chooses within Envoy's mutation rules."""

import copy

import pytest

from ext_proc.core.route_policy import DEFAULT_NAMESPACE
from ext_proc.tools.check_envoy import reader
from ext_proc.tools.check_envoy.writes import (
    Mutation,
    client_derived,
    last_mutations,
    permits,
    route_configs,
    writes,
)
from tests.tools.check_envoy.shipped import SHIPPED, hcm

_T = "type.googleapis.com/envoy.extensions.filters.http."
MUTATION = _T + "header_mutation.v3.HeaderMutation"
MUTATION_PER_ROUTE = _T + "header_mutation.v3.HeaderMutationPerRoute"


def _chain(config=None):
    return reader.read_chain(0, hcm(config or SHIPPED), DEFAULT_NAMESPACE)


def _sets(key, value):
    return {"append": {"header": {"key": key, "value": value}}}


def _mutation(*mutations):
    return {
        "name": "m",
        "typed_config": {"@type": MUTATION, "mutations": {"request_mutations": [*mutations]}},
    }


@pytest.mark.parametrize(
    ("value", "derived"),
    [
        ("10.0.0.5:8000", False),
        ("%UNIQUE_ID%", False),
        ("%REQ(x-mine)%", True),
        ("%REQ(x-request-id)%", True),
        ("%DOWNSTREAM_REMOTE_ADDRESS%", True),
        ("%UNIQUE_ID%-%REQ(x)%", True),
    ],
)
def test_any_format_command_but_the_fresh_id_may_carry_a_clients_value(value, derived):
    assert client_derived(value) is derived


def test_a_header_mutation_states_what_each_header_is_last_left_holding():
    entry = _mutation(
        _sets("X-A", "%REQ(x)%"),
        {"remove": "x-a"},
        _sets("x-b", "1"),
        _sets("x-b", "%REQ(y)%"),
    )
    can = writes(_chain(), entry)
    assert can.of("x-a") is None
    written = can.of("x-b")
    assert written is not None
    assert (written.copies, written.stated) == (True, True)
    assert can.of("x-c") is None


def test_the_last_mutation_of_each_header_keeps_its_action():
    mutations = [
        {"remove": "X-A"},
        _sets("x-a", "one"),
        {"append": {"header": {"key": "x-b", "value": ""}, "keep_empty_value": True}},
        {"append": {"header": {"key": "x-c", "value": "c"}, "append": False}},
        {"append": {"header": {"key": "x-d", "value": "d"}, "append_action": "ADD_IF_ABSENT"}},
        {"remove": "x-e"},
    ]
    assert last_mutations(mutations) == {
        "x-a": Mutation("one", "APPEND_IF_EXISTS_OR_ADD"),
        "x-b": Mutation("", "APPEND_IF_EXISTS_OR_ADD", keeps_empty=True),
        "x-c": Mutation("c", "OVERWRITE_IF_EXISTS_OR_ADD"),
        "x-d": Mutation("d", "ADD_IF_ABSENT"),
        "x-e": Mutation(None),
    }


def test_a_routes_configurations_of_a_filter_most_specific_first():
    inner = {"@type": MUTATION_PER_ROUTE, "mutations": {}}
    levels = [
        {"m": {"@type": reader.FILTER_CONFIG, "config": inner}},
        {"other": inner},
        "not a mapping",
        {"m": {"@type": MUTATION_PER_ROUTE}},
        {"m": {"@type": reader.FILTER_CONFIG, "disabled": True}},
    ]
    assert route_configs(levels, "m") == [inner, {"@type": MUTATION_PER_ROUTE}]


def test_a_routes_configuration_of_it_is_a_write_of_its_own():
    config = copy.deepcopy(SHIPPED)
    vhost = hcm(config)["route_config"]["virtual_hosts"][0]
    vhost["typed_per_filter_config"] = {
        "m": {
            "@type": MUTATION_PER_ROUTE,
            "mutations": {"request_mutations": [_sets("x-a", "%REQ(x)%")]},
        }
    }
    written = writes(_chain(config), _mutation(_sets("x-a", "1"))).of("x-a")
    assert written is not None
    assert written.copies
    assert "'1'" in written.how
    assert "'%REQ(x)%'" in written.how


def test_local_ratelimit_states_what_it_adds():
    entry = {
        "name": "limit",
        "typed_config": {
            "@type": _T + "local_ratelimit.v3.LocalRateLimit",
            "request_headers_to_add_when_not_enforced": [
                {"header": {"key": "X-Request-Id", "value": "%REQ(x-client-request-id)%"}}
            ],
        },
    }
    written = writes(_chain(), entry).of("x-request-id")
    assert written is not None
    assert written.copies
    assert written.how.startswith("it adds x-request-id")


@pytest.mark.parametrize(
    "kind", ["router.v3.Router", "buffer.v3.Buffer", "rbac.v3.RBAC", "decompressor.v3.Decompressor"]
)
def test_filters_known_to_write_no_request_header_write_none(kind):
    can = writes(_chain(), {"name": "f", "typed_config": {"@type": _T + kind}})
    assert [can.of(h) for h in ("x-request-id", "x-envoy-retry-on")] == [None, None]


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "lua", "typed_config": {"@type": _T + "lua.v3.Lua"}},
        {"name": "ecds", "config_discovery": {}},
        {"name": "authz", "typed_config": {"@type": _T + "ext_authz.v3.ExtAuthz"}},
    ],
    ids=["lua", "ecds", "ext_authz-unchecked"],
)
def test_a_chooser_nothing_bounds_may_write_anything_from_a_client(entry):
    written = writes(_chain(), entry).of("x-envoy-retry-on")
    assert written is not None
    assert (written.copies, written.stated) == (True, False)


# Envoy's Checker::isAllowed, in its order (mutation_rules.cc).
@pytest.mark.parametrize(
    ("rules", "name", "allowed"),
    [
        (None, "x-envoy-retry-on", True),
        ({}, "x-prefiller-host-port", True),
        ({}, "x-envoy-retry-on", False),
        ({}, "host", False),
        ({}, ":path", True),
        ({"disallow_system": True}, ":path", False),
        ({"allow_all_routing": True}, "host", True),
        ({"allow_envoy": True}, "x-envoy-retry-on", True),
        ({"disallow_all": True}, "x-prefiller-host-port", False),
        (
            {"disallow_all": True, "allow_expression": {"regex": "x-pre.*"}},
            "x-prefiller-host-port",
            True,
        ),
        ({"allow_expression": {"regex": "x-envoy-.*"}}, "x-envoy-retry-on", True),
        ({"allow_expression": {"regex": "x-envoy"}}, "x-envoy-retry-on", False),
        (
            {"allow_expression": {"regex": ".*"}, "disallow_expression": {"regex": "x-pre.*"}},
            "x-prefiller-host-port",
            False,
        ),
        # A regex this module cannot read: the answer that fails closed.
        ({"disallow_expression": {"regex": "(?P<"}}, "x-prefiller-host-port", True),
        ({"disallow_all": True, "allow_expression": {"regex": "(?P<"}}, "x-a", True),
    ],
)
def test_mutation_rules_are_read_in_envoys_order(rules, name, allowed):
    assert permits(rules, name) is allowed


def test_an_ext_proc_server_is_held_to_its_mutation_rules():
    entry = {
        "name": "picker",
        "typed_config": {
            "@type": _T + "ext_proc.v3.ExternalProcessor",
            "mutation_rules": {"disallow_expression": {"regex": "x-prefiller-.*"}},
        },
    }
    can = writes(_chain(), entry)
    assert [can.of(h) is None for h in ("x-prefiller-host-port", "x-envoy-retry-on")] == [
        True,
        True,
    ]
    assert can.of("x-request-id") is not None
