"""deploy/llm-d/standalone/: the values for llm-d's standalone router chart and the
NetworkPolicies beside them, checked offline.

The values replace the chart's Envoy bootstrap (a string the chart renders with helm's
``tpl``). Here it is rendered as helm would, per the chart helpers it calls (routerlib
templates/_helpers.tpl at llm-d/llm-d-router ebab6879, quoted in values.yaml), then
validated by the real Envoy and by ``check_envoy``, and compared with the shipped
one-message config (envoy/envoy.yaml), the Istio patch's processor cluster and the
processor's ConfigMap. Then it runs: the real Envoy with this project's processor, a
stand-in EPP (FULL_DUPLEX_STREAMED, picks the recording upstream) and the recording
stand-in vLLM.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import sys
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import kubernetes_validate
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bench import grpc_api
from devstack import processes
from ext_proc._pb import core_pb2 as core
from ext_proc._pb import external_processor_pb2 as pb
from ext_proc.core.route_policy import Action, RoutePolicy, Topology
from ext_proc.edge.attributes import READ_HEADERS, attribute_keys
from ext_proc.tools import carrier_headers, check_envoy, refused_paths, token_endpoints
from tests.e2e.test_deploy import (
    DEPLOY,
    KUBE_VERSION,
    NOT_KUBERNETES,
    PATH_SETTINGS,
    REPO,
    bounded_connection,
    documents,
    envoy_validate,
    generated_not_found_routes,
    istio_filter,
    one,
    patch_of,
    policy_from,
    processor_config,
    processor_connection,
    shipped_manager,
)

HERE = DEPLOY / "llm-d" / "standalone"
VALUES = HERE / "values.yaml"
RELEASE, NAMESPACE_K8S = "llama", "llm-d"
OURS = "ext_proc.token_policy"
BUFFER = "envoy.filters.http.buffer"
EPP = "envoy.filters.http.ext_proc"
ROUTER = "envoy.filters.http.router"
STEP = carrier_headers.FILTER
ORDER = [STEP, OURS, BUFFER, EPP, ROUTER]
SIXTEEN_MIB = 16 * 1024 * 1024
EXT_PROC_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
BUFFER_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute"
# The EPP pod's labels (routerlib llm-d-router.selectorLabels, router.inferencePool.create
# true) and the processor pods' (deploy/kubernetes/deployment.yaml).
EPP_POD = {"llm-d-router-gateway": f"{RELEASE}-epp"}

# --- the chart's template helpers, as helm renders them ---------------------------------

# routerlib llm-d-router.proxy.envoyExtProcTLSOptions / envoyExtProcTransportSocket, when
# router.epp.flags.secure-serving is not false (the chart's default); empty otherwise.
TLS_OPTIONS = 'tls_options:\n  alpn_protocols: ["h2"]'
TRANSPORT_SOCKET = (
    'transport_socket:\n  name: "envoy.transport_sockets.tls"\n  typed_config:\n'
    '    "@type": type.googleapis.com/'
    "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext\n"
    "    common_tls_context:\n      validation_context:"
)
INCLUDE = re.compile(r'\{\{\s*include\s+"([^"]+)"\s+\.\s*(?:\|\s*indent\s+(\d+)\s*)?\}\}')


def helpers(mode: str, secure: bool) -> dict[str, str]:
    service = mode == "service"
    return {
        "llm-d-router.proxy.extProcClusterType": "STRICT_DNS" if service else "STATIC",
        "llm-d-router.proxy.extProcHost": (
            f"{RELEASE}-epp.{NAMESPACE_K8S}.svc.cluster.local" if service else "127.0.0.1"
        ),
        "llm-d-router.proxy.envoyExtProcTLSOptions": TLS_OPTIONS if secure else "",
        "llm-d-router.proxy.envoyExtProcTransportSocket": TRANSPORT_SOCKET if secure else "",
    }


def render(text: str, mode: str = "sidecar", secure: bool = True) -> str:
    """``text`` through helm's ``tpl`` for these values: each ``include`` replaced by the
    helper's output, ``indent N`` as Sprig's (every line, the first included, padded)."""
    known = helpers(mode, secure)

    def expand(match: re.Match[str]) -> str:
        output = known[match[1]]
        if match[2]:
            pad = " " * int(match[2])
            output = pad + output.replace("\n", "\n" + pad)
        return output

    rendered = INCLUDE.sub(expand, text)
    assert "{{" not in rendered, "a template expression is left"
    assert "}}" not in rendered, "a template expression is left"
    return rendered


def values() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(VALUES.read_text())
    return data


def envoy_template() -> str:
    text: str = values()["router"]["proxy"]["configMap"]["data"]["envoy.yaml"]
    return text


def bootstrap(mode: str = "sidecar", secure: bool = True) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(render(envoy_template(), mode, secure))
    return config


def listener(config: dict[str, Any]) -> dict[str, Any]:
    (found,) = [x for x in config["static_resources"]["listeners"] if x["name"] == "vllm"]
    return found


def manager(config: dict[str, Any]) -> dict[str, Any]:
    (chain,) = listener(config)["filter_chains"]
    (hcm,) = chain["filters"]
    typed: dict[str, Any] = hcm["typed_config"]
    return typed


def filters(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f["typed_config"] for f in manager(config)["http_filters"]}


def routes(config: dict[str, Any]) -> list[dict[str, Any]]:
    (vhost,) = manager(config)["route_config"]["virtual_hosts"]
    found: list[dict[str, Any]] = vhost["routes"]
    return found


def cluster(config: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
    return found


def shipped_filter() -> dict[str, Any]:
    """The ext_proc filter of envoy/envoy.yaml (the only one there)."""
    (found,) = [
        f
        for f in shipped_manager()["http_filters"]
        if f["typed_config"]["@type"] == check_envoy.EXT_PROC
    ]
    typed: dict[str, Any] = found["typed_config"]
    return typed


def order_problems(config: dict[str, Any]) -> list[str]:
    """What is wrong with the listener's filter chain: order, and fail-open filters."""
    problems = []
    names = [f["name"] for f in manager(config)["http_filters"]]
    if names != ORDER:
        problems.append(f"filter order {names}, expected {ORDER}")
    for name in (OURS, EPP):
        if filters(config).get(name, {}).get("failure_mode_allow", True) is not False:
            problems.append(f"{name} fails open")
    return problems


def without_epp(config: dict[str, Any]) -> dict[str, Any]:
    """The listener with the EPP's filter (and its per-route settings) removed."""
    changed = copy.deepcopy(listener(config))
    hcm = changed["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != EPP]
    for route in hcm["route_config"]["virtual_hosts"][0]["routes"]:
        route.get("typed_per_filter_config", {}).pop(EPP, None)
    return changed


# --- the values -----------------------------------------------------------------------------


def test_values_fail_closed_and_keep_only_the_charts_own_templates():
    proxy = values()["router"]["proxy"]
    assert proxy["failOpen"] is False
    assert (proxy["enabled"], proxy["proxyType"], proxy["mode"]) == (True, "envoy", "sidecar")
    # The four expressions of the EPP's cluster, nothing else (the string goes through tpl).
    template = envoy_template()
    assert template.count("{{") == template.count("}}") == 4
    assert {m[1] for m in INCLUDE.finditer(template)} == set(helpers("sidecar", True))
    assert "failOpen" not in template  # the EPP's failure_mode_allow does not follow a value


@pytest.mark.parametrize(
    ("mode", "secure"),
    [("sidecar", True), ("sidecar", False), ("service", True)],
    ids=["sidecar-tls", "sidecar-plaintext", "service-tls"],
)
def test_rendered_config_validates(tmp_path, mode, secure):
    config = bootstrap(mode, secure)
    epp = cluster(config, "ext_proc")
    assert ("transport_socket" in epp) is secure
    assert ("tls_options" in epp["health_checks"][0]) is secure
    assert epp["type"] == ("STRICT_DNS" if mode == "service" else "STATIC")
    envoy_validate(config, tmp_path, f"standalone-{mode}-{'tls' if secure else 'plain'}")


def test_filter_order_and_both_ext_procs_fail_closed():
    config = bootstrap()
    assert order_problems(config) == []
    ours, epp = filters(config)[OURS], filters(config)[EPP]
    # The EPP's filter as the chart writes it: its cluster, its streamed modes.
    assert epp["grpc_service"]["envoy_grpc"] == {
        "cluster_name": "ext_proc",
        "authority": "localhost:9002",
    }
    assert epp["processing_mode"]["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert ours["grpc_service"]["envoy_grpc"]["cluster_name"] == "ext_proc_token_policy"
    assert filters(config)[BUFFER]["max_request_bytes"] == SIXTEEN_MIB


def test_our_filter_is_the_shipped_one_message_filter():
    ours = copy.deepcopy(filters(bootstrap())[OURS])
    shipped = copy.deepcopy(shipped_filter())
    for config in (ours, shipped):
        del config["grpc_service"]["envoy_grpc"]["cluster_name"]
    assert ours == shipped
    assert ours["request_attributes"] == [*attribute_keys().all(), *READ_HEADERS.values()]


def test_processor_cluster_is_the_istio_patchs():
    ours = cluster(bootstrap(), "ext_proc_token_policy")
    istio = patch_of(istio_filter(), "CLUSTER")["patch"]["value"]
    for key in ("type", "connect_timeout", "dns_lookup_family", "health_checks"):
        assert ours[key] == istio[key], key
    assert ours["typed_extension_protocol_options"] == istio["typed_extension_protocol_options"]
    assert ours["load_assignment"]["endpoints"] == istio["load_assignment"]["endpoints"]


def test_the_processor_connection_has_room_for_its_streams_bodies():
    # These values are written by hand: envoygen's figures for their largest body.
    config = bootstrap()
    largest = max(r["request_body_buffer_limit"] for r in routes(config) if "route" in r)
    got = processor_connection(config, "ext_proc_token_policy")
    assert got == bounded_connection(largest)


def test_every_forwarding_route_holds_the_processors_body_limit():
    config = bootstrap()
    forwarding = [r for r in routes(config) if "route" in r]
    assert forwarding
    limit = processor_config().max_body_bytes
    assert limit == SIXTEEN_MIB
    assert {r["request_body_buffer_limit"] for r in forwarding} == {limit}
    assert filters(config)[BUFFER]["max_request_bytes"] == limit
    # The listener keeps the chart's per-connection limit.
    assert listener(config)["per_connection_buffer_limit_bytes"] == 32768


def test_the_charts_route_carries_the_aggregated_policy():
    (route,) = [r for r in routes(bootstrap()) if "route" in r]
    assert route["match"] == {"prefix": "/"}
    assert route["route"]["cluster"] == "original_destination_cluster"
    assert "prefix_rewrite" not in route["route"]
    policy = policy_from(route["metadata"]["filter_metadata"][OURS])
    assert policy == RoutePolicy(Topology.AGGREGATED, Action.STRIP)


def test_token_endpoints_are_answered_first_with_every_filter_off():
    listed = routes(bootstrap())
    answered = [r for r in listed if "direct_response" in r]
    assert listed[: len(answered)] == answered
    # Last among them, right before the chart's "/" route: the endpoints it refuses, by
    # the regex envoy-config writes for a "/" route that accepts nothing.
    refused = answered.pop()
    assert refused["match"] == {
        "safe_regex": {
            "regex": refused_paths.route_regex("/", None, refused_paths.refused_names(()))
        }
    }
    assert listed[len(answered) + 1]["name"] == "default"
    bare = [{k: v for k, v in r.items() if k != "typed_per_filter_config"} for r in answered]
    assert bare == generated_not_found_routes()
    shipped = [r for r in shipped_manager()["route_config"]["virtual_hosts"][0]["routes"]]
    assert bare == [
        {k: v for k, v in r.items() if k != "typed_per_filter_config"}
        for r in shipped
        if "direct_response" in r and not r["name"].endswith("-refused")
    ]
    for route in [*answered, refused]:
        assert route["typed_per_filter_config"] == {
            OURS: {"@type": EXT_PROC_PER_ROUTE, "disabled": True},
            BUFFER: {"@type": BUFFER_PER_ROUTE, "disabled": True},
            EPP: {"@type": EXT_PROC_PER_ROUTE, "disabled": True},
        }
    # The chart's "/" route rewrites nothing onto the token-in API: no 404s beyond these.
    assert token_endpoints.rewritten_into("/", None) == ()


def test_connection_manager_is_the_shipped_one():
    hcm, shipped = manager(bootstrap()), shipped_manager()
    assert hcm["http_protocol_options"] == shipped["http_protocol_options"]
    for key in PATH_SETTINGS:
        assert hcm[key] == shipped[key], key


def test_check_envoy_passes_the_gateway_listener():
    config = bootstrap()
    # The EPP's filter is another service's (it requests none of this processor's
    # attributes); it runs after our decision and changes requests by design, so the
    # deployment declares it; the listener `vllm` is clean.
    declared = frozenset({EPP})
    full = check_envoy.check(config, listeners=frozenset({"vllm"}), declared=declared)
    assert (full.errors, full.warnings, full.routes) == ([], [], 6)
    assert check_envoy.check(listener(config), declared=declared).errors == []
    # Undeclared, it is a filter that can change what the processor decided.
    undeclared = check_envoy.check(config, listeners=frozenset({"vllm"}))
    assert undeclared.codes("error") == ["filter-after-decision"]
    # Unnamed, the readiness listener (19001, Envoy's own stats) is held to the contract
    # too: it runs no filter of this processor.
    (error,) = check_envoy.check(config, declared=declared).errors
    assert "no ext_proc filter of this processor" in error
    # Declared, it still may not change the path or routing headers.
    filters(config)[EPP].pop("mutation_rules")
    unbounded = check_envoy.check(config, listeners=frozenset({"vllm"}), declared=declared)
    assert unbounded.codes("error") == ["declared-filter-unbounded"]


# --- mutations: the checks above catch what they are for ----------------------------------


def test_order_check_catches_the_epp_filter_first():
    config = bootstrap()
    chain = manager(config)["http_filters"]
    chain.insert(0, chain.pop([f["name"] for f in chain].index(EPP)))
    assert order_problems(config) == [
        f"filter order {[EPP, STEP, OURS, BUFFER, ROUTER]}, expected {ORDER}"
    ]


def test_checks_catch_a_fail_open_epp_filter():
    config = bootstrap()
    filters(config)[EPP]["failure_mode_allow"] = True
    assert order_problems(config) == [f"{EPP} fails open"]


def test_check_envoy_catches_the_chart_route_without_the_404s():
    config = bootstrap()
    (vhost,) = manager(config)["route_config"]["virtual_hosts"]
    vhost["routes"] = [r for r in vhost["routes"] if "direct_response" not in r]
    errors = check_envoy.check(without_epp(config)).errors
    assert any("vllm-default/default: forwards '/inference/v1/generate'" in e for e in errors), (
        errors
    )


# --- NetworkPolicies ----------------------------------------------------------------------


def policy(name: str) -> dict[str, Any]:
    (doc,) = documents(HERE / name)
    try:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{name}: {exc}")
    assert doc["kind"] == "NetworkPolicy"
    assert doc["metadata"]["namespace"] == NAMESPACE_K8S
    return doc


def processor_pod_labels() -> dict[str, str]:
    labels: dict[str, str] = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def test_epp_network_policy():
    spec = policy("networkpolicy.yaml")["spec"]
    assert spec["podSelector"] == {"matchLabels": EPP_POD}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    clients, metrics = spec["ingress"]
    assert clients["ports"] == [{"protocol": "TCP", "port": 8081}]
    (peer,) = clients["from"]
    assert peer["podSelector"]["matchLabels"]
    assert peer["namespaceSelector"]["matchLabels"]
    assert {p["port"] for p in metrics["ports"]} == {9090, 19001}
    (peer,) = metrics["from"]
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    processor, models, dns, api = spec["egress"]
    assert processor["ports"] == [{"protocol": "TCP", "port": 50051}]
    (peer,) = processor["to"]
    assert peer["podSelector"]["matchLabels"].items() <= processor_pod_labels().items()
    # The port of the processor cluster in the values.
    endpoint = cluster(bootstrap(), "ext_proc_token_policy")["load_assignment"]["endpoints"][0]
    assert (
        endpoint["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["port_value"] == 50051
    )
    (peer,) = models["to"]
    assert peer["podSelector"]["matchLabels"]
    assert models["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
    assert {p["port"] for p in api["ports"]} == {443, 6443}


def test_processor_network_policy_admits_the_epp_pod():
    spec = policy("processor-networkpolicy.yaml")["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= processor_pod_labels().items()
    # Ingress only: the processor's egress stays as deploy/kubernetes sets it (Redis, DNS).
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    assert peer["podSelector"] == {"matchLabels": EPP_POD}
    assert peer["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": NAMESPACE_K8S}
    }
    assert rule["ports"] == [{"protocol": "TCP", "port": 50051}]


def test_standalone_values_are_not_a_kubernetes_object():
    assert VALUES.relative_to(DEPLOY).as_posix() in NOT_KUBERNETES
    assert Path(HERE / "README.md").is_file()


# --- the rendered config, run: the real Envoy, this project's processor, a stand-in EPP ----

LOCAL = "127.0.0.1"


@dataclass
class StandInEpp:
    """The EPP's side of its filter as the chart configures it (FULL_DUPLEX_STREAMED both
    ways): every request is sent to ``destination``, every body chunk passed on as it
    came; each whole request body it saw is kept."""

    destination: str
    bodies: list[bytes] = field(default_factory=list)

    def Process(
        self, request_iterator: Iterator[pb.ProcessingRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.ProcessingResponse]:
        body = b""
        for request in request_iterator:
            kind = request.WhichOneof("request")
            if kind == "request_headers":
                pick = core.HeaderValueOption(
                    header=core.HeaderValue(
                        key="x-gateway-destination-endpoint", raw_value=self.destination.encode()
                    )
                )
                mutation = pb.HeaderMutation(set_headers=[pick])
                yield pb.ProcessingResponse(
                    request_headers=pb.HeadersResponse(
                        response=pb.CommonResponse(header_mutation=mutation)
                    )
                )
            elif kind in ("request_body", "response_body"):
                chunk = getattr(request, kind)
                if kind == "request_body":
                    body += chunk.body
                    if chunk.end_of_stream:
                        self.bodies.append(body)
                passed = pb.BodyMutation(
                    streamed_response=pb.StreamedBodyResponse(
                        body=chunk.body, end_of_stream=chunk.end_of_stream
                    )
                )
                answer = pb.BodyResponse(response=pb.CommonResponse(body_mutation=passed))
                yield pb.ProcessingResponse(**{kind: answer})
            elif kind == "response_headers":
                yield pb.ProcessingResponse(response_headers=pb.HeadersResponse())
            else:
                yield pb.ProcessingResponse(**{kind: pb.TrailersResponse()})


def runnable(config: dict[str, Any], ports: dict[str, int]) -> dict[str, Any]:
    """The rendered config (sidecar, plaintext EPP) on local ports: the listeners, the
    admin, the EPP's and the processor's endpoints moved, IPv6 listeners dropped."""
    config = copy.deepcopy(config)
    config["admin"]["address"]["socket_address"]["port_value"] = ports["admin"]
    for entry in config["static_resources"]["listeners"]:
        entry.pop("additional_addresses", None)
        name = "gateway" if entry["name"] == "vllm" else "ready"
        entry["address"]["socket_address"]["port_value"] = ports[name]
    moved = {"prometheus_stats": "admin", "ext_proc": "epp", "ext_proc_token_policy": "processor"}
    for name, port in moved.items():
        endpoint = cluster(config, name)["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
        address = endpoint["endpoint"]["address"]["socket_address"]
        assert address["address"] in (
            LOCAL,
            "ext-proc-token-policy-headless.llm-d.svc.cluster.local",
        )
        address.update(address=LOCAL, port_value=ports[port])
    return config


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("standalone")
    ports = {
        name: processes.free_port()
        for name in ("admin", "gateway", "ready", "epp", "processor", "upstream", "metrics")
    }
    epp = StandInEpp(f"{LOCAL}:{ports['upstream']}")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    grpc_api.add_to_server(epp.Process, server)
    checks = health.HealthServicer()
    checks.set(
        "envoy.service.ext_proc.v3.ExternalProcessor", health_pb2.HealthCheckResponse.SERVING
    )
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    server.add_insecure_port(f"{LOCAL}:{ports['epp']}")
    server.start()
    children = []
    try:
        upstream = processes.start(
            [
                sys.executable,
                "-m",
                "devstack",
                "upstream",
                "--listen",
                f"{LOCAL}:{ports['upstream']}",
            ],
            workdir / "upstream.log",
            cwd=REPO,
        )
        children.append(upstream)
        processes.wait_for_port(ports["upstream"], upstream)
        (workdir / "processor.yaml").write_text(yaml.safe_dump({"drain_seconds": 0.1}))
        processor = processes.start(
            [
                sys.executable,
                "-m",
                "ext_proc",
                "serve",
                "--listen",
                f"{LOCAL}:{ports['processor']}",
                "--metrics-listen",
                f"{LOCAL}:{ports['metrics']}",
                "--config",
                str(workdir / "processor.yaml"),
            ],
            workdir / "processor.log",
        )
        children.append(processor)
        processes.wait_for_port(ports["processor"], processor)
        path = workdir / "envoy.yaml"
        path.write_text(yaml.safe_dump(runnable(bootstrap(secure=False), ports), sort_keys=False))
        envoy = processes.start(processes.envoy_args(path, ports["admin"]), workdir / "envoy.log")
        children.append(envoy)
        processes.wait_for_envoy(ports["admin"], envoy)
        yield {"ports": ports, "epp": epp, "url": f"http://{LOCAL}:{ports['gateway']}"}
    finally:
        for child in reversed(children):
            processes.stop(child)
        server.stop(grace=None)


def received(router: dict[str, Any]) -> list[dict[str, Any]]:
    url = f"http://{LOCAL}:{router['ports']['upstream']}/__stub__/requests"
    found: list[dict[str, Any]] = httpx.get(url, timeout=5).json()
    httpx.delete(url, timeout=5)
    return found


def test_running_router_strips_before_the_epp_sees_the_body(router):
    router["epp"].bodies.clear()
    received(router)
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi " * 20000}],  # over the listener's 32 KiB
        "kv_transfer_params": {"prompt_token_ids": [1, 2, 3], "remote_port": 9},
    }
    reply = httpx.post(router["url"] + "/v1/chat/completions", json=chat, timeout=30)
    assert reply.status_code == 200, reply.text
    (forwarded,) = received(router)
    body = json.loads(base64.b64decode(forwarded["body_b64"]))
    assert "kv_transfer_params" not in body
    assert body["messages"] == chat["messages"]
    # The EPP got the decided body, not the client's.
    (seen,) = router["epp"].bodies
    assert json.loads(seen) == body


def test_running_router_answers_token_endpoints_without_the_epp(router):
    router["epp"].bodies.clear()
    received(router)
    for path in ("/inference/v1/generate", "/v1/chat/completions/render", "/V1/%72ender"):
        reply = httpx.post(router["url"] + path, json={"prompt": [1, 2]}, timeout=10)
        assert reply.status_code == 404, (path, reply.status_code)
    # An escaped slash is redirected to its unescaped form, which the 404s then answer.
    reply = httpx.post(router["url"] + "/v1/completions%2Fderender", json={}, timeout=10)
    assert (reply.status_code, reply.headers["location"]) == (307, "/v1/completions/derender")
    assert received(router) == []
    assert router["epp"].bodies == []


def test_running_router_refuses_bodies_over_the_limit(router):
    received(router)
    reply = httpx.post(
        router["url"] + "/v1/chat/completions",
        content=b'{"x": "' + b"a" * SIXTEEN_MIB + b'"}',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert reply.status_code == 413
    assert received(router) == []


def test_running_router_filter_order_from_the_admin_interface(router):
    """The path the README's jq command takes through /config_dump."""
    dump = httpx.get(f"http://{LOCAL}:{router['ports']['admin']}/config_dump", timeout=10).json()
    (listeners,) = [c for c in dump["configs"] if c["@type"].endswith("ListenersConfigDump")]
    (vllm,) = [
        x["listener"] for x in listeners["static_listeners"] if x["listener"]["name"] == "vllm"
    ]
    names = [
        f["name"] for f in vllm["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    ]
    assert names == ORDER


def test_envoys_heap_is_bounded_as_in_the_shipped_configs():
    # Every route holds up to 16 MiB: the overload manager answers 503 before the heap
    # outgrows the container, as envoy/envoy.yaml's does.
    shipped = yaml.safe_load((REPO / "envoy" / "envoy.yaml").read_text())
    assert bootstrap()["overload_manager"] == shipped["overload_manager"]


def test_the_regex_program_size_limit_is_the_shipped_configs():
    shipped = yaml.safe_load((REPO / "envoy" / "envoy.yaml").read_text())
    assert bootstrap()["layered_runtime"] == shipped["layered_runtime"]
