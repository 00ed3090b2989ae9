"""The command line's imports: serving never loads the Envoy config generator's optional
dependencies (the ``envoy-config`` extra), and ``envoy-config`` without them says which
extra to install. Each runs in a fresh interpreter, whose ``sys.modules`` is its own.
``serve`` and ``check-config`` refuse what serving could not use, in one line."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ext_proc.__main__ import GENERATOR_EXTRA, GENERATOR_MODULES

REPO = Path(__file__).resolve().parents[1]
# What the extra brings, beyond what the generator imports itself.
EXTRA_MODULES = (*sorted(GENERATOR_MODULES), "grpclib", "h2", "ext_proc.tools.envoygen")


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_serving_imports_none_of_the_generators_dependencies():
    code = (
        "import sys\n"
        "import ext_proc.__main__, ext_proc.edge.server, ext_proc.edge.supervisor\n"
        "import ext_proc.tools.check_envoy, ext_proc.tools.preflight\n"
        f"print(sorted(m for m in sys.modules if m.startswith({EXTRA_MODULES!r})))\n"
    )
    result = python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


def test_the_check_sees_the_generators_dependencies_once_imported():
    """The check above would notice: importing the generator loads them."""
    code = (
        "import sys\n"
        "import ext_proc.tools.envoygen\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(GENERATOR_MODULES)!r}))\n"
    )
    result = python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{sorted(GENERATOR_MODULES)}\n"


# `python -m ext_proc envoy-config ...` with one of the extra's modules missing.
WITHOUT = """
import runpy, sys
sys.modules[sys.argv[1]] = None  # as if not installed: importing it raises
sys.argv = ["ext_proc", "envoy-config", "deploy/envoy-config.example.yaml"]
runpy.run_module("ext_proc", run_name="__main__")
"""


@pytest.mark.parametrize("missing", ["envoy_data_plane", "betterproto2"])
def test_envoy_config_without_the_extra_is_one_line_naming_it(missing):
    result = python(WITHOUT, missing)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert f"pip install '{GENERATOR_EXTRA}'" in result.stderr
    assert GENERATOR_EXTRA == "ext-proc-token-policy[envoy-config]"
    assert result.stderr.startswith("envoy-config: ")
    assert f"'{missing}'" in result.stderr


def test_any_other_missing_module_is_not_blamed_on_the_extra():
    result = python(WITHOUT, "ext_proc.tools.envoygen.cli")
    assert result.returncode == 1
    assert "Traceback" in result.stderr
    assert "ModuleNotFoundError" in result.stderr
    assert GENERATOR_EXTRA not in result.stderr


def run_main(*args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ext_proc", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, **environ},
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            (REPO / "envoy" / "envoy.yaml").read_text().replace("action: honor", "action: honr"),
            "metadata: field 'ext_proc.token_policy.action' is 'honr'; allowed values: ",
        ),
        ("{{{: [\n", "not YAML: expected the node content"),
    ],
    ids=["bad-action", "not-yaml"],
)
def test_serve_checks_the_envoy_config_it_serves_and_never_listens(tmp_path, text, said):
    envoy = tmp_path / "envoy.yaml"
    envoy.write_text(text)
    port = free_port()
    result = run_main(
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--metrics-listen",
        "",
        "--envoy-config",
        str(envoy),
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"ext_proc: {envoy}: ")
    assert said in result.stderr
    assert result.stderr.count("\n") == 1  # no traceback, no "serving" line
    assert "serving" not in result.stderr


def key_config(tmp_path: Path, content: str | None) -> Path:
    key = tmp_path / "k1"
    if content is not None:
        key.write_text(content)
    config = tmp_path / "config.yaml"
    config.write_text(f"proof: {{keys: [{{id: k1, file: {key}}}]}}\n")
    return config


@pytest.mark.parametrize(
    ("content", "said"),
    [(None, "cannot read proof key file"), ("short\n", "holds fewer than 32 bytes")],
    ids=["missing", "short"],
)
def test_check_config_reads_the_key_files_as_serve_does(tmp_path, content, said):
    config = key_config(tmp_path, content)
    checked = run_main("check-config", str(config))
    assert checked.returncode == 1
    assert checked.stdout == ""
    assert said in checked.stderr
    served = run_main(
        "serve",
        "--config",
        str(config),
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--metrics-listen",
        "",
    )
    assert served.returncode == 2
    assert said in served.stderr


def test_check_config_passes_key_files_serving_reads(tmp_path):
    config = key_config(tmp_path, "a" * 64)
    checked = run_main("check-config", str(config))
    assert (checked.returncode, checked.stdout) == (0, f"{config}: OK\n")


def record_config(tmp_path: Path, url: str) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(f'proof: {{record: "{url}", record_timeout_seconds: 0.2}}\n')
    return config


def test_check_config_refuses_a_record_url_that_names_no_redis(tmp_path):
    for url, said in [
        ("redis://:6379/0", "a redis:// URL names a host"),
        ("redis://ext-proc-redis:70000/0", "the port must be a number from 1 to 65535"),
    ]:
        config = record_config(tmp_path, url)
        checked = run_main("check-config", str(config))
        assert checked.returncode == 1
        assert checked.stdout == ""
        (line,) = checked.stderr.splitlines()
        assert line.startswith(f"{config}: ")
        assert said in line


def test_check_config_reaches_the_record_only_when_asked(tmp_path):
    """A Redis that does not answer is an outage serve starts through: check-config
    says the file is valid, and with --connect that the Redis does not answer."""
    config = record_config(tmp_path, f"redis://127.0.0.1:{free_port()}/0")
    checked = run_main("check-config", str(config))
    assert (checked.returncode, checked.stdout) == (0, f"{config}: OK\n")
    reached = run_main("check-config", "--connect", str(config))
    assert reached.returncode == 1
    assert reached.stdout == ""
    (line,) = reached.stderr.splitlines()
    assert line.startswith(f"{config}: proof.record: the Redis cannot be consulted (")
    own = tmp_path / "own.yaml"
    own.write_text("proof: {}\n")
    reached = run_main("check-config", "--connect", str(own))
    assert (reached.returncode, reached.stderr) == (0, "")
    assert (
        reached.stdout
        == f"{own}: OK; proof.record is the processor's own table: nothing to reach\n"
    )
