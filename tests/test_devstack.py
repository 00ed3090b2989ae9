"""devstack.stack: every port checked before anything starts, one line per refusal."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack import stack
from ext_proc.address import HostPort

REPO = Path(__file__).resolve().parents[1]
VARIABLES = ("GATEWAY_PORT", "ENVOY_ADMIN_PORT", "PROCESSOR_PORT", "METRICS_PORT", "STUB_PORT")


@pytest.fixture
def taken() -> Iterator[int]:
    """A port with a listener on it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def free_ports() -> dict[str, str]:
    """A distinct free port for each variable."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in VARIABLES]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return {name: str(s.getsockname()[1]) for name, s in zip(VARIABLES, socks, strict=True)}


def make_run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in VARIABLES and "UPSTREAM" not in k}
    return subprocess.run(
        [sys.executable, "-m", "devstack"],
        cwd=REPO,
        env={**base, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize("variable", VARIABLES)
def test_a_taken_port_ends_the_run_with_one_line(variable, taken):
    result = make_run({**free_ports(), variable: str(taken)})
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"make run: port {taken} ({variable}) is in use; set {variable} to a free port\n"
    )


def test_one_port_for_two_variables_is_refused():
    ports = free_ports()
    result = make_run({**ports, "METRICS_PORT": ports["GATEWAY_PORT"]})
    assert result.returncode == 1
    assert result.stderr == (
        f"make run: GATEWAY_PORT and METRICS_PORT are both {ports['GATEWAY_PORT']}; "
        "set METRICS_PORT to another port\n"
    )


@pytest.mark.parametrize("value", ["x", "0", "65536", "80 "])
def test_a_port_that_is_no_port_is_refused(value):
    result = make_run({**free_ports(), "PROCESSOR_PORT": value})
    assert result.returncode == 1
    assert result.stderr == (
        f"make run: PROCESSOR_PORT must be a port number in 1..65535, got {value!r}\n"
    )


def test_a_bad_upstream_or_config_is_refused_in_one_line(tmp_path):
    result = make_run({**free_ports(), "AGGREGATED_UPSTREAM": "vllm"})
    assert result.returncode == 1
    assert result.stderr.startswith("make run: AGGREGATED_UPSTREAM: expected host:port")
    assert result.stderr.count("\n") == 1
    missing = tmp_path / "missing.yaml"
    result = make_run({**free_ports(), "ENVOY_CONFIG": str(missing)})
    assert (result.returncode, result.stderr) == (1, f"make run: ENVOY_CONFIG: no file {missing}\n")


def test_real_upstreams_leave_the_stub_port_alone(monkeypatch, taken):
    for name, port in free_ports().items():
        monkeypatch.setenv(name, port)
    monkeypatch.setenv("STUB_PORT", str(taken))
    monkeypatch.delenv("ENVOY_CONFIG", raising=False)
    monkeypatch.setenv("AGGREGATED_UPSTREAM", "10.0.0.1:8000")
    monkeypatch.setenv("DISAGGREGATED_UPSTREAM", "[fd00::1]:8001")
    plan = stack.plan(None)
    assert not plan.stub
    assert "STUB_PORT" not in plan.ports
    clusters = {c["name"]: c for c in plan.envoy["static_resources"]["clusters"]}
    addresses = {
        name: clusters[name]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"][
            "address"
        ]["socket_address"]
        for name in ("aggregated", "disaggregated", "ext_proc")
    }
    assert addresses == {
        "aggregated": {"address": "10.0.0.1", "port_value": 8000},
        "disaggregated": {"address": "fd00::1", "port_value": 8001},
        "ext_proc": {"address": "127.0.0.1", "port_value": plan.port("PROCESSOR_PORT").port},
    }


def test_check_ports_accepts_free_distinct_ports():
    ports = {name: HostPort("127.0.0.1", int(port)) for name, port in free_ports().items()}
    stack.check_ports(ports)
