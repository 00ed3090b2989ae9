from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.stack import Stack


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(item.fspath).is_relative_to(here):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack(tmp_path_factory.mktemp("stack")).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def gateway(stack: Stack) -> Stack:
    stack.clear()
    return stack
