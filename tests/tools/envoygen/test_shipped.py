"""The shipped envoy/*.yaml: each has an input, and the documented example is the default
config (that each committed file is its input's output: tests/test_generated.py)."""

from __future__ import annotations

import yaml

from tests.tools.envoygen.configs import INPUTS, REPO, example, generate


def test_every_shipped_config_has_an_input():
    shipped = {p.name for p in (REPO / "envoy").glob("*.yaml")}
    assert len(shipped) >= 7
    assert shipped == {p.name for p in INPUTS.glob("*.yaml")}


def test_example_reproduces_the_shipped_config():
    assert generate(example()) == yaml.safe_load((REPO / "envoy" / "envoy.yaml").read_text())
