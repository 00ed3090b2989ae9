"""A mint or honor route's body, decided once, reaches the upstreams once: no retry that
can follow a request an upstream read, no hedge, no mirror, at any level Envoy reads."""

import copy

import pytest

from tests.tools.check_envoy.shipped import HCM, at, clean, found, hcm, mutated, policy, route

RETRY = {"retry_on": "5xx", "num_retries": 1}
MIRROR = [{"cluster": "aggregated"}]
HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
HTTP_OPTIONS_TYPE = "type.googleapis.com/" + HTTP_OPTIONS


def _vhost(config):
    return hcm(config)["route_config"]["virtual_hosts"][0]


def _action(name):
    def change(config, **settings):
        route(config, name)["route"].update(settings)

    return change


def _cluster_options(name, **settings):
    def change(config):
        (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
        options = cluster.setdefault("typed_extension_protocol_options", {})
        options.setdefault(HTTP_OPTIONS, {"@type": HTTP_OPTIONS_TYPE}).update(settings)

    return change


HONOR, MINT = at("disaggregated"), at("prefill")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # Route level, on the honor and the mint route.
        (lambda c: _action("disaggregated")(c, retry_policy=RETRY), [("body-retried", HONOR)]),
        (lambda c: _action("prefill")(c, retry_policy=RETRY), [("body-retried", MINT)]),
        (
            lambda c: _action("disaggregated")(
                c, retry_policy_typed_config={"@type": "type.googleapis.com/x.Retry"}
            ),
            [("body-retried", HONOR)],
        ),
        (
            lambda c: _action("disaggregated")(c, hedge_policy={"hedge_on_per_try_timeout": True}),
            [("body-hedged", HONOR)],
        ),
        (
            lambda c: _action("disaggregated")(c, request_mirror_policies=MIRROR),
            [("body-mirrored", HONOR)],
        ),
        # Virtual host level: every mint and honor route under it.
        (
            lambda c: _vhost(c).update(retry_policy=RETRY),
            [("body-retried", f"{MINT} virtual_host"), ("body-retried", f"{HONOR} virtual_host")],
        ),
        (
            lambda c: _vhost(c).update(retry_policy_typed_config={"@type": "x"}),
            [("body-retried", f"{MINT} virtual_host"), ("body-retried", f"{HONOR} virtual_host")],
        ),
        (
            lambda c: _vhost(c).update(hedge_policy={"hedge_on_per_try_timeout": True}),
            [("body-hedged", f"{MINT} virtual_host"), ("body-hedged", f"{HONOR} virtual_host")],
        ),
        (
            lambda c: _vhost(c).update(request_mirror_policies=MIRROR),
            [
                ("body-mirrored", f"{MINT} virtual_host"),
                ("body-mirrored", f"{HONOR} virtual_host"),
            ],
        ),
        # Route configuration level (mirrors only).
        (
            lambda c: hcm(c)["route_config"].update(request_mirror_policies=MIRROR),
            [
                ("body-mirrored", f"{MINT} route_config"),
                ("body-mirrored", f"{HONOR} route_config"),
            ],
        ),
        # Cluster level (HttpProtocolOptions): the clusters the routes send to.
        (
            _cluster_options("disaggregated", retry_policy=RETRY),
            [("body-retried", f"{HONOR} cluster 'disaggregated'")],
        ),
        (
            _cluster_options("prefill", request_mirror_policies=MIRROR),
            [("body-mirrored", f"{MINT} cluster 'prefill'")],
        ),
    ],
    ids=[
        "route-retry-honor",
        "route-retry-mint",
        "route-retry-typed",
        "route-hedge",
        "route-mirror",
        "vhost-retry",
        "vhost-retry-typed",
        "vhost-hedge",
        "vhost-mirror",
        "route-config-mirror",
        "cluster-retry",
        "cluster-mirror",
    ],
)
def test_a_second_copy_of_a_decided_body_is_an_error(change, expected):
    report = mutated(change)
    assert found(report) == expected
    assert found(report, "warning") == []


@pytest.mark.parametrize(
    "change",
    [
        # Strip routes: a second copy of a stripped body spends no proof.
        lambda c: _action("aggregated")(c, retry_policy=RETRY, request_mirror_policies=MIRROR),
        lambda c: _action("default")(c, hedge_policy={"hedge_on_per_try_timeout": True}),
        _cluster_options("aggregated", retry_policy=RETRY, request_mirror_policies=MIRROR),
        # Retries that follow only requests no upstream read, or none at all.
        lambda c: _action("disaggregated")(
            c, retry_policy={"retry_on": "connect-failure,refused-stream,reset-before-request"}
        ),
        lambda c: _action("disaggregated")(c, retry_policy={"retry_on": "5xx", "num_retries": 0}),
        # The route's own policy replaces the virtual host's entirely.
        lambda c: (
            _vhost(c).update(retry_policy=RETRY),
            _action("prefill")(c, retry_policy={"retry_on": "connect-failure"}),
            _action("disaggregated")(c, retry_policy={"retry_on": "connect-failure"}),
        ),
        # A cluster's replaces the route's for the requests sent to it.
        lambda c: (
            _action("disaggregated")(c, retry_policy=RETRY),
            _cluster_options("disaggregated", retry_policy={"retry_on": "connect-failure"})(c),
        ),
        # An internal redirect runs the filter chain again: decided again, not replayed.
        lambda c: _action("disaggregated")(c, internal_redirect_policy={}),
    ],
    ids=[
        "strip-route",
        "strip-route-hedge",
        "strip-cluster",
        "unsent-only",
        "no-retries",
        "route-replaces-vhost",
        "cluster-replaces-route",
        "internal-redirect",
    ],
)
def test_what_resends_no_decided_body_passes(change):
    assert clean(mutated(change))


def test_a_cluster_chosen_per_request_may_be_any_cluster():
    def change(config):
        action = route(config, "disaggregated")["route"]
        del action["cluster"]
        action.update(cluster_header="x-cluster", retry_policy=RETRY)
        _cluster_options("aggregated", retry_policy={"retry_on": "connect-failure"})(config)

    # Refused (rules.closure); the route's retry still stands for the clusters without
    # a policy of their own.
    assert found(mutated(change)) == [("decided-cluster-chosen", HONOR), ("body-retried", HONOR)]


def _retry_headers(*names):
    return [{"header": {"key": name, "value": "1"}} for name in names]


RETRY_ADDED = _retry_headers("x-envoy-retry-on", "x-envoy-max-retries")


def _weighted(config):
    action = route(config, "disaggregated")["route"]
    name = action.pop("cluster")
    action["weighted_clusters"] = {
        "clusters": [{"name": name, "weight": 1, "request_headers_to_add": RETRY_ADDED}]
    }


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda c: route(c, "disaggregated").update(request_headers_to_add=RETRY_ADDED),
            [("retry-header-added", HONOR)],
        ),
        (
            lambda c: route(c, "prefill").update(
                request_headers_to_add=_retry_headers("X-Envoy-Hedge-On-Per-Try-Timeout")
            ),
            [("retry-header-added", MINT)],
        ),
        *(
            (
                lambda c, name=name: route(c, "disaggregated").update(
                    request_headers_to_add=_retry_headers(name)
                ),
                [("retry-header-added", HONOR)],
            )
            for name in (
                "x-envoy-retry-grpc-on",
                "x-envoy-retriable-status-codes",
                "x-envoy-retriable-header-names",
                "x-envoy-upstream-rq-per-try-timeout-ms",
            )
        ),
        (_weighted, [("retry-header-added", f"{HONOR} weighted_cluster 'disaggregated'")]),
        (
            lambda c: _vhost(c).update(request_headers_to_add=RETRY_ADDED),
            [
                ("retry-header-added", f"{MINT} virtual_host"),
                ("retry-header-added", f"{HONOR} virtual_host"),
            ],
        ),
        (
            lambda c: hcm(c)["route_config"].update(request_headers_to_add=RETRY_ADDED),
            [
                ("retry-header-added", f"{MINT} route_config"),
                ("retry-header-added", f"{HONOR} route_config"),
            ],
        ),
    ],
    ids=[
        "route-honor",
        "route-mint-any-case",
        "retry-grpc-on",
        "retriable-status-codes",
        "retriable-header-names",
        "per-try-timeout",
        "weighted-cluster",
        "vhost",
        "route-config",
    ],
)
def test_a_retry_header_added_to_a_decided_request_is_an_error(change, expected):
    report = mutated(change)
    assert found(report) == expected
    assert found(report, "warning") == []


@pytest.mark.parametrize(
    "change",
    [
        # A strip route may be retried.
        lambda c: route(c, "aggregated").update(request_headers_to_add=RETRY_ADDED),
        # Headers the router does not retry by.
        lambda c: route(c, "disaggregated").update(
            request_headers_to_add=_retry_headers("x-envoy-upstream-rq-timeout-ms", "x-retry")
        ),
        # Which address is judged, not which addresses are internal: with no
        # internal_address_config no request is internal.
        lambda c: hcm(c).update(use_remote_address=True, xff_num_trusted_hops=1),
    ],
    ids=["strip-route", "other-headers", "xff-trusted-hops"],
)
def test_what_adds_or_trusts_no_retry_header_passes(change):
    assert clean(mutated(change))


@pytest.mark.parametrize(
    "internal",
    [
        {"cidr_ranges": [{"address_prefix": "10.0.0.0", "prefix_len": 8}]},
        # Empty: RFC1918, RFC4193 and loopback addresses are internal.
        {},
        {"unix_sockets": True},
    ],
    ids=["cidr-ranges", "empty", "unix-sockets"],
)
def test_internal_addresses_on_a_deciding_manager_are_an_error(internal):
    report = mutated(lambda c: hcm(c).update(internal_address_config=internal))
    assert found(report) == [("retry-header-trusted", HCM)]


def test_internal_addresses_where_no_route_decides_pass():
    def change(config):
        hcm(config)["internal_address_config"] = {}
        for name in ("prefill", "disaggregated"):
            policy(config, name)["action"] = "strip"

    assert "retry-header-trusted" not in mutated(change).codes()


def test_a_decided_routes_cluster_from_cds_is_not_taken_as_replaying_nothing():
    """The honor route's cluster comes from CDS (not listed, route_config.validate_clusters
    false): its HttpProtocolOptions, retry_policy and request_mirror_policies included,
    are not seen here. envoy 1.40 --mode validate accepts the configuration; the check
    must not pass it as replaying nothing (as it refuses a processor cluster from CDS)."""

    def change(config):
        resources = config["static_resources"]
        (xds,) = [copy.deepcopy(c) for c in resources["clusters"] if c["name"] == "aggregated"]
        xds["name"] = "xds"
        xds["typed_extension_protocol_options"] = {
            HTTP_OPTIONS: {
                "@type": HTTP_OPTIONS_TYPE,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
        resources["clusters"] = [
            *(c for c in resources["clusters"] if c["name"] != "disaggregated"),
            xds,
        ]
        config["node"] = {"id": "node1", "cluster": "c1"}
        grpc = {"envoy_grpc": {"cluster_name": "xds"}}
        config["dynamic_resources"] = {
            "cds_config": {
                "resource_api_version": "V3",
                "api_config_source": {
                    "api_type": "GRPC",
                    "transport_api_version": "V3",
                    "grpc_services": [grpc],
                },
            }
        }
        hcm(config)["route_config"]["validate_clusters"] = False

    assert any(place.startswith(HONOR) for _, place in found(mutated(change)))


@pytest.mark.parametrize("weighted", [False, True], ids=["action", "weighted-cluster"])
def test_a_weighted_cluster_chosen_per_request_may_be_any_cluster(weighted):
    """A ClusterWeight's cluster_header lets the request name the cluster, as the
    action's does: envoy 1.40 --mode validate accepts both."""

    def change(config):
        action = route(config, "disaggregated")["route"]
        del action["cluster"]
        if weighted:
            action["weighted_clusters"] = {
                "clusters": [{"cluster_header": "x-cluster", "weight": 100}]
            }
        else:
            action["cluster_header"] = "x-cluster"
        _cluster_options(
            "aggregated", retry_policy=RETRY, explicit_http_config={"http_protocol_options": {}}
        )(config)

    chosen = f"{HONOR} weighted_cluster #0" if weighted else HONOR
    assert found(mutated(change)) == [
        ("decided-cluster-chosen", chosen),
        ("body-retried", f"{HONOR} cluster 'aggregated'"),
    ]
