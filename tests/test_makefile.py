"""The Makefile's targets whose output is a file's content print nothing else, and
`make test` runs every test tier."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_make_envoy_config_prints_only_the_yaml() -> None:
    # `-o` takes the virtual environment as made; PY runs this interpreter.
    make = ["make", "--no-print-directory", "-o", ".venv/.installed"]
    made = subprocess.run(
        [*make, "envoy-config", f"PY={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    direct = subprocess.run(
        [sys.executable, "-m", "ext_proc", "envoy-config", "deploy/envoy-config.example.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert made.stdout == direct.stdout
    assert "static_resources" in yaml.safe_load(made.stdout)


def test_make_test_runs_every_tier() -> None:
    with (ROOT / "pyproject.toml").open("rb") as file:
        markers = tomllib.load(file)["tool"]["pytest"]["ini_options"]["markers"]
    tiers = {line.split(":", 1)[0] for line in markers}
    planned = subprocess.run(
        ["make", "--no-print-directory", "-n", "-o", ".venv/.installed", "test"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    run = {tier for tier in tiers if f"-m pytest -m {tier} " in planned}
    assert run == tiers
