"""devstack.stack: every port checked before anything starts, one line per refusal."""

from __future__ import annotations

import copy
import itertools
import os
import re
import shlex
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devstack import envoy_config, processes, stack
from ext_proc.core.address import HostPort

REPO = Path(__file__).resolve().parents[1]
VARIABLES = ("GATEWAY_PORT", "ENVOY_ADMIN_PORT", "PROCESSOR_PORT", "METRICS_PORT", "STUB_PORT")
UPSTREAMS = ("AGGREGATED_UPSTREAM", "DISAGGREGATED_UPSTREAM", "PREFILL_UPSTREAM")


@pytest.fixture
def taken() -> Iterator[int]:
    """A port with a listener on it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def free_ports() -> dict[str, str]:
    """A distinct free port for each variable."""
    return {name: str(processes.free_port()) for name in VARIABLES}


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


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_a_bad_upstream_or_config_is_refused_in_one_line(tmp_path, upstream):
    result = make_run({**free_ports(), upstream: "vllm"})
    assert result.returncode == 1
    assert result.stderr.startswith(f"make run: {upstream}: expected host:port")
    assert result.stderr.count("\n") == 1
    missing = tmp_path / "missing.yaml"
    result = make_run({**free_ports(), "ENVOY_CONFIG": str(missing)})
    assert (result.returncode, result.stderr) == (1, f"make run: ENVOY_CONFIG: no file {missing}\n")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{{{: [\n", "not YAML: expected the node content, but found ':' (line 1, column 4)"),
        (
            envoy_config.SHIPPED.read_text().replace("action: honor", "action: honr", 1),
            "http_connection_manager[0] route vllm/disaggregated: invalid route policy "
            "metadata: field 'ext_proc.token_policy.action' is 'honr'; allowed values: ",
        ),
        (
            envoy_config.SHIPPED.read_text().replace(
                "action: honor\n", "action: honor\n                      colour: blue\n", 1
            ),
            "http_connection_manager[0] route vllm/disaggregated: invalid route policy "
            "metadata: unknown field 'ext_proc.token_policy.colour'; allowed fields: ",
        ),
        ("[1]\n", "no HTTP connection manager found"),
    ],
    ids=["not-yaml", "bad-action", "unknown-field", "no-bootstrap"],
)
def test_an_envoy_config_the_processor_would_refuse_ends_the_run_in_one_line(tmp_path, text, said):
    source = tmp_path / "envoy.yaml"
    source.write_text(text)
    result = make_run({**free_ports(), "ENVOY_CONFIG": str(source)})
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith(f"make run: ENVOY_CONFIG {source}: {said}")
    assert result.stderr.count("\n") == 1


def test_the_processor_is_given_the_envoy_config_it_serves(ports_set, tmp_path):
    plan = stack.plan(None)
    ((_, _, _), (serve, _, _), (envoy, _, _)) = list(stack._commands(plan, tmp_path))
    given = serve[serve.index("--envoy-config") + 1]
    assert given in envoy
    assert yaml.safe_load(Path(given).read_text()) == plan.envoy


@pytest.mark.parametrize("config", [None, "envoy/envoy-tls.yaml"])
def test_an_upstream_for_a_cluster_the_config_lacks_is_named_in_one_line(config):
    env = {**free_ports(), "COORDINATOR_UPSTREAM": "127.0.0.1:8090"}
    if config is not None:
        env["ENVOY_CONFIG"] = config
    result = make_run(env)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"make run: COORDINATOR_UPSTREAM is set but ENVOY_CONFIG {config or 'envoy/envoy.yaml'} "
        "has no cluster 'coordinator'; unset COORDINATOR_UPSTREAM or set ENVOY_CONFIG to a "
        "config with that cluster (envoy/envoy-coordinator.yaml)\n"
    )


def endpoint(config: dict, cluster: str) -> dict:
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    (group,) = clusters[cluster]["load_assignment"]["endpoints"]
    (lb_endpoint,) = group["lb_endpoints"]
    return lb_endpoint["endpoint"]["address"]["socket_address"]


@pytest.fixture
def ports_set(monkeypatch) -> dict[str, str]:
    """Free ports in the environment, nothing else of the stack's."""
    ports = free_ports()
    for name, port in ports.items():
        monkeypatch.setenv(name, port)
    for name in ("ENVOY_CONFIG", *UPSTREAMS, *stack.OTHER_UPSTREAMS, stack.PROOF_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    return ports


def with_prefill_cluster(tmp_path: Path) -> Path:
    """The shipped config with a ``prefill`` cluster, whether or not it ships one."""
    config = yaml.safe_load(envoy_config.SHIPPED.read_text())
    clusters = config["static_resources"]["clusters"]
    if all(c["name"] != "prefill" for c in clusters):
        (decode,) = [c for c in clusters if c["name"] == "disaggregated"]
        clusters.append({**copy.deepcopy(decode), "name": "prefill"})
        clusters[-1]["load_assignment"]["cluster_name"] = "prefill"
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_real_upstreams_leave_the_stub_port_alone(monkeypatch, ports_set, taken, tmp_path):
    monkeypatch.setenv("STUB_PORT", str(taken))
    monkeypatch.setenv("ENVOY_CONFIG", str(with_prefill_cluster(tmp_path)))
    monkeypatch.setenv("AGGREGATED_UPSTREAM", "10.0.0.1:8000")
    monkeypatch.setenv("DISAGGREGATED_UPSTREAM", "[fd00::1]:8001")
    monkeypatch.setenv("PREFILL_UPSTREAM", "10.0.0.2:8002")
    plan = stack.plan(None)
    assert not plan.stub
    assert "STUB_PORT" not in plan.ports
    addresses = {
        name: endpoint(plan.envoy, name)
        for name in ("aggregated", "disaggregated", "prefill", "ext_proc")
    }
    assert addresses == {
        "aggregated": {"address": "10.0.0.1", "port_value": 8000},
        "disaggregated": {"address": "fd00::1", "port_value": 8001},
        "prefill": {"address": "10.0.0.2", "port_value": 8002},
        "ext_proc": {"address": "127.0.0.1", "port_value": plan.port("PROCESSOR_PORT").port},
    }


@pytest.mark.parametrize("missing", UPSTREAMS)
def test_any_upstream_not_given_is_the_stand_in(monkeypatch, ports_set, tmp_path, missing):
    monkeypatch.setenv("ENVOY_CONFIG", str(with_prefill_cluster(tmp_path)))
    for name in UPSTREAMS:
        if name != missing:
            monkeypatch.setenv(name, "10.0.0.1:8000")
    plan = stack.plan(None)
    assert plan.stub
    cluster = {
        "AGGREGATED_UPSTREAM": "aggregated",
        "DISAGGREGATED_UPSTREAM": "disaggregated",
        "PREFILL_UPSTREAM": "prefill",
    }[missing]
    stand_in = {"address": "127.0.0.1", "port_value": int(ports_set["STUB_PORT"])}
    assert endpoint(plan.envoy, cluster) == stand_in


def test_a_config_without_a_prefill_cluster_is_run_without_one(ports_set, monkeypatch, tmp_path):
    config = yaml.safe_load(with_prefill_cluster(tmp_path).read_text())
    clusters = config["static_resources"]["clusters"]
    clusters[:] = [c for c in clusters if c["name"] != "prefill"]
    older = tmp_path / "older.yaml"
    older.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("ENVOY_CONFIG", str(older))
    monkeypatch.setenv("PREFILL_UPSTREAM", "10.0.0.2:8002")
    plan = stack.plan(None)
    names = [c["name"] for c in plan.envoy["static_resources"]["clusters"]]
    assert "prefill" not in names
    assert {"aggregated", "disaggregated", "ext_proc"} <= set(names)


def test_the_coordinator_upstream_goes_to_the_coordinator_cluster(monkeypatch, ports_set):
    monkeypatch.setenv("ENVOY_CONFIG", str(REPO / "envoy" / "envoy-coordinator.yaml"))
    monkeypatch.setenv("COORDINATOR_UPSTREAM", "10.0.0.5:8090")
    plan = stack.plan(None)
    assert endpoint(plan.envoy, "coordinator") == {"address": "10.0.0.5", "port_value": 8090}


def test_the_prefill_leg_defaults_to_the_decode_upstream(tmp_path):
    source = with_prefill_cluster(tmp_path)
    local = HostPort("127.0.0.1", 1)
    decode = HostPort("10.0.0.9", 9000)
    config = envoy_config.render(
        gateway=local,
        admin=local,
        processor=local,
        aggregated=local,
        disaggregated=decode,
        source=source,
    )
    assert endpoint(config, "prefill") == {"address": "10.0.0.9", "port_value": 9000}


def test_a_run_without_keys_gets_a_throwaway_one(ports_set):
    assert stack.plan(None).throwaway_key


def test_keys_from_the_environment_or_the_config_file_are_kept(monkeypatch, ports_set, tmp_path):
    configured = tmp_path / "processor.yaml"
    configured.write_text(yaml.safe_dump({"proof": {"keys": [{"id": "k", "file": "/k"}]}}))
    assert not stack.plan(configured).throwaway_key
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"workers": 1}))
    assert stack.plan(other).throwaway_key
    monkeypatch.setenv(stack.PROOF_VARIABLE, "{keys: []}")
    assert not stack.plan(None).throwaway_key


def test_the_throwaway_key_is_private_random_and_named_by_the_variable(tmp_path):
    value = stack.throwaway_proof(tmp_path)
    (key,) = yaml.safe_load(value)["keys"]
    path = Path(key["file"])
    assert key["id"] == stack.THROWAWAY_KEY_ID
    assert path.parent == tmp_path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = path.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", secret)
    other = tmp_path / "again"
    other.mkdir()
    assert Path(yaml.safe_load(stack.throwaway_proof(other))["keys"][0]["file"]).read_text() != (
        secret
    )


def test_the_printed_hand_off_is_four_lines_through_both_legs():
    lines = stack.handoff_lines(HostPort("127.0.0.1", 8080))
    assert len(lines) == 4
    assert "/pd/prefill/v1/chat/completions" in lines[0]
    assert '"return_token_ids": true' in lines[0]
    assert "/pd/v1/chat/completions" in lines[3]
    for line in lines:
        shlex.split(line)  # each one is complete shell


def test_check_ports_accepts_free_distinct_ports():
    ports = {name: HostPort("127.0.0.1", int(port)) for name, port in free_ports().items()}
    stack.check_ports(ports)


def test_free_ports_come_from_below_the_ephemeral_range_and_never_twice():
    start = processes._ephemeral_start()
    ports = [processes.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= port < start for port in ports)
    for port in ports[:5]:  # each can be listened on
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
            sock.listen()


def test_a_port_handed_out_once_is_not_handed_out_again(monkeypatch):
    start = processes._ephemeral_start()
    first = processes.free_port()
    # The same pick twice, then any other.
    again = itertools.chain([first, first], range(start - 1, 1024, -1))
    monkeypatch.setattr(processes.random, "randrange", lambda low, high: next(again))
    assert processes.free_port() != first
