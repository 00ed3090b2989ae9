"""What the check reads of a bootstrap, and the places it names."""

import copy

import yaml

from ext_proc.tools.check_envoy import check, reader
from tests.tools.check_envoy.rules.test_tenant import COPY, REMOVE, guard, tenant_route
from tests.tools.check_envoy.shipped import (
    BUFFER,
    EXT_PROC,
    FILTER_CONFIG,
    PER_ROUTE,
    SHIPPED,
    at,
    filter_names,
    found,
    hcm,
)


def test_an_ext_proc_per_route_config_is_read_also_through_its_wrapper():
    read = reader.ext_proc_per_route
    config = {"@type": PER_ROUTE, "overrides": {}}
    assert read(config) is config
    assert read({"@type": FILTER_CONFIG, "config": config}) is config
    assert read({"@type": FILTER_CONFIG, "disabled": True}) == {
        "@type": PER_ROUTE,
        "disabled": True,
    }
    assert read({"@type": FILTER_CONFIG}) == {"@type": PER_ROUTE}
    assert read({"@type": "type.googleapis.com/x"}) is None
    assert read("not a mapping") is None


def test_the_shipped_chain():
    chain = reader.read_chain(0, hcm(SHIPPED), "ext_proc.token_policy")
    assert chain.place == "http_connection_manager[0]"
    assert chain.names == [EXT_PROC]
    assert chain.on_by_default == {EXT_PROC}
    assert chain.positions == {EXT_PROC: filter_names(SHIPPED).index(EXT_PROC)}
    assert [(h.name, h.position) for h in chain.holds] == [
        (BUFFER, filter_names(SHIPPED).index(BUFFER))
    ]


def test_the_shipped_routes_and_their_levels():
    chain = reader.read_chain(0, hcm(SHIPPED), "ext_proc.token_policy")
    (vhost,) = reader.virtual_hosts(chain)
    assert vhost.place == "http_connection_manager[0] virtual_host vllm"
    (prefill,) = [r for r in vhost.routes if r.entry["name"] == "prefill"]
    assert prefill.place == at("prefill")
    assert prefill.levels == [prefill.entry["typed_per_filter_config"], {}, {}]
    assert prefill.forwards


def test_a_route_without_a_name_is_placed_by_its_position():
    manager = {"route_config": {"virtual_hosts": [{"name": "v", "routes": [{"match": {}}]}]}}
    chain = reader.read_chain(0, manager, "ext_proc.token_policy")
    (vhost,) = reader.virtual_hosts(chain)
    assert [r.place for r in vhost.routes] == ["http_connection_manager[0] route v/#0"]


# Envoy reads YAML with yaml-cpp, whose booleans include y, Y, n and N (YAML 1.1's
# PyYAML reads them as strings): envoy 1.40 runs `failure_mode_allow: y` failing open
# and `failure_mode_allow: n` failing closed, and accepts `disabled: n` on a filter
# (which then runs). The check must read the document as Envoy does.
def test_a_writer_disabled_by_a_plain_n_still_runs(tmp_path):
    """A header_mutation after the guard copies the client's tenant back: Envoy runs it
    (``disabled: n`` is false to yaml-cpp)."""

    def change(config):
        copier = {**guard(COPY), "name": "copier", "disabled": "PLACEHOLDER"}
        tenant_route(guard(REMOVE), copier)(config)

    config = copy.deepcopy(SHIPPED)
    change(config)
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False).replace("PLACEHOLDER", "n"))
    assert found(check(reader.load(path))) == [("tenant-header-unguarded", at("aggregated"))]
