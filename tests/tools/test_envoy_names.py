"""envoy_names: the names the generator writes are the names Envoy and the checker read."""

import yaml

from ext_proc.tools import envoy_names
from tests.tools.envoygen.configs import REPO


def _walk(node):
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        yield from _walk(child)


def test_the_shipped_config_spells_each_name():
    config = yaml.safe_load((REPO / "envoy" / "envoy.yaml").read_text())
    nodes = list(_walk(config))
    filters = {n.get("name") for n in nodes if isinstance(n, dict)}
    assert envoy_names.BUFFER_FILTER in filters
    types = {n.get("@type") for n in nodes if isinstance(n, dict)}
    assert f"type.googleapis.com/{envoy_names.PER_ROUTE_TYPE}" in types
    modes = [n["processing_mode"] for n in nodes if isinstance(n, dict) and "processing_mode" in n]
    assert any(
        all(mode.get(k) == v for k, v in envoy_names.MINT_RESPONSE.items()) for mode in modes
    )
