"""The version: stated once, in pyproject.toml, read from the installed metadata, and
printed by ``--version`` of every command line (each in a fresh interpreter)."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ext_proc.version import version

REPO = Path(__file__).resolve().parents[1]
COMMANDS = [
    ("ext_proc",),
    ("ext_proc", "serve"),
    ("ext_proc", "check-config"),
    ("ext_proc", "check-envoy"),
    # Its own parser needs the optional extra; --version does not.
    ("ext_proc", "envoy-config"),
    ("devstack",),
    ("bench",),
]


def test_the_version_is_pyprojects():
    stated = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert version() == stated


def test_no_module_states_a_version_of_its_own():
    """pyproject.toml is the one source: no ``__version__`` copy to fall behind."""
    assert not [
        path
        for path in (REPO / "ext_proc").rglob("*.py")
        if "_pb" not in path.parts and "__version__ =" in path.read_text()
    ]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_prints_its_name_and_the_version(command):
    module, *sub = command
    done = subprocess.run(
        [sys.executable, "-m", module, *sub, "--version"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"python -m {' '.join(command)} {version()}\n"
