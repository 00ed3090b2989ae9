"""The hostile-load tier: each test reproduces an attack on the availability of the
gateway through the real Envoy (loopback only, bounded in count and time) and checks
that legitimate requests still get their answers."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import BODY_MODES
from tests.e2e.stack import Stack


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(item.fspath).is_relative_to(here):
            item.add_marker(pytest.mark.hostile)


def shipped_stack(workdir: Path, mode: str) -> Stack:
    """The shipped configuration in ``mode``, the processor with its default limits."""
    return Stack(workdir, source=BODY_MODES[mode])


@pytest.fixture(scope="module", params=list(BODY_MODES))
def shipped(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    with shipped_stack(tmp_path_factory.mktemp(request.param), request.param) as stack:
        yield stack
