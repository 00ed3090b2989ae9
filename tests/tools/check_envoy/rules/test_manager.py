"""The connection manager normalises paths as the upstream decodes them, runs this
chain for upgrades, and carries routes the check can read."""

import copy

import pytest

from tests.tools.check_envoy.shipped import HCM, VHOST, found, hcm, mutated, per_route


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda m: m.pop("normalize_path"), "path-not-normalized"),
        (lambda m: m.update(normalize_path=False), "path-not-normalized"),
        (lambda m: m.pop("path_with_escaped_slashes_action"), "escaped-slashes-kept"),
        (
            lambda m: m.update(path_with_escaped_slashes_action="KEEP_UNCHANGED"),
            "escaped-slashes-kept",
        ),
    ],
)
def test_route_matches_must_see_the_path_the_upstream_decodes(change, code):
    assert found(mutated(lambda c: change(hcm(c)))) == [(code, HCM)]


@pytest.mark.parametrize("action", ["UNESCAPE_AND_FORWARD", "REJECT_REQUEST"])
def test_escaped_slashes_may_also_be_forwarded_unescaped_or_refused(action):
    assert mutated(lambda c: hcm(c).update(path_with_escaped_slashes_action=action)).findings == ()


def _answered(regex):
    """Escaped slashes kept, and a 400 route for ``regex`` first in every virtual host
    (a shared gateway's wiring, scoped to the hosts it polices)."""

    def change(config):
        manager = hcm(config)
        manager["path_with_escaped_slashes_action"] = "KEEP_UNCHANGED"
        for vhost in manager["route_config"]["virtual_hosts"]:
            vhost["routes"].insert(
                0,
                {
                    "name": "path-not-normalized",
                    "match": {"safe_regex": {"regex": regex}},
                    "direct_response": {"status": 400},
                    "typed_per_filter_config": per_route(disabled=True),
                },
            )

    return change


def test_escaped_slashes_kept_may_be_answered_in_every_policed_virtual_host():
    assert mutated(_answered("(?i).*(//|%2f|%5c).*")).findings == ()


def test_escaped_slashes_kept_and_answered_in_part_are_an_error():
    # An escaped backslash still reaches the upstream, which decodes it.
    assert found(mutated(_answered("(?i).*%2f.*"))) == [("escaped-slashes-kept", HCM)]


def test_an_upgrade_with_its_own_filters_is_an_error():
    def change(config):
        manager = hcm(config)
        manager["upgrade_configs"] = [
            {"upgrade_type": "websocket", "filters": [copy.deepcopy(manager["http_filters"][-1])]}
        ]

    assert found(mutated(change)) == [("upgrade-filter-chain", HCM)]


@pytest.mark.parametrize("source", ["rds", "scoped_routes"])
def test_routes_this_check_cannot_see_are_errors(source):
    def change(config):
        manager = hcm(config)
        manager.pop("route_config")
        manager[source] = {"route_config_name": "r", "config_source": {"ads": {}}}

    assert found(mutated(change)) == [("routes-unseen", HCM)]


def test_virtual_hosts_from_vhds_are_unseen_too():
    # The listed virtual hosts pass; others arrive on demand, unchecked.
    def change(config):
        hcm(config)["route_config"]["vhds"] = {"config_source": {"ads": {}}}

    assert found(mutated(change)) == [("routes-unseen", HCM)]


def test_a_matcher_tree_is_an_error():
    def change(config):
        (vhost,) = hcm(config)["route_config"]["virtual_hosts"]
        vhost["matcher"] = {"matcher_tree": {}}

    assert ("matcher-tree", VHOST) in found(mutated(change))
