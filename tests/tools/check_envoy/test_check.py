"""The whole check on the shipped configs, and which connection managers it reads."""

import copy

import pytest
import yaml

from ext_proc.tools.check_envoy import check
from tests.tools.check_envoy.shipped import SHIPPED, SHIPPED_CONFIGS, found, policy, routes


def test_shipped_config_is_clean():
    report = check(SHIPPED)
    assert (report.findings, report.routes) == ((), 12)
    # Among them: a mint route, an honor route, and direct responses without metadata
    # or the filter (the token endpoints, and each route's refused endpoints), none of
    # which is reported.
    assert policy(SHIPPED, "prefill")["action"] == "mint"
    assert policy(SHIPPED, "disaggregated")["action"] == "honor"
    direct = [r for r in routes(SHIPPED) if "direct_response" in r]
    assert len(direct) == 8
    assert all("metadata" not in r and "typed_per_filter_config" in r for r in direct)


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_is_clean(path):
    assert check(yaml.safe_load(path.read_text())).findings == ()


def with_admin_listener(config):
    """A second listener that forwards Envoy's own stats, with no ext_proc filter (to a
    cluster of its own: one a policed route reaches is policed-cluster-bypassed)."""
    listeners = config["static_resources"]["listeners"]
    admin = copy.deepcopy(listeners[0])
    admin["name"] = "stats"
    manager = admin["filter_chains"][0]["filters"][0]["typed_config"]
    manager["http_filters"] = [manager["http_filters"][-1]]
    stats = {"match": {"prefix": "/stats"}, "route": {"cluster": "stats"}}
    manager["route_config"] = {
        "virtual_hosts": [{"name": "stats", "domains": ["*"], "routes": [stats]}]
    }
    listeners.append(admin)
    address = {"socket_address": {"address": "127.0.0.1", "port_value": 9901}}
    config["static_resources"]["clusters"].append(
        {
            "name": "stats",
            "type": "STATIC",
            "load_assignment": {
                "cluster_name": "stats",
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
            },
        }
    )


def test_named_listeners_are_the_only_ones_checked():
    config = copy.deepcopy(SHIPPED)
    with_admin_listener(config)
    gateway = config["static_resources"]["listeners"][0]["name"]
    assert found(check(config)) == [("ext-proc-missing", "http_connection_manager[1]")]
    assert check(config, listeners=frozenset({gateway})).findings == ()
    assert found(check(config, listeners=frozenset({gateway, "nope"}))) == [
        ("listener-missing", "")
    ]
    assert found(check(config, listeners=frozenset({"nope"}))) == [
        ("listener-missing", ""),
        ("no-connection-manager", ""),
    ]


@pytest.mark.parametrize("config", [{}, None, {"static_resources": {}}])
def test_a_config_without_a_connection_manager_fails(config):
    report = check(config)
    assert (found(report), report.routes) == ([("no-connection-manager", "")], 0)
