"""The chart's gateway wiring for a team's own routes, from values alone
(deploy/helm/ext-proc-token-policy/ci/team-routes-values.yaml): two of its HTTPRoutes and
an Ingress host on a shared Istio gateway. The rendered EnvoyFilter, applied as istiod
applies it to the routes istiod makes of the team's HTTPRoutes and Ingress (defined
here, not the chart's examples; tests/e2e/gateway_assembly.py, istio_ingress.py), passes
check-envoy and runs on the real Envoy with the processor: the strip route strips, a
proof minted on the mint route is honored on the honor route, a route of the policed
host without a policy strips, and a route of another host on the same gateway receives
what its client sent, byte for byte. The body limit is one value in every manifest; two
releases share a namespace. The same HTTPRoutes on a shared Envoy Gateway Gateway
(ci/team-routes-envoy-gateway-values.yaml), the rendered EnvoyPatchPolicy applied to the
routes Envoy Gateway makes of them, pass check-envoy and run on the real Envoy."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import helm_python
import httpx
import pytest
import yaml

from devstack import helm
from ext_proc.core import tenants
from ext_proc.core.config import Config
from ext_proc.core.route_policy import FAIRNESS_HEADER
from ext_proc.tools import check_envoy, envoygen
from tests.e2e import gateway_assembly, gateway_run, istio_ingress
from tests.e2e.manifests import envoy_validate
from tests.e2e.stack import new_key

TEAM = helm.CHART / "ci" / "team-routes-values.yaml"
NAMESPACE = "inference"
POLICED = "llm.team-a.example.com"
INGRESS_HOST = "ingress.team-a.example.com"
OTHER = "web.team-b.example.com"
PROCESSOR = "ext_proc_token_policy"
# The processor's filter and the steps around it, enabled on the routes they police.
PROCESSOR_FILTER = "ext_proc.token_policy"
STEPS = ("envoy.filters.http.header_mutation", "envoy.filters.http.buffer")


def _rule(prefix: str, service: str, rewrite: str | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "matches": [{"path": {"type": "PathPrefix", "value": prefix}}],
        "backendRefs": [{"name": service, "port": 8000}],
    }
    if rewrite is not None:
        path = {"type": "ReplacePrefixMatch", "replacePrefixMatch": rewrite}
        rule["filters"] = [{"type": "URLRewrite", "urlRewrite": {"path": path}}]
    return rule


def _httproute(namespace: str, name: str, host: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "parentRefs": [{"name": "shared-gateway", "namespace": NAMESPACE}],
            "hostnames": [host],
            "rules": rules,
        },
    }


# The team's HTTPRoutes, a route of its host that values give no policy (team-a/misc),
# and another team's route on another host of the same gateway (team-b/web).
HTTPROUTES = [
    _httproute("team-a", "chat", POLICED, [_rule("/v1/", "chat")]),
    _httproute(
        "team-a",
        "pd",
        POLICED,
        [_rule("/pd/v1/", "decode", "/v1/"), _rule("/pd/prefill/v1/", "prefill", "/v1/")],
    ),
    _httproute("team-a", "misc", POLICED, [_rule("/misc/", "misc")]),
    _httproute("team-b", "web", OTHER, [_rule("/", "web")]),
]
INGRESS = {
    "metadata": {"name": "llm", "namespace": "team-a"},
    "spec": {
        "rules": [
            {
                "host": INGRESS_HOST,
                "http": {
                    "paths": [
                        {
                            "path": "/",
                            "pathType": "Prefix",
                            "backend": {"service": {"name": "llm", "port": {"number": 8000}}},
                        }
                    ]
                },
            }
        ]
    },
}


def render(
    values: dict[str, Any], release: str = helm.RELEASE, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    rendered = helm_python.Chart.load(helm.CHART).render(values, name=release, namespace=namespace)
    return [
        doc
        for name, text in rendered.items()
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def team_values(**more: Any) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(TEAM.read_text())
    values.update(more)
    return values


def envoy_filter(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == "EnvoyFilter"]
    return found


def assembled(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The gateway's bootstrap: istiod's virtual hosts of the team's HTTPRoutes (each
    backend its own cluster) and Ingress, with the rendered EnvoyFilter applied."""
    hosts = gateway_assembly.istio_virtual_hosts(HTTPROUTES, by_backend=True)
    ingress_hosts, clusters = istio_ingress.virtual_hosts(INGRESS)
    names = sorted(
        {
            gateway_assembly.istio_cluster(r["metadata"]["namespace"], backend)
            for r in HTTPROUTES
            for rule in r["spec"]["rules"]
            for backend in rule["backendRefs"]
        }
    )
    clusters += [
        gateway_assembly.static_cluster(name, name.rsplit("|", 1)[-1], 8000) for name in names
    ]
    return gateway_assembly.istio_assemble(
        envoy_filter(objects), [*hosts, *ingress_hosts], clusters
    )


def virtual_hosts(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (listener,) = config["static_resources"]["listeners"]
    manager = listener["default_filter_chain"]["filters"][0]["typed_config"]
    return {h["name"]: h for h in manager["route_config"]["virtual_hosts"]}


def test_the_team_routes_pass_check_envoy_and_only_the_policed_hosts_change():
    objects = render(team_values())
    config = assembled(objects)
    report = check_envoy.check(config, processor="mutual")
    assert report.errors == []
    # The policed host's route without a policy gets the default one; the other team's
    # route is not policed, and both are told.
    assert [(f.code, f.place.rsplit(" ", 1)[-1]) for f in report.findings] == [
        ("policy-missing", f"{POLICED}:80/team-a.misc.0"),
        ("route-unpoliced", f"{OTHER}:80/team-b.web.0"),
    ]
    hosts = virtual_hosts(config)
    # Routes of the policed hosts: policy metadata where values name them, the
    # filters enabled by the virtual host; the other host exactly as istiod made it.
    made = {h["name"]: h for h in gateway_assembly.istio_virtual_hosts(HTTPROUTES, by_backend=True)}
    assert hosts[f"{OTHER}:80"] == made[f"{OTHER}:80"]
    policed = {r.get("name"): r for r in hosts[f"{POLICED}:80"]["routes"]}
    policies = {
        name: policed[name]["metadata"]["filter_metadata"]["ext_proc.token_policy"]["action"]
        for name in ("team-a.chat.0", "team-a.pd.0", "team-a.pd.1")
    }
    assert policies == {"team-a.chat.0": "strip", "team-a.pd.0": "honor", "team-a.pd.1": "mint"}
    assert "metadata" not in policed["team-a.misc.0"]
    assert {"path-not-normalized", "token-endpoint-echo"} <= set(policed)
    assert hosts[f"{POLICED}:80"]["typed_per_filter_config"]
    (ingress_route,) = [r for r in hosts[f"{INGRESS_HOST}:80"]["routes"] if "route" in r]
    assert ingress_route["metadata"]["filter_metadata"]["ext_proc.token_policy"] == {
        "topology": "aggregated",
        "action": "strip",
    }
    # No setting of the connection manager for every host.
    (listener,) = config["static_resources"]["listeners"]
    manager = listener["default_filter_chain"]["filters"][0]["typed_config"]
    assert {k: manager[k] for k in gateway_assembly.ISTIO_PATH_DEFAULTS} == (
        gateway_assembly.ISTIO_PATH_DEFAULTS
    )
    assert "common_http_protocol_options" not in manager
    assert all(
        f.get("disabled")
        for f in manager["http_filters"]
        if f["name"] != "envoy.filters.http.router"
    )


def test_a_route_without_the_filter_to_a_policed_cluster_is_refused():
    """Scoped wiring never opens a second door: the other team's route sent to the
    decode pool's cluster is an error."""
    config = assembled(render(team_values()))
    hosts = virtual_hosts(config)
    (other,) = hosts[f"{OTHER}:80"]["routes"]
    other["route"]["cluster"] = gateway_assembly.istio_cluster("team-a", {"name": "decode"})
    report = check_envoy.check(config, processor="mutual")
    (door,) = [f for f in report.findings if f.code == "ext-proc-not-running"]
    assert door.severity == "error"
    assert door.place.endswith(f"{OTHER}:80/team-b.web.0")
    assert "which a policed route reaches" in door.message
    assert "route-unpoliced" not in report.codes()


def test_a_route_of_another_host_named_as_a_policed_one_gets_no_policy():
    """A route's name is no proof of whose it is: a VirtualService names its http routes
    freely, so another team's route on its own host named as the team's mint rule
    (team-a.pd.1) must not get the mint policy (the gateway would sign what that team's
    backend answers, honored on the team's decode route). It runs the filters without a
    policy (strip), as a host of the team's HTTPRoute left out of gateway.hosts does."""
    hosts = gateway_assembly.istio_virtual_hosts(HTTPROUTES, by_backend=True)
    other = _httproute("team-b", "vs", OTHER, [_rule("/pd/prefill/v1/", "web", "/v1/")])
    (named,) = gateway_assembly.istio_routes([other], by_backend=True)
    named["name"] = "team-a.pd.1"
    (host,) = [h for h in hosts if h["name"] == f"{OTHER}:80"]
    host["routes"].insert(0, named)
    clusters = [
        gateway_assembly.static_cluster(name, name.rsplit("|", 1)[-1], 8000)
        for name in sorted({r["route"]["cluster"] for h in hosts for r in h["routes"]})
    ]
    config = gateway_assembly.istio_assemble(envoy_filter(render(team_values())), hosts, clusters)
    (route,) = [
        r for r in virtual_hosts(config)[f"{OTHER}:80"]["routes"] if r["name"] == named["name"]
    ]
    assert "metadata" not in route
    assert set(route["typed_per_filter_config"]) == {PROCESSOR_FILTER, *STEPS}
    assert all(
        c["@type"].endswith("FilterConfig") for c in route["typed_per_filter_config"].values()
    )


def test_a_tenant_route_from_values_sets_the_fairness_id_without_a_body(tmp_path: Path):
    """On the real Envoy: a request without a body on a route setting llm-d's fairness
    id from its tenant reaches the upstream with the tenant's partition id, never with
    the one its client sent."""
    values = team_values(tls={"mode": "none"})
    chat, *rest = values["gateway"]["routes"]
    tenant = {"tenant": "route:team-a", "fairness_id": True}
    chat = {**chat, "policy": {**chat["policy"], **tenant}}
    values["gateway"] = {**values["gateway"], "routes": [chat, *rest]}
    key = new_key()
    partition = tenants.tag(tenants.key_for(key, "route:team-a"))
    config = assembled(render(values))
    with gateway_run.running(config, tmp_path, PROCESSOR, tenant_key=key) as gateway:
        sent = {"host": POLICED, FAIRNESS_HEADER: "another-tenant"}
        assert gateway.send("GET", "/v1/models", None, sent) == 200
        (record,) = gateway.records()
        got = [v for k, v in record["headers"] if k.lower() == FAIRNESS_HEADER]
        assert got == [partition]


def test_a_tenant_route_from_values_sends_the_processor_its_headers():
    """A route policy naming a tenant source (and setting llm-d's fairness id from it)
    needs the request headers at the processor: a request without a body would
    otherwise be forwarded naming no tenant, with its client's fairness id."""
    values = team_values()
    chat, pd, prefill, *rest = values["gateway"]["routes"]
    tenant = {"tenant": "route:team-a", "fairness_id": True}
    chat = {**chat, "policy": {**chat["policy"], **tenant}}
    prefill = {**prefill, "policy": {**prefill["policy"], **tenant}}
    pd = {**pd, "policy": {**pd["policy"], **tenant}}
    values["gateway"] = {**values["gateway"], "routes": [chat, pd, prefill, *rest]}
    report = check_envoy.check(assembled(render(values)), processor="mutual")
    assert report.errors == []


KINDS = {
    "istio": {"kind": "istio", "examples": True, "hosts": ["*:80"]},
    "envoyGateway": {"kind": "envoyGateway", "examples": True},
    "llmd-istio": {"kind": "llmd", "llmdProvider": "istio"},
    "llmd-envoyGateway": {"kind": "llmd", "llmdProvider": "envoyGateway"},
}


@pytest.mark.parametrize("gateway", list(KINDS))
def test_one_body_limit_reaches_every_manifest(gateway):
    # The in-flight budget must hold a body of the limit (the processor's validation).
    config = {"maxBodyBytes": 33554432, "inflightBudgetBytes": 536870912}
    objects = render({"gateway": KINDS[gateway], "config": config})
    assert "16777216" not in yaml.safe_dump_all(objects)
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    loaded = Config.model_validate(yaml.safe_load(config_map["data"]["config.yaml"]))
    assert loaded.max_body_bytes == 33554432
    # The gateway's objects: the buffer filter's and the routes' limits, and the
    # windows and gRPC message derived from the limit.
    wiring = yaml.safe_dump_all([o for o in objects if "." in o["apiVersion"].split("/")[0]])
    assert "16Mi" not in wiring
    assert wiring.count("33554432") >= 2
    assert "67108864" in wiring or "64Mi" in wiring
    # The processor cluster's room for its streams' bodies, envoygen's for the limit.
    bounded = (envoygen.PROCESSOR_STREAMS, envoygen.processor_outbound_frames(33554432))
    assert processor_connections(objects) == [bounded]


_FRAMES_PATH = "/http2_protocol_options/max_outbound_frames"


def processor_connections(objects: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Each processor cluster's streams per connection and max_outbound_frames: an
    EnvoyFilter's cluster, or an EnvoyExtensionPolicy's with its EnvoyPatchPolicy patch."""
    found = []
    frames = {
        p["name"]: p["operation"]["value"]
        for o in objects
        if o["kind"] == "EnvoyPatchPolicy"
        for p in o["spec"]["jsonPatches"]
        if p["operation"]["path"].endswith(_FRAMES_PATH)
    }
    for o in objects:
        if o["kind"] == "EnvoyFilter":
            for patch in o["spec"]["configPatches"]:
                value = patch["patch"]["value"]
                if patch["applyTo"] == "CLUSTER" and value["name"] == PROCESSOR:
                    options = value["typed_extension_protocol_options"][envoygen.HTTP_OPTIONS]
                    h2 = options["explicit_http_config"]["http2_protocol_options"]
                    found.append((h2.get("max_concurrent_streams"), h2.get("max_outbound_frames")))
        if o["kind"] == "EnvoyExtensionPolicy":
            meta = o["metadata"]
            for index, ext_proc in enumerate(o["spec"]["extProc"]):
                h2 = ext_proc["backendSettings"]["http2"]
                name = f"envoyextensionpolicy/{meta['namespace']}/{meta['name']}/{index}"
                found.append((h2.get("maxConcurrentStreams"), frames.get(name)))
    return found


def test_two_releases_in_one_namespace_render_and_pass_check_envoy():
    configs = []
    for release, gateway in (("team-a", "shared-gateway"), ("team-b", "other-gateway")):
        values = team_values()
        values["gateway"] = {**values["gateway"], "name": gateway}
        objects = render(values, release=release)
        config = assembled(objects)
        assert check_envoy.check(config, processor="mutual").errors == []
        found = envoy_filter(objects)
        assert found["metadata"]["name"] == f"{release}-ext-proc-token-policy"
        configs.append(yaml.safe_dump(config))
    assert "team-a-ext-proc-token-policy-headless.inference.svc" in configs[0]
    assert "team-b-ext-proc-token-policy-headless.inference.svc" in configs[1]


def _forwarded(gateway: gateway_run.Running) -> dict[str, Any]:
    (found,) = gateway.bodies()
    gateway.clear()
    return dict(json.loads(found[1]))


def _chat(params: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4,
    }
    if params is not None:
        body["kv_transfer_params"] = params
    return body


DEFAULT_POLICY_METRIC = "ext_proc_default_policy_requests_total"
FORGED = {"do_remote_prefill": True, "remote_engine_id": "forged", "remote_port": 9}


def test_the_team_routes_run_on_the_real_envoy(tmp_path: Path):
    objects = render(team_values(tls={"mode": "none"}))
    config = assembled(objects)
    with gateway_run.running(config, tmp_path, PROCESSOR, {"k1": new_key()}) as gateway:
        with httpx.Client(base_url=f"http://{gateway.gateway}", timeout=20) as client:

            def post(host: str, path: str, body: dict[str, Any]) -> httpx.Response:
                return client.post(path, json=body, headers={"host": host})

            # Forged parameters removed on the strip route, on the policed host's route
            # without a policy, and on the Ingress host.
            for host, path in ((POLICED, "/v1/"), (POLICED, "/misc/"), (INGRESS_HOST, "/v1/")):
                reply = post(host, f"{path}chat/completions", _chat(FORGED))
                assert reply.status_code == 200, (host, path, reply.text)
                assert "kv_transfer_params" not in _forwarded(gateway), (host, path)

            # Minted on the mint route, honored on the honor route.
            prefill = {**_chat(None), "max_tokens": 1, "return_token_ids": True}
            reply = post(POLICED, "/pd/prefill/v1/chat/completions", prefill)
            assert reply.status_code == 200, reply.text
            params = reply.json()["kv_transfer_params"]
            assert params["token_policy_proof"].startswith("tp4.k1.")
            gateway.clear()
            reply = post(POLICED, "/pd/v1/chat/completions", _chat(params))
            assert reply.status_code == 200, reply.text
            assert _forwarded(gateway)["kv_transfer_params"] == params

            # The route without a policy is counted (alert ExtProcRouteWithoutPolicy);
            # the routes with one are not.
            metrics = httpx.get(f"http://{gateway.metrics}/metrics", timeout=10).text
            counted = [
                line for line in metrics.splitlines() if line.startswith(DEFAULT_POLICY_METRIC)
            ]
            assert counted == [f'{DEFAULT_POLICY_METRIC}{{route="team-a.misc.0"}} 1.0'], counted

            # The refused endpoints' 404s and the unnormalised paths' 400s: on the
            # policed hosts only.
            for host in (POLICED, INGRESS_HOST):
                assert client.get("/v1/render", headers={"host": host}).status_code == 404
            assert post(POLICED, "/v1/chat%2Fcompletions", _chat(None)).status_code == 400
            assert gateway.received() == []

        # The other team's route: the bytes and headers its client sent, untouched
        # (forged parameters, a client's request id and tenant, an underscore header,
        # an escaped slash, a render path).
        body = json.dumps(_chat(FORGED), separators=(",", ":")).encode()
        sent = {
            "host": OTHER,
            "content-type": "application/json",
            "x-request-id": "client-chosen",
            "x-tenant-id": "team-b",
            "x_request_id": "underscored",
        }
        for method, path, payload in (
            ("POST", "/v1/chat/completions", body),
            ("GET", "/v1/render", None),
            ("POST", "/v1/chat%2Fcompletions", body),
        ):
            assert gateway.send(method, path, payload, sent) == 200, path
            (record,) = gateway.records()
            gateway.clear()
            assert (record["method"], record["target"]) == (method, path)
            got = dict((k.lower(), v) for k, v in record["headers"])
            for key, value in sent.items():
                if key != "host":
                    assert got.get(key) == value, (path, key)
            assert base64.b64decode(record["body_b64"]) == (payload or b"")


def test_the_team_values_leave_the_shipped_examples_out():
    objects = render(team_values())
    assert [o for o in objects if o["kind"] == "HTTPRoute"] == []
    patches = envoy_filter(objects)["spec"]["configPatches"]
    text = yaml.safe_dump(patches)
    assert "llama" not in text


STRIP = {"action": "strip"}


@pytest.mark.parametrize(
    "gateway",
    [
        {"httpRoutes": True},  # the value examples replaced
        # One route each: an HTTPRoute rule, an Ingress host or an Envoy route name.
        {"routes": [{"policy": STRIP}]},
        {"routes": [{"envoyRoute": "a.b.0", "ingress": {"host": "a.example"}, "policy": STRIP}]},
        # The processor's policy fields, as it reads them.
        {"routes": [{"envoyRoute": "a.b.0", "policy": {"action": "allow"}}]},
        {"routes": [{"envoyRoute": "a.b.0", "policy": {"action": "strip", "colour": "red"}}]},
        {"routes": [{"envoyRoute": "a.b.0", "policy": {"topology": "aggregated"}}]},
        {"hosts": ["llm.example.com"]},  # Istio's name has the port
        # A route by name is policed in the policed hosts only: none named.
        {"routes": [{"envoyRoute": "a.b.0", "policy": STRIP}]},
        {"examples": True},
        # Routes and hosts of values are the Istio and Envoy Gateway wirings': an
        # Ingress is not Envoy Gateway's, its hostnames have no port.
        {"kind": "envoyGateway", "routes": [{"ingress": {"host": "a.example"}, "policy": STRIP}]},
        {"kind": "envoyGateway", "hosts": ["llm.example.com:80"]},
        # An HTTPRoute's hostnames and matches name Envoy Gateway's routes, not Istio's.
        {
            "hosts": ["llm.example.com:80"],
            "routes": [
                {"httpRoute": {"name": "a", "rule": 0, "hostnames": ["a.example"]}, "policy": STRIP}
            ],
        },
        {
            "hosts": ["llm.example.com:80"],
            "routes": [{"httpRoute": {"name": "a", "rule": 0, "matches": 2}, "policy": STRIP}],
        },
        {"kind": "llmd", "hosts": ["llm.example.com:80"]},
    ],
    ids=lambda gateway: yaml.safe_dump(gateway, default_flow_style=True).strip(),
)
def test_routes_the_chart_cannot_police_as_stated_are_refused(gateway):
    values = {"gateway": {"kind": "istio", **gateway}}
    with pytest.raises((helm_python.HelmValuesError, helm_python.HelmError)):
        render(values)


# --- the same routes on a shared Envoy Gateway Gateway ---------------------------------

TEAM_EG = helm.CHART / "ci" / "team-routes-envoy-gateway-values.yaml"
EG_LISTENER = f"{NAMESPACE}/shared-gateway/http"
EG_PROCESSOR = f"envoyextensionpolicy/{NAMESPACE}/token-policy/0"


def _no_hostnames(route: dict[str, Any]) -> dict[str, Any]:
    return {**route, "spec": {k: v for k, v in route["spec"].items() if k != "hostnames"}}


# The team's HTTPRoutes without hostnames (Envoy Gateway's route names end in '*'), a
# route values give no policy (team-a/misc) and another team's (team-b/web).
EG_HTTPROUTES = [_no_hostnames(r) for r in HTTPROUTES]


def eg_assembled(
    objects: list[dict[str, Any]], httproutes: list[dict[str, Any]] = EG_HTTPROUTES
) -> dict[str, Any]:
    """The Gateway's bootstrap as Envoy Gateway makes it of the team's HTTPRoutes, with
    the rendered EnvoyPatchPolicy applied."""
    (extension,) = [o for o in objects if o["kind"] == "EnvoyExtensionPolicy"]
    (patches,) = [o for o in objects if o["kind"] == "EnvoyPatchPolicy"]
    return gateway_assembly.envoy_gateway_bootstrap(extension, patches, httproutes, EG_LISTENER)


def _eg_policies(config: dict[str, Any]) -> dict[str, Any]:
    (host,) = virtual_hosts(config).values()
    return {
        r["name"]: r.get("metadata", {}).get("filter_metadata", {}).get("ext_proc.token_policy")
        for r in host["routes"]
        if r["name"].startswith("httproute/")
    }


def _route_patches(objects: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    (patches,) = [o for o in objects if o["kind"] == "EnvoyPatchPolicy"]
    wanted = f"..routes[?(@.name=='{name}')]"
    return [
        p["operation"]
        for p in patches["spec"]["jsonPatches"]
        if p["operation"].get("jsonPath") == wanted
    ]


def test_the_team_routes_on_envoy_gateway_pass_check_envoy_and_envoy_validate(tmp_path: Path):
    values = yaml.safe_load(TEAM_EG.read_text())
    objects = render(values)
    assert "llama" not in yaml.safe_dump(objects)
    config = eg_assembled(objects)
    report = check_envoy.check(config, processor="mutual")
    assert report.errors == []
    policies = _eg_policies(config)
    actions = {name: policy and policy["action"] for name, policy in policies.items()}
    assert actions == {
        "httproute/team-a/chat/rule/0/match/0/*": "strip",
        "httproute/team-a/pd/rule/0/match/0/*": "honor",
        "httproute/team-a/pd/rule/1/match/0/*": "mint",
        "httproute/team-a/misc/rule/0/match/0/*": None,
        "httproute/team-b/web/rule/0/match/0/*": None,
    }
    # Envoy takes it (without the processor's TLS, whose files are the gateway pods').
    plain = eg_assembled(render({**values, "tls": {"mode": "none"}}))
    envoy_validate(plain, tmp_path, "team-routes-envoy-gateway")
    # Each action's patches are the example route's of that action, the policy the
    # route's: the mint route's response processing override as the example's.
    examples = render({**values, "gateway": {**values["gateway"], "examples": True}})
    mint = _route_patches(objects, "httproute/team-a/pd/rule/1/match/0/*")
    example = _route_patches(examples, f"httproute/{NAMESPACE}/llama-pd/rule/1/match/0/*")
    assert [o["path"] for o in mint] == [o["path"] for o in example]
    assert mint[2]["value"] == example[2]["value"]


def test_the_team_routes_on_envoy_gateway_with_hostnames_name_every_virtual_host():
    """HTTPRoutes with hostnames: Envoy Gateway names each route and virtual host by
    the hostname (dots as '_'); each virtual host of gateway.hosts gets the refused
    endpoints' 404s, and check-envoy finds one left out (its routes are inspected, its
    refused endpoints forwarded)."""
    values = yaml.safe_load(TEAM_EG.read_text())
    for route in values["gateway"]["routes"]:
        route["httpRoute"]["hostnames"] = [POLICED]
    values["gateway"]["hosts"] = [POLICED, OTHER]
    objects = render(values)
    (extension,) = [o for o in objects if o["kind"] == "EnvoyExtensionPolicy"]
    (patches,) = [o for o in objects if o["kind"] == "EnvoyPatchPolicy"]
    config = gateway_assembly.envoy_gateway_bootstrap(extension, patches, HTTPROUTES, EG_LISTENER)
    report = check_envoy.check(config, processor="mutual")
    assert report.errors == []
    hosts = virtual_hosts(config)
    host = "llm_team-a_example_com"
    policed = {r["name"]: r for r in hosts[f"{EG_LISTENER}/{host}"]["routes"]}
    metadata = {
        name: policed[f"httproute/team-a/{name}/match/0/{host}"]["metadata"]
        for name in ("chat/rule/0", "pd/rule/0", "pd/rule/1")
    }
    actions = {
        n: m["filter_metadata"]["ext_proc.token_policy"]["action"] for n, m in metadata.items()
    }
    assert actions == {"chat/rule/0": "strip", "pd/rule/0": "honor", "pd/rule/1": "mint"}
    for name in (host, "web_team-b_example_com"):
        routes = [r["name"] for r in hosts[f"{EG_LISTENER}/{name}"]["routes"]]
        assert "token-endpoint-internal-refused" in routes, name
    notes = helm.notes(values)
    assert f"404s (gateway.hosts): {POLICED}, {OTHER}\n" in notes
    assert "every route of the Gateway inspected, a route without a policy stripped" in notes
    values["gateway"]["hosts"] = [POLICED]
    objects = render(values)
    (patches,) = [o for o in objects if o["kind"] == "EnvoyPatchPolicy"]
    config = gateway_assembly.envoy_gateway_bootstrap(extension, patches, HTTPROUTES, EG_LISTENER)
    report = check_envoy.check(config, processor="mutual")
    found = {(f.code, f.place.rsplit("/", 1)[-1]) for f in report.findings if f.severity == "error"}
    assert ("refused-endpoint-forwarded", "web_team-b_example_com") in found


def test_the_team_routes_on_envoy_gateway_run_on_the_real_envoy(tmp_path: Path):
    values = yaml.safe_load(TEAM_EG.read_text())
    config = eg_assembled(render({**values, "tls": {"mode": "none"}}))
    with (
        gateway_run.running(config, tmp_path, EG_PROCESSOR, {"k1": new_key()}) as gateway,
        httpx.Client(base_url=f"http://{gateway.gateway}", timeout=20) as client,
    ):
        # Forged parameters removed on the strip route and on the route without a
        # policy (every route of the Gateway is inspected).
        for path in ("/v1/", "/misc/"):
            reply = client.post(f"{path}chat/completions", json=_chat(FORGED))
            assert reply.status_code == 200, (path, reply.text)
            assert "kv_transfer_params" not in _forwarded(gateway), path
        # Minted on the mint route, honored on the honor route.
        prefill = {**_chat(None), "max_tokens": 1, "return_token_ids": True}
        reply = client.post("/pd/prefill/v1/chat/completions", json=prefill)
        assert reply.status_code == 200, reply.text
        params = reply.json()["kv_transfer_params"]
        assert params["token_policy_proof"].startswith("tp4.k1.")
        gateway.clear()
        reply = client.post("/pd/v1/chat/completions", json=_chat(params))
        assert reply.status_code == 200, reply.text
        assert _forwarded(gateway)["kv_transfer_params"] == params


def test_each_match_of_a_rule_gets_its_policy_on_envoy_gateway():
    """Envoy Gateway makes a route of each match of a rule: each named (``matches``)
    gets the rule's policy."""
    values = yaml.safe_load(TEAM_EG.read_text())
    values["gateway"]["routes"][0]["httpRoute"]["matches"] = 2
    httproutes = copy.deepcopy(EG_HTTPROUTES)
    second = {"path": {"type": "PathPrefix", "value": "/v2/"}}
    httproutes[0]["spec"]["rules"][0]["matches"].append(second)
    config = eg_assembled(render(values), httproutes)
    assert check_envoy.check(config, processor="mutual").errors == []
    policies = _eg_policies(config)
    for match in (0, 1):
        policy = policies[f"httproute/team-a/chat/rule/0/match/{match}/*"]
        assert policy == {"topology": "aggregated", "action": "strip"}, match
