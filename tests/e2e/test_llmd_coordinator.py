"""deploy/llm-d/coordinator/: the manifests for llm-d's coordinator architecture (what
`make llm-d-manifests` writes: tests/test_generated.py), as Istio and Envoy Gateway would
assemble them, give each EPP-Profile phase the policy of envoy/envoy-coordinator.yaml (which
tests/e2e/test_coordinator.py runs end to end), pass check-envoy and the real
`envoy --mode validate`; the overlays render with kustomize."""

from __future__ import annotations

import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml

from devstack import llmd
from ext_proc.tools import check_envoy
from ext_proc.tools.check_envoy.rules.replay import UNSENT
from tests.e2e import gateway_assembly, gateway_run
from tests.e2e.test_deploy import (
    KUBE_VERSION,
    KUBECTL,
    NAMESPACE,
    bounded_connection,
    documents,
    envoy_validate,
    largest_route_body,
    manager_of,
    policy_from,
    processor_connection,
    routes_of,
)
from tests.tools.envoygen.configs import hcm_of

OUT = llmd.OUTPUT
EG_LISTENER = "llm-d/inference-gateway/http"


def httproute() -> dict[str, Any]:
    (route,) = documents(OUT / "routes" / "httproute.yaml")
    return route


def istio(envoy_filter: dict[str, Any] | None = None) -> dict[str, Any]:
    (found,) = documents(OUT / "istio" / "envoyfilter.yaml")
    return gateway_assembly.istio_bootstrap(envoy_filter or found, [httproute()])


def envoy_gateway(patch: dict[str, Any] | None = None) -> dict[str, Any]:
    (extension,) = documents(OUT / "envoy-gateway" / "extension-policy.yaml")
    (found,) = documents(OUT / "envoy-gateway" / "patch-policy.yaml")
    return gateway_assembly.envoy_gateway_bootstrap(
        extension, patch or found, [httproute()], EG_LISTENER
    )


def expected_policies(name_of: Any) -> dict[str, Any]:
    """Each phase route's policy as the processor reads it, by the route name the
    gateway gives its rule (``name_of(rule index)``)."""
    limits = {"vocab_size": 128256, "max_ids": 131072}
    return {
        name_of(index): policy_from(llmd.policy(entry, limits))
        for index, entry in enumerate(llmd.routes())
    }


@pytest.mark.parametrize(
    ("assemble", "name_of"),
    [
        (istio, lambda i: f"llm-d.llm-d-coordinator.{i}"),
        (envoy_gateway, lambda i: f"httproute/llm-d/llm-d-coordinator/rule/{i}/match/0/*"),
    ],
    ids=["istio", "envoy-gateway"],
)
def test_each_phase_gets_its_policy(assemble, name_of, tmp_path):
    config = assemble()
    by_name = {r["name"]: r for r in routes_of(config) if "route" in r}
    expected = expected_policies(name_of)
    assert set(by_name) == set(expected)
    for name, policy in expected.items():
        got = policy_from(by_name[name]["metadata"]["filter_metadata"][NAMESPACE])
        assert got == policy, name
        assert by_name[name]["request_body_buffer_limit"] == 16 * 1024 * 1024
    actions = [p.action.value for p in expected.values()]
    assert actions == ["mint", "honor", "strip", "strip"]
    # The phase routes come before the coordinator's catch-all, which clients reach.
    order = [r["name"] for r in routes_of(config) if "route" in r]
    assert order == list(expected)
    report = check_envoy.check(config)
    assert report.errors == []
    assert report.warnings == []
    envoy_validate(config, tmp_path, "coordinator")


@pytest.mark.parametrize(
    ("assemble", "processor"),
    [
        (istio, "ext_proc_token_policy"),
        (envoy_gateway, "envoyextensionpolicy/llm-d/token-policy/0"),
    ],
    ids=["istio", "envoy-gateway"],
)
def test_the_processor_connection_has_room_for_its_streams_bodies(assemble, processor):
    config = assemble()
    assert processor_connection(config, processor) == bounded_connection(largest_route_body(config))


def test_istio_prefill_and_decode_phases_retry_only_unread_requests():
    # istiod's default retry policy on every phase route; the EnvoyFilter replaces its
    # retry_on on the mint and honor phases (deploy/istio/envoyfilter.yaml, 4.).
    routes = {r["name"]: r for r in routes_of(istio()) if "route" in r}
    retry_on = {name: routes[name]["route"]["retry_policy"]["retry_on"] for name in routes}
    for index in (0, 1):  # prefill (mint), decode (honor)
        assert set(retry_on[f"llm-d.llm-d-coordinator.{index}"].split(",")) == UNSENT
    for index in (2, 3):  # encode, the coordinator (strip)
        expected = gateway_assembly.ISTIO_RETRY_POLICY["retry_on"]
        assert retry_on[f"llm-d.llm-d-coordinator.{index}"] == expected
    envoy_filter = documents(OUT / "istio" / "envoyfilter.yaml")[0]
    for patch in envoy_filter["spec"]["configPatches"]:
        patch["patch"]["value"].pop("route", None)
    report = check_envoy.check(istio(envoy_filter))
    assert report.codes() == ["body-retried"] * 2


def test_the_phase_header_selects_the_route():
    routes = {r["name"]: r for r in routes_of(istio())}
    for index, phase in enumerate(["prefill", "decode", "encode"]):
        match = routes[f"llm-d.llm-d-coordinator.{index}"]["match"]
        assert match["headers"] == [{"name": "epp-profile", "string_match": {"exact": phase}}]
    assert "headers" not in routes["llm-d.llm-d-coordinator.3"]["match"]


def test_istio_keeps_the_filter_and_its_hold():
    names = [f["name"] for f in manager_of(istio())["http_filters"]]
    assert names == [
        "envoy.filters.http.header_mutation",
        "envoy.filters.http.rbac",
        "ext_proc.token_policy",
        "envoy.filters.http.buffer",
        "envoy.filters.http.router",
    ]


@pytest.mark.parametrize("assemble", [istio, envoy_gateway], ids=["istio", "envoy-gateway"])
def test_a_phase_stated_twice_is_refused_as_in_the_gateways_config(assemble):
    # The same RBAC filter and 400 as envoy/envoy-coordinator.yaml (which
    # tests/e2e/test_coordinator.py sends both forms to), between the header step and
    # the processor's filter.
    shipped = hcm_of(yaml.safe_load((llmd.REPO / "envoy" / "envoy-coordinator.yaml").read_text()))
    (want,) = [f for f in shipped["http_filters"] if f["name"] == "envoy.filters.http.rbac"]
    manager = manager_of(assemble())
    names = [f["name"] for f in manager["http_filters"]]
    at = names.index("envoy.filters.http.rbac")
    assert names[at - 1] == "envoy.filters.http.header_mutation"
    assert manager["http_filters"][at] == want
    assert at < min(i for i, f in enumerate(manager["http_filters"]) if "ext_proc" in str(f))
    (mapper,) = manager["local_reply_config"]["mappers"]
    assert mapper == shipped["local_reply_config"]["mappers"][0]
    assert mapper["status_code"] == 400


@pytest.mark.parametrize(
    ("assemble", "processor"),
    [
        (istio, "ext_proc_token_policy"),
        (envoy_gateway, "envoyextensionpolicy/llm-d/token-policy/0"),
    ],
    ids=["istio", "envoy-gateway"],
)
def test_a_bodiless_request_never_reaches_a_refused_endpoint_in_any_phase(
    assemble, processor, tmp_path
):
    # The coordinator's catch-all and each phase route (EPP-Profile), behind the phase
    # routes' prefix and a root path no route names: answered 404 by path before them.
    with gateway_run.running(assemble(), tmp_path, processor) as gateway:
        for phase in (None, "prefill", "decode", "encode"):
            headers = None if phase is None else {llmd.PROFILE: phase}
            missed = gateway_run.bodiless_refusals(gateway, ("/", "/v1/", "/x/"), headers)
            assert missed == [], phase
        assert gateway.received() == []
        for phase in (None, "prefill"):
            headers = None if phase is None else {llmd.PROFILE: phase}
            assert gateway.send("GET", "/v1/models", headers=headers) == 200, phase
        assert gateway.received() == [("GET", "/v1/models")] * 2


def _without_mint_override(envoy_filter: dict[str, Any]) -> None:
    for patch in envoy_filter["spec"]["configPatches"]:
        patch["patch"]["value"].pop("typed_per_filter_config", None)


def test_check_envoy_catches_a_prefill_phase_without_its_response_override():
    (envoy_filter,) = documents(OUT / "istio" / "envoyfilter.yaml")
    _without_mint_override(envoy_filter)
    errors = check_envoy.check(istio(envoy_filter)).errors
    assert any("llm-d.llm-d-coordinator.0: action mint" in e for e in errors), errors


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")
@pytest.mark.parametrize("overlay", ["istio", "envoy-gateway"])
def test_the_overlays_render(overlay):
    assert KUBECTL is not None
    result = subprocess.run(
        [KUBECTL, "kustomize", str(OUT / overlay)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    rendered = [d for d in yaml.safe_load_all(result.stdout) if d is not None]
    kinds = {d["kind"] for d in rendered}
    assert {"Deployment", "Service", "NetworkPolicy", "HTTPRoute"} <= kinds
    for doc in rendered:
        assert doc["metadata"]["namespace"] == "llm-d", doc["kind"]
        if doc["apiVersion"].startswith(
            ("v1", "apps/", "policy/", "autoscaling/", "networking.k8s.io/")
        ):
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
