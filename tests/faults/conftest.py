"""The fault tier: each test does one fault to one part of the real stack (the real
Envoy on the shipped envoy/envoy.yaml, the processor, the recording upstream, a real
redis-server) under a bounded load (loopback only, a few clients for seconds) and counts
what the clients got and what reached the upstream (tests/faults/harness.py)."""

from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(item.fspath).is_relative_to(here):
            item.add_marker(pytest.mark.faults)
