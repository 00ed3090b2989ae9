"""Every shipped envoy/*.yaml is its input's output (``make envoy-configs``)."""

from __future__ import annotations

from pathlib import Path

import yaml

from ext_proc.tools import envoygen
from tests.tools.envoygen.configs import INPUTS, REPO, example, generate


def test_every_shipped_config_has_an_input():
    shipped = {p.name for p in (REPO / "envoy").glob("*.yaml")}
    assert len(shipped) >= 7
    assert shipped == {p.name for p in INPUTS.glob("*.yaml")}


def test_shipped_configs_are_their_inputs_output(tmp_path, monkeypatch):
    # What `make envoy-configs` runs, from the repository root.
    monkeypatch.chdir(REPO)
    inputs = sorted(p.relative_to(REPO).as_posix() for p in INPUTS.glob("*.yaml"))
    assert envoygen.main([*inputs, "--output-dir", str(tmp_path)]) == 0
    names = [Path(name).name for name in inputs]
    stale = [n for n in names if (tmp_path / n).read_text() != (REPO / "envoy" / n).read_text()]
    assert stale == [], f"{stale} differ from their inputs: run `make envoy-configs`"


def test_example_reproduces_the_shipped_config():
    assert generate(example()) == yaml.safe_load((REPO / "envoy" / "envoy.yaml").read_text())
