import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack import envoy_config, processes
from ext_proc.core.address import HostPort
from tests.conformance import results, vllm_env
from tests.e2e.stack import Stack, new_key, route

VOCAB = vllm_env.TINY_VOCAB_SIZE
# The gateway's signing key id (docs/trust.md): mint routes sign with it.
KEY_ID = "conformance"
# Test routes, each rewritten to vLLM's /v1/.
DENY = "/deny"  # aggregated, action deny
DECODE = "/pdv"  # the decode leg: honor, the tiny vocabulary; a client's ids untrusted
ANY_CALLER = "/pdany"  # honor from any caller (trust_any_caller): the ids only validated
MINT = "/mint"  # the prefill leg: mint, the response signed
# A mint route placed before the gateway's token endpoint 404s: render and derender
# reach vLLM through it, as through an operator's config without those rules.
UNGUARDED_MINT = "/unguarded-mint"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(item.fspath).is_relative_to(here):
            item.add_marker(pytest.mark.vllm)
            item.add_marker(pytest.mark.timeout(900))


@pytest.fixture(scope="session")
def vllm() -> Iterator[str]:
    # Fails loudly (never skips) when vLLM cannot be installed or started.
    # --enable-scale-out adds vLLM's render, derender and token-in endpoints (and
    # nothing else): the gateway is tested against the server that echoes most.
    # Releases before 0.30 serve them without the flag.
    scale_out = vllm_env.scale_out_args()
    with vllm_env.run_vllm(processes.free_port(), extra_args=scale_out) as base_url:
        yield base_url


def mint_route(name: str, prefix: str, policy: dict[str, Any]) -> dict[str, Any]:
    """A mint route: the shipped prefill route's filter override (response headers and
    the buffered response body sent to the processor), so the response can be signed."""
    shipped = yaml.safe_load(envoy_config.SHIPPED.read_text())
    hcm = shipped["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    (vhost,) = hcm["typed_config"]["route_config"]["virtual_hosts"]
    (prefill,) = [r for r in vhost["routes"] if r.get("name") == "prefill"]
    mint = route(name, prefix, policy)
    mint["typed_per_filter_config"] = copy.deepcopy(prefill["typed_per_filter_config"])
    return mint


@pytest.fixture(scope="session")
def gateway(vllm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    address = HostPort.parse(vllm.removeprefix("http://"))
    decode = {"topology": "disaggregated", "action": "honor", "vocab_size": VOCAB}
    routes = [
        route("deny", f"{DENY}/v1/", {"topology": "aggregated", "action": "deny"}),
        route("pd-vocab", f"{DECODE}/v1/", decode),
        route("pd-any-caller", f"{ANY_CALLER}/v1/", {**decode, "trust_any_caller": True}),
        mint_route("mint", f"{MINT}/v1/", {**decode, "action": "mint"}),
    ]
    unguarded = mint_route("unguarded-mint", f"{UNGUARDED_MINT}/v1/", {**decode, "action": "mint"})
    stack = Stack(
        tmp_path_factory.mktemp("vllm-stack"),
        routes=routes,
        unguarded=[unguarded],
        real_upstream=address,
        proof_keys={KEY_ID: new_key()},
    )
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def pytest_sessionfinish(session: pytest.Session) -> None:
    results.write()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if results.RESULTS:
        terminalreporter.write_sep("-", "vLLM prompt token counts / status codes")
        terminalreporter.write_line(results.table())
