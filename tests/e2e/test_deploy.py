"""deploy/: manifests parse and follow their schemas, as written and as `kubectl kustomize`
renders them; the Envoy configuration inside them (Istio EnvoyFilter, Envoy Gateway
policies) and the generator's output pass the real `envoy --mode validate`; a generated
config runs end to end."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml

from devstack import llmd, processes, release
from ext_proc.core import memory, route_policy
from ext_proc.core.address import HostPort
from ext_proc.core.config import Config
from ext_proc.core.route_policy import Action, RoutePolicy, Topology
from ext_proc.core.vllm_request import CONNECTOR_REQUESTS
from ext_proc.edge.attributes import attribute_keys
from ext_proc.tools import carrier_headers, check_envoy, envoygen, refused_paths, token_endpoints
from ext_proc.tools.check_envoy.rules.replay import UNSENT
from tests.e2e import gateway_assembly, gateway_run
from tests.e2e.manifests import KUBE_VERSION, documents, envoy_validate
from tests.e2e.stack import Stack, new_key, start_stand_in
from tests.filters import assert_fails_closed

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUBE = DEPLOY / "kubernetes"
# The Helm chart holds templates and values, not manifests (tests/e2e/test_helm.py).
MANIFESTS = sorted(p for p in DEPLOY.rglob("*.yaml") if not p.is_relative_to(DEPLOY / "helm"))
# YAML under deploy/ that is not a Kubernetes object: the Envoy generator's example
# input, the Prometheus rules file (tests/e2e/test_monitoring.py checks it) and the
# values of llm-d's standalone chart (tests/e2e/test_llmd_standalone.py), and the
# routing-sidecar component's Envoy configs (tests/e2e/test_llmd_routing_sidecar_manifests.py).
NOT_KUBERNETES = frozenset(
    {
        "envoy-config.example.yaml",
        "monitoring/rules.yaml",
        "llm-d/standalone/values.yaml",
        *(f"llm-d/routing-sidecar/component/{name}" for name in llmd.POD_CONFIGS),
    }
)
KUBECTL = shutil.which("kubectl")
NAMESPACE = "ext_proc.token_policy"
PROOF_KEYS = "/etc/ext-proc/proof-keys"
PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
FILTER_CONFIG = "type.googleapis.com/envoy.config.route.v3.FilterConfig"


def kube_objects() -> list[tuple[Path, dict[str, Any]]]:
    return [
        (path, doc)
        for path in sorted(KUBE.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in documents(path)
    ]


def one(kind: str, name: str = "ext-proc-token-policy") -> dict[str, Any]:
    (found,) = [
        doc for _, doc in kube_objects() if doc["kind"] == kind and doc["metadata"]["name"] == name
    ]
    return found


def policy_from(fields: dict[str, Any]) -> RoutePolicy:
    """What the processor makes of route metadata, given the way CEL renders it."""
    values = {k: v if isinstance(v, bool) else str(v) for k, v in fields.items()}
    return route_policy.parse(values, float(len(fields)))


# --- every manifest ------------------------------------------------------------------


def test_manifests_exist():
    names = {p.relative_to(DEPLOY).as_posix() for p in MANIFESTS}
    assert {
        "kubernetes/kustomization.yaml",
        "kubernetes/deployment.yaml",
        "istio/envoyfilter.yaml",
        "envoy-gateway/extension-policy.yaml",
        "envoy-gateway/patch-policy.yaml",
        "envoy-config.example.yaml",
    } <= names
    assert (DEPLOY / "LLM-D.md").is_file()


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_manifest_parses(path):
    docs = documents(path)
    assert docs, f"{path} holds no document"
    for doc in docs:
        assert isinstance(doc, dict)
        if path.relative_to(DEPLOY).as_posix() not in NOT_KUBERNETES:
            assert {"apiVersion", "kind"} <= set(doc), f"{path}: not a Kubernetes object"


# --- Kubernetes base -------------------------------------------------------------------


def test_kustomization_lists_every_object_file():
    (kustomization,) = documents(KUBE / "kustomization.yaml")
    files = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)
    assert kustomization["namespace"] == "llm-d"


def test_core_objects_follow_the_kubernetes_schemas():
    kinds = []
    for path, doc in kube_objects():
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.name}: {doc['kind']}: {exc}")
        kinds.append(doc["kind"])
    assert sorted(kinds) == sorted(
        [
            "ConfigMap",
            "Deployment",
            "Deployment",
            "HorizontalPodAutoscaler",
            "NetworkPolicy",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Service",
            "Service",
            "Service",
            "ServiceAccount",
        ]
    )


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")
def test_kustomize_renders_exactly_the_listed_objects():
    assert KUBECTL is not None
    result = subprocess.run(
        [KUBECTL, "kustomize", str(KUBE)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]
    names = sorted((doc["kind"], doc["metadata"]["name"]) for doc in rendered)
    listed = sorted((doc["kind"], doc["metadata"]["name"]) for _, doc in kube_objects())
    assert names == listed
    for doc in rendered:
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"rendered {doc['kind']}: {exc}")
        metadata = doc["metadata"]
        assert metadata["namespace"] == "llm-d", doc["kind"]
        assert metadata["labels"]["app.kubernetes.io/part-of"] == "ext-proc-token-policy"
    images = {
        doc["metadata"]["name"]: {c["image"] for c in doc["spec"]["template"]["spec"]["containers"]}
        for doc in rendered
        if doc["kind"] == "Deployment"
    }
    assert images == {
        "ext-proc-token-policy": {f"{release.image()}:{release.version()}"},
        "ext-proc-redis": {chart_values()["redis"]["image"]},  # pinned by digest
    }


def chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(
        (DEPLOY / "helm" / "ext-proc-token-policy" / "values.yaml").read_text()
    )
    return values


def chart_image() -> str:
    """The image the chart's values name (deploy/helm/ext-proc-token-policy)."""
    image = chart_values()
    return f"{image['image']['repository']}:{image['image']['tag']}"


def test_schema_check_catches_a_typo():
    deployment = copy.deepcopy(one("Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {
        "grcp": {"port": 50051}
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)


def processor_config() -> Config:
    data = yaml.safe_load(one("ConfigMap")["data"]["config.yaml"])
    assert {
        "listen",
        "log_level",
        "max_body_bytes",
        "inflight_budget_bytes",
        "body_timeout_seconds",
        "route_metadata_namespace",
        "shutdown_grace_seconds",
    } <= set(data)
    return Config.model_validate(data)


def test_configmap_is_a_valid_processor_config():
    config = processor_config()
    assert config.listen == "0.0.0.0:50051"
    assert config.route_metadata_namespace == NAMESPACE
    assert config.max_body_bytes == 16 * 1024 * 1024
    # Signing keys from the mounted Secret, one file per key id.
    assert [key.id for key in config.proof.keys] == ["k1"]
    assert {key.file for key in config.proof.keys} == {f"{PROOF_KEYS}/k1"}
    assert config.proof.ttl_seconds == 20


def test_check_config_accepts_the_configmap(tmp_path, capsys):
    from ext_proc.__main__ import main  # noqa: PLC0415 - the command line, as operators run it

    path = tmp_path / "config.yaml"
    text = one("ConfigMap")["data"]["config.yaml"]
    path.write_text(text)
    # The key files are read as serve reads them: here the Secret is not mounted.
    assert main(["check-config", str(path)]) == 1
    assert f"cannot read proof key file {PROOF_KEYS}/k1: " in capsys.readouterr().err
    # Where it is, the configuration passes.
    keys = tmp_path / "proof-keys"
    keys.mkdir()
    (keys / "k1").write_text("a" * 64)
    path.write_text(text.replace(f"{PROOF_KEYS}/", f"{keys}/"))
    assert main(["check-config", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: OK\n"


def test_proof_keys_come_from_a_secret_mounted_read_only():
    pod = one("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == PROOF_KEYS]
    assert mount["readOnly"] is True
    assert "subPath" not in mount  # a subPath mount never sees the Secret change
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    assert secret["secretName"] == "ext-proc-proof-keys"
    assert secret.get("optional", False) is False  # no keys, no start
    # Readable by the owner (root) and the pod's fsGroup only; the process runs in it.
    assert secret["defaultMode"] == 0o440
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    # The key is not shipped: no Secret among the objects.
    assert "Secret" not in {doc["kind"] for _, doc in kube_objects()}
    kustomization = (KUBE / "kustomization.yaml").read_text()
    assert "create secret generic ext-proc-proof-keys" in kustomization


def test_deployment():
    deployment = one("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"{release.image()}:{release.version()}"
    assert chart_image() == container["image"]
    assert container["command"] == [
        "python",
        "-m",
        "ext_proc",
        "serve",
        "--config",
        "/etc/ext-proc/config.yaml",
        "--listen",
        "0.0.0.0:50051",
    ]
    assert {"name": "grpc", "containerPort": 50051, "protocol": "TCP"} in container["ports"]
    assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in container["ports"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["grpc"] == {"port": 50051}, probe
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) & set(resources["limits"])
    # The config file the command names is the mounted ConfigMap.
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/ext-proc"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == one("ConfigMap")["metadata"]["name"]


def test_termination_outlasts_the_drain():
    config = processor_config()
    drain = getattr(config, "drain_seconds", 0.0)
    pod = one("Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > drain + config.shutdown_grace_seconds
    (container,) = pod["containers"]
    liveness = container["livenessProbe"]
    # A draining processor reports NOT_SERVING; liveness must not restart it meanwhile.
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > drain


def test_memory_limit_holds_the_memory_model():
    config = processor_config()
    (container,) = one("Deployment")["spec"]["template"]["spec"]["containers"]
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    # Baseline, warm-up, budget, the body being admitted and memory.QUEUED of the largest
    # bodies received by gRPC at once (ext_proc/core/memory.py), per worker.
    bound = memory.resident_bound(
        memory.BASELINE, config.inflight_budget_bytes, config.max_body_bytes, memory.QUEUED
    )
    assert int(limit.removesuffix("Mi")) * memory.MiB >= bound * config.workers
    assert int(limit.removesuffix("Mi")) * memory.MiB == memory.pod_limit(
        config.inflight_budget_bytes, config.max_body_bytes, config.workers
    )


def test_selectors_agree():
    labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    selector = one("Deployment")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    for kind in ("PodDisruptionBudget",):
        assert one(kind)["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert one("NetworkPolicy")["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    services = [
        doc
        for _, doc in kube_objects()
        if doc["kind"] == "Service" and doc["metadata"]["name"] != "ext-proc-redis"
    ]
    assert len(services) == 2
    for service in services:
        assert service["spec"]["selector"].items() <= labels.items()
        (port,) = service["spec"]["ports"]
        assert (port["port"], port["name"], port["appProtocol"]) == (
            50051,
            "grpc",
            "kubernetes.io/h2c",
        )
    assert {s["spec"].get("clusterIP") for s in services} == {None, "None"}
    hpa = one("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == one("Deployment")["metadata"]["name"]
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert hpa["spec"]["minReplicas"] >= 2
    assert one("PodDisruptionBudget")["spec"]["minAvailable"] >= 1


def test_network_policy_admits_only_the_gateway_on_50051_and_prometheus_on_9464():
    spec = one("NetworkPolicy")["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    # Egress: the Redis record of spent proofs on 6379 and the cluster DNS, nothing else.
    redis, dns = spec["egress"]
    assert redis == {
        "to": [{"podSelector": {"matchLabels": redis_pod_labels()}}],
        "ports": [{"protocol": "TCP", "port": 6379}],
    }
    (peer,) = dns["to"]
    assert peer["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert peer["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
    }
    assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
    grpc, metrics = spec["ingress"]
    assert grpc["ports"] == [{"protocol": "TCP", "port": 50051}]
    (peer,) = grpc["from"]
    assert peer["podSelector"]["matchLabels"], "an empty selector would admit every pod"
    # No namespaceSelector: the peer is in the policy's own namespace, whichever an
    # overlay gives the base (a selector naming `llm-d` would refuse a renamed gateway,
    # and every request would fail closed).
    assert set(peer) == {"podSelector"}
    assert metrics["ports"] == [{"protocol": "TCP", "port": 9464}]
    (peer,) = metrics["from"]
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}


# --- the record of spent proofs: Redis ---------------------------------------------------


def redis_pod_labels() -> dict[str, str]:
    """The Redis Deployment's selector: the labels its pods are known by."""
    labels: dict[str, str] = one("Deployment", "ext-proc-redis")["spec"]["selector"]["matchLabels"]
    return labels


def redis_command() -> list[str]:
    pod = one("Deployment", "ext-proc-redis")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command: list[str] = container["command"]
    return command


def redis_option(command: list[str], name: str) -> str:
    (index,) = [i for i, arg in enumerate(command) if arg == f"--{name}"]
    return command[index + 1]


def rendered_base() -> list[dict[str, Any]]:
    if KUBECTL is None:
        pytest.skip("kubectl is not on PATH")
    result = subprocess.run(
        [KUBECTL, "kustomize", str(KUBE)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


def test_the_replicas_share_the_redis_record_as_rendered():
    rendered = rendered_base()
    (config_map,) = [
        d
        for d in rendered
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ext-proc-token-policy"
    ]
    config = Config.model_validate(yaml.safe_load(config_map["data"]["config.yaml"]))
    (service,) = [
        d for d in rendered if d["kind"] == "Service" and d["metadata"]["name"] == "ext-proc-redis"
    ]
    (port,) = service["spec"]["ports"]
    # The processor resolves the bare name in its own namespace: the Service's.
    assert service["metadata"]["namespace"] == config_map["metadata"]["namespace"]
    assert config.proof.record == f"redis://{service['metadata']['name']}:{port['port']}/0"
    (redis,) = [
        d
        for d in rendered
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "ext-proc-redis"
    ]
    pod = redis["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    (container_port,) = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    assert container_port["containerPort"] == int(redis_option(container["command"], "port"))
    # Several replicas verify proofs for the same routes.
    assert one("HorizontalPodAutoscaler")["spec"]["minReplicas"] >= 2


def test_redis_keeps_nothing_and_evicts_only_by_ttl():
    redis = one("Deployment", "ext-proc-redis")
    command = redis_command()
    assert command[0] == "redis-server"
    assert redis_option(command, "save") == ""
    assert redis_option(command, "appendonly") == "no"
    assert redis_option(command, "maxmemory-policy") == "noeviction"
    maxmemory = redis_option(command, "maxmemory")
    assert maxmemory.endswith("mb")
    # Far above what the record holds at 10,000 proofs honored per second: every key
    # lives ttl + 2 x skew, ~100 bytes each (an evicted live key lets a replay through).
    proof = processor_config().proof
    held = 10_000 * (proof.ttl_seconds + 2 * proof.clock_skew_seconds) * 100
    assert int(maxmemory.removesuffix("mb")) * 1024**2 >= 2 * held
    # One record at a time: never two Redis pods behind the Service.
    assert redis["spec"]["replicas"] == 1
    assert redis["spec"]["strategy"] == {"type": "Recreate"}
    pod = redis["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "persistentVolumeClaim" not in json.dumps(pod["volumes"])
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    limit = container["resources"]["limits"]["memory"]
    assert int(limit.removesuffix("Mi")) > int(maxmemory.removesuffix("mb"))
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False


def test_only_the_processor_pods_reach_redis():
    spec = one("NetworkPolicy", "ext-proc-redis")["spec"]
    assert spec["podSelector"] == {"matchLabels": redis_pod_labels()}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["egress"] == []
    (rule,) = spec["ingress"]
    processor_pods = {
        "app.kubernetes.io/name": "ext-proc-token-policy",
        "app.kubernetes.io/instance": "ext-proc-token-policy",
    }
    assert rule["from"] == [{"podSelector": {"matchLabels": processor_pods}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    processor = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert rule["from"][0]["podSelector"]["matchLabels"].items() <= processor.items()
    # The selector picks the processor pods and not Redis itself or anything else shipped.
    for _, doc in kube_objects():
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] != "ext-proc-token-policy":
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert not rule["from"][0]["podSelector"]["matchLabels"].items() <= labels.items()


# --- the generator -----------------------------------------------------------------------


ARRANGEMENTS = {
    "one-message": {},
    "two-message": {"one_message": False},
    "streamed": {"one_message": False, "body_mode": "streamed"},
}


@pytest.mark.parametrize("arrangement", list(ARRANGEMENTS))
def test_generated_config_validates(tmp_path, arrangement):
    data = yaml.safe_load((DEPLOY / "envoy-config.example.yaml").read_text())
    data |= ARRANGEMENTS[arrangement]
    data["processor"] = "ext-proc-token-policy-headless.llm-d.svc.cluster.local:50051"
    spec = envoygen.load_input(data)
    envoy_validate(yaml.safe_load(envoygen.render(spec)), tmp_path, f"generated-{arrangement}")


def chat(params: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be careful."},
            {"role": "user", "content": "hello"},
        ],
        "kv_transfer_params": params,
    }


def test_generated_config_runs_end_to_end(tmp_path):
    generated = tmp_path / "generated.yaml"
    assert envoygen.main([str(DEPLOY / "envoy-config.example.yaml"), "-o", str(generated)]) == 0
    stack = Stack(tmp_path, source=generated, routes=[], proof_keys={"k1": new_key()}).start()
    try:
        with httpx.Client(timeout=20) as client:
            # A client's own parameters are removed whole, on every route.
            for path in ("/v1/chat/completions", "/pd/v1/chat/completions"):
                reply = client.post(
                    stack.url + path, json=chat({"prompt_token_ids": [1, 2, 3], "remote_port": 9})
                )
                assert reply.status_code == 200, reply.text
                (received,) = stack.received()
                assert received.target == "/v1/chat/completions"
                assert "kv_transfer_params" not in json.loads(received.body)
                stack.clear()

            # The hand-off: signed on the prefill route, honored on the decode route.
            prefill = {**chat({}), "max_tokens": 1, "return_token_ids": True}
            del prefill["kv_transfer_params"]
            reply = client.post(stack.url + "/pd/prefill/v1/chat/completions", json=prefill)
            assert reply.status_code == 200, reply.text
            params = reply.json()["kv_transfer_params"]
            assert params["token_policy_proof"].startswith("tp4.k1.")
            stack.clear()
            reply = client.post(stack.url + "/pd/v1/chat/completions", json=chat(params))
            assert reply.status_code == 200, reply.text
            (received,) = stack.received()
            assert json.loads(received.body)["kv_transfer_params"] == params  # as sent
            stack.clear()

            # Ids changed after signing: the proof no longer matches, the parameters go.
            forged = {**params, "prompt_token_ids": [1, True, -3]}
            reply = client.post(stack.url + "/pd/v1/chat/completions", json=chat(forged))
            assert reply.status_code == 200, reply.text
            (received,) = stack.received()
            assert "kv_transfer_params" not in json.loads(received.body)
    finally:
        stack.stop()


# --- Istio ---------------------------------------------------------------------------------


def istio_filter() -> dict[str, Any]:
    (doc,) = documents(DEPLOY / "istio" / "envoyfilter.yaml")
    assert (doc["apiVersion"], doc["kind"]) == ("networking.istio.io/v1alpha3", "EnvoyFilter")
    return doc


def httproutes() -> list[dict[str, Any]]:
    """The example HTTPRoutes, which both Istio and Envoy Gateway serve."""
    return documents(DEPLOY / "envoy-gateway" / "httproutes.yaml")


def istio_filter_name() -> str:
    """The name the EnvoyFilter gives this project's ext_proc filter (the one it
    inserts first)."""
    (name,) = [
        p["patch"]["value"]["name"]
        for p in istio_filter()["spec"]["configPatches"]
        if p["applyTo"] == "HTTP_FILTER" and p["patch"]["operation"] == "INSERT_FIRST"
    ]
    return str(name)


def istio_bootstrap(envoy_filter: dict[str, Any] | None = None) -> dict[str, Any]:
    return gateway_assembly.istio_bootstrap(envoy_filter or istio_filter(), httproutes())


def routes_of(config: dict[str, Any]) -> list[dict[str, Any]]:
    hcm = config["static_resources"]["listeners"][0]["default_filter_chain"]["filters"][0]
    routes: list[dict[str, Any]] = hcm["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    return routes


def manager_of(config: dict[str, Any]) -> dict[str, Any]:
    manager: dict[str, Any] = config["static_resources"]["listeners"][0]["default_filter_chain"][
        "filters"
    ][0]["typed_config"]
    return manager


def shipped_manager() -> dict[str, Any]:
    shipped = yaml.safe_load((REPO / "envoy" / "envoy.yaml").read_text())
    (listener,) = shipped["static_resources"]["listeners"]
    (chain,) = listener["filter_chains"]
    (manager,) = chain["filters"]
    typed: dict[str, Any] = manager["typed_config"]
    return typed


# The rewrites of the example HTTPRoutes, as Istio and Envoy Gateway write them.
# The connector request the prefill routes write (connector: nixl).
NIXL = tuple(CONNECTOR_REQUESTS["nixl"].items())
PD_REWRITES = {
    "llama-pd.0": {"match_prefix": "/pd/v1", "prefix_rewrite": "/v1"},
    "llama-pd.1": {"match_prefix": "/pd/prefill/v1", "prefix_rewrite": "/v1"},
}


def generated_not_found_routes() -> list[dict[str, Any]]:
    """The generator's token endpoint 404s for routes shaped as the HTTPRoutes (/pd/v1/
    and /pd/prefill/v1/ rewritten to /v1/, and /), without the per-filter config."""
    data = yaml.safe_load((DEPLOY / "envoy-config.example.yaml").read_text())
    config = envoygen.to_dict(envoygen.build(envoygen.load_input(data)))
    routes = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]["route_config"]["virtual_hosts"][0]["routes"]
    return [
        {k: v for k, v in r.items() if k != "typed_per_filter_config"}
        for r in routes
        if "direct_response" in r and not r["name"].endswith("-refused")
    ]


def test_httproutes_need_no_404s_beyond_the_generators():
    # No HTTPRoute rewrites onto the token-in API: the regex and the root prefixes cover
    # every path its routes reach (the deploy 404s below are those).
    for route in gateway_assembly.istio_routes(httproutes()):
        match = route["match"]
        prefix = match.get("path_separated_prefix", match.get("prefix"))
        rewrite = route.get("route", {}).get("prefix_rewrite")
        assert token_endpoints.rewritten_into(prefix, rewrite) == (), route["name"]


def test_istio_filter_is_first_and_fails_closed():
    patches = istio_filter()["spec"]["configPatches"]
    http_filter, step, hold = [p for p in patches if p["applyTo"] == "HTTP_FILTER"]
    assert http_filter["match"]["context"] == "GATEWAY"
    # The header step right before the filter: the generator's own.
    assert step["patch"]["operation"] == "INSERT_BEFORE"
    before = step["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"]
    assert before == http_filter["patch"]["value"]["name"]
    spec = envoygen.load_input(envoygen.read_input(REPO / "deploy" / "envoy-config.example.yaml"))
    generated = envoygen.to_dict(envoygen.build(spec))
    (listener,) = generated["static_resources"]["listeners"]
    generated_chain = listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    assert step["patch"]["value"] == generated_chain[0]
    # The request is held right after the filter until its body has been let through.
    assert hold["patch"]["operation"] == "INSERT_AFTER"
    sub = hold["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"]
    assert sub == http_filter["patch"]["value"]["name"]
    assert hold["patch"]["value"]["name"] == "envoy.filters.http.buffer"
    names = [f["name"] for f in manager_of(istio_bootstrap())["http_filters"]]
    assert names == [
        carrier_headers.FILTER,
        sub,
        "envoy.filters.http.buffer",
        "envoy.filters.http.router",
    ]
    # Before the router and before any endpoint-picker ext_proc.
    assert http_filter["patch"]["operation"] == "INSERT_FIRST"
    config = http_filter["patch"]["value"]["typed_config"]
    assert_fails_closed(config)
    (cluster,) = [p for p in patches if p["applyTo"] == "CLUSTER"]
    assert config["grpc_service"]["envoy_grpc"]["cluster_name"] == cluster["patch"]["value"]["name"]
    endpoint = cluster["patch"]["value"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    address = endpoint["endpoint"]["address"]["socket_address"]["address"]
    assert address == "ext-proc-token-policy-headless.llm-d.svc.cluster.local"


def test_istio_routes_get_policy_and_buffer_limit():
    routes = [r for r in routes_of(istio_bootstrap()) if "route" in r]
    policies = {r["name"]: policy_from(r["metadata"]["filter_metadata"][NAMESPACE]) for r in routes}
    assert policies == {
        "llm-d.llama-pd.0": RoutePolicy(
            Topology.DISAGGREGATED, Action.HONOR, 128256, 131072, **PD_REWRITES["llama-pd.0"]
        ),
        "llm-d.llama-pd.1": RoutePolicy(
            Topology.DISAGGREGATED,
            Action.MINT,
            128256,
            131072,
            **PD_REWRITES["llama-pd.1"],
            connector=NIXL,
        ),
        "llm-d.llama.0": RoutePolicy(Topology.AGGREGATED, Action.STRIP),
    }
    assert {r["request_body_buffer_limit"] for r in routes} == {16 * 1024 * 1024}
    by_name = {r["name"]: r for r in routes}
    # The metadata states each route's rewrite (check-envoy compares them too).
    for name in ("llm-d.llama-pd.0", "llm-d.llama-pd.1"):
        entry = by_name[name]
        stated = entry["metadata"]["filter_metadata"][NAMESPACE]
        assert stated["match_prefix"] == entry["match"]["path_separated_prefix"]
        assert stated["prefix_rewrite"] == entry["route"]["prefix_rewrite"]
    # Only the prefill (mint) route sends the response to the processor.
    filter_name = istio_filter_name()
    (override,) = by_name["llm-d.llama-pd.1"]["typed_per_filter_config"].values()
    assert_sends_the_response(override, filter_name, by_name["llm-d.llama-pd.1"], "SKIP")
    for name in ("llm-d.llama-pd.0", "llm-d.llama.0"):
        assert "typed_per_filter_config" not in by_name[name]


def test_istio_answers_the_token_endpoints_as_the_generator_does():
    routes = routes_of(istio_bootstrap())
    filter_name = istio_filter_name()
    inserted = [r for r in routes if "direct_response" in r]
    # Before every route Istio makes of the HTTPRoutes, the filter disabled on each.
    assert routes[: len(inserted)] == inserted
    for entry in inserted:
        assert entry.pop("typed_per_filter_config") == {
            filter_name: {"@type": PER_ROUTE, "disabled": True}
        }
    key = json.dumps
    token = [r for r in inserted if not r["name"].endswith("-refused")]
    assert sorted(map(key, token)) == sorted(map(key, generated_not_found_routes()))


def refused_by_class() -> dict[str, dict[str, Any]]:
    """The 404s of every refused endpoint, one per class, as refused_paths writes them
    for a route table it does not know (a platform's)."""
    return {
        name: {
            "name": name,
            "match": {
                "safe_regex": {
                    "regex": refused_paths.anywhere_regex(refused_paths.class_names(refused))
                }
            },
            "direct_response": {"status": 404},
        }
        for name, refused in refused_paths.ANYWHERE_ROUTES.items()
    }


def test_istio_answers_the_refused_endpoints_by_path_before_every_route():
    routes = routes_of(istio_bootstrap())
    first = next(i for i, r in enumerate(routes) if "route" in r)
    answered = {r["name"]: r for r in routes[:first] if r["name"].endswith("-refused")}
    for entry in answered.values():
        assert entry.pop("typed_per_filter_config") == {
            istio_filter_name(): {"@type": PER_ROUTE, "disabled": True}
        }
    assert answered == refused_by_class()


def assert_sends_the_response(
    override: dict[str, Any], name: str, route: dict[str, Any], request_headers: str
) -> None:
    """``override`` is the mint route's ExtProcPerRoute for filter ``name``: response
    headers and the buffered response body go to the processor, the request as the
    filter sends it (``request_headers``: SKIP for one message per request)."""
    assert route["typed_per_filter_config"] == {name: route["typed_per_filter_config"][name]}
    assert override["@type"] == PER_ROUTE
    mode = override["overrides"]["processing_mode"]
    assert mode == {
        "request_header_mode": request_headers,
        "response_header_mode": "SEND",
        "request_body_mode": "BUFFERED",
        "response_body_mode": "BUFFERED",
        "request_trailer_mode": "SEND",
        "response_trailer_mode": "SKIP",
    }
    assert "failure_mode_allow" not in override["overrides"]


PATH_SETTINGS = ("normalize_path", "merge_slashes", "path_with_escaped_slashes_action")


def test_istio_connection_manager_is_the_shipped_one():
    """As the shipped Envoy configs: keep_alive_after_denial, and the path normalised
    (escaped slashes included, which Istio keeps by default) before routes match."""
    manager, shipped = manager_of(istio_bootstrap()), shipped_manager()
    assert manager["http_protocol_options"] == shipped["http_protocol_options"]
    for key in PATH_SETTINGS:
        assert manager[key] == shipped[key], key


def test_istio_envoy_config_passes_check_envoy():
    report = check_envoy.check(istio_bootstrap())
    assert (report.errors, report.warnings, report.routes) == ([], [], 9)


def patch_of(
    envoy_filter: dict[str, Any], apply_to: str, name: str | None = None
) -> dict[str, Any]:
    """The one patch of ``envoy_filter`` that applies to ``apply_to`` (and whose value,
    or whose matched route, is called ``name``)."""
    (found,) = [
        p
        for p in envoy_filter["spec"]["configPatches"]
        if p["applyTo"] == apply_to
        and name
        in (
            None,
            p["patch"]["value"].get("name"),
            p["match"].get("routeConfiguration", {}).get("vhost", {}).get("route", {}).get("name"),
        )
    ]
    return found


def _keep_escaped_slashes(envoy_filter: dict[str, Any]) -> None:
    typed = patch_of(envoy_filter, "NETWORK_FILTER")["patch"]["value"]["typed_config"]
    del typed["path_with_escaped_slashes_action"]  # Istio's default stays: KEEP_UNCHANGED


def _no_echo_route(envoy_filter: dict[str, Any]) -> None:
    envoy_filter["spec"]["configPatches"].remove(
        patch_of(envoy_filter, "HTTP_ROUTE", "token-endpoint-echo")
    )


def _no_hold(envoy_filter: dict[str, Any]) -> None:
    envoy_filter["spec"]["configPatches"].remove(
        patch_of(envoy_filter, "HTTP_FILTER", "envoy.filters.http.buffer")
    )


def _unstated_rewrite(envoy_filter: dict[str, Any]) -> None:
    value = patch_of(envoy_filter, "HTTP_ROUTE", "llm-d.llama-pd.1")["patch"]["value"]
    for key in envoygen.REWRITE_FIELDS:
        del value["metadata"]["filter_metadata"][NAMESPACE][key]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        # Istio's default: escaped slashes kept, and vLLM's server decodes "%2F".
        (_keep_escaped_slashes, "path_with_escaped_slashes_action KEEP_UNCHANGED"),
        # Without the echo route, the P/D routes pass render paths to vLLM.
        (_no_echo_route, "llm-d.llama-pd.0: forwards '/pd/v1/chat/completions/render'"),
        # Without the stated rewrite, proofs would be bound to the downstream path.
        (_unstated_rewrite, "llm-d.llama-pd.1: the route rewrites '/pd/prefill/v1' to '/v1'"),
        # Without the buffer filter, the upstream request opens before the decision.
        (_no_hold, "llm-d.llama.0: ext_proc.token_policy skips the request headers"),
    ],
    ids=["escaped-slashes", "echo-route", "rewrite-metadata", "hold"],
)
def test_check_envoy_catches_an_istio_filter_without_each_part(change, error):
    envoy_filter = istio_filter()
    change(envoy_filter)
    errors = check_envoy.check(istio_bootstrap(envoy_filter)).errors
    assert any(error in e for e in errors), errors


def _no_retry_override(envoy_filter: dict[str, Any]) -> None:
    for patch in envoy_filter["spec"]["configPatches"]:
        patch["patch"]["value"].pop("route", None)


def _zero_retries(envoy_filter: dict[str, Any]) -> None:
    # A zero is no value in a proto merge: istiod's num_retries stays.
    for patch in envoy_filter["spec"]["configPatches"]:
        if "route" in patch["patch"]["value"]:
            patch["patch"]["value"]["route"] = {"retry_policy": {"num_retries": 0}}


def _empty_retry_on(envoy_filter: dict[str, Any]) -> None:
    # Likewise an empty retry_on: istiod's conditions stay.
    for patch in envoy_filter["spec"]["configPatches"]:
        if "route" in patch["patch"]["value"]:
            patch["patch"]["value"]["route"] = {"retry_policy": {"retry_on": ""}}


ISTIO_DEFAULTS = pytest.mark.parametrize(
    "default",
    [gateway_assembly.ISTIO_RETRY_POLICY, gateway_assembly.ISTIO_1_23_RETRY_POLICY],
    ids=["istio", "istio-1.23"],
)
MINT_AND_HONOR = ["llm-d.llama-pd.0", "llm-d.llama-pd.1"]


def _flagged_routes(errors: list[str]) -> list[str]:
    return sorted(m.group(1) for e in errors if (m := re.search(r" route [^/\s]+/(\S+?):", e)))


@ISTIO_DEFAULTS
def test_istio_mint_and_honor_routes_retry_only_unread_requests(default):
    config = gateway_assembly.istio_bootstrap(istio_filter(), httproutes(), default)
    assert check_envoy.check(config).errors == []
    by_name = {r["name"]: r for r in routes_of(config) if "route" in r}
    kept = {k: v for k, v in default.items() if k != "retry_on"}
    for name in MINT_AND_HONOR:
        policy = dict(by_name[name]["route"]["retry_policy"])
        # Only conditions no upstream read the request under; istiod's other fields stay
        # and act on those conditions alone (retriable_status_codes on none of them).
        assert set(policy.pop("retry_on").split(",")) == UNSENT
        assert policy == kept
    # The aggregated (strip) route keeps istiod's policy: its copies spend no proof.
    assert by_name["llm-d.llama.0"]["route"]["retry_policy"] == default


@ISTIO_DEFAULTS
@pytest.mark.parametrize(
    "change", [_no_retry_override, _zero_retries, _empty_retry_on], ids=["none", "zero", "empty"]
)
def test_check_envoy_catches_istios_retry_on_mint_and_honor_routes(default, change):
    envoy_filter = istio_filter()
    change(envoy_filter)
    config = gateway_assembly.istio_bootstrap(envoy_filter, httproutes(), default)
    report = check_envoy.check(config)
    assert report.codes() == ["body-retried", "body-retried"]
    assert _flagged_routes(report.errors) == MINT_AND_HONOR


@ISTIO_DEFAULTS
def test_istio_envoy_config_validates(default, tmp_path):
    config = gateway_assembly.istio_bootstrap(istio_filter(), httproutes(), default)
    envoy_validate(config, tmp_path, "istio")


# --- Envoy Gateway -----------------------------------------------------------------------


def envoy_gateway_bootstrap() -> dict[str, Any]:
    eg = DEPLOY / "envoy-gateway"
    (extension,) = documents(eg / "extension-policy.yaml")
    (patch,) = documents(eg / "patch-policy.yaml")
    return gateway_assembly.envoy_gateway_bootstrap(
        extension, patch, httproutes(), "llm-d/inference-gateway/http"
    )


def test_envoy_gateway_extension_policy():
    (policy,) = documents(DEPLOY / "envoy-gateway" / "extension-policy.yaml")
    assert (policy["apiVersion"], policy["kind"]) == (
        "gateway.envoyproxy.io/v1alpha1",
        "EnvoyExtensionPolicy",
    )
    (ext_proc,) = policy["spec"]["extProc"]
    assert ext_proc["failOpen"] is False
    assert ext_proc["processingMode"]["request"]["body"] == "Buffered"
    assert "response" not in ext_proc["processingMode"]
    assert ext_proc["messageTimeout"] == "5s"
    (ref,) = ext_proc["backendRefs"]
    names = {doc["metadata"]["name"] for _, doc in kube_objects() if doc["kind"] == "Service"}
    assert ref["kind"] == "Service"
    assert ref["name"] in names
    assert ref["port"] == 50051
    assert policy["spec"]["targetRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway"}
    ]


def test_envoy_gateway_patches_complete_the_filter():
    config = envoy_gateway_bootstrap()
    hcm = config["static_resources"]["listeners"][0]["default_filter_chain"]["filters"][0]
    step, ext_proc, router = hcm["typed_config"]["http_filters"]
    assert router["name"] == "envoy.filters.http.router"
    # The header step first: check-envoy (below) checks what it removes and sets.
    assert step["name"] == carrier_headers.FILTER
    typed = ext_proc["typed_config"]
    assert typed["failure_mode_allow"] is False
    # Two messages: EnvoyExtensionPolicy sends the headers whenever `request` is set.
    assert typed["processing_mode"]["request_header_mode"] == "SEND"
    assert typed["request_attributes"] == list(attribute_keys().all())
    assert typed["processing_mode"]["request_body_mode"] == "BUFFERED"
    assert typed["processing_mode"]["request_trailer_mode"] == "SEND"
    assert typed["grpc_service"]["envoy_grpc"]["max_receive_message_length"] == 64 * 1024**2
    routes = [r for r in routes_of(config) if "route" in r]
    by_name = {r["name"]: r for r in routes}
    pd = by_name["httproute/llm-d/llama-pd/rule/0/match/0/*"]
    prefill = by_name["httproute/llm-d/llama-pd/rule/1/match/0/*"]
    aggregated = by_name["httproute/llm-d/llama/rule/0/match/0/*"]
    assert policy_from(pd["metadata"]["filter_metadata"][NAMESPACE]) == RoutePolicy(
        Topology.DISAGGREGATED, Action.HONOR, 128256, 131072, **PD_REWRITES["llama-pd.0"]
    )
    assert policy_from(prefill["metadata"]["filter_metadata"][NAMESPACE]) == RoutePolicy(
        Topology.DISAGGREGATED,
        Action.MINT,
        128256,
        131072,
        **PD_REWRITES["llama-pd.1"],
        connector=NIXL,
    )
    assert policy_from(aggregated["metadata"]["filter_metadata"][NAMESPACE]) == RoutePolicy(
        Topology.AGGREGATED, Action.STRIP
    )
    # The stated rewrites are the routes' (Envoy Gateway drops the trailing "/").
    for entry in (pd, prefill):
        stated = entry["metadata"]["filter_metadata"][NAMESPACE]
        assert stated["match_prefix"] == entry["match"]["path_separated_prefix"]
        assert stated["prefix_rewrite"] == entry["route"]["prefix_rewrite"]
    # Envoy Gateway's own metadata survives the patch.
    assert "envoy-gateway" in pd["metadata"]["filter_metadata"]
    assert {r["request_body_buffer_limit"] for r in routes} == {16 * 1024 * 1024}
    # The filter stays enabled on every route (Envoy Gateway adds it disabled); only the
    # prefill route also sends the response.
    for route in routes:
        (enabling,) = route["typed_per_filter_config"].values()
        assert enabling["@type"] == FILTER_CONFIG
        assert not enabling.get("disabled", False)
    (enabling,) = prefill["typed_per_filter_config"].values()
    assert_sends_the_response(enabling["config"], ext_proc["name"], prefill, "SEND")
    for route in (pd, aggregated):
        (enabling,) = route["typed_per_filter_config"].values()
        assert enabling["config"] == {}


def test_envoy_gateway_answers_the_token_endpoints_as_the_generator_does():
    routes = routes_of(envoy_gateway_bootstrap())
    inserted = [r for r in routes if "direct_response" in r]
    # First in the virtual host, in the generator's order; Envoy Gateway's filter is
    # disabled unless a route enables it, and these do not.
    assert routes[: len(inserted)] == inserted
    token = [r for r in inserted if not r["name"].endswith("-refused")]
    assert token == generated_not_found_routes()


def test_envoy_gateway_answers_the_refused_endpoints_by_path_before_every_route():
    routes = routes_of(envoy_gateway_bootstrap())
    first = next(i for i, r in enumerate(routes) if "route" in r)
    # After the token endpoints' 404s, without the filter (Envoy Gateway's is disabled
    # unless a route enables it).
    answered = {r["name"]: r for r in routes[:first] if r["name"].endswith("-refused")}
    assert answered == refused_by_class()


def test_envoy_gateway_normalises_paths_as_the_shipped_configs():
    manager, shipped = manager_of(envoy_gateway_bootstrap()), shipped_manager()
    for key in PATH_SETTINGS:
        assert manager[key] == shipped[key], key


def test_envoy_gateway_patch_with_a_wrong_name_is_caught():
    (patch,) = documents(DEPLOY / "envoy-gateway" / "patch-policy.yaml")
    operation = next(
        copy.deepcopy(p["operation"])
        for p in patch["spec"]["jsonPatches"]
        if "token-policy" in p["operation"]["jsonPath"]
    )
    operation["jsonPath"] = operation["jsonPath"].replace("token-policy", "token-polcy")
    with pytest.raises(LookupError):
        gateway_assembly.apply_patch({"http_filters": []}, operation)


def test_envoy_gateway_envoy_config_validates(tmp_path):
    envoy_validate(envoy_gateway_bootstrap(), tmp_path, "envoy-gateway")


def test_envoy_gateway_envoy_config_passes_check_envoy():
    # Envoy Gateway adds the filter disabled and enables it per route (FilterConfig).
    report = check_envoy.check(envoy_gateway_bootstrap())
    assert report.errors == []
    assert report.warnings == []
    assert report.routes == 9


def test_check_envoy_catches_a_patch_policy_without_the_404s():
    eg = DEPLOY / "envoy-gateway"
    (extension,) = documents(eg / "extension-policy.yaml")
    (patch,) = documents(eg / "patch-policy.yaml")
    patch["spec"]["jsonPatches"] = [
        p
        for p in patch["spec"]["jsonPatches"]
        if "virtual_hosts" not in p["operation"].get("jsonPath", "")
    ]
    config = gateway_assembly.envoy_gateway_bootstrap(
        extension, patch, httproutes(), "llm-d/inference-gateway/http"
    )
    errors = check_envoy.check(config).errors
    assert any(
        "llama-pd/rule/0/match/0/*: forwards '/pd/v1/chat/completions/render'" in e for e in errors
    )
    assert any("llama/rule/0/match/0/*: forwards '/inference/v1/generate'" in e for e in errors)


# --- refused endpoints without a body, through the assembled gateways -------------------

# The example HTTPRoutes' prefixes, and a root path no route names.
HTTPROUTE_PREFIXES = ("/", "/v1/", "/pd/v1/", "/pd/prefill/v1/", "/x/")
# Processor clusters, by the name each platform's manifests give them.
ISTIO_PROCESSOR = "ext_proc_token_policy"
EG_PROCESSOR = "envoyextensionpolicy/llm-d/token-policy/0"
PLATFORMS = {
    "istio": (istio_bootstrap, ISTIO_PROCESSOR),
    "envoy-gateway": (envoy_gateway_bootstrap, EG_PROCESSOR),
}


def processor_connection(config: dict[str, Any], processor: str) -> tuple[int, int]:
    """The processor cluster's streams on one HTTP/2 connection and max_outbound_frames."""
    (found,) = [c for c in config["static_resources"]["clusters"] if c["name"] == processor]
    options = found["typed_extension_protocol_options"][envoygen.HTTP_OPTIONS]
    h2 = options["explicit_http_config"]["http2_protocol_options"]
    return h2.get("max_concurrent_streams", 0), h2.get("max_outbound_frames", 0)


def bounded_connection(largest_body: int) -> tuple[int, int]:
    """What every wiring gives the processor cluster for its largest body (envoygen's)."""
    return envoygen.PROCESSOR_STREAMS, envoygen.processor_outbound_frames(largest_body)


def largest_route_body(config: dict[str, Any]) -> int:
    hcm = config["static_resources"]["listeners"][0]["default_filter_chain"]["filters"][0]
    hosts = hcm["typed_config"]["route_config"]["virtual_hosts"]
    limits = [r["request_body_buffer_limit"] for h in hosts for r in h["routes"] if "route" in r]
    assert limits
    return int(max(limits))


@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_the_processor_connection_has_room_for_its_streams_bodies(platform):
    # Bodies queued on one connection to a processor slow to read would otherwise pass
    # Envoy's default max_outbound_frames, which ends the connection as a flood.
    assemble, processor = PLATFORMS[platform]
    config = assemble()
    assert processor_connection(config, processor) == bounded_connection(largest_route_body(config))


@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_a_bodiless_request_never_reaches_a_refused_endpoint_through_the_manifests(
    platform, tmp_path
):
    # A request without a body never reaches the processor with one message per request
    # (Istio); with two (Envoy Gateway) it would be refused 400 there, but in audit mode
    # let through. Envoy answers it by path first, on every route.
    assemble, processor = PLATFORMS[platform]
    with gateway_run.running(assemble(), tmp_path, processor) as gateway:
        assert gateway_run.bodiless_refusals(gateway, HTTPROUTE_PREFIXES) == []
        assert gateway.received() == []
        # A path that only ends like one is served, and so is a bodiless request to an
        # endpoint no route refuses.
        for path in ("/v1/models", "/pd/v1/flush_cache_x", "/v1/my_pause"):
            assert gateway.send("GET", path) == 200, path
        assert [target for _, target in gateway.received()] == [
            "/v1/models",
            "/v1/flush_cache_x",
            "/v1/my_pause",
        ]


def test_check_envoy_catches_manifests_without_the_refused_404s():
    envoy_filter = istio_filter()
    patches = envoy_filter["spec"]["configPatches"]
    envoy_filter["spec"]["configPatches"] = [
        p for p in patches if not p["patch"]["value"].get("name", "").endswith("-refused")
    ]
    istio = check_envoy.check(istio_bootstrap(envoy_filter))
    eg = DEPLOY / "envoy-gateway"
    (extension,) = documents(eg / "extension-policy.yaml")
    (patch,) = documents(eg / "patch-policy.yaml")
    patch["spec"]["jsonPatches"] = [
        p
        for p in patch["spec"]["jsonPatches"]
        if not str(p["operation"].get("value", "")).count("-refused")
    ]
    config = gateway_assembly.envoy_gateway_bootstrap(
        extension, patch, httproutes(), "llm-d/inference-gateway/http"
    )
    envoy_gateway = check_envoy.check(config)
    for report in (istio, envoy_gateway):
        assert sorted(set(report.codes())) == ["refused-endpoint-forwarded"]
        assert len(report.errors) == 3  # each forwarding route


@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_the_manifests_answer_an_unreachable_processor_503_with_retry_after(platform, tmp_path):
    # The processor's cluster points at a port nothing listens on: Envoy answers
    # status_on_error's 503 and the virtual hosts' (or route configuration's) retry-after,
    # forwarding nothing; an answer of Envoy's own that is no processor failure (a token
    # endpoint's 404) gets no retry-after.
    assemble, processor = PLATFORMS[platform]
    ports = {
        name: HostPort("127.0.0.1", processes.free_port())
        for name in ("gateway", "admin", "processor", "stand_in")
    }
    config = gateway_run.runnable(assemble(), ports, processor)
    (tmp_path / "envoy.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    stand_in = start_stand_in(ports["stand_in"], tmp_path / "stand-in.log")
    try:
        args = processes.envoy_args(tmp_path / "envoy.yaml", ports["admin"].port)
        envoy = processes.start(args, tmp_path / "envoy.log")
        try:
            processes.wait_for_envoy(ports["admin"].port, envoy)
            url = f"http://{ports['gateway']}"
            with httpx.Client(timeout=20) as client:
                for path in ("/v1/completions", "/pd/v1/completions", "/pd/prefill/v1/completions"):
                    reply = client.post(url + path, json={"model": "m", "prompt": "hi"})
                    assert reply.status_code == 503, (path, reply.text)
                    assert reply.headers["retry-after"] == "1", path
                refused = client.post(url + "/v1/render", json={})
                assert refused.status_code == 404
                assert "retry-after" not in refused.headers
            running = gateway_run.Running(ports["gateway"], ports["stand_in"])
            assert running.received() == []
        finally:
            processes.stop(envoy)
    finally:
        processes.stop(stand_in)
