"""The shipped envoy/*.yaml: each has an input, and the documented example is the default
config (that each committed file is its input's output: tests/test_generated.py)."""

from __future__ import annotations

import yaml

from ext_proc.tools.envoy_names import RETRY_AFTER_FORMAT
from tests.tools.envoygen.configs import INPUTS, REPO, example, generate


def test_every_shipped_config_has_an_input():
    shipped = {p.name for p in (REPO / "envoy").glob("*.yaml")}
    assert len(shipped) >= 7
    assert shipped == {p.name for p in INPUTS.glob("*.yaml")}


def test_example_reproduces_the_shipped_config():
    assert generate(example()) == yaml.safe_load((REPO / "envoy" / "envoy.yaml").read_text())


def _retry_after_values(node: object) -> list[str]:
    if isinstance(node, dict):
        header = node.get("header")
        own = (
            [header["value"]]
            if isinstance(header, dict) and header.get("key") == "retry-after"
            else []
        )
        return own + [v for item in node.values() for v in _retry_after_values(item)]
    if isinstance(node, list):
        return [v for item in node for v in _retry_after_values(item)]
    return []


def test_the_gateway_wiring_states_the_retry_condition_envoy_config_writes():
    # Written by hand there (deploy/istio, deploy/envoy-gateway), the same text as the
    # local reply mapper's condition here: a change to one must reach the others.
    for name in ("istio/envoyfilter.yaml", "envoy-gateway/patch-policy.yaml"):
        documents = list(yaml.safe_load_all((REPO / "deploy" / name).read_text()))
        assert _retry_after_values(documents) == [RETRY_AFTER_FORMAT], name
    # llm-d's standalone router: the Envoy bootstrap is a string of its values.
    text = (REPO / "deploy" / "llm-d" / "standalone" / "values.yaml").read_text()
    assert text.count("key: retry-after") == 1
    assert f'value: "{RETRY_AFTER_FORMAT}"' in text
