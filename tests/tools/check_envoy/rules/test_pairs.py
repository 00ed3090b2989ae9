"""A mint route and an honor route one client reaches name one tenant source: a proof
binds the partition its mint route put the prompt in, and an honor route of another
partition refuses it (docs/trust.md#a-pair-knows-its-tenant)."""

import copy

import pytest

from tests.tools.check_envoy.shipped import at, mutated, policy

CODE = "tenant-pair-mismatch"


def pair(mint, honor, **others):
    """The shipped prefill (mint) and disaggregated (honor) routes naming ``mint`` and
    ``honor`` (None: no tenant source), and other routes as ``others`` says."""

    def change(config):
        for name, source in {"prefill": mint, "disaggregated": honor, **others}.items():
            if source is not None:
                policy(config, name)["tenant"] = source

    return change


def mismatched(change):
    report = mutated(change)
    return [(f.place, f.message) for f in report.findings if f.code == CODE]


@pytest.mark.parametrize(
    ("mint", "honor"),
    [
        ("route:team-a", None),
        (None, "route:team-a"),
        ("route:team-a", "route:team-b"),
        ("header:x-auth-tenant", "route:team-a"),
        ("header:x-auth-tenant", "header:x-other-tenant"),
        ("peer_san", "header:x-auth-tenant"),
    ],
)
def test_a_pair_naming_different_tenant_sources_is_refused(mint, honor):
    ((place, message),) = mismatched(pair(mint, honor))
    assert place == at("disaggregated")
    assert at("prefill") in message
    assert "proof_partition_mismatch" in message


@pytest.mark.parametrize("source", [None, "route:team-a", "header:x-auth-tenant", "peer_san"])
def test_a_pair_naming_one_tenant_source_passes(source):
    # Each request's own tenant is the processor's to compare (proof_partition_mismatch).
    assert mismatched(pair(source, source)) == []


def test_routes_that_decide_nothing_are_no_pair():
    # A strip route names its own tenant: it mints and honors nothing.
    assert mismatched(pair(None, None, aggregated="route:team-a", default="route:x")) == []


def test_a_pair_across_two_listeners_is_refused():
    # A client that reaches one listener may reach the other: the second listener's
    # honor route is paired with the first listener's mint route too.
    def change(config):
        listeners = config["static_resources"]["listeners"]
        second = copy.deepcopy(listeners[0])
        second["name"] = "tenant-gateway"
        second["address"]["socket_address"]["port_value"] += 1
        listeners.append(second)
        manager = second["filter_chains"][0]["filters"][0]["typed_config"]
        (vhost,) = manager["route_config"]["virtual_hosts"]
        (decode,) = [r for r in vhost["routes"] if r.get("name") == "disaggregated"]
        decode["metadata"]["filter_metadata"]["ext_proc.token_policy"]["tenant"] = "route:a"

    places = [place for place, _ in mismatched(change)]
    assert places == [at("disaggregated").replace("[0]", "[1]")]
