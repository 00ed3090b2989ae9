"""The benchmark's extra route (no process): a copy of the shipped decode route under
another prefix states its own rewrite, as the processor needs."""

from __future__ import annotations

from bench import bodies, stack
from devstack import envoy_config
from ext_proc.core.address import HostPort
from ext_proc.tools.check_envoy import check

ANYWHERE = HostPort("127.0.0.1", 1)


def test_the_any_caller_route_states_its_own_prefix() -> None:
    config = envoy_config.render(
        gateway=ANYWHERE,
        admin=ANYWHERE,
        processor=ANYWHERE,
        aggregated=ANYWHERE,
        disaggregated=ANYWHERE,
    )
    stack._add_any_caller_route(config)
    (vhost,) = stack._hcm(config)["route_config"]["virtual_hosts"]
    (extra,) = [r for r in vhost["routes"] if r["name"] == "disaggregated-any-caller"]
    fields = extra["metadata"]["filter_metadata"][stack.POLICY]
    assert fields["trust_any_caller"] is True
    assert (fields["match_prefix"], fields["prefix_rewrite"]) == (bodies.ANY_CALLER_ROUTE, "/v1/")
    assert extra["route"]["prefix_rewrite"] == "/v1/"
    report = check(config)
    # trust_any_caller is reported as the warning it is; nothing else.
    assert report.errors == []
    assert [w for w in report.warnings if "trust_any_caller" not in w] == []
