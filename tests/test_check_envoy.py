import copy
from pathlib import Path

import pytest
import yaml

from ext_proc.check_envoy import check

SHIPPED = yaml.safe_load((Path(__file__).resolve().parents[1] / "envoy" / "envoy.yaml").read_text())


def hcm(config):
    return config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]


def ext_proc(config):
    return hcm(config)["http_filters"][0]["typed_config"]


def routes(config):
    return hcm(config)["route_config"]["virtual_hosts"][0]["routes"]


def test_shipped_config_is_clean():
    report = check(SHIPPED)
    assert (report.errors, report.warnings, report.routes) == ([], [], 3)


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
        (lambda c: ext_proc(c)["processing_mode"].update(request_header_mode="SKIP"), "SKIP needs"),
        (
            lambda c: ext_proc(c)["processing_mode"].update(
                request_body_mode="FULL_DUPLEX_STREAMED", request_trailer_mode="SKIP"
            ),
            "request_trailer_mode SEND",
        ),
        (lambda c: ext_proc(c)["request_attributes"].pop(0), "request_attributes lacks"),
        (
            lambda c: routes(c)[0]["metadata"]["filter_metadata"]["ext_proc.token_policy"].update(
                action="allow"
            ),
            "ext_proc.token_policy.action",
        ),
        (
            lambda c: routes(c)[0]["metadata"]["filter_metadata"]["ext_proc.token_policy"].update(
                topolgy="aggregated"
            ),
            "allowed fields",
        ),
        (
            lambda c: routes(c)[0]["metadata"]["filter_metadata"]["ext_proc.token_policy"].update(
                vocab_size=1.5
            ),
            "vocab_size",
        ),
        (
            lambda c: routes(c)[0].update(
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
    ],
)
def test_problems_are_errors(change, text):
    report = mutated(change)
    assert any(text in error for error in report.errors), report.errors


def test_route_without_metadata_and_disabled_filter_are_warnings():
    def change(config):
        del routes(config)[0]["metadata"]
        routes(config)[1]["typed_per_filter_config"] = {
            "envoy.filters.http.ext_proc": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3."
                "ExtProcPerRoute",
                "disabled": True,
            }
        }

    report = mutated(change)
    assert report.errors == []
    assert len(report.warnings) == 2
