"""deploy/helm/ext-proc-token-policy: the chart lints; every values file under ci/ renders,
each object follows the Kubernetes schemas (core objects) or is a resource the wiring
is checked as (CRDs); the Envoy configuration inside the rendered wiring, assembled as
Istio and Envoy Gateway would, passes check-envoy and the real `envoy --mode validate`;
the chart in the base's namespace renders the shipped manifests; values outside the
schema are refused."""

from __future__ import annotations

import asyncio
import base64
import copy
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import helm_python
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis import Redis as RedisClient
from redis.exceptions import AuthenticationError, NoPermissionError

from bench import tools
from devstack import helm, llmd, monitoring, processes
from ext_proc.core.config import Config
from ext_proc.core.replay import Ticket, Verdict
from ext_proc.edge import server
from ext_proc.edge.redis_record import RedisRecord
from ext_proc.tools import check_envoy
from ext_proc.tools.check_envoy.rules import processor_tls
from tests.e2e import certs, gateway_assembly
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
        ("cert-manager.io/v1", "Certificate"),
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
        "plaintext",
        "cert-manager",
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
    pod = one(objects, "Deployment", "ext-proc-token-policy")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    if values["redis"]["enabled"]:
        service = one(objects, "Service", "ext-proc-redis")
        assert config.proof.record == f"redis://{service['metadata']['name']}:6379/0"
        password = "ext-proc-redis-auth"
    else:
        assert config.proof.record == values["redis"]["url"]
        assert [d["metadata"]["name"] for d in every(objects, "Deployment")] == [
            "ext-proc-token-policy"
        ]
        password = values["redis"]["passwordSecret"]["name"]
    # The Redis password: a file of a mounted Secret.
    assert secret_of(pod, container, config.proof.record_password_file) == password
    # The proof keys: an existing Secret, never one of the chart's.
    assert secret_of(pod, container, config.proof.keys[0].file) == values["proofKeys"]["secretName"]
    assert values["proofKeys"]["secretName"] not in {
        o["metadata"]["name"] for o in every(objects, "Secret")
    }
    image = values["image"]
    expected = (
        f"{image['repository']}@{image['digest']}"
        if image["digest"]
        else f"{image['repository']}:{image['tag']}"
    )
    assert container["image"] == expected
    grace = config.drain_seconds + config.shutdown_grace_seconds
    assert pod["terminationGracePeriodSeconds"] > grace


def secret_of(pod: dict[str, Any], container: dict[str, Any], path: str | None) -> str:
    """The Secret whose volume the container mounts the file ``path`` from."""
    assert path is not None
    found = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    mount = max(found, key=lambda m: len(m["mountPath"]))  # the innermost mount
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return str(volume["secret"]["secretName"])


# --- secrets stay secret; the processor knows its caller ------------------------------------


@pytest.mark.parametrize("path", CI, ids=lambda p: p.name)
def test_no_configmap_holds_a_password(path):
    objects = rendered(values_of(path))
    passwords = [
        base64.b64decode(secret["data"]["password"]).decode()
        for secret in every(objects, "Secret")
        if "password" in secret.get("data", {})
    ]
    assert passwords or not merged(values_of(path))["redis"]["enabled"]
    for config_map in every(objects, "ConfigMap"):
        text = yaml.safe_dump(config_map)
        assert not any(password in text for password in passwords)
        for url in re.findall(r"rediss?://\S+", text):
            assert urlsplit(url).password is None, url
            assert "password=" not in url


def default_objects() -> tuple[list[dict[str, Any]], Config]:
    objects = rendered({})
    config = Config.model_validate(yaml.safe_load(one(objects, "ConfigMap")["data"]["config.yaml"]))
    return objects, config


def test_a_default_install_serves_only_envoys_certificate():
    """The processor demands a client certificate of the chart's CA; Envoy's certificate
    is of that CA, the processor's names its Services."""
    objects, config = default_objects()
    assert config.tls is not None
    assert config.tls.client_ca_file is not None
    pod = one(objects, "Deployment", "ext-proc-token-policy")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert secret_of(pod, container, config.tls.cert_file) == "ext-proc-token-policy-tls"
    assert secret_of(pod, container, config.tls.client_ca_file) == "ext-proc-token-policy-tls"
    server, client = (
        {k: base64.b64decode(v) for k, v in one(objects, "Secret", name)["data"].items()}
        for name in ("ext-proc-token-policy-tls", "ext-proc-token-policy-envoy")
    )
    assert server["ca.crt"] == client["ca.crt"]
    ca = x509.load_pem_x509_certificate(server["ca.crt"])
    for pem in (server["tls.crt"], client["tls.crt"]):
        x509.load_pem_x509_certificate(pem).verify_directly_issued_by(ca)
    names = x509.load_pem_x509_certificate(server["tls.crt"]).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert f"ext-proc-token-policy.{NAMESPACE}.svc" in names.value.get_values_for_type(x509.DNSName)


def test_without_the_network_policy_only_envoys_certificate_is_served():
    """networkPolicy.enabled false renders only with the processor's mTLS: the schema
    refuses it with tls.mode none (test_values_violating_the_schema_are_refused_at_render)."""
    objects = rendered({"networkPolicy": {"enabled": False}})
    assert "ext-proc-token-policy" not in {
        o["metadata"]["name"] for o in every(objects, "NetworkPolicy")
    }
    config = Config.model_validate(yaml.safe_load(one(objects, "ConfigMap")["data"]["config.yaml"]))
    assert config.tls is not None
    assert config.tls.client_ca_file is not None


def write_certificates(objects: list[dict[str, Any]], directory: Path) -> dict[str, Path]:
    """The chart's generated Secrets as files: the processor's and Envoy's."""
    out = {}
    for name, role in (
        ("ext-proc-token-policy-tls", "processor"),
        ("ext-proc-token-policy-envoy", "envoy"),
    ):
        folder = directory / role
        folder.mkdir(parents=True)
        for key, value in one(objects, "Secret", name)["data"].items():
            (folder / key).write_bytes(base64.b64decode(value))
        out[role] = folder
    return out


async def _health(port: int, credentials: grpc.ChannelCredentials) -> int:
    options = [("grpc.ssl_target_name_override", f"ext-proc-token-policy.{NAMESPACE}.svc")]
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
        return int(reply.status)


def test_the_processor_with_the_charts_certificates_refuses_a_caller_without_envoys(tmp_path):
    """The real processor, its tls as the chart's ConfigMap sets it, on the chart's
    generated certificates: Envoy's certificate is served, no certificate is refused."""
    objects, rendered_config = default_objects()
    files = write_certificates(objects, tmp_path)
    assert rendered_config.tls is not None
    tls = {
        field: str(files["processor"] / Path(getattr(rendered_config.tls, field)).name)
        for field in ("cert_file", "key_file", "client_ca_file")
    }
    config = Config.load(environ={}, listen="127.0.0.1:0", metrics_listen="", tls=tls)
    envoy = {
        name: (files["envoy"] / name).read_bytes() for name in ("tls.crt", "tls.key", "ca.crt")
    }

    async def run() -> None:
        running = await server.listen(config)
        try:
            with_certificate = grpc.ssl_channel_credentials(
                envoy["ca.crt"], envoy["tls.key"], envoy["tls.crt"]
            )
            assert await _health(running.port, with_certificate) >= 0
            without = grpc.ssl_channel_credentials(envoy["ca.crt"])
            with pytest.raises(grpc.aio.AioRpcError):
                await _health(running.port, without)
        finally:
            await running.server.stop(None)

    asyncio.run(run())


REDIS_REFUSED = [
    ("FLUSHALL",),
    ("CONFIG", "GET", "*"),
    ("KEYS", "*"),
    ("DEL", "ext_proc:spent-since"),
    ("SET", "other:key", "1"),
    ("GET", "other:key"),
    ("ACL", "LIST"),
    ("EVAL", "return redis.call('FLUSHALL')", "0"),
]


def test_the_charts_redis_serves_the_record_with_its_password_and_nothing_else(tmp_path):
    """A real redis-server started as the chart starts it (its init container writes
    the ACL file from the mounted password): the processor's record, with the password
    file the ConfigMap names, spends a proof; without the password nothing is served;
    with it, nothing outside the record's keys and commands."""
    objects = rendered({})
    redis_pod = one(objects, "Deployment", "ext-proc-redis")["spec"]["template"]["spec"]
    (init,) = redis_pod["initContainers"]
    (container,) = redis_pod["containers"]
    secret = one(objects, "Secret", "ext-proc-redis-auth")
    (tmp_path / "auth").mkdir()
    (tmp_path / "acl").mkdir()
    (tmp_path / "auth" / "password").write_bytes(base64.b64decode(secret["data"]["password"]))
    script = init["command"][2].replace("/etc/redis-auth/", f"{tmp_path}/auth/")
    script = script.replace("/acl/", f"{tmp_path}/acl/")
    environment = {e["name"]: e["value"] for e in init["env"]}
    subprocess.run([init["command"][0], "-c", script], env=environment, check=True, timeout=30)
    port = processes.free_port()
    command = container["command"][1:]
    command[command.index("--port") + 1] = str(port)
    command[command.index("--aclfile") + 1] = str(tmp_path / "acl" / "users.acl")
    binary = tools.ensure_tools({"redis-server": "redis-server"})["redis-server"]
    redis_process = processes.start(
        [binary, *command, "--bind", "127.0.0.1", "--dir", str(tmp_path)], tmp_path / "redis.log"
    )
    try:
        processes.wait_for_port(port, redis_process)
        password_file = str(tmp_path / "auth" / "password")
        url = f"redis://127.0.0.1:{port}/0"

        async def spend() -> list[Verdict]:
            record = RedisRecord(url, 2.0, password_file=password_file)
            try:
                await record.check()
                # Minted after the record begins (at this first spend).
                now = int(time.time())
                ticket = Ticket(b"k" * 16, now + 30, now + 1)
                return [await record.spend(ticket), await record.spend(ticket)]
            finally:
                await record.close()

        assert asyncio.run(spend()) == [Verdict.FIRST, Verdict.SPENT]
        with RedisClient.from_url(url) as anonymous, pytest.raises(AuthenticationError):
            anonymous.get("ext_proc:spent-since")
        with RedisClient.from_url(url, password=Path(password_file).read_text()) as client:
            for refused in REDIS_REFUSED:
                with pytest.raises(NoPermissionError):
                    client.execute_command(*refused)
    finally:
        os.killpg(redis_process.pid, signal.SIGTERM)
        redis_process.wait(timeout=20)


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


# --- names from the release, the standard pod settings, what install prints ---------------


def validated(objects: list[dict[str, Any]]) -> None:
    for doc in objects:
        if doc["apiVersion"] in CORE:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        else:
            assert (doc["apiVersion"], doc["kind"]) in CRDS, doc["kind"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_two_releases_in_one_namespace_render_apart():
    """Every object of a release is named from it and selects only its own pods: a
    second release beside the shipped one (ext-proc-token-policy, whose names the
    deploy/ wiring uses) clashes with none of its objects and wires its own."""
    monitoring_on = values_of(helm.CHART / "ci" / "monitoring-values.yaml")
    releases = {
        name: [
            doc
            for text in helm.render(monitoring_on, NAMESPACE, release=name).values()
            for doc in parse(text)
        ]
        for name in ("ext-proc-token-policy", "team-b")
    }
    shipped, other = releases.values()
    named = lambda objects: {(o["kind"], o["metadata"]["name"]) for o in objects}  # noqa: E731
    assert len(named(shipped)) == len(shipped)
    assert len(named(other)) == len(other)
    assert named(shipped) & named(other) == set()
    assert ("Service", "ext-proc-token-policy-headless") in named(shipped)
    assert ("Service", "ext-proc-redis") in named(shipped)
    assert ("Secret", "ext-proc-redis-auth") in named(shipped)
    for objects in releases.values():
        validated(objects)
    for name, objects in releases.items():
        prefix = "ext-proc-" if name == "ext-proc-token-policy" else f"{name}-ext-proc-"
        assert all(o["metadata"]["name"].startswith(prefix) for o in objects), name
        assert all(o["metadata"]["labels"]["app.kubernetes.io/instance"] == name for o in objects)
    # What a selector may pick: pods, and Services (a ServiceMonitor's).
    pods = {
        name: [d["spec"]["template"]["metadata"]["labels"] for d in every(objects, "Deployment")]
        + [d["metadata"]["labels"] for d in every(objects, "Service")]
        for name, objects in releases.items()
    }
    for name, objects in releases.items():
        (theirs,) = [pods[other_name] for other_name in pods if other_name != name]
        for doc in objects:
            spec = doc.get("spec", {})
            selector = spec.get("selector", {}).get("matchLabels") or (
                spec.get("selector") if doc["kind"] == "Service" else None
            )
            selector = selector or spec.get("podSelector", {}).get("matchLabels")
            if selector:
                assert not any(selects(selector, labels) for labels in theirs), doc["kind"]
                assert any(selects(selector, labels) for labels in pods[name]), doc["kind"]
    # team-b's processor reaches team-b's Redis, serves team-b's names, reads its Secrets.
    config = yaml.safe_load(one(other, "ConfigMap")["data"]["config.yaml"])
    assert config["proof"]["record"] == "redis://team-b-ext-proc-redis:6379/0"
    assert ("Service", "team-b-ext-proc-redis") in named(other)
    pod = one(other, "Deployment", "team-b-ext-proc-token-policy")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["serviceAccountName"] == "team-b-ext-proc-token-policy"
    assert (
        secret_of(pod, container, config["tls"]["cert_file"]) == "team-b-ext-proc-token-policy-tls"
    )
    password = secret_of(pod, container, config["proof"]["record_password_file"])
    assert password == "team-b-ext-proc-redis-auth"
    server = one(other, "Secret", "team-b-ext-proc-token-policy-tls")["data"]["tls.crt"]
    names = x509.load_pem_x509_certificate(base64.b64decode(server)).extensions
    sans = names.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"team-b-ext-proc-token-policy-headless.{NAMESPACE}.svc" in sans.get_values_for_type(
        x509.DNSName
    )
    assert ("Secret", "team-b-ext-proc-token-policy-envoy") in named(other)
    target = one(other, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["name"]
    assert target == "team-b-ext-proc-token-policy"


def test_the_standard_pod_settings_reach_the_pods():
    values = values_of(helm.CHART / "ci" / "pod-settings-values.yaml")
    objects = rendered(values)
    processor = one(objects, "Deployment", "ext-proc-token-policy")["spec"]["template"]
    redis = one(objects, "Deployment", "ext-proc-redis")["spec"]["template"]["spec"]
    pod = processor["spec"]
    assert processor["metadata"]["labels"]["team"] == "inference"
    annotations = processor["metadata"]["annotations"]
    assert annotations["example.com/owner"] == "inference"
    assert annotations["sidecar.istio.io/inject"] == "false"
    for key in ("nodeSelector", "tolerations", "imagePullSecrets"):
        assert pod[key] == values[key] == redis[key], key
    assert pod["affinity"] == values["affinity"]
    assert redis["affinity"] == values["redis"]["affinity"]
    assert pod["priorityClassName"] == values["priorityClassName"]
    assert pod["topologySpreadConstraints"] == values["topologySpreadConstraints"]
    (container,) = pod["containers"]
    assert values["extraEnv"][0] in container["env"]
    assert values["extraVolumeMounts"][0] in container["volumeMounts"]
    assert values["extraVolumes"][0] in pod["volumes"]
    # runAsUser: null removes the default (a platform that assigns the user); the rest
    # stays.
    assert "runAsUser" not in pod["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    readiness = container["readinessProbe"]
    assert (readiness["periodSeconds"], readiness["timeoutSeconds"]) == (10, 3)
    assert readiness["failureThreshold"] == 2
    assert readiness["tcpSocket"] == {"port": 50051}
    defaults = yaml.safe_load((helm.CHART / "values.yaml").read_text())["probes"]
    for probe, key in (("startupProbe", "startup"), ("livenessProbe", "liveness")):
        assert {k: container[probe][k] for k in defaults[key]} == defaults[key]


@pytest.mark.parametrize(
    ("endpoint", "peer"),
    [
        (
            "otel-collector.observability.svc.cluster.local:4317",
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": "observability"}
                }
            },
        ),
        ("otel-collector:4318", {"podSelector": {}}),
        ("10.0.0.7:4317", {"ipBlock": {"cidr": "10.0.0.7/32"}}),
        ("otel.example.com:4317", None),  # no NetworkPolicy resolves a name: the port
    ],
)
def test_with_tracing_the_network_policy_admits_the_collector(endpoint, peer):
    values = {"config": {"tracing": {"enabled": True, "endpoint": endpoint}}}
    policy = one(rendered(values), "NetworkPolicy", "ext-proc-token-policy")
    validated([policy])
    port = int(endpoint.rsplit(":", 1)[1])
    (rule,) = [r for r in policy["spec"]["egress"] if r["ports"][0]["port"] == port]
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]
    assert rule.get("to") == (None if peer is None else [peer])
    # Tracing off: no egress beyond the record and DNS.
    off = one(rendered({}), "NetworkPolicy", "ext-proc-token-policy")["spec"]["egress"]
    assert sorted(p["port"] for r in off for p in r["ports"]) == [53, 53, 6379]


def test_the_notes_state_what_was_wired():
    values = {
        **values_of(helm.CHART / "ci" / "team-routes-values.yaml"),
        "tls": {"mode": "certManager", "issuer": {"kind": "ClusterIssuer", "name": "mesh-ca"}},
        "config": {"tracing": {"enabled": True}},
    }
    notes = helm.notes(values, NAMESPACE, release="team-b")
    for stated in (
        "objects named team-b-ext-proc-token-policy, namespace inference",
        "Services team-b-ext-proc-token-policy and team-b-ext-proc-token-policy-headless",
        "gateway.kind istio",
        "Istio EnvoyFilter on the Envoy pods of the Gateway shared-gateway",
        "- HTTPRoute team-a/chat rule 0: strip\n",
        "- HTTPRoute team-a/pd rule 0: honor\n",
        "- HTTPRoute team-a/pd rule 1: mint\n",
        "- Ingress host ingress.team-a.example.com:80: strip\n",
        "(gateway.hosts): llm.team-a.example.com:80\n",
        "signed by the ClusterIssuer mesh-ca",
        "Secret\nteam-b-ext-proc-token-policy-envoy at /etc/ext-proc-token-policy/envoy",
        "redis://team-b-ext-proc-redis:6379/0",
        "OTLP/gRPC to otel-collector.observability:4317",
        "kubectl -n inference rollout status deployment/team-b-ext-proc-token-policy",
        "kubectl -n inference get envoyfilter",
    ):
        assert stated in notes, stated
    assert "{{" not in notes
    assert "<no value>" not in notes


def test_the_render_refuses_names_and_probes_that_would_break():
    # <fullname>-headless would be no DNS label: the render fails, nothing is cut short.
    with pytest.raises(helm_python.HelmError, match="longer than 54"):
        helm.render({}, NAMESPACE, release="a-release-name-of-forty-characters-long")
    # Liveness would restart a draining processor (it answers NOT_SERVING meanwhile).
    short = {
        "probes": {"liveness": {"periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 5}}
    }
    with pytest.raises(helm_python.HelmError, match=r"config\.drainSeconds"):
        helm.render(short, NAMESPACE)


@pytest.mark.parametrize(("drain", "grace"), [(0, 0), (2.5, 40), (30, 0.2)])
def test_the_termination_grace_covers_the_drain_and_the_shutdown_grace(drain, grace):
    """Kubernetes kills the pod at terminationGracePeriodSeconds: it follows the values,
    past the processor's drain and shutdown grace by a margin for its stop and exit."""
    objects = rendered({"config": {"drainSeconds": drain, "shutdownGraceSeconds": grace}})
    config = Config.model_validate(yaml.safe_load(one(objects, "ConfigMap")["data"]["config.yaml"]))
    assert (config.drain_seconds, config.shutdown_grace_seconds) == (drain, grace)
    pod = one(objects, "Deployment", "ext-proc-token-policy")["spec"]["template"]["spec"]
    stopping = config.drain_seconds + config.shutdown_grace_seconds
    assert pod["terminationGracePeriodSeconds"] >= stopping + 10


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
        # A password in the URL would land in the ConfigMap.
        {"redis": {"enabled": False, "url": "redis://ext-proc:secret@redis:6379/0"}},
        {"redis": {"enabled": False, "url": "rediss://:secret@redis:6380/0"}},
        {"redis": {"enabled": False, "url": "redis://redis:6379/0?password=secret"}},
        # redis-py decodes a query parameter's name and takes any as a keyword.
        {"redis": {"enabled": False, "url": "redis://redis:6379/0?%70assword=secret"}},
        {"redis": {"enabled": False, "url": "redis://r:6379/0?socket_timeout=5&passw%6Frd=s"}},
        {"redis": {"passwordSecret": {"name": "mine"}}},  # the chart's Redis has its own
        {"redis": {"image": "redis:7"}},  # not pinned by digest
        # Plain h2c only behind the NetworkPolicy: anyone reaching 50051 would be served.
        {"tls": {"mode": "none"}, "networkPolicy": {"enabled": False}},
        {"tls": {"mode": "certManager"}},  # no issuer
        {"tls": {"mode": "h2c"}},
        {"config": {"extra": {"tls": {"cert_file": "/c", "key_file": "/k"}}}},
        {"proofKeys": {"ids": []}},
        {"proofKeys": {"key": "00112233"}},
        {"config": {"extra": {"proof": {"keys": []}}}},
        # One worker per pod: a second would serve a port no Service or gateway lists.
        {"config": {"extra": {"workers": 2}}},
        {"config": {"maxBodyBytes": 0}},
        {"replica": 3},
        {"nodeSelectors": {"x": "y"}},  # an unknown key is still refused
        {"nodeSelector": {"x": 1}},
        {"podLabels": {"app.kubernetes.io/instance": "other"}},  # the selector's
        {"podAnnotations": {"sidecar.istio.io/inject": "true"}},  # would end the mTLS
        {"extraEnv": [{"name": "EXT_PROC_TLS", "value": "null"}]},  # config past the schema
        {"extraVolumeMounts": [{"name": "x", "mountPath": "/etc/ext-proc/config.yaml"}]},
        {"securityContext": {"readOnlyRootFilesystem": False}},
        {"securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}},
        {"podSecurityContext": {"runAsNonRoot": None}},
        {"probes": {"readiness": {"periodSeconds": 0}}},
        {"fullnameOverride": "Not-A-Name"},
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


# The shipped deploy/ wiring is plain h2c; the chart's with tls.mode none is that.
PLAIN = {"tls": {"mode": "none"}}
# The chart's Istio wiring is the shipped one scoped to the routes of its values
# (devstack/helm_routes.py; tests/e2e/test_helm_routes.py), not that file as it is.
GATEWAY_VALUES = {
    "envoy-gateway": (
        {**PLAIN, "gateway": {"kind": "envoyGateway", "examples": True}},
        ["envoy-gateway/extension-policy.yaml", "envoy-gateway/patch-policy.yaml"],
    ),
    "llm-d-istio": (
        {**PLAIN, "gateway": {"kind": "llmd"}},
        ["llm-d/coordinator/routes/httproute.yaml", "llm-d/coordinator/istio/envoyfilter.yaml"],
    ),
    "llm-d-envoy-gateway": (
        {**PLAIN, "gateway": {"kind": "llmd", "llmdProvider": "envoyGateway"}},
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
    # A Prometheus selects monitors and rules by label (monitoring.*.labels).
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
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


# A team's own routes on a shared gateway: its HTTPRoutes, Ingress and the check are
# tests/e2e/test_helm_routes.py's.
TEAM_ROUTES = helm.CHART / "ci" / "team-routes-values.yaml"
TEAM_ROUTES_EG = helm.CHART / "ci" / "team-routes-envoy-gateway-values.yaml"
WIRED = [
    p
    for p in CI
    if merged(values_of(p))["gateway"]["kind"] != "none" and p not in (TEAM_ROUTES, TEAM_ROUTES_EG)
]


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
    """check-envoy told what the rendered processor demands (its ConfigMap's tls): every
    wiring's processor cluster presents Envoy's certificate where it demands one."""
    config = assemble(path)
    objects = rendered(values_of(path))
    processor = Config.model_validate(
        yaml.safe_load(one(objects, "ConfigMap")["data"]["config.yaml"])
    )
    wanted = processor_tls.demand(processor)
    assert wanted == ("none" if merged(values_of(path))["tls"]["mode"] == "none" else "mutual")
    report = check_envoy.check(config, processor=wanted)
    assert report.errors == []
    assert report.warnings == []
    assert report.routes > 0
    text = yaml.safe_dump(config)
    if wanted != "none":
        # Envoy reads the certificate files the gateway's pods mount: these, here.
        if any(
            o["metadata"]["name"] == "ext-proc-token-policy-envoy" for o in every(objects, "Secret")
        ):
            files = write_certificates(objects, tmp_path / "certs")["envoy"]
        else:  # cert-manager writes the Secret in the cluster
            made = certs.make(tmp_path / "certs")
            files = tmp_path / "envoy"
            files.mkdir()
            for name, source in (
                ("tls.crt", "envoy.crt"),
                ("tls.key", "envoy.key"),
                ("ca.crt", "ca.crt"),
            ):
                (files / name).write_bytes((made / source).read_bytes())
        assert text.count(helm.ENVOY_CERTS) >= 3
        config = yaml.safe_load(text.replace(helm.ENVOY_CERTS, str(files)))
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
