"""The command line's imports: serving never loads the Envoy config generator's optional
dependencies (the ``envoy-config`` extra), and ``envoy-config`` without them says which
extra to install. Each runs in a fresh interpreter, whose ``sys.modules`` is its own."""

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
        "import ext_proc.tools.check_envoy\n"
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
