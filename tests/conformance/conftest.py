from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack import processes
from ext_proc.address import HostPort
from tests.conformance import results, vllm_env
from tests.e2e.stack import Stack, route

VOCAB = vllm_env.TINY_VOCAB_SIZE


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(item.fspath).is_relative_to(here):
            item.add_marker(pytest.mark.vllm)
            item.add_marker(pytest.mark.timeout(900))


@pytest.fixture(scope="session")
def vllm() -> Iterator[str]:
    # Fails loudly (never skips) when vLLM cannot be installed or started.
    with vllm_env.run_vllm(processes.free_port()) as base_url:
        yield base_url


@pytest.fixture(scope="session")
def gateway(vllm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    address = HostPort.parse(vllm.removeprefix("http://"))
    routes = [
        route("deny", "/deny/v1/", {"topology": "aggregated", "action": "deny"}),
        route("pd-vocab", "/pdv/v1/", {"topology": "disaggregated", "vocab_size": VOCAB}),
    ]
    stack = Stack(tmp_path_factory.mktemp("vllm-stack"), routes=routes, real_upstream=address)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if results.RESULTS:
        terminalreporter.write_sep("-", "vLLM prompt token counts / status codes")
        terminalreporter.write_line(results.table())
