"""The SGLang tier: what SGLang's own request models read from what the gateway
forwards. SGLang's models run in their own cached environment (``sglang_env``); the
gateway is the e2e tier's real stack (Envoy, the processor, the recording stand-in)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.stack import Stack, new_key
from tests.sglang import sglang_env

ENVOY = Path(__file__).resolve().parents[2] / "envoy"
# The request's messages in each of the processor's arrangements (as the e2e tier runs
# them): headers as attributes with the buffered body (the shipped default), headers
# then the buffered body, headers then streamed chunks.
BODY_MODES = {
    "one-message": ENVOY / "envoy.yaml",
    "two-message": ENVOY / "envoy-two-message.yaml",
    "streamed": ENVOY / "envoy-streamed.yaml",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(item.fspath).is_relative_to(here):
            item.add_marker(pytest.mark.sglang)
            item.add_marker(pytest.mark.timeout(900))


@pytest.fixture(scope="session")
def sglang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sglang_env.Parser]:
    # Fails loudly (never skips) when the environment cannot be installed.
    log = tmp_path_factory.mktemp("sglang") / "parse_request.log"
    with sglang_env.Parser(log) as parser:
        yield parser


@pytest.fixture(scope="module", params=list(BODY_MODES))
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp(request.param)
    # A signing key, as a deployment with a mint route (the prefill route) has one.
    with Stack(workdir, source=BODY_MODES[request.param], proof_keys={"sglang": new_key()}) as s:
        yield s


@pytest.fixture
def gateway(stack: Stack) -> Stack:
    stack.clear()
    return stack
