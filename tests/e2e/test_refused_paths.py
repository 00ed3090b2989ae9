"""Requests without a body never reach an internal or token-in endpoint: through the
real Envoy and processor, in each body arrangement, the shipped routes' 404s
(``refused_paths``) answer GET, HEAD, DELETE, OPTIONS, PUT and POST, with a body or
without, on every path a route's rewrite sends to one (behind a root path, in upper
case, with a trailing slash or an escaped newline), in vLLM's error shape, and the
stand-in receives nothing; a path that only ends like one is served. The same for the
internal endpoints that act or disclose on a bodiless GET (the configuration, the RL
weight sync's state, SGLang's transfer-engine info...), while health, version, load and
the models served are forwarded. Where Envoy skips
the headers (one message per request), a request without a body never reaches the
processor, which judges endpoints from the body alone.

A route whose policy accepts the class serves it: the generated config with such a
route forwards a bodiless request there (tests/tools/envoygen checks the config, and
check-envoy probes every route with every refused endpoint)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ext_proc.tools import envoygen
from tests.e2e.conftest import BODY_MODES
from tests.e2e.stack import Stack

NOT_FOUND = {"error": {"message": "not found", "type": "NotFoundError", "param": None, "code": 404}}
# Internal and token-in endpoints the servers act on without a body (SGLang's cache and
# profiling, vLLM's development mode, Dynamo's frontend), and one with a template.
ENDPOINTS = (
    "/flush_cache",
    "/pause",
    "/sleep",
    "/reset_prefix_cache",
    "/dumper/x",
    "/hicache/storage-backend/clear",
    "/freeze_gc",
    "/start_profile",
    "/clear_kv_blocks",
    "/workers",
    "/workers/1/drain",
    "/generative_scoring",
)
# Internal endpoints that act or disclose on a bodiless GET (the inventory records every
# route, not only those that take a body), and reads that stay public.
BODILESS = (
    "/server_info",
    "/get_server_info",
    "/is_paused",
    "/get_world_size",
    "/weight_info",
    "/fault_tolerance/status",
    "/v1/fault_tolerance/status",
    "/checkpoint/status",
    "/kv_event_sources",
    "/tokenizer_info",
    "/list_external_corpora",
    "/get_hicache_l3_cache_layout",
    "/remote_instance_transfer_engine_info",
    "/get_remote_instance_transfer_engine_info",
)
PUBLIC = ("/health", "/ready", "/version", "/load", "/v1/loads", "/v1/models", "/model_info")
# Each through the shipped routes: prefix, and what the upstream sees in its place.
REWRITES = {"/": "/", "/v1/": "/v1/", "/pd/v1/": "/v1/", "/pd/prefill/v1/": "/v1/"}
PREFIXES = tuple(REWRITES)
METHODS = ("GET", "HEAD", "DELETE", "OPTIONS", "PUT", "POST")
# A route accepting both classes, to the upstream's root.
ADMIN = "/admin/"


def spellings(endpoint: str) -> dict[str, str]:
    return {
        "plain": endpoint,
        "behind-a-root-path": f"/x{endpoint}",
        "upper": endpoint.upper(),
        "trailing-slash": f"{endpoint}/",
        "escaped-newline": f"{endpoint}%0A",
        "query": f"{endpoint}?x=1",
    }


PATHS = {
    f"{prefix}{name}:{endpoint}": prefix.rstrip("/") + path
    for prefix in PREFIXES
    for endpoint in ENDPOINTS
    for name, path in spellings(endpoint).items()
}


def config(source: Path, workdir: Path) -> Path:
    """``source``'s input with an ``/admin/`` route accepting internal and token
    endpoints, generated as the shipped configs are."""
    data = envoygen.read_input(source.parent / "inputs" / source.name)
    data.pop("base", None)
    data["routes"] = [
        {
            "name": "admin",
            "prefix": ADMIN,
            "prefix_rewrite": "/",
            "upstream": "aggregated",
            "policy": {"accept": "internal_endpoints|token_endpoints"},
        },
        *data["routes"],
    ]
    path = workdir / source.name
    path.write_text(envoygen.render(envoygen.load_input(data)))
    return path


@pytest.fixture(scope="module", params=["one-message", "two-message"])
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp(f"refused-{request.param}")
    source = config(BODY_MODES[request.param], workdir)
    with Stack(workdir, source=source, routes=[]) as running:
        yield running


@pytest.fixture
def gateway(stack: Stack) -> Stack:
    stack.clear()
    return stack


def send(stack: Stack, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    """One request, the path sent exactly as written."""
    connection = http.client.HTTPConnection(stack.gateway.host, stack.gateway.port, timeout=20)
    headers = {"connection": "close"}
    if body is not None:
        headers["content-type"] = "application/json"
    try:
        connection.request(method, path, body, headers)
        reply = connection.getresponse()
        return reply.status, reply.read()
    finally:
        connection.close()


@pytest.mark.parametrize("path", PATHS.values(), ids=PATHS.keys())
def test_a_bodiless_request_never_reaches_a_refused_endpoint(gateway, path):
    for method in METHODS:
        status, body = send(gateway, method, path)
        assert status == 404, (method, path, status, body)
        if method != "HEAD":
            assert json.loads(body) == NOT_FOUND, (method, path)
    # With a body, the same: Envoy answers before the processor.
    status, body = send(gateway, "POST", path, b"{}")
    assert (status, json.loads(body)) == (404, NOT_FOUND), path
    assert gateway.received() == []


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_bodiless_admin_or_disclosure_read_is_answered_404(gateway, prefix):
    for endpoint in BODILESS:
        for path in (spellings(endpoint)["plain"], spellings(endpoint)["behind-a-root-path"]):
            for method in ("GET", "HEAD", "DELETE"):
                status, body = send(gateway, method, prefix.rstrip("/") + path)
                assert status == 404, (method, prefix, path, status, body)
                if method != "HEAD":
                    assert json.loads(body) == NOT_FOUND, (method, prefix, path)
    assert gateway.received() == []


def test_public_reads_are_served(gateway):
    for endpoint in PUBLIC:
        gateway.clear()
        status, _ = send(gateway, "GET", endpoint)
        assert status == 200, endpoint
        (received,) = gateway.received()
        assert (received.method, received.target) == ("GET", endpoint)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_path_that_only_ends_like_one_is_served(gateway, prefix):
    for suffix in ("flush_cache_x", "my_flush_cache", "flush_cache/x", "workers/1/drain/x"):
        gateway.clear()
        path = prefix + suffix
        status, _ = send(gateway, "GET", path)
        assert status == 200, (path, status)
        (received,) = gateway.received()
        assert received.target == REWRITES[prefix] + suffix


@pytest.mark.parametrize("endpoint", ENDPOINTS + BODILESS)
def test_a_route_accepting_them_serves_them_without_a_body(gateway, endpoint):
    status, _ = send(gateway, "GET", ADMIN.rstrip("/") + endpoint)
    assert status == 200
    (received,) = gateway.received()
    assert (received.method, received.target) == ("GET", endpoint)


def test_the_configs_answer_them_by_path(stack):
    # The 404s come from the config, one per route, before it (not from the processor,
    # which a bodiless request does not reach with one message per request).
    routes = yaml.safe_load(stack.source.read_text())["static_resources"]["listeners"][0][
        "filter_chains"
    ][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    names = [r["name"] for r in routes]
    refused = [n for n in names if n.endswith("-refused")]
    assert refused == [
        f"token-endpoint-{r}-refused" for r in ("prefill", "disaggregated", "aggregated", "default")
    ]
