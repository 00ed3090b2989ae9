from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import tools
from tests.e2e.stack import Stack, new_key


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(item.fspath).is_relative_to(here):
            item.add_marker(pytest.mark.e2e)


ENVOY = Path(__file__).resolve().parents[2] / "envoy"
# The signing key of every `stack` (as a deployment with a mint route has one).
KEY_ID = "e2e"
# Every end-to-end test through `stack` runs once per arrangement of the request's
# messages: one (headers as attributes, BUFFERED body: the shipped default), two (the
# headers, then the BUFFERED body), and FULL_DUPLEX_STREAMED (the headers, then chunks).
BODY_MODES = {
    "one-message": ENVOY / "envoy.yaml",
    "two-message": ENVOY / "envoy-two-message.yaml",
    "streamed": ENVOY / "envoy-streamed.yaml",
}


@pytest.fixture(scope="module", params=list(BODY_MODES))
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    source = BODY_MODES[request.param]
    workdir = tmp_path_factory.mktemp(request.param)
    with Stack(workdir, source=source, proof_keys={KEY_ID: new_key()}) as running:
        yield running


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool, from Debian's prometheus package (installed with apt-get if missing)."""
    return tools.ensure_tools({"promtool": "prometheus"})["promtool"]


@pytest.fixture(scope="module")
def decompressing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """envoy/envoy-decompress.yaml: Envoy's gzip decompressor runs before ext_proc."""
    with Stack(tmp_path_factory.mktemp("gz"), source=ENVOY / "envoy-decompress.yaml") as running:
        yield running


@pytest.fixture
def gateway(stack: Stack) -> Stack:
    stack.clear()
    return stack
