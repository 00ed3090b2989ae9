"""This processor's filter and its overrides fail closed; other ext_proc filters run
after the decision; per-route configurations name a filter of the chain."""

import copy

import pytest

from ext_proc.edge.attributes import HEADERS, TRACE_HEADERS
from ext_proc.tools.check_envoy import check
from tests.tools.check_envoy.shipped import (
    BUFFER,
    EXT_PROC,
    EXT_PROC_TYPE,
    FILTER_CONFIG,
    HCM,
    OURS,
    SHIPPED,
    VHOST,
    at,
    ext_proc,
    ext_proc_index,
    filter_names,
    found,
    hcm,
    mint_mode,
    mutated,
    per_route,
    route,
)

OVERRIDES = f"{at('prefill')} {EXT_PROC} overrides"
FAILS_OPEN = per_route(overrides={"failure_mode_allow": True})


def _weighted_fail_open(config):
    route(config, "aggregated")["route"].update(
        weighted_clusters={
            "clusters": [{"name": "aggregated", "weight": 1, "typed_per_filter_config": FAILS_OPEN}]
        }
    )


def _mint_override_fails_open(config):
    route(config, "prefill")["typed_per_filter_config"][EXT_PROC]["overrides"].update(
        failure_mode_allow=True
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda c: ext_proc(c).update(failure_mode_allow=True),
            [("failure-mode-allow", OURS)],
        ),
        (
            lambda c: ext_proc(c).update(observability_mode=True),
            [("observability-mode", OURS)],
        ),
        (
            lambda c: ext_proc(c).update(allow_content_length_header=True),
            [("content-length-allowed", OURS)],
        ),
        (
            lambda c: ext_proc(c).update(disable_immediate_response=True),
            [("refusals-dropped", OURS)],
        ),
        (
            lambda c: ext_proc(c)["processing_mode"].update(request_body_mode="STREAMED"),
            [("body-not-inspected", OURS), ("one-message-incomplete", OURS)],
        ),
        # A header attribute missing: the filter and the mint route's override (which
        # skips the headers too) both need it.
        (
            lambda c: ext_proc(c)["request_attributes"].remove(HEADERS["x-request-id"]),
            [("one-message-incomplete", OURS), ("one-message-incomplete", OVERRIDES)],
        ),
        (
            lambda c: ext_proc(c)["processing_mode"].update(
                request_body_mode="FULL_DUPLEX_STREAMED", request_trailer_mode="SKIP"
            ),
            [("one-message-incomplete", OURS), ("streamed-without-trailers", OURS)],
        ),
        (
            lambda c: ext_proc(c)["request_attributes"].pop(0),
            [("attributes-missing", OURS)],
        ),
        # The override replaces the filter's whole mode: its request side is checked too.
        (
            lambda c: mint_mode(c).pop("request_body_mode"),
            [("body-not-inspected", OVERRIDES), ("one-message-incomplete", OVERRIDES)],
        ),
        # Overrides that fail open, wherever they sit, also inside a FilterConfig.
        (
            lambda c: route(c, "aggregated").update(typed_per_filter_config=FAILS_OPEN),
            [("override-fails-open", at("aggregated"))],
        ),
        (
            lambda c: route(c, "aggregated").update(
                typed_per_filter_config={
                    EXT_PROC: {"@type": FILTER_CONFIG, "config": FAILS_OPEN[EXT_PROC]}
                }
            ),
            [("override-fails-open", at("aggregated"))],
        ),
        (_mint_override_fails_open, [("override-fails-open", at("prefill"))]),
        (
            lambda c: hcm(c)["route_config"]["virtual_hosts"][0].update(
                typed_per_filter_config=FAILS_OPEN
            ),
            [("override-fails-open", VHOST)],
        ),
        (
            lambda c: hcm(c)["route_config"].update(typed_per_filter_config=FAILS_OPEN),
            [("override-fails-open", f"{HCM} route_config")],
        ),
        (_weighted_fail_open, [("override-fails-open", at("aggregated"))]),
    ],
)
def test_a_filter_or_override_that_fails_open_is_an_error(change, expected):
    report = mutated(change)
    assert found(report) == expected
    assert found(report, "warning") == []


def test_a_filter_without_the_trace_headers_passes():
    """The trace context and the client's request id are for the span alone: a filter
    that does not request them decides the same."""

    def change(config):
        for key in TRACE_HEADERS.values():
            ext_proc(config)["request_attributes"].remove(key)

    report = mutated(change)
    assert found(report) == []
    assert found(report, "warning") == []


def test_a_per_route_config_under_the_types_name_is_an_error():
    # The 404s' disable keyed by the filter's type: Envoy looks per-route configs up by
    # the filter's name only, so the processor still runs on them.
    def change(config):
        configs = route(config, "token-endpoint-echo")["typed_per_filter_config"]
        configs[EXT_PROC_TYPE.removeprefix("type.googleapis.com/")] = configs.pop(EXT_PROC)

    assert found(mutated(change)) == [("per-route-name-unknown", HCM)]


# --- other ext_proc filters -------------------------------------------------------------------

# An endpoint picker's filter: another service, failing open, none of our attributes;
# declared (it changes the request after the decision by design), kept off the path.
PICKER = {
    "name": "picker",
    "typed_config": {
        "@type": EXT_PROC_TYPE,
        "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}},
        "failure_mode_allow": True,
        "processing_mode": {"request_body_mode": "FULL_DUPLEX_STREAMED"},
        "mutation_rules": {"disallow_system": True},
    },
}
DECLARED = frozenset({"picker"})


def picker(*, fails_open):
    entry = copy.deepcopy(PICKER)
    entry["typed_config"]["failure_mode_allow"] = fails_open
    return entry


def after_hold(config):
    return filter_names(config).index(BUFFER) + 1


def test_another_services_filter_after_the_hold_is_left_to_its_service():
    report = mutated(
        lambda c: hcm(c)["http_filters"].insert(after_hold(c), picker(fails_open=True)), DECLARED
    )
    # Failing open is its own service's business, but worth saying.
    assert (found(report), found(report, "warning")) == ([], [("other-ext-proc-fails-open", HCM)])
    closed = picker(fails_open=False)
    insert = lambda c: hcm(c)["http_filters"].insert(after_hold(c), closed)  # noqa: E731
    assert mutated(insert, DECLARED).findings == ()


@pytest.mark.parametrize(
    ("position", "code"),
    [(EXT_PROC, "other-ext-proc-first"), (BUFFER, "other-ext-proc-before-hold")],
    ids=["before-ours", "before-the-hold"],
)
def test_another_services_filter_before_the_decision_is_an_error(position, code):
    def change(config):
        hcm(config)["http_filters"].insert(
            filter_names(config).index(position), picker(fails_open=False)
        )

    # Before ours it runs after the header step too, and its server may write carriers.
    first = code == "other-ext-proc-first"
    writes = [("header-rewritten-by-filter", f"{HCM} filter picker")] if first else []
    assert found(mutated(change, DECLARED)) == [(code, HCM), *writes]


def test_a_filter_asking_only_for_generic_attributes_is_not_ours():
    # The route name and path are anyone's to ask for: only the route metadata fields
    # make a filter this processor's.
    entry = picker(fails_open=False)
    entry["typed_config"]["request_attributes"] = ["xds.route_name", "request.url_path"]
    insert = lambda c: hcm(c)["http_filters"].insert(after_hold(c), entry)  # noqa: E731
    assert mutated(insert, DECLARED).findings == ()


def test_a_chain_with_only_another_services_filter_is_an_error():
    def change(config):
        filters = hcm(config)["http_filters"]
        filters[:] = [copy.deepcopy(PICKER), filters[-1]]

    (finding,) = mutated(change).findings
    assert (finding.code, finding.place, finding.severity) == ("ext-proc-missing", HCM, "error")


def test_without_this_processors_filter_nothing_else_is_checked():
    report = mutated(lambda c: hcm(c)["http_filters"].pop(ext_proc_index(c)))
    assert found(report) == [("ext-proc-missing", HCM)]
    assert report.routes == 0


# --- the cluster the filter reaches the processor through ---------------------------------


def _cluster_renamed(config):
    ext_proc(config)["grpc_service"]["envoy_grpc"]["cluster_name"] = "ext_proc_typo"


def _cluster_from_cds(config):
    _cluster_renamed(config)
    config["dynamic_resources"] = {"cds_config": {"ads": {}}}


def _google_grpc(config):
    ext_proc(config)["grpc_service"] = {
        "google_grpc": {"target_uri": "127.0.0.1:50051", "stat_prefix": "ext_proc"}
    }


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (_cluster_renamed, [("processor-cluster-missing", OURS)]),
        (_cluster_from_cds, [("processor-cluster-unseen", OURS)]),
        (_google_grpc, []),
    ],
    ids=["missing", "from-cds", "google-grpc"],
)
def test_the_processors_cluster_is_a_static_cluster(change, expected):
    assert found(mutated(change)) == expected


def test_a_document_that_is_no_bootstrap_lists_no_cluster_to_check():
    config = copy.deepcopy(SHIPPED)
    _cluster_renamed(config)
    (listener,) = config["static_resources"]["listeners"]
    assert check(listener).errors == []  # a listener alone: its clusters are elsewhere


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda c: ext_proc(c).update(failureModeAllow=True), "failure-mode-allow"),
        (lambda c: ext_proc(c).update(observabilityMode=True), "observability-mode"),
    ],
    ids=["failureModeAllow", "observabilityMode"],
)
def test_a_filter_that_fails_open_by_json_names_is_refused(change, code):
    """Envoy parses the filter's fields by their JSON names too: ``failureModeAllow:
    true`` forwards every request uninspected (no cache_salt written on a tenant route)
    while the processor is down or slow."""
    config = copy.deepcopy(SHIPPED)
    change(config)
    assert (code, OURS) in [(f.code, f.place) for f in check(config).findings]


# --- an override's grpc_service -----------------------------------------------------------


def _service(cluster=None, **grpc):
    return {"envoy_grpc": {"cluster_name": cluster}, **grpc} if cluster else grpc


def _honor_served_by(service, level="route"):
    """An edit: the honor route's requests (or its virtual host's) sent elsewhere by an
    ExtProcPerRoute override (the audit's canary processor)."""

    def change(config):
        config["static_resources"]["clusters"].append(
            {**copy.deepcopy(config["static_resources"]["clusters"][0]), "name": "canary"}
        )
        holder = route(config, "disaggregated")
        if level == "vhost":
            holder = hcm(config)["route_config"]["virtual_hosts"][0]
        holder.setdefault("typed_per_filter_config", {}).update(
            per_route(overrides={"grpc_service": service})
        )

    return change


@pytest.mark.parametrize(
    ("change", "place"),
    [
        (_honor_served_by(_service("canary")), at("disaggregated")),
        (_honor_served_by(_service("canary"), level="vhost"), VHOST),
        (
            _honor_served_by(_service(google_grpc={"target_uri": "canary:50051"})),
            at("disaggregated"),
        ),
    ],
    ids=["another-cluster", "virtual-host", "google-grpc"],
)
def test_an_override_naming_another_service_is_an_error(change, place):
    assert found(mutated(change)) == [("override-grpc-service", f"{place} {EXT_PROC}")]


def test_an_override_naming_the_filters_own_cluster_passes():
    service = _service("ext_proc", timeout="2s")
    assert found(mutated(_honor_served_by(service))) == []
