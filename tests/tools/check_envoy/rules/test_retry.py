"""A processor failure is a 503 with retry-after where nothing was forwarded: the
filter's status_on_error, and a local reply mapper or, in a scoped wiring, a
response_headers_to_add on the policed routes."""

import copy

import pytest
import yaml

from ext_proc.tools.check_envoy import check
from tests.tools.check_envoy.shipped import (
    EXT_PROC,
    OURS,
    PER_ROUTE,
    SHIPPED,
    SHIPPED_CONFIGS,
    at,
    ext_proc,
    found,
    hcm,
    mutated,
    route,
    routes,
)

# Spelt out here, not taken from envoy_names: the tests are a third opinion.
RETRY_SAFE = (
    "response.code_details.startsWith('ext_proc_error_') && "
    "!response.code_details.startsWith('ext_proc_error_gRPC_error_9{') && "
    "!has(upstream.address)"
)
FORMAT = f"%CEL({RETRY_SAFE} ? '1' : '')%"
FORWARDING = [r["name"] for r in routes(SHIPPED) if "route" in r]
CODES = ("processor-error-status", "retry-after-missing")


def _retry(report):
    return [hit for hit in found(report) if hit[0] in CODES]


def _no_mapper(config):
    mappers = hcm(config)["local_reply_config"]["mappers"]
    mappers[:] = [m for m in mappers if RETRY_SAFE not in str(m["filter"])]


def _header(value=FORMAT, **extra):
    return [{"header": {"key": "Retry-After", "value": value}, **extra}]


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_says_retry(path):
    assert _retry(check(yaml.safe_load(path.read_text()))) == []


@pytest.mark.parametrize("status", [None, {"code": 500}, {"code": "InternalServerError"}])
def test_a_processor_failure_must_be_a_503(status):
    def change(config):
        if status is None:
            del ext_proc(config)["status_on_error"]
        else:
            ext_proc(config)["status_on_error"] = status

    assert _retry(mutated(change)) == [("processor-error-status", OURS)]


@pytest.mark.parametrize("status", [{"code": 503}, {"code": "ServiceUnavailable"}])
def test_503_by_name_or_number(status):
    def change(config):
        ext_proc(config)["status_on_error"] = status

    assert _retry(mutated(change)) == []


def test_without_the_mapper_every_policed_route_lacks_retry_after():
    assert _retry(mutated(_no_mapper)) == [("retry-after-missing", at(n)) for n in FORWARDING]


def test_a_mapper_without_the_header_does_not_count():
    def change(config):
        for mapper in hcm(config)["local_reply_config"]["mappers"]:
            mapper.pop("headers_to_add", None)

    assert _retry(mutated(change)) == [("retry-after-missing", at(n)) for n in FORWARDING]


def test_the_virtual_host_or_route_config_header_stands_for_the_mapper():
    def on_vhost(config):
        _no_mapper(config)
        hcm(config)["route_config"]["virtual_hosts"][0]["response_headers_to_add"] = _header()

    def on_route_config(config):
        _no_mapper(config)
        hcm(config)["route_config"]["response_headers_to_add"] = _header()

    assert _retry(mutated(on_vhost)) == []
    assert _retry(mutated(on_route_config)) == []


def test_a_route_header_covers_that_route_only():
    def change(config):
        _no_mapper(config)
        route(config, FORWARDING[0])["response_headers_to_add"] = _header()

    assert _retry(mutated(change)) == [("retry-after-missing", at(n)) for n in FORWARDING[1:]]


@pytest.mark.parametrize(
    "header",
    [
        # A fixed value would tell every answer, an upstream failure's too, to retry.
        _header("1"),
        # An empty value kept: every answer gets an empty retry-after.
        _header(keep_empty_value=True),
    ],
)
def test_a_header_must_be_the_conditional_one(header):
    def change(config):
        _no_mapper(config)
        hcm(config)["route_config"]["virtual_hosts"][0]["response_headers_to_add"] = header

    assert _retry(mutated(change)) == [("retry-after-missing", at(n)) for n in FORWARDING]


def test_a_route_the_filter_does_not_run_on_needs_none():
    config = copy.deepcopy(SHIPPED)
    _no_mapper(config)
    for entry in routes(config):
        if "route" in entry and entry["name"] != FORWARDING[0]:
            configs = entry.setdefault("typed_per_filter_config", {})
            configs[EXT_PROC] = {"@type": PER_ROUTE, "disabled": True}
    hits = [hit for hit in _retry(check(config)) if hit[0] == "retry-after-missing"]
    assert hits == [("retry-after-missing", at(FORWARDING[0]))]
