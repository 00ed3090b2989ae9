"""The wheel alone: built from the sources the image copies, installed with its declared
dependencies into a fresh virtual environment and run from outside the checkout; once
as the image installs it (no extras: it serves, and ``envoy-config`` names the extra it
needs), once with the ``envoy-config`` extra (the generator runs)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack import processes
from ext_proc.tools import envoygen
from tests.test_layers import commanded

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)


def run(
    args: list[str | Path], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def clean_env() -> dict[str, str]:
    """This environment without anything that would point Python at the checkout."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSAFEPATH"}
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # what deploy/Dockerfile copies, nothing else
    source.mkdir()
    shutil.copy2(REPO / "pyproject.toml", source)
    shutil.copy2(REPO / "README.md", source)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "ext_proc", source / "ext_proc", ignore=ignore)
    built = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", root / "dist", source], root
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (root / "dist").glob("*.whl")
    return wheel


def test_the_wheel_holds_the_modules_the_commands_run(wheel):
    # Production runs the wheel: its modules are the ones `python -m ext_proc` imports,
    # with no maintainer's tool (the engines' inventory lives in devstack/).
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    modules = {name for name in names if name.endswith(".py")}
    assert modules == {path.relative_to(REPO).as_posix() for path in commanded()}
    assert not [name for name in names if "inventory" in name]
    assert "ext_proc/core/declared.json" in names


def install(root: Path, requirement: str) -> Path:
    """The interpreter of a fresh virtual environment in ``root`` holding only
    ``requirement`` and its declared dependencies (no bytecode: imports compile it)."""
    created = run([sys.executable, "-m", "venv", "--without-pip", root / "venv"], root)
    assert created.returncode == 0, created.stderr
    python = root / "venv" / "bin" / "python"
    # This interpreter's pip installs into the new environment: no pip to bootstrap there.
    args = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet"]
    installed = run([*args, "--no-compile", requirement], root)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return python


@pytest.fixture(scope="module")
def python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel as deploy/Dockerfile installs it: without extras."""
    return install(tmp_path_factory.mktemp("plain"), str(wheel))


@pytest.fixture(scope="module")
def generator_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel with the ``envoy-config`` extra (the Envoy config generator's models)."""
    return install(tmp_path_factory.mktemp("generator"), f"{wheel}[envoy-config]")


def test_the_package_comes_from_the_wheel(python, tmp_path):
    found = run([python, "-c", "import ext_proc; print(ext_proc.__file__)"], tmp_path)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).is_relative_to(python.parents[1])
    assert "include-system-site-packages = false" in (python.parents[1] / "pyvenv.cfg").read_text()


DEVELOPMENT = ["h11", "devstack", "bench", "pytest", "httpx"]
# Only the envoy-config extra brings these (grpclib and h2: envoy-data-plane's betterproto2[all]).
GENERATOR = ["envoy_data_plane", "betterproto2", "grpclib", "h2"]


@pytest.mark.parametrize("module", [*DEVELOPMENT, *GENERATOR])
def test_development_and_generator_modules_are_not_installed(python, tmp_path, module):
    result = run([python, "-c", f"import {module}"], tmp_path)
    assert result.returncode == 1
    assert f"No module named '{module}'" in result.stderr


def test_serve_answers_health_checks_and_stops_on_sigterm(python, tmp_path):
    port = processes.free_port()
    args = [str(python), "-m", "ext_proc", "serve", "--listen", f"127.0.0.1:{port}"]
    args += ["--metrics-listen", ""]
    env = {**clean_env(), "EXT_PROC_DRAIN_SECONDS": "0"}
    log = tmp_path / "serve.log"
    server = processes.start(args, log, cwd=tmp_path, env=env)
    try:
        processes.wait_for_port(port, server)
        status = None
        deadline = time.monotonic() + 20
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while status != health_pb2.HealthCheckResponse.SERVING:
                assert time.monotonic() < deadline, f"health: {status}; {log.read_text()}"
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                status = reply.status
                time.sleep(0.05)
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0, log.read_text()
    finally:
        processes.stop(server)
    assert "Traceback" not in log.read_text()


def _without_envoy() -> dict[str, str]:
    """This environment with no directory on PATH that holds an ``envoy``: the image's."""
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    kept = [d for d in dirs if d and not (Path(d) / "envoy").exists()]
    return {**clean_env(), "PATH": os.pathsep.join(kept)}


def test_check_envoy_and_check_config_run_without_the_extra(python, tmp_path):
    shipped = REPO / "envoy" / "envoy.yaml"
    checked = run([python, "-m", "ext_proc", "check-envoy", shipped], tmp_path, _without_envoy())
    # No envoy beside the wheel's Python nor on PATH: Envoy's validation did not run,
    # and the check says so and fails unless told to skip it.
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert checked.stdout.startswith("error[envoy-validate-not-run]: ")
    assert checked.stdout.endswith("; envoy --mode validate did not run)\n")
    skipped = [python, "-m", "ext_proc", "check-envoy", "--no-envoy-validate", shipped]
    checked = run(skipped, tmp_path, _without_envoy())
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.endswith("; envoy --mode validate skipped (--no-envoy-validate))\n")
    config = tmp_path / "processor.yaml"
    config.write_text("log_level: info\n")
    checked = run([python, "-m", "ext_proc", "check-config", config], tmp_path)
    assert (checked.returncode, checked.stdout) == (0, f"{config}: OK\n")


EXAMPLE = REPO / "deploy" / "envoy-config.example.yaml"


def test_envoy_config_without_the_extra_names_it_in_one_line(python, tmp_path):
    out = tmp_path / "envoy.yaml"
    generated = run([python, "-m", "ext_proc", "envoy-config", EXAMPLE, "-o", out], tmp_path)
    assert generated.returncode == 2, generated.stdout + generated.stderr
    assert generated.stdout == ""
    (line,) = generated.stderr.splitlines()
    assert line.startswith("envoy-config: ")
    assert line.endswith("pip install 'ext-proc-token-policy[envoy-config]'")
    assert not out.exists()


def test_envoy_config_runs_with_the_extra(generator_python, tmp_path):
    out = tmp_path / "envoy.yaml"
    generated = run(
        [generator_python, "-m", "ext_proc", "envoy-config", EXAMPLE, "-o", out], tmp_path
    )
    assert generated.returncode == 0, generated.stdout + generated.stderr
    # What the checkout's generator writes from the same input.
    assert out.read_text() == envoygen.generate(EXAMPLE)
    assert "static_resources" in out.read_text()
