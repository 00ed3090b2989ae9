"""One message per request: a buffer filter after this processor's holds the request
until the decision, at the route's own limit."""

import pytest
import yaml

from ext_proc.tools.check_envoy import check
from tests.tools.check_envoy.shipped import (
    BUFFER,
    BUFFER_PER_ROUTE,
    EXT_PROC,
    FILTER_CONFIG,
    PER_ROUTE,
    SHIPPED,
    SHIPPED_DIR,
    at,
    ext_proc,
    filter_names,
    found,
    hcm,
    mutated,
    route,
    routes,
)

FORWARDING = [r["name"] for r in routes(SHIPPED) if "route" in r]


def _move_hold_before_ext_proc(config):
    filters = hcm(config)["http_filters"]
    filters.insert(0, filters.pop(filter_names(config).index(BUFFER)))


def _hold(config, name, value):
    route(config, name)["typed_per_filter_config"][BUFFER] = value


def _off_by_default(config):
    hcm(config)["http_filters"][filter_names(config).index(BUFFER)]["disabled"] = True
    for entry in routes(config):
        entry.get("typed_per_filter_config", {}).pop(BUFFER, None)


@pytest.mark.parametrize(
    ("change", "held"),
    [
        # No buffer filter: every forwarding route opens the upstream before the decision.
        (lambda c: hcm(c)["http_filters"].pop(filter_names(c).index(BUFFER)), []),
        # Before ext_proc it holds the request for nothing: ext_proc still passes the
        # headers on to the router first.
        (_move_hold_before_ext_proc, []),
        # Off on one route, by its own settings or a FilterConfig wrapper.
        (
            lambda c: _hold(c, "aggregated", {"@type": BUFFER_PER_ROUTE, "disabled": True}),
            ["prefill", "disaggregated", "default"],
        ),
        (
            lambda c: _hold(c, "default", {"@type": FILTER_CONFIG, "disabled": True}),
            ["prefill", "disaggregated", "aggregated"],
        ),
        # Off by default and not enabled on the routes.
        (_off_by_default, []),
    ],
    ids=["absent", "before-ext-proc", "off-on-a-route", "off-by-wrapper", "off-by-default"],
)
def test_one_message_without_a_hold_is_an_error(change, held):
    expected = [("hold-missing", at(name)) for name in FORWARDING if name not in held]
    assert found(mutated(change)) == expected


def test_a_hold_enabled_by_an_empty_wrapper_counts():
    def change(config):
        hcm(config)["http_filters"][filter_names(config).index(BUFFER)]["disabled"] = True
        for entry in routes(config):
            if "route" in entry:
                entry["typed_per_filter_config"][BUFFER] = {"@type": FILTER_CONFIG}

    # The filter's own max_request_bytes then replaces each route's limit: equal here.
    assert mutated(change).findings == ()


def _hold_limit(limit):
    return lambda c: _hold(
        c, "aggregated", {"@type": BUFFER_PER_ROUTE, "buffer": {"max_request_bytes": limit}}
    )


def test_a_hold_below_the_routes_limit_is_a_warning():
    report = mutated(_hold_limit(1024))
    assert (found(report), found(report, "warning")) == (
        [],
        [("hold-limit-lowered", at("aggregated"))],
    )


def test_a_hold_above_the_routes_limit_is_an_error():
    # The hold sets the stream's limit: Envoy would buffer a GiB where the route says 16 MiB.
    assert found(mutated(_hold_limit(1 << 30))) == [("hold-limit-raised", at("aggregated"))]


def test_a_hold_on_a_route_without_a_limit_is_an_error():
    report = mutated(lambda c: route(c, "aggregated").pop("request_body_buffer_limit"))
    assert found(report) == [("hold-limit-unstated", at("aggregated"))]


def weighted(config, name, inner):
    """Route ``name`` split over one weighted cluster with ``inner`` as its own
    typed_per_filter_config."""
    action = route(config, name)["route"]
    cluster = action.pop("cluster")
    action["weighted_clusters"] = {
        "clusters": [{"name": cluster, "weight": 1, "typed_per_filter_config": inner}]
    }


CLUSTER = f"{at('disaggregated')} weighted cluster 'disaggregated'"


def test_a_weighted_cluster_that_turns_the_hold_off_is_an_error():
    off = {BUFFER: {"@type": BUFFER_PER_ROUTE, "disabled": True}}
    assert found(mutated(lambda c: weighted(c, "disaggregated", off))) == [
        ("hold-missing", CLUSTER)
    ]


def test_a_weighted_cluster_that_raises_the_limit_is_an_error():
    raised = {BUFFER: {"@type": BUFFER_PER_ROUTE, "buffer": {"max_request_bytes": 1 << 30}}}
    assert found(mutated(lambda c: weighted(c, "disaggregated", raised))) == [
        ("hold-limit-raised", CLUSTER)
    ]


def test_two_messages_need_no_hold():
    two = yaml.safe_load((SHIPPED_DIR / "envoy-two-message.yaml").read_text())
    assert BUFFER not in filter_names(two)
    assert check(two).findings == ()
    # A route that overrides the mode to one message needs one.
    mode = route(two, "aggregated").setdefault("typed_per_filter_config", {})
    mode[EXT_PROC] = {
        "@type": PER_ROUTE,
        "overrides": {
            "processing_mode": {**ext_proc(two)["processing_mode"], "request_header_mode": "SKIP"}
        },
    }
    ext_proc(two)["request_attributes"] = ext_proc(SHIPPED)["request_attributes"]
    assert found(check(two)) == [("hold-missing", at("aggregated"))]
