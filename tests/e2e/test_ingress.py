"""deploy/ingress/: the example Ingress and its NetworkPolicy follow the Kubernetes schemas;
the routes istiod makes of the Ingress (tests/e2e/istio_ingress.py, held to Istio's own
testdata), with the generated EnvoyFilter's patches applied as istiod applies them, give
each route what the Istio EnvoyFilter gives its HTTPRoute rule, pass `check-envoy` and
the real `envoy --mode validate`, and run with the real Envoy and the processor."""

from __future__ import annotations

import json
from typing import Any

import httpx
import kubernetes_validate
import pytest

from devstack import ingress
from ext_proc.tools import check_envoy
from tests.e2e import gateway_assembly, gateway_run, istio_ingress
from tests.e2e.stack import new_key
from tests.e2e.test_deploy import (
    ISTIO_DEFAULTS,
    ISTIO_PROCESSOR,
    KUBE_VERSION,
    NAMESPACE,
    bounded_connection,
    chat,
    documents,
    envoy_validate,
    httproutes,
    istio_filter,
    largest_route_body,
    processor_connection,
    routes_of,
)


def the_ingress() -> dict[str, Any]:
    (found,) = [d for d in documents(ingress.INGRESS) if d["kind"] == "Ingress"]
    return found


def ingress_filter() -> dict[str, Any]:
    (doc,) = documents(ingress.ENVOY_FILTER)
    assert (doc["apiVersion"], doc["kind"]) == ("networking.istio.io/v1alpha3", "EnvoyFilter")
    return doc


def assembled(
    envoy_filter: dict[str, Any] | None = None, retry_policy: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ingress gateway's bootstrap: istiod's routes for the Ingress, patched."""
    hosts, clusters = istio_ingress.virtual_hosts(the_ingress(), retry_policy=retry_policy)
    return gateway_assembly.istio_assemble(envoy_filter or ingress_filter(), hosts, clusters)


def virtual_hosts(config: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    hcm = config["static_resources"]["listeners"][0]["default_filter_chain"]["filters"][0]
    hosts = hcm["typed_config"]["route_config"]["virtual_hosts"]
    return {h["name"]: h["routes"] for h in hosts}


# --- the manifests ---------------------------------------------------------------------


def test_the_manifests_follow_the_kubernetes_schemas():
    kinds = []
    for path in (ingress.INGRESS, ingress.GATEWAY_POLICY):
        for doc in documents(path):
            try:
                kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{path.name}: {doc['kind']}: {exc}")
            kinds.append(doc["kind"])
    assert kinds == ["IngressClass", "Ingress", "NetworkPolicy"]


def test_the_ingress_is_istios_with_a_host_per_route_policy():
    (ingress_class,) = [d for d in documents(ingress.INGRESS) if d["kind"] == "IngressClass"]
    assert ingress_class["spec"]["controller"] == "istio.io/ingress-controller"
    spec = the_ingress()["spec"]
    assert spec["ingressClassName"] == ingress_class["metadata"]["name"]
    # One path per host: istiod's routes of an Ingress are told apart by host alone.
    assert [len(rule["http"]["paths"]) for rule in spec["rules"]] == [1, 1, 1]
    paths = {rule["host"]: rule["http"]["paths"][0]["path"] for rule in spec["rules"]}
    # The example HTTPRoutes' paths, each on its own host.
    assert paths == {
        "llama.example.com": "/",
        "decode.llama-pd.example.com": "/pd/v1/",
        "prefill.llama-pd.example.com": "/pd/prefill/v1/",
    }


def test_the_gateway_may_reach_the_processor():
    (policy,) = documents(ingress.GATEWAY_POLICY)
    (base,) = documents(ingress.NETWORK_POLICY)
    assert policy["spec"]["podSelector"] == base["spec"]["podSelector"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 50051}]
    (peer,) = rule["from"]
    # The pods the EnvoyFilter patches.
    assert (
        peer["podSelector"]["matchLabels"] == ingress_filter()["spec"]["workloadSelector"]["labels"]
    )
    assert peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": ingress_filter()["metadata"]["namespace"]
    }


# --- the converter, held to Istio's testdata ---------------------------------------------

# pilot/pkg/config/kube/ingress/testdata/simple.yaml: each path, its pathType and the
# backend's port (the port tells the paths apart in the golden file).
SIMPLE = [
    ("/path", None, 4200),
    ("/sub/path", None, 4201),
    ("/sub/path/", None, 4202),
    ("/regex1.*", None, 4203),
    ("/regex2*", None, 4204),
    ("/regex3/*", None, 4205),
    ("/sub/path", "Exact", 4206),
    ("/sub/path/", "Exact", 4207),
    ("/sub/path", "Prefix", 4208),
    ("/sub/path/", "Prefix", 4209),
]
# simple.yaml.golden: the VirtualService's routes, in order, as (port, uri match).
SIMPLE_GOLDEN = [
    (4202, {"exact": "/sub/path/"}),
    (4207, {"exact": "/sub/path/"}),
    (4209, {"prefix": "/sub/path/"}),
    (4201, {"exact": "/sub/path"}),
    (4206, {"exact": "/sub/path"}),
    (4208, {"prefix": "/sub/path"}),
    (4204, {"exact": "/regex2*"}),
    (4203, {"prefix": "/regex1"}),
    (4205, {"prefix": "/regex3"}),
    (4200, {"exact": "/path"}),
]


def simple_ingress() -> dict[str, Any]:
    paths = []
    for path, path_type, port in SIMPLE:
        entry: dict[str, Any] = {
            "path": path,
            "backend": {"service": {"name": "service1", "port": {"number": port}}},
        }
        if path_type is not None:
            entry["pathType"] = path_type
        paths.append(entry)
    return {
        "metadata": {"name": "foo", "namespace": "ns"},
        "spec": {"rules": [{"host": "foohost.bar.com", "http": {"paths": paths}}]},
    }


def test_the_converter_makes_istios_virtual_service_of_its_testdata():
    (service,) = istio_ingress.virtual_services(simple_ingress())
    assert service["metadata"] == {
        "name": "foohost-bar-com-foo-istio-autogenerated-k8s-ingress",
        "namespace": "ns",
    }
    assert service["spec"]["hosts"] == ["foohost.bar.com"]
    made = [
        (r["route"][0]["destination"]["port"]["number"], r["match"][0]["uri"])
        for r in service["spec"]["http"]
    ]
    assert made == SIMPLE_GOLDEN
    hosts = {r["route"][0]["destination"]["host"] for r in service["spec"]["http"]}
    assert hosts == {"service1.ns.svc.cluster.local"}


def test_the_converter_writes_istios_envoy_matches():
    # route_test.go ("ingress semantics"): a prefix without its trailing "/" as a
    # path_separated_prefix, "/" a prefix; an exact match a path.
    (vhost,), _ = istio_ingress.virtual_hosts(simple_ingress())
    assert vhost["name"] == "foohost.bar.com:80"
    matches = [r["match"] for r in vhost["routes"]]
    assert matches[2] == {"path_separated_prefix": "/sub/path"}
    assert matches[0] == {"path": "/sub/path/"}
    assert all("name" not in r for r in vhost["routes"])


# --- the assembled gateway ---------------------------------------------------------------

# Fields the EnvoyFilter's patches set on a forwarding route.
PATCHED = ("metadata", "typed_per_filter_config", "request_body_buffer_limit")


def forwarding(routes: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [r for r in routes if "route" in r]
    return found


def test_each_ingress_route_is_patched_as_its_httproute_rules_route():
    by_host = virtual_hosts(assembled())
    assert sorted(by_host) == sorted(f"{host}:80" for host in ingress.HOSTS.values())
    shipped = {
        r["name"]: r
        for r in routes_of(gateway_assembly.istio_bootstrap(istio_filter(), httproutes()))
    }
    for name, host in ingress.HOSTS.items():
        made, expected = forwarding(by_host[f"{host}:80"]), shipped[name]
        for field in PATCHED:
            if field == "metadata":
                assert (
                    made[field]["filter_metadata"][NAMESPACE]
                    == (expected[field]["filter_metadata"][NAMESPACE])
                ), name
            else:
                assert made.get(field) == expected.get(field), (name, field)
        # The same match, rewrite and retry policy; only the cluster differs.
        assert made["match"] == expected["match"], name
        made_action = {k: v for k, v in made["route"].items() if k != "cluster"}
        expected_action = {k: v for k, v in expected["route"].items() if k != "cluster"}
        assert made_action == expected_action, name


def test_the_p_d_routes_state_the_rewrite_the_filter_gives_them():
    by_host = virtual_hosts(assembled())
    for host in ("decode.llama-pd.example.com", "prefill.llama-pd.example.com"):
        entry = forwarding(by_host[f"{host}:80"])
        stated = entry["metadata"]["filter_metadata"][NAMESPACE]
        assert stated["match_prefix"] == entry["match"]["path_separated_prefix"]
        assert stated["prefix_rewrite"] == entry["route"]["prefix_rewrite"] == "/v1"


def test_every_virtual_host_answers_the_refused_endpoints_first():
    shipped = routes_of(gateway_assembly.istio_bootstrap(istio_filter(), httproutes()))
    inserted = [r for r in shipped if "direct_response" in r]
    for name, routes in virtual_hosts(assembled()).items():
        assert routes[: len(inserted)] == inserted, name
        assert len(routes) == len(inserted) + 1, name


def test_the_processor_connection_has_room_for_its_streams_bodies():
    config = assembled()
    assert processor_connection(config, ISTIO_PROCESSOR) == bounded_connection(
        largest_route_body(config)
    )


def test_the_assembled_gateway_passes_check_envoy():
    report = check_envoy.check(assembled())
    assert (report.errors, report.warnings, report.routes) == ([], [], 21)


def _no_rewrite(envoy_filter: dict[str, Any]) -> None:
    for patch in envoy_filter["spec"]["configPatches"]:
        patch["patch"]["value"].get("route", {}).pop("prefix_rewrite", None)


def _no_retry_override(envoy_filter: dict[str, Any]) -> None:
    for patch in envoy_filter["spec"]["configPatches"]:
        patch["patch"]["value"].get("route", {}).pop("retry_policy", None)


def _other_hosts(envoy_filter: dict[str, Any]) -> None:
    for patch in envoy_filter["spec"]["configPatches"]:
        vhost = patch["match"].get("routeConfiguration", {}).get("vhost", {})
        if "name" in vhost:
            vhost["name"] = "other." + vhost["name"]


@pytest.mark.parametrize(
    ("change", "codes"),
    [
        # The metadata states a rewrite the route does not make.
        (_no_rewrite, ["rewrite-stated-not-made", "rewrite-stated-not-made"]),
        # istiod's retries resend a decided body on the mint and honor routes.
        (_no_retry_override, ["body-retried", "body-retried"]),
    ],
    ids=["rewrite", "retries"],
)
def test_check_envoy_catches_a_filter_without_each_route_part(change, codes):
    envoy_filter = ingress_filter()
    change(envoy_filter)
    assert check_envoy.check(assembled(envoy_filter)).codes() == codes


def test_a_patch_for_another_host_leaves_the_default_policy():
    # Fail closed: unmatched routes are aggregated and strip (no metadata), unrewritten.
    envoy_filter = ingress_filter()
    _other_hosts(envoy_filter)
    config = assembled(envoy_filter)
    for routes in virtual_hosts(config).values():
        entry = forwarding(routes)
        assert NAMESPACE not in entry["metadata"]["filter_metadata"]
        assert "prefix_rewrite" not in entry["route"]
    assert check_envoy.check(config).errors == []


@ISTIO_DEFAULTS
def test_the_assembled_gateway_validates(default, tmp_path):
    envoy_validate(assembled(retry_policy=default), tmp_path, "istio-ingress")


# --- end to end through the real Envoy ---------------------------------------------------

AGGREGATED = "llama.example.com"
DECODE = "decode.llama-pd.example.com"
PREFILL = "prefill.llama-pd.example.com"


def _forwarded(gateway: gateway_run.Running) -> tuple[str, dict[str, Any]]:
    (found,) = gateway.bodies()
    gateway.clear()
    return found[0], json.loads(found[1])


def test_the_ingress_routes_run_with_the_processor(tmp_path):
    config = assembled()
    with gateway_run.running(config, tmp_path, ISTIO_PROCESSOR, {"k1": new_key()}) as gateway:
        url = f"http://{gateway.gateway}"
        with httpx.Client(base_url=url, timeout=20) as client:

            def post(host: str, path: str, body: dict[str, Any]) -> httpx.Response:
                return client.post(path, json=body, headers={"host": host})

            # A client's own parameters are removed whole, on the aggregated path and on
            # the decode path, which is rewritten to vLLM's.
            own = chat({"prompt_token_ids": [1, 2, 3], "remote_port": 9})
            for host, path in ((AGGREGATED, "/v1/"), (DECODE, "/pd/v1/")):
                reply = post(host, f"{path}chat/completions", own)
                assert reply.status_code == 200, reply.text
                target, body = _forwarded(gateway)
                assert target == "/v1/chat/completions"
                assert "kv_transfer_params" not in body

            # The hand-off: signed on the prefill host, honored on the decode host.
            prefill = {**chat({}), "max_tokens": 1, "return_token_ids": True}
            del prefill["kv_transfer_params"]
            reply = post(PREFILL, "/pd/prefill/v1/chat/completions", prefill)
            assert reply.status_code == 200, reply.text
            params = reply.json()["kv_transfer_params"]
            assert params["token_policy_proof"].startswith("tp4.k1.")
            assert _forwarded(gateway)[0] == "/v1/chat/completions"
            reply = post(DECODE, "/pd/v1/chat/completions", chat(params))
            assert reply.status_code == 200, reply.text
            assert _forwarded(gateway)[1]["kv_transfer_params"] == params

            # The proof honored on the decode host is not honored on the aggregated one.
            reply = post(AGGREGATED, "/v1/chat/completions", chat(params))
            assert reply.status_code == 200, reply.text
            assert "kv_transfer_params" not in _forwarded(gateway)[1]

            # A host the Ingress does not name has no route.
            assert post("other.example.com", "/v1/chat/completions", own).status_code == 404
            assert gateway.bodies() == []

        # Requests without a body to refused endpoints: 404 on every host, none forwarded.
        for host, path in ((AGGREGATED, "/v1/"), (DECODE, "/pd/v1/"), (PREFILL, "/pd/prefill/v1/")):
            assert gateway_run.bodiless_refusals(gateway, ("/", path), {"host": host}) == []
        assert gateway.received() == []
