import copy
from pathlib import Path

import pytest
import yaml

from ext_proc.check_envoy import check, main

SHIPPED_DIR = Path(__file__).resolve().parents[1] / "envoy"
SHIPPED = yaml.safe_load((SHIPPED_DIR / "envoy.yaml").read_text())


def hcm(config):
    return config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]


def ext_proc(config):
    return hcm(config)["http_filters"][0]["typed_config"]


def routes(config):
    return hcm(config)["route_config"]["virtual_hosts"][0]["routes"]


def route(config, name):
    (found,) = [r for r in routes(config) if r["name"] == name]
    return found


def policy(config, name):
    return route(config, name)["metadata"]["filter_metadata"]["ext_proc.token_policy"]


def mint_mode(config):
    per_route = route(config, "prefill")["typed_per_filter_config"]["envoy.filters.http.ext_proc"]
    return per_route["overrides"]["processing_mode"]


PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"


def per_route(**config):
    return {"envoy.filters.http.ext_proc": {"@type": PER_ROUTE, **config}}


def test_shipped_config_is_clean():
    report = check(SHIPPED)
    assert (report.errors, report.warnings, report.routes) == ([], [], 7)
    # Among them: a mint route, an honor route, and direct responses without metadata
    # or the filter (the token endpoints), none of which is reported.
    assert policy(SHIPPED, "prefill")["action"] == "mint"
    assert policy(SHIPPED, "disaggregated")["action"] == "honor"
    direct = [r for r in routes(SHIPPED) if "direct_response" in r]
    assert len(direct) == 3
    assert all("metadata" not in r and "typed_per_filter_config" in r for r in direct)


@pytest.mark.parametrize("path", sorted(SHIPPED_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_is_clean(path):
    report = check(yaml.safe_load(path.read_text()))
    assert (report.errors, report.warnings) == ([], [])


def mutated(change):
    config = copy.deepcopy(SHIPPED)
    change(config)
    return check(config)


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (lambda c: ext_proc(c).update(failure_mode_allow=True), "failure_mode_allow"),
        (lambda c: ext_proc(c).update(observability_mode=True), "observability_mode"),
        (lambda c: ext_proc(c).update(allow_content_length_header=True), "content_length"),
        (lambda c: ext_proc(c)["processing_mode"].update(request_body_mode="STREAMED"), "STREAMED"),
        (lambda c: ext_proc(c)["request_attributes"].pop(), "SKIP needs"),
        (
            lambda c: ext_proc(c)["processing_mode"].update(
                request_body_mode="FULL_DUPLEX_STREAMED", request_trailer_mode="SKIP"
            ),
            "request_trailer_mode SEND",
        ),
        (lambda c: ext_proc(c)["request_attributes"].pop(0), "request_attributes lacks"),
        (
            lambda c: policy(c, "disaggregated").update(action="allow"),
            "ext_proc.token_policy.action",
        ),
        (
            lambda c: policy(c, "disaggregated").update(topolgy="aggregated"),
            "allowed fields",
        ),
        (
            lambda c: policy(c, "disaggregated").update(vocab_size=1.5),
            "vocab_size",
        ),
        (
            lambda c: route(c, "aggregated").update(
                typed_per_filter_config={
                    "envoy.filters.http.ext_proc": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3."
                        "ExtProcPerRoute",
                        "overrides": {"failure_mode_allow": True},
                    }
                }
            ),
            "fails open",
        ),
        (lambda c: hcm(c)["http_filters"].pop(0), "no ext_proc filter"),
        # A mint route whose response the processor never sees signs nothing.
        (
            lambda c: route(c, "prefill").pop("typed_per_filter_config"),
            "response is not processed",
        ),
        (lambda c: mint_mode(c).update(response_body_mode="NONE"), "response is not processed"),
        (
            lambda c: mint_mode(c).update(response_body_mode="STREAMED"),
            "response is not processed",
        ),
        (lambda c: mint_mode(c).pop("response_header_mode"), "response is not processed"),
        (
            lambda c: route(c, "prefill").update(typed_per_filter_config=per_route(disabled=True)),
            "response is not processed",
        ),
        # The override replaces the filter's whole mode: its request side is checked too.
        (lambda c: mint_mode(c).pop("request_body_mode"), "request_body_mode NONE"),
        # Overrides that fail open, wherever they sit, also inside a FilterConfig.
        (
            lambda c: route(c, "aggregated").update(
                typed_per_filter_config={
                    "envoy.filters.http.ext_proc": {
                        "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                        "config": per_route(overrides={"failure_mode_allow": True})[
                            "envoy.filters.http.ext_proc"
                        ],
                    }
                }
            ),
            "aggregated: envoy.filters.http.ext_proc overrides.failure_mode_allow",
        ),
        (
            lambda c: route(c, "prefill").update(
                typed_per_filter_config={
                    "envoy.filters.http.ext_proc": {
                        "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                        "disabled": True,
                    }
                }
            ),
            "response is not processed",
        ),
        (
            lambda c: route(c, "prefill")["typed_per_filter_config"]["envoy.filters.http.ext_proc"][
                "overrides"
            ].update(failure_mode_allow=True),
            "fails open",
        ),
        (
            lambda c: hcm(c)["route_config"]["virtual_hosts"][0].update(
                typed_per_filter_config=per_route(overrides={"failure_mode_allow": True})
            ),
            "virtual_host vllm: envoy.filters.http.ext_proc overrides.failure_mode_allow",
        ),
        (
            lambda c: hcm(c)["route_config"].update(
                typed_per_filter_config=per_route(overrides={"failure_mode_allow": True})
            ),
            "route_config: envoy.filters.http.ext_proc overrides.failure_mode_allow",
        ),
        (
            lambda c: route(c, "aggregated")["route"].update(
                weighted_clusters={
                    "clusters": [
                        {
                            "name": "aggregated",
                            "weight": 1,
                            "typed_per_filter_config": per_route(
                                overrides={"failure_mode_allow": True}
                            ),
                        }
                    ]
                }
            ),
            "aggregated: envoy.filters.http.ext_proc overrides.failure_mode_allow",
        ),
    ],
)
def test_problems_are_errors(change, text):
    report = mutated(change)
    assert any(text in error for error in report.errors), report.errors


def test_route_without_metadata_is_a_warning():
    (warning,) = warnings_of(lambda c: route(c, "disaggregated").pop("metadata"))
    assert "route vllm/disaggregated: no 'ext_proc.token_policy' metadata" in warning


NOT_INSPECTED = "no ext_proc filter runs on this forwarding route"


@pytest.mark.parametrize(
    "disable",
    [
        lambda r: r.update(typed_per_filter_config=per_route(disabled=True)),
        # The same through a FilterConfig wrapper.
        lambda r: r.update(
            typed_per_filter_config={
                "envoy.filters.http.ext_proc": {
                    "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                    "disabled": True,
                }
            }
        ),
    ],
    ids=["ExtProcPerRoute", "FilterConfig"],
)
def test_a_forwarding_route_without_the_filter_is_an_error(disable, tmp_path, capsys):
    # Its bodies, client-chosen ids included, would reach the upstream uninspected: the
    # check fails (exit 1), it does not merely warn.
    def change(config):
        disable(route(config, "aggregated"))

    report = mutated(change)
    (error,) = report.errors
    assert error.startswith("http_connection_manager[0] route vllm/aggregated: " + NOT_INSPECTED)
    assert "direct_response" in error
    assert not any(NOT_INSPECTED in w for w in report.warnings)
    config = copy.deepcopy(SHIPPED)
    change(config)
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(path) == 1
    out = capsys.readouterr().out
    assert f"error: http_connection_manager[0] route vllm/aggregated: {NOT_INSPECTED}" in out
    assert "FAILED" in out


def test_a_route_that_forwards_nothing_needs_no_filter():
    # The shipped token endpoints are direct responses with the filter disabled; a
    # redirect forwards nothing either.
    def change(config):
        entry = route(config, "aggregated")
        del entry["route"]
        entry["redirect"] = {"path_redirect": "/v1/"}
        entry["typed_per_filter_config"] = per_route(disabled=True)

    assert mutated(change).errors == []


def test_a_filter_disabled_by_default_runs_only_where_a_route_enables_it():
    # Envoy Gateway's pattern: every ext_proc filter is added disabled and enabled per
    # route, here through a FilterConfig wrapper.
    def enable_everywhere(config):
        hcm(config)["http_filters"][0]["disabled"] = True
        for entry in hcm(config)["route_config"]["virtual_hosts"][0]["routes"]:
            if "route" not in entry:
                continue
            own = entry.setdefault("typed_per_filter_config", {})
            inner = own.get("envoy.filters.http.ext_proc")
            wrapper = {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig"}
            if inner is not None:
                wrapper["config"] = inner
            own["envoy.filters.http.ext_proc"] = wrapper

    assert mutated(enable_everywhere).errors == []
    assert mutated(enable_everywhere).warnings == []

    def enable_nowhere(config):
        hcm(config)["http_filters"][0]["disabled"] = True
        for entry in hcm(config)["route_config"]["virtual_hosts"][0]["routes"]:
            entry.pop("typed_per_filter_config", None)

    report = mutated(enable_nowhere)
    assert {e.split(": ")[0] for e in report.errors if NOT_INSPECTED in e} == {
        f"http_connection_manager[0] route vllm/{name}"
        for name in ("prefill", "disaggregated", "aggregated", "default")
    }
    # ... and a mint route that no filter runs on signs nothing.
    assert any("response is not processed" in e for e in report.errors)


def warnings_of(change):
    report = mutated(change)
    assert report.errors == []
    return report.warnings


def test_honor_route_trusting_any_caller_is_a_warning():
    (warning,) = warnings_of(lambda c: policy(c, "disaggregated").update(trust_any_caller=True))
    assert "route vllm/disaggregated: trust_any_caller honors ids from any caller" in warning
    assert "only for routes nothing untrusted can reach" in warning


def test_honor_route_without_vocab_size_is_a_warning():
    (warning,) = warnings_of(lambda c: policy(c, "disaggregated").pop("vocab_size"))
    assert "route vllm/disaggregated: honor without vocab_size" in warning
    # A mint route needs none: what it honors is only what honor routes check again.
    assert warnings_of(lambda c: policy(c, "prefill").pop("vocab_size")) == []


def test_mint_route_may_take_the_response_mode_from_the_filter():
    def change(config):
        route(config, "prefill").pop("typed_per_filter_config")
        ext_proc(config)["processing_mode"].update(
            response_header_mode="SEND", response_body_mode="BUFFERED"
        )

    assert warnings_of(change) == []


def test_mint_route_may_take_the_response_mode_from_its_virtual_host():
    def change(config):
        overrides = route(config, "prefill").pop("typed_per_filter_config")
        hcm(config)["route_config"]["virtual_hosts"][0]["typed_per_filter_config"] = overrides

    assert warnings_of(change) == []


def test_a_route_disabling_the_filter_wins_over_its_virtual_host():
    def change(config):
        overrides = route(config, "prefill")["typed_per_filter_config"]
        hcm(config)["route_config"]["virtual_hosts"][0]["typed_per_filter_config"] = overrides
        route(config, "prefill")["typed_per_filter_config"] = per_route(disabled=True)

    report = mutated(change)
    assert any("prefill: action mint but the response is not processed" in e for e in report.errors)


def test_a_forwarding_route_is_reported_where_a_direct_response_is_not():
    def change(config):
        token_route = route(config, "token-endpoint-render")
        token_route["route"] = {"cluster": "aggregated"}
        del token_route["direct_response"]

    report = mutated(change)
    (error,) = report.errors
    assert "token-endpoint-render" in error
    assert NOT_INSPECTED in error
    (warning,) = report.warnings
    assert "token-endpoint-render: no 'ext_proc.token_policy' metadata" in warning
