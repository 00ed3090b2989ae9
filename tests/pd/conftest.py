"""The prefill/decode tier: a real NIXL pair behind ``make run`` with the shipped config.

Each vLLM server sits behind a ``Recorder``: the tests see exactly what the gateway
forwarded to it. The pair is the session's; tests read the decode server's counters
before and after what they send, so they run one at a time (pytest's default)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack import processes
from ext_proc.core.address import HostPort
from tests.e2e.test_make_run import start, wait_ready
from tests.pd import pair as pd_pair
from tests.recorder import Recorder
from tests.test_devstack import free_ports

RESULTS: list[str] = []
TURNS_CONFIG = Path(__file__).resolve().parents[2] / "envoy" / "envoy-turns.yaml"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(item.fspath).is_relative_to(here):
            item.add_marker(pytest.mark.pd)
            item.add_marker(pytest.mark.timeout(900))


@pytest.fixture(scope="session")
def pair() -> Iterator[pd_pair.Pair]:
    # Fails loudly (never skips) when vLLM or nixl cannot be installed or started.
    with pd_pair.run_pair(processes.free_port(), processes.free_port()) as running:
        yield running


class Gateway:
    def __init__(
        self, url: str, metrics: str, prefill: Recorder, decode: Recorder, output: Path
    ) -> None:
        self.url = url
        self.metrics = metrics  # the processor's Prometheus endpoint
        self.prefill = prefill  # what reached the prefill server
        self.decode = decode  # what reached the decode server
        self.output = output  # make run's output


@contextlib.contextmanager
def make_run(
    pair: pd_pair.Pair, tmp: Path, env: dict[str, str], ports: dict[str, str] | None = None
) -> Iterator[Gateway]:
    """``make run`` with the prefill leg pointed at the pair's prefill server and the
    other routes at its decode server, each behind a recorder; ``env``: more settings."""
    prefill = Recorder(HostPort.parse(pair.prefill.removeprefix("http://")))
    decode = Recorder(HostPort.parse(pair.decode.removeprefix("http://")))
    with prefill.running(), decode.running():
        ports = ports or free_ports()
        upstreams = {
            "PREFILL_UPSTREAM": str(prefill.address),
            "DISAGGREGATED_UPSTREAM": str(decode.address),
            "AGGREGATED_UPSTREAM": str(decode.address),
        }
        run = start(tmp, {**ports, **upstreams, **env})
        log = tmp / "make-run.log"
        try:
            wait_ready(run, log)
            yield Gateway(
                f"http://127.0.0.1:{ports['GATEWAY_PORT']}",
                f"http://127.0.0.1:{ports['METRICS_PORT']}/metrics",
                prefill,
                decode,
                log,
            )
            os.kill(run.pid, signal.SIGINT)
            run.wait(timeout=30)
        finally:
            processes.stop(run)


@pytest.fixture(scope="session")
def bidirectional_pair() -> Iterator[pd_pair.Pair]:
    """A second pair whose connectors run with ``bidirectional_kv_xfer`` (the decode
    server keeps a turn's blocks for the next turn's read-back)."""
    with pd_pair.run_pair(
        processes.free_port(), processes.free_port(), bidirectional=True
    ) as running:
        yield running


@pytest.fixture(scope="session")
def turns_gateway(
    bidirectional_pair: pd_pair.Pair, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """``make run`` with envoy/envoy-turns.yaml (its turns route signs the decode
    server's turn parameters) in front of the bidirectional pair."""
    tmp = tmp_path_factory.mktemp("pd-turns-make-run")
    with make_run(bidirectional_pair, tmp, {"ENVOY_CONFIG": str(TURNS_CONFIG)}) as running:
        yield running


@pytest.fixture(scope="session")
def gateway(pair: pd_pair.Pair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """``make run`` (the shipped Envoy config) with both legs pointed at the pair."""
    with make_run(pair, tmp_path_factory.mktemp("pd-make-run"), {}) as running:
        yield running


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if RESULTS:
        terminalreporter.write_sep("-", "prefill/decode hand-offs")
        for line in RESULTS:
            terminalreporter.write_line(line)
