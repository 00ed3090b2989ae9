"""A forwarding route runs this processor's filter, its policy metadata is valid, a mint
route's response reaches the processor, and the metadata states the route's rewrite."""

import copy

import pytest

from ext_proc.tools.check_envoy import check
from tests.tools.check_envoy.shipped import (
    EXT_PROC,
    FILTER_CONFIG,
    PER_ROUTE,
    SHIPPED,
    at,
    ext_proc,
    ext_proc_index,
    found,
    hcm,
    mint_mode,
    mutated,
    per_route,
    policy,
    route,
    routes,
    split,
)

FORWARDING = ("prefill", "disaggregated", "aggregated", "default")


@pytest.mark.parametrize(
    "disable",
    [
        per_route(disabled=True),
        {EXT_PROC: {"@type": FILTER_CONFIG, "disabled": True}},
    ],
    ids=["ExtProcPerRoute", "FilterConfig"],
)
def test_a_forwarding_route_without_the_filter_is_an_error(disable):
    # Its bodies, client-chosen ids included, would reach the upstream uninspected: the
    # check fails, it does not merely warn.
    report = mutated(lambda c: route(c, "aggregated").update(typed_per_filter_config=disable))
    assert found(report) == [("ext-proc-not-running", at("aggregated"))]
    assert found(report, "warning") == []


def test_a_route_that_forwards_nothing_needs_no_filter():
    # The shipped token endpoints are direct responses with the filter disabled; a
    # redirect forwards nothing either.
    def change(config):
        entry = route(config, "aggregated")
        del entry["route"]
        entry["redirect"] = {"path_redirect": "/v1/"}
        entry["typed_per_filter_config"] = per_route(disabled=True)

    assert mutated(change).findings == ()


def test_a_filter_disabled_by_default_runs_only_where_a_route_enables_it():
    # Envoy Gateway's pattern: every ext_proc filter is added disabled and enabled per
    # route, here through a FilterConfig wrapper.
    def enable_everywhere(config):
        hcm(config)["http_filters"][ext_proc_index(config)]["disabled"] = True
        for entry in routes(config):
            if "route" not in entry:
                continue
            own = entry.setdefault("typed_per_filter_config", {})
            inner = own.get(EXT_PROC)
            wrapper = {"@type": FILTER_CONFIG}
            if inner is not None:
                wrapper["config"] = inner
            own[EXT_PROC] = wrapper

    assert mutated(enable_everywhere).findings == ()

    def enable_nowhere(config):
        hcm(config)["http_filters"][ext_proc_index(config)]["disabled"] = True
        for entry in routes(config):
            entry.pop("typed_per_filter_config", None)

    report = mutated(enable_nowhere)
    # ... and a mint route that no filter runs on signs nothing.
    assert found(report) == [
        ("ext-proc-not-running", at("prefill")),
        ("mint-response-unseen", at("prefill")),
        *[("ext-proc-not-running", at(name)) for name in FORWARDING[1:]],
    ]


def test_a_weighted_cluster_that_disables_the_filter_is_an_error():
    def change(config):
        split(config, "aggregated", {EXT_PROC: {"@type": PER_ROUTE, "disabled": True}})

    assert found(mutated(change)) == [("ext-proc-off-for-cluster", at("aggregated"))]


def test_a_forwarding_route_is_reported_where_a_direct_response_is_not():
    def change(config):
        token_route = route(config, "token-endpoint-render")
        token_route["route"] = {"cluster": "aggregated"}
        del token_route["direct_response"]

    report = mutated(change)
    assert found(report) == [
        ("ext-proc-not-running", at("token-endpoint-render")),
        # Its paths ("/render/flush_cache"...) reach no route's own 404s.
        ("refused-endpoint-forwarded", at("token-endpoint-render")),
    ]
    assert found(report, "warning") == [("policy-missing", at("token-endpoint-render"))]


# --- the policy metadata ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        lambda c: policy(c, "disaggregated").update(action="allow"),
        lambda c: policy(c, "disaggregated").update(topolgy="aggregated"),
        lambda c: policy(c, "disaggregated").update(vocab_size=1.5),
    ],
    ids=["value", "field", "type"],
)
def test_invalid_metadata_is_an_error(change):
    assert found(mutated(change)) == [("policy-invalid", at("disaggregated"))]


def test_an_unknown_metadata_field_is_named():
    report = mutated(lambda c: policy(c, "disaggregated").update(topolgy="aggregated"))
    (text,) = report.errors
    assert "unknown field 'ext_proc.token_policy.topolgy'" in text


def test_metadata_that_is_not_a_mapping_is_an_error():
    def change(config):
        route(config, "aggregated")["metadata"]["filter_metadata"]["ext_proc.token_policy"] = "x"

    assert found(mutated(change)) == [("policy-not-mapping", at("aggregated"))]


@pytest.mark.parametrize(
    ("change", "code", "name"),
    [
        (lambda c: route(c, "disaggregated").pop("metadata"), "policy-missing", "disaggregated"),
        (
            lambda c: policy(c, "disaggregated").update(trust_any_caller=True),
            "trust-any-caller",
            "disaggregated",
        ),
        (
            lambda c: policy(c, "disaggregated").pop("vocab_size"),
            "vocab-size-missing",
            "disaggregated",
        ),
    ],
)
def test_warnings(change, code, name):
    report = mutated(change)
    assert (found(report), found(report, "warning")) == ([], [(code, at(name))])


def test_a_mint_route_needs_no_vocab_size():
    # What it honors is only what honor routes check again.
    assert mutated(lambda c: policy(c, "prefill").pop("vocab_size")).findings == ()


# --- a mint route's response -----------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        lambda c: route(c, "prefill").pop("typed_per_filter_config"),
        lambda c: mint_mode(c).update(response_body_mode="NONE"),
        lambda c: mint_mode(c).update(response_body_mode="STREAMED"),
        lambda c: mint_mode(c).pop("response_header_mode"),
    ],
    ids=["no-override", "no-body", "streamed-body", "no-headers"],
)
def test_a_mint_route_whose_response_is_not_processed_is_an_error(change):
    assert found(mutated(change)) == [("mint-response-unseen", at("prefill"))]


@pytest.mark.parametrize(
    "disable",
    [per_route(disabled=True), {EXT_PROC: {"@type": FILTER_CONFIG, "disabled": True}}],
    ids=["ExtProcPerRoute", "FilterConfig"],
)
def test_a_mint_route_without_the_filter_signs_nothing(disable):
    report = mutated(lambda c: route(c, "prefill").update(typed_per_filter_config=disable))
    assert found(report) == [
        ("ext-proc-not-running", at("prefill")),
        ("mint-response-unseen", at("prefill")),
    ]


def test_mint_route_may_take_the_response_mode_from_the_filter():
    def change(config):
        route(config, "prefill").pop("typed_per_filter_config")
        ext_proc(config)["processing_mode"].update(
            response_header_mode="SEND", response_body_mode="BUFFERED"
        )

    assert mutated(change).findings == ()


def test_mint_route_may_take_the_response_mode_from_its_virtual_host():
    def change(config):
        overrides = route(config, "prefill").pop("typed_per_filter_config")
        hcm(config)["route_config"]["virtual_hosts"][0]["typed_per_filter_config"] = overrides

    assert mutated(change).findings == ()


def test_a_route_disabling_the_filter_wins_over_its_virtual_host():
    def change(config):
        overrides = route(config, "prefill")["typed_per_filter_config"]
        hcm(config)["route_config"]["virtual_hosts"][0]["typed_per_filter_config"] = overrides
        route(config, "prefill")["typed_per_filter_config"] = per_route(disabled=True)

    assert ("mint-response-unseen", at("prefill")) in found(mutated(change))


# --- a route's rewrite, as the processor must know it ----------------------------------------


def unstated(name):
    def change(config):
        for key in ("match_prefix", "prefix_rewrite"):
            policy(config, name).pop(key)

    return change


@pytest.mark.parametrize("name", ["prefill", "disaggregated"])
def test_mint_and_honor_routes_must_state_their_rewrite(name):
    assert found(mutated(unstated(name))) == [("rewrite-unstated", at(name))]


@pytest.mark.parametrize(
    ("fields", "rewrite"),
    [
        ({"match_prefix": "/pd/", "prefix_rewrite": "/"}, "/v1/"),
        ({"match_prefix": "/pd/v1/", "prefix_rewrite": "/v1/"}, "/v2/"),
    ],
)
def test_a_stated_rewrite_must_be_the_routes(fields, rewrite):
    def change(config):
        policy(config, "disaggregated").update(fields)
        route(config, "disaggregated")["route"]["prefix_rewrite"] = rewrite

    assert found(mutated(change)) == [("rewrite-misstated", at("disaggregated"))]


def test_a_stated_rewrite_the_route_does_not_make_is_an_error():
    def change(config):
        policy(config, "aggregated").update(match_prefix="/v1/", prefix_rewrite="/v2/")

    assert found(mutated(change)) == [("rewrite-stated-not-made", at("aggregated"))]


@pytest.mark.parametrize(
    "match",
    [{"path": "/pd/v1/chat/completions"}, {"safe_regex": {"regex": "/pd/v1/.*"}}],
    ids=["path", "safe_regex"],
)
def test_a_rewrite_of_a_matcher_that_is_not_a_prefix_is_an_error_on_honor(match):
    report = mutated(lambda c: route(c, "disaggregated").update(match=match))
    assert ("rewrite-unfollowed", at("disaggregated")) in found(report)


def test_a_strip_route_with_an_unstated_rewrite_is_a_warning():
    report = mutated(lambda c: route(c, "aggregated")["route"].update(prefix_rewrite="/v1/x/"))
    assert (found(report), found(report, "warning")) == (
        [],
        [("rewrite-unstated", at("aggregated"))],
    )


def test_a_path_separated_prefix_rewrite_is_followed():
    # As Envoy Gateway and Istio write a Gateway API PathPrefix and ReplacePrefixMatch.
    def change(config):
        entry = route(config, "disaggregated")
        entry["match"] = {"path_separated_prefix": "/pd/v1"}
        entry["route"]["prefix_rewrite"] = "/v1"
        policy(config, "disaggregated").update(match_prefix="/pd/v1", prefix_rewrite="/v1")

    assert mutated(change).findings == ()


@pytest.mark.parametrize("name", ["aggregated", "disaggregated"])
def test_a_regex_rewrite_is_an_error_on_any_forwarding_route(name):
    # Nobody can tell where it sends a path: /legacy/inference/v1/generate, say. Said
    # once, by the token path rule, not again by the metadata's.
    def change(config):
        entry = route(config, name)
        entry["route"].pop("prefix_rewrite", None)
        entry["route"]["regex_rewrite"] = {"pattern": {"regex": "^/legacy/"}, "substitution": "/"}

    assert found(mutated(change)) == [("rewrite-unreadable", at(name))]


def test_the_end_to_end_stacks_routes_state_their_own_rewrites():
    # tests/e2e/stack.py puts test routes before the shipped forwarding ones, after the
    # token endpoint 404s: each states its own prefix and rewrite.
    from tests.e2e import stack  # noqa: PLC0415 - the end-to-end helpers, not needed above

    config = copy.deepcopy(SHIPPED)
    added = stack.extra_routes()
    stack.add_routes(routes(config), added)
    for entry in added:
        fields = entry.get("metadata", {}).get("filter_metadata", {}).get("ext_proc.token_policy")
        if fields is not None:
            assert fields["match_prefix"] == entry["match"]["prefix"], entry["name"]
            assert fields["prefix_rewrite"] == entry["route"]["prefix_rewrite"], entry["name"]
    # Only the routes whose metadata is invalid on purpose (bad-*) are errors, and the
    # test routes' refused endpoints: the stack adds no 404s for them, so the processor's
    # own refusal of a body is what the e2e tier meets there.
    report = check(config)
    invalid = {place for code, place in found(report) if code == "policy-invalid"}
    refused = {
        place.split("/")[-1]
        for code, place in found(report)
        if code == "refused-endpoint-forwarded"
    }
    assert refused <= {entry["name"] for entry in added}
    assert [
        f for f in found(report) if f[0] not in {"policy-invalid", "refused-endpoint-forwarded"}
    ] == []
    assert invalid
    assert all(place.split("/")[-1].startswith("bad-") for place in invalid)


def _scoped(config):
    """A shared gateway's wiring: the filter disabled by default and enabled on every
    forwarding route but ``default``, which goes to a cluster of its own."""
    hcm(config)["http_filters"][ext_proc_index(config)]["disabled"] = True
    for entry in routes(config):
        if "route" not in entry or entry.get("name") == "default":
            continue
        own = entry.setdefault("typed_per_filter_config", {})
        own[EXT_PROC] = {"@type": FILTER_CONFIG, "config": own.get(EXT_PROC, {})}
    clusters = config["static_resources"]["clusters"]
    other = copy.deepcopy(clusters[-1])
    other["name"] = other["load_assignment"]["cluster_name"] = "other"
    clusters.append(other)
    route(config, "default")["route"]["cluster"] = "other"


def test_a_route_a_scoped_wiring_leaves_out_is_told_not_refused():
    report = mutated(_scoped)
    assert found(report) == []
    assert found(report, "warning") == [("route-unpoliced", at("default"))]


def test_a_route_a_scoped_wiring_leaves_out_may_not_reach_a_policed_cluster():
    def change(config):
        _scoped(config)
        route(config, "default")["route"]["cluster"] = route(config, "aggregated")["route"][
            "cluster"
        ]

    assert found(mutated(change)) == [("ext-proc-not-running", at("default"))]


def _istio_named(config, pool: str, other: str) -> None:
    """``_scoped`` with the aggregated pool's cluster named as istiod names a Service's
    (``pool``) and the left-out route's cluster ``other``, a cluster of its own."""
    _scoped(config)
    old = route(config, "aggregated")["route"]["cluster"]
    for entry in routes(config):
        if entry.get("route", {}).get("cluster") == old:
            entry["route"]["cluster"] = pool
    clusters = config["static_resources"]["clusters"]
    for cluster in clusters:
        if cluster["name"] == old:
            cluster["name"] = cluster["load_assignment"]["cluster_name"] = pool
        if cluster["name"] == "other":
            cluster["name"] = cluster["load_assignment"]["cluster_name"] = other
    route(config, "default")["route"]["cluster"] = other


@pytest.mark.parametrize(
    "other",
    [
        "outbound|8000|v2|decode.team-a.svc.cluster.local",  # a subset of the same Service
        "outbound|8001||decode.team-a.svc.cluster.local",  # another port of it
    ],
)
def test_a_route_a_scoped_wiring_leaves_out_may_not_reach_a_policed_service(other):
    """istiod names a cluster by the Service's port, subset and host: another port or a
    subset of a policed route's Service reaches the same pods under another name."""
    pool = "outbound|8000||decode.team-a.svc.cluster.local"
    report = mutated(lambda config: _istio_named(config, pool, other))
    assert found(report) == [("ext-proc-not-running", at("default"))]


def test_a_route_a_scoped_wiring_leaves_out_may_reach_another_service():
    pool = "outbound|8000||decode.team-a.svc.cluster.local"
    other = "outbound|8000||web.team-b.svc.cluster.local"
    report = mutated(lambda config: _istio_named(config, pool, other))
    assert found(report) == []
    assert found(report, "warning") == [("route-unpoliced", at("default"))]
