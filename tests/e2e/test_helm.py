"""deploy/helm/ext-proc-token-policy: the chart lints; every values file under ci/ renders,
each object follows the Kubernetes schemas (core objects) or is a resource the wiring
is checked as (CRDs); the Envoy configuration inside the rendered wiring, assembled as
Istio and Envoy Gateway would, passes check-envoy and the real `envoy --mode validate`;
the chart in the base's namespace renders the shipped manifests; values outside the
schema are refused."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from devstack import helm, llmd, monitoring
from ext_proc.core.config import Config
from ext_proc.tools import check_envoy
from tests.e2e import gateway_assembly
from tests.e2e.manifests import KUBE_VERSION, documents, envoy_validate, parse

CI = sorted((helm.CHART / "ci").glob("*-values.yaml"))
# Not the base's: the wiring must name the release's namespace, never `llm-d`.
NAMESPACE = "inference"
CORE = frozenset({"v1", "apps/v1", "autoscaling/v2", "policy/v1", "networking.k8s.io/v1"})
# The custom resources, each checked by the assembly below (Istio, Envoy Gateway, the
# HTTPRoutes they patch) or by promtool's tests of the rules (tests/e2e/test_monitoring.py).
CRDS = frozenset(
    {
        ("networking.istio.io/v1alpha3", "EnvoyFilter"),
        ("gateway.envoyproxy.io/v1alpha1", "EnvoyExtensionPolicy"),
        ("gateway.envoyproxy.io/v1alpha1", "EnvoyPatchPolicy"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute"),
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
    }
)


def values_of(path: Path) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    return values


def merged(values: dict[str, Any]) -> dict[str, Any]:
    """The chart's values with ``values`` over them, as Helm merges them."""
    out: dict[str, Any] = copy.deepcopy(yaml.safe_load((helm.CHART / "values.yaml").read_text()))

    def merge(into: dict[str, Any], top: dict[str, Any]) -> None:
        for key, value in top.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    merge(out, values)
    return out


def rendered(values: dict[str, Any], namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    return [doc for text in helm.render(values, namespace).values() for doc in parse(text)]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return found


def every(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_the_chart_lints_without_a_warning():
    for values in [None, *(values_of(path) for path in CI)]:
        report = helm_python.lint(helm.CHART, values, strict=True, namespace=NAMESPACE)
        assert report["errors"] == []
        # Severity 1 is information ("icon is recommended"); 2 and 3 warn and fail.
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_each_arrangement_has_a_values_file():
    names = {path.name.removesuffix("-values.yaml") for path in CI}
    assert {
        "default",
        "istio",
        "envoy-gateway",
        "llm-d-istio",
        "llm-d-envoy-gateway",
        "external-redis",
        "monitoring",
    } <= names


@pytest.mark.parametrize("path", CI, ids=lambda p: p.name)
def test_every_rendered_object_follows_its_schema(path):
    objects = rendered(values_of(path))
    assert objects
    for doc in objects:
        assert doc["metadata"]["namespace"] == NAMESPACE, doc["kind"]
        if doc["apiVersion"] in CORE:
            try:
                kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{path.name}: {doc['kind']} {doc['metadata']['name']}: {exc}")
        else:
            assert (doc["apiVersion"], doc["kind"]) in CRDS, doc["kind"]


@pytest.mark.parametrize("path", CI, ids=lambda p: p.name)
def test_the_processor_config_loads_and_names_the_record(path):
    values = merged(values_of(path))
    objects = rendered(values_of(path))
    data = yaml.safe_load(one(objects, "ConfigMap")["data"]["config.yaml"])
    config = Config.model_validate(data)
    assert [key.id for key in config.proof.keys] == values["proofKeys"]["ids"]
    if values["redis"]["enabled"]:
        service = one(objects, "Service", "ext-proc-redis")
        assert config.proof.record == f"redis://{service['metadata']['name']}:6379/0"
    else:
        assert config.proof.record == values["redis"]["url"]
        assert [d["metadata"]["name"] for d in every(objects, "Deployment")] == [
            "ext-proc-token-policy"
        ]
    pod = one(objects, "Deployment", "ext-proc-token-policy")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == values["proofKeys"]["secretName"]
    assert "Secret" not in {o["kind"] for o in objects}  # never a key in the chart
    (container,) = pod["containers"]
    image = values["image"]
    expected = (
        f"{image['repository']}@{image['digest']}"
        if image["digest"]
        else f"{image['repository']}:{image['tag']}"
    )
    assert container["image"] == expected
    grace = config.drain_seconds + config.shutdown_grace_seconds
    assert pod["terminationGracePeriodSeconds"] > grace


# --- the NetworkPolicy follows the release's namespace ------------------------------------


def gateway_peer(policy: dict[str, Any]) -> dict[str, Any]:
    (grpc,) = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == 50051]
    (peer,) = grpc["from"]
    return dict(peer)


def test_the_network_policy_admits_the_gateway_of_the_release_namespace():
    policy = one(rendered({}, "inference"), "NetworkPolicy", "ext-proc-token-policy")
    # A peer with a podSelector alone selects pods in the policy's own namespace.
    assert policy["metadata"]["namespace"] == "inference"
    assert gateway_peer(policy) == {
        "podSelector": {
            "matchLabels": {"gateway.networking.k8s.io/gateway-name": "inference-gateway"}
        }
    }


def test_the_network_policy_admits_the_named_gateway_namespaces():
    values = values_of(helm.CHART / "ci" / "istio-values.yaml")
    policy = one(rendered(values), "NetworkPolicy", "ext-proc-token-policy")
    assert gateway_peer(policy) == {
        "podSelector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "edge-gateway"}},
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "In",
                    "values": ["inference", "edge"],
                }
            ]
        },
    }


# --- values outside the schema ------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        {"gateway": {"kind": "nginx"}},
        {"gateway": {"name": "Not A Name"}},
        {"image": {"tag": ""}},
        {"image": {"digest": "latest"}},
        {"redis": {"enabled": False}},  # no record shared by the replicas
        {"redis": {"url": "redis://elsewhere:6379/0"}},  # and the chart's own
        {"proofKeys": {"ids": []}},
        {"proofKeys": {"key": "00112233"}},
        {"config": {"extra": {"proof": {"keys": []}}}},
        {"config": {"maxBodyBytes": 0}},
        {"replica": 3},
    ],
    ids=lambda values: yaml.safe_dump(values, default_flow_style=True).strip(),
)
def test_values_violating_the_schema_are_refused_at_render(values):
    with pytest.raises(helm_python.HelmValuesError):
        helm.render(values, NAMESPACE)


# --- one source ---------------------------------------------------------------------------


def test_the_image_is_stated_once():
    values = yaml.safe_load((helm.CHART / "values.yaml").read_text())["image"]
    chart = yaml.safe_load((helm.CHART / "Chart.yaml").read_text())
    (kustomization,) = documents(helm.BASE / "kustomization.yaml")
    (image,) = kustomization["images"]
    assert image == {"name": values["repository"], "newTag": values["tag"]}
    assert values["tag"] == chart["appVersion"]


GATEWAY_VALUES = {
    "istio": ({"gateway": {"kind": "istio"}}, ["istio/envoyfilter.yaml"]),
    "envoy-gateway": (
        {"gateway": {"kind": "envoyGateway"}},
        ["envoy-gateway/extension-policy.yaml", "envoy-gateway/patch-policy.yaml"],
    ),
    "llm-d-istio": (
        {"gateway": {"kind": "llmd"}},
        ["llm-d/coordinator/routes/httproute.yaml", "llm-d/coordinator/istio/envoyfilter.yaml"],
    ),
    "llm-d-envoy-gateway": (
        {"gateway": {"kind": "llmd", "llmdProvider": "envoyGateway"}},
        [
            "llm-d/coordinator/routes/httproute.yaml",
            "llm-d/coordinator/envoy-gateway/extension-policy.yaml",
            "llm-d/coordinator/envoy-gateway/patch-policy.yaml",
        ],
    ),
}


@pytest.mark.parametrize("arrangement", list(GATEWAY_VALUES))
def test_the_chart_in_the_base_namespace_renders_the_shipped_wiring(arrangement):
    values, shipped = GATEWAY_VALUES[arrangement]
    found = [o for o in rendered(values, llmd.NAMESPACE) if o["apiVersion"] not in CORE]
    expected = [doc for name in shipped for doc in documents(helm.DEPLOY / name)]
    if values["gateway"]["kind"] != "llmd":
        expected += documents(helm.DEPLOY / "envoy-gateway" / "httproutes.yaml")
    key = lambda doc: (doc["kind"], doc["metadata"]["name"])  # noqa: E731
    assert sorted(found, key=key) == sorted(expected, key=key)


def test_the_prometheus_rule_is_the_rules_file():
    values = values_of(helm.CHART / "ci" / "monitoring-values.yaml")
    rule = one(rendered(values), "PrometheusRule")
    source = monitoring.prometheus_rule(yaml.safe_load(monitoring.RULES.read_text()))
    # Prometheus' own {{ $labels... }} templates arrive as written.
    assert rule["spec"] == source["spec"]
    objects = rendered(values)
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service", "ext-proc-token-policy-metrics")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


# --- the rendered wiring in the real Envoy ------------------------------------------------


def assemble(path: Path) -> dict[str, Any]:
    """The Envoy configuration the rendered wiring makes, as its control plane would."""
    values = merged(values_of(path))
    objects = rendered(values_of(path))
    routes = every(objects, "HTTPRoute")
    gateway = values["gateway"]
    provider = gateway["llmdProvider"] if gateway["kind"] == "llmd" else gateway["kind"]
    if provider == "istio":
        return gateway_assembly.istio_bootstrap(one(objects, "EnvoyFilter"), routes)
    return gateway_assembly.envoy_gateway_bootstrap(
        one(objects, "EnvoyExtensionPolicy"),
        one(objects, "EnvoyPatchPolicy"),
        routes,
        f"{NAMESPACE}/{gateway['name']}/http",
    )


WIRED = [p for p in CI if merged(values_of(p))["gateway"]["kind"] != "none"]


def test_every_gateway_kind_has_a_values_file():
    kinds = {
        (g["kind"], g["llmdProvider"] if g["kind"] == "llmd" else None)
        for g in (merged(values_of(p))["gateway"] for p in WIRED)
    }
    assert kinds == {
        ("istio", None),
        ("envoyGateway", None),
        ("llmd", "istio"),
        ("llmd", "envoyGateway"),
    }


@pytest.mark.parametrize("path", WIRED, ids=lambda p: p.name)
def test_the_rendered_wiring_passes_check_envoy_and_envoy_validate(path, tmp_path):
    config = assemble(path)
    report = check_envoy.check(config)
    assert report.errors == []
    assert report.warnings == []
    assert report.routes > 0
    envoy_validate(config, tmp_path, path.stem)
    text = yaml.safe_dump(config)
    # Every name of the wiring is the release's: nothing left in the base's namespace.
    assert f"{llmd.NAMESPACE}/" not in text
    assert f"{llmd.NAMESPACE}." not in text.replace(f"{llmd.HTTPROUTE}.", "")


def test_the_istio_cluster_is_the_release_namespaces_headless_service():
    objects = rendered(values_of(helm.CHART / "ci" / "istio-values.yaml"))
    envoy_filter = one(objects, "EnvoyFilter")
    (cluster,) = [p for p in envoy_filter["spec"]["configPatches"] if p["applyTo"] == "CLUSTER"]
    (endpoint,) = cluster["patch"]["value"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    address = endpoint["endpoint"]["address"]["socket_address"]["address"]
    headless = one(objects, "Service", "ext-proc-token-policy-headless")["metadata"]["name"]
    assert address == f"{headless}.{NAMESPACE}.svc.cluster.local"
    assert envoy_filter["spec"]["workloadSelector"] == {
        "labels": {"gateway.networking.k8s.io/gateway-name": "edge-gateway"}
    }
