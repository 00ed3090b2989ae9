"""deploy/llm-d/routing-sidecar/, offline: the component renders on the example
Deployments, its objects follow the Kubernetes schemas, the Envoy configs it mounts are
the generated envoy/envoy-pod-*.yaml and pass check-envoy and `envoy --mode validate`,
vLLM is on loopback behind them and the routing sidecar is hardened."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ext_proc.core.config import Config
from ext_proc.tools import check_envoy
from tests.e2e.manifests import envoy_validate

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "deploy" / "llm-d" / "routing-sidecar"
COMPONENT = HERE / "component"
EXAMPLE = HERE / "example"
KUBECTL = shutil.which("kubectl")
KUBE_VERSION = "1.31.0"  # native sidecars (initContainers restartPolicy) GA since 1.29
ROLES = {
    # role: (Envoy config, vLLM's loopback port, the pod Envoy's listener)
    "prefill": ("envoy-pod-prefill.yaml", 8001, ("0.0.0.0", 8000)),
    "decode": ("envoy-pod-decode.yaml", 8201, ("127.0.0.1", 8200)),
}


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    if KUBECTL is None:
        pytest.skip("kubectl is not on PATH")
    result = subprocess.run(
        [KUBECTL, "kustomize", str(EXAMPLE)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d is not None]


def objects(rendered: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in rendered if d["kind"] == kind]


def deployment(rendered: list[dict[str, Any]], role: str) -> dict[str, Any]:
    (found,) = [
        d
        for d in objects(rendered, "Deployment")
        if d["metadata"]["labels"].get("llm-d.ai/role") == role
    ]
    return found


def pod(rendered: list[dict[str, Any]], role: str) -> dict[str, Any]:
    spec: dict[str, Any] = deployment(rendered, role)["spec"]["template"]["spec"]
    return spec


def init_container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in spec["initContainers"] if c["name"] == name]
    return found


def flag(args: list[str], name: str) -> str | None:
    """The value a flag takes when given more than once: the last (argparse, pflag)."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return values[-1] if values else None


def envoy_config(rendered: list[dict[str, Any]], role: str) -> str:
    spec = pod(rendered, role)
    (volume,) = [v for v in spec["volumes"] if v["name"] == "token-policy-envoy"]
    name = volume["configMap"]["name"]
    (config_map,) = [d for d in objects(rendered, "ConfigMap") if d["metadata"]["name"] == name]
    text: str = config_map["data"]["envoy.yaml"]
    return text


def test_the_objects_follow_the_kubernetes_schemas(rendered):
    kinds = []
    for doc in rendered:
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {exc}")
        kinds.append(doc["kind"])
    assert sorted(kinds) == sorted(
        [
            "ConfigMap",
            "ConfigMap",
            "ConfigMap",
            "Deployment",
            "Deployment",
            "Deployment",
            "NetworkPolicy",
            "NetworkPolicy",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
    )


@pytest.mark.parametrize("role", ROLES)
def test_the_mounted_envoy_configs_are_the_generated_ones_and_valid(rendered, role, tmp_path):
    name = ROLES[role][0]
    text = envoy_config(rendered, role)
    assert text == (COMPONENT / name).read_text()
    config = yaml.safe_load(text)
    report = check_envoy.check(config)
    assert report.errors == []
    envoy_validate(config, tmp_path, name)


@pytest.mark.parametrize("role", ROLES)
def test_vllm_listens_on_loopback_behind_the_pods_envoy(rendered, role):
    _name, port, (listen_host, listen_port) = ROLES[role]
    spec = pod(rendered, role)
    vllm = spec["containers"][0]
    assert flag(vllm["args"], "host") == "127.0.0.1"
    assert flag(vllm["args"], "port") == str(port)
    # Only the NIXL side channel is declared: every HTTP port of the pod is the Envoy's
    # or the sidecar's.
    assert [p["containerPort"] for p in vllm["ports"]] == [5600]
    assert {"name": "UCX_TCP_PORT_RANGE", "value": "5700-5799"} in vllm["env"]
    # Probes reach vLLM through the pod's public port or from inside its container.
    for probe in ("startupProbe", "readinessProbe"):
        assert vllm[probe]["httpGet"]["port"] == 8000
    liveness = " ".join(vllm["livenessProbe"]["exec"]["command"])
    assert f"http://127.0.0.1:{port}/health" in liveness

    # The pod's Envoy listens where the traffic arrives and forwards to vLLM's port.
    config = yaml.safe_load(envoy_config(rendered, role))
    (listener,) = config["static_resources"]["listeners"]
    address = listener["address"]["socket_address"]
    assert (address["address"], address["port_value"]) == (listen_host, listen_port)
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    for cluster, expected in (("vllm", port), ("ext_proc", 50051)):
        (locality,) = clusters[cluster]["load_assignment"]["endpoints"]
        (endpoint,) = locality["lb_endpoints"]
        target = endpoint["endpoint"]["address"]["socket_address"]
        assert (target["address"], target["port_value"]) == ("127.0.0.1", expected)

    # Native sidecars, started before vLLM: the processor, then its Envoy.
    names = [c["name"] for c in spec["initContainers"]]
    assert names[-2:] == ["token-policy-processor", "token-policy-envoy"]
    for container in spec["initContainers"]:
        assert container["restartPolicy"] == "Always"


def test_the_processor_config_is_valid_and_on_loopback(rendered):
    (config_map,) = [
        d
        for d in objects(rendered, "ConfigMap")
        if d["metadata"]["name"] == "ext-proc-token-policy-pod"
    ]
    data = yaml.safe_load(config_map["data"]["config.yaml"])
    shipped = yaml.safe_load(
        yaml.safe_load((REPO / "deploy" / "kubernetes" / "configmap.yaml").read_text())["data"][
            "config.yaml"
        ]
    )
    assert set(data) == set(shipped)
    config = Config.model_validate(data)
    assert config.listen == "127.0.0.1:50051"
    assert [(k.id, k.file) for k in config.proof.keys] == [("k1", "/etc/ext-proc/proof-keys/k1")]
    for role in ROLES:
        spec = pod(rendered, role)
        (secret,) = [v for v in spec["volumes"] if v["name"] == "token-policy-proof-keys"]
        assert secret["secret"]["secretName"] == "ext-proc-proof-keys"
        mounted = [
            c["name"]
            for c in spec["initContainers"] + spec["containers"]
            if any(m["name"] == "token-policy-proof-keys" for m in c.get("volumeMounts", []))
        ]
        assert mounted == ["token-policy-processor"]


def test_the_routing_sidecar_is_hardened(rendered):
    spec = pod(rendered, "decode")
    sidecar = init_container(spec, "routing-proxy")
    args = sidecar["args"]
    assert flag(args, "enable-ssrf-protection") == "true"
    assert flag(args, "inference-pool") == "$(POD_NAMESPACE)/$(INFERENCE_POOL_NAME)"
    assert flag(args, "model-server-port") == "8200"  # the decode pod's Envoy
    env = {e["name"] for e in sidecar["env"]}
    assert {"POD_NAMESPACE", "INFERENCE_POOL_NAME"} <= env
    # The ServiceAccount token reaches the sidecar alone.
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == "llm-d-routing-sidecar"
    holders = [
        c["name"]
        for c in spec["initContainers"] + spec["containers"]
        if any(m["name"] == "routing-proxy-token" for m in c.get("volumeMounts", []))
    ]
    assert holders == ["routing-proxy"]
    (role,) = objects(rendered, "Role")
    granted = {
        (g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert {("", "pods"), ("inference.networking.k8s.io", "inferencepools")} <= granted
    for rule in role["rules"]:
        assert sorted(rule["verbs"]) == ["get", "list", "watch"]
    (binding,) = objects(rendered, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "llm-d-routing-sidecar", "namespace": "llm-d"}
    ]


def named(rendered: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in objects(rendered, kind) if d["metadata"]["name"] == name]
    return found


def redis_option(command: list[str], name: str) -> str:
    (index,) = [i for i, arg in enumerate(command) if arg == f"--{name}"]
    return command[index + 1]


def test_every_pods_processor_shares_the_redis_record(rendered):
    config_map = named(rendered, "ConfigMap", "ext-proc-token-policy-pod")
    config = Config.model_validate(yaml.safe_load(config_map["data"]["config.yaml"]))
    service = named(rendered, "Service", "ext-proc-redis")
    (port,) = service["spec"]["ports"]
    assert service["metadata"]["namespace"] == config_map["metadata"]["namespace"]
    # A decode pod honors a proof only if no pod did: one record for all of them.
    assert config.proof.record == f"redis://{service['metadata']['name']}:{port['port']}/0"
    redis = named(rendered, "Deployment", "ext-proc-redis")
    assert redis["spec"]["replicas"] == 1
    assert redis["spec"]["strategy"] == {"type": "Recreate"}
    template = redis["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    shipped = yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "redis.yaml").read_text())
    (base,) = [d for d in shipped if d["kind"] == "Deployment"]
    base_spec = base["spec"]["template"]["spec"]
    (container,) = template["spec"]["containers"]
    command = container["command"]
    # The base's Redis: its image pinned by digest, its password and ACL.
    assert container["image"] == base_spec["containers"][0]["image"]
    assert "@sha256:" in container["image"]
    assert template["spec"]["initContainers"] == base_spec["initContainers"]
    assert template["spec"]["volumes"] == base_spec["volumes"]
    assert template["spec"] == base_spec
    (auth,) = [v for v in template["spec"]["volumes"] if v["name"] == "auth"]
    assert auth["secret"]["secretName"] == "ext-proc-redis-auth"
    assert redis_option(command, "aclfile") == "/acl/users.acl"
    (container_port,) = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    assert container_port["containerPort"] == int(redis_option(command, "port"))
    # Persistence off; eviction by TTL only, sized as deploy/kubernetes's.
    assert redis_option(command, "save") == ""
    assert redis_option(command, "appendonly") == "no"
    assert redis_option(command, "maxmemory-policy") == "noeviction"
    assert command == base_spec["containers"][0]["command"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["runAsNonRoot"] is True
    # Both roles' processors carry the config and Redis's password (the Secret Redis's
    # ACL is written from), and their pods may reach Redis (the pool's own NetworkPolicy
    # restricts ingress only).
    password = config.proof.record_password_file
    assert password is not None
    assert Path(password).name == "password"  # the Secret's key
    for role in ROLES:
        spec = pod(rendered, role)
        (volume,) = [v for v in spec["volumes"] if v["name"] == "token-policy-config"]
        assert volume["configMap"]["name"] == "ext-proc-token-policy-pod"
        (secret,) = [v for v in spec["volumes"] if v["name"] == "token-policy-redis-auth"]
        assert secret["secret"]["secretName"] == auth["secret"]["secretName"]
        mounts = {
            c["name"]: m["mountPath"]
            for c in spec["initContainers"] + spec["containers"]
            for m in c.get("volumeMounts", [])
            if m["name"] == "token-policy-redis-auth"
        }
        assert mounts == {"token-policy-processor": str(Path(password).parent)}, role
    assert named(rendered, "NetworkPolicy", "llm-d-model-servers")["spec"]["policyTypes"] == [
        "Ingress"
    ]


def test_only_the_pools_pods_reach_redis(rendered):
    spec = named(rendered, "NetworkPolicy", "ext-proc-redis")["spec"]
    redis = named(rendered, "Deployment", "ext-proc-redis")
    assert spec["podSelector"] == {"matchLabels": redis["spec"]["selector"]["matchLabels"]}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["egress"] == []
    (rule,) = spec["ingress"]
    pool = {"llm-d.ai/inference-serving": "true"}
    assert rule["from"] == [{"podSelector": {"matchLabels": pool}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    for role in ROLES:
        labels = deployment(rendered, role)["spec"]["template"]["metadata"]["labels"]
        assert pool.items() <= labels.items(), role
    assert not pool.items() <= redis["spec"]["template"]["metadata"]["labels"].items()


def test_the_network_policy_admits_the_pool_to_nixl_and_ucx_only(rendered):
    policy = named(rendered, "NetworkPolicy", "llm-d-model-servers")
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"llm-d.ai/inference-serving": "true"}}
    assert spec["policyTypes"] == ["Ingress"]
    pool = {"podSelector": {"matchLabels": {"llm-d.ai/inference-serving": "true"}}}
    by_port = {}
    for rule in spec["ingress"]:
        for port in rule["ports"]:
            by_port[(port["port"], port.get("endPort"))] = rule["from"]
    assert set(by_port) == {(8000, None), (5600, None), (5700, 5799), (9464, None)}
    assert pool in by_port[(8000, None)]
    assert by_port[(5600, None)] == [pool]
    assert by_port[(5700, 5799)] == [pool]
    # No rule names vLLM's loopback ports or the decode Envoy's.
    assert not {8001, 8201, 8200, 50051} & {p for p, _ in by_port}
