"""The closed world: every field of the Envoy messages the check walks (generated from
envoy-data-plane) is classified once, and on a listener that carries a policed route a
refused field, an unclassified one or a key that is no field at all is an error."""

import copy
import dataclasses

import pytest

from ext_proc.tools.check_envoy import check
from ext_proc.tools.check_envoy.coverage import WALKED, coverage, table, unclassified
from ext_proc.tools.check_envoy.field_classes import BY_MESSAGE, CLASSES
from ext_proc.tools.check_envoy.spelling import canonical
from tests.tools.check_envoy.shipped import EXT_PROC, SHIPPED, found, hcm, mutated, route

LISTENER = "envoy.config.listener.v3.Listener"
# The place of the shipped listener, and of its connection manager within it.
GATEWAY = "listener " + SHIPPED["static_resources"]["listeners"][0]["name"]
MANAGER = f"{GATEWAY}.filter_chains[0].filters[0].typed_config"


def test_every_field_of_the_table_has_exactly_one_class():
    assert set(table().messages) == set(WALKED)
    assert unclassified(table(), CLASSES) == []
    # One class per (message, field): the classification is keyed by message, then field.
    assert len(CLASSES) == sum(len(fields) for fields in BY_MESSAGE.values())
    assert {c.kind for c in CLASSES.values()} == {"read", "refused", "harmless"}
    assert all(c.reason for c in CLASSES.values())


def test_the_table_names_its_source():
    assert table().source.startswith("envoy-data-plane ")


def with_field(message, field):
    """A copy of the generated table in which ``message`` has one more field, as a new
    Envoy release's would."""
    given = table()
    messages = {m: dict(fields) for m, fields in given.messages.items()}
    messages[message][field] = "bool"
    return dataclasses.replace(given, messages=messages)


def test_a_field_the_classification_does_not_know_fails():
    newer = with_field(LISTENER, "reroute_everything")
    assert unclassified(newer, CLASSES) == [f"{LISTENER}.reroute_everything"]


def test_a_field_the_classification_does_not_know_is_an_error_where_it_is_set():
    newer = with_field(LISTENER, "reroute_everything")
    config = copy.deepcopy(SHIPPED)
    config["static_resources"]["listeners"][0]["reroute_everything"] = True
    config, _ = canonical(config)
    findings = list(coverage(config, "ext_proc.token_policy", given=newer))
    assert [(f.code, f.place) for f in findings] == [
        ("field-unclassified", f"{GATEWAY}.reroute_everything")
    ]
    # Unset, it changes nothing.
    assert list(coverage(canonical(SHIPPED)[0], "ext_proc.token_policy", given=newer)) == []


def test_a_field_removed_from_the_schema_fails_too():
    given = table()
    messages = {m: dict(fields) for m, fields in given.messages.items()}
    del messages[LISTENER]["freebind"]
    older = dataclasses.replace(given, messages=messages)
    assert unclassified(older, CLASSES) == [f"{LISTENER}.freebind"]


def test_the_shipped_config_uses_no_refused_field():
    assert list(coverage(canonical(SHIPPED)[0], "ext_proc.token_policy")) == []


def rewrite_honor_path(config):
    route(config, "disaggregated")["route"]["path_rewrite"] = "/v1/completions"


def upstream_filters(config):
    (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "disaggregated"]
    cluster["filters"] = [{"name": "envoy.filters.network.ratelimit"}]


def optional_filter(config):
    hcm(config)["http_filters"][0]["is_optional"] = True


def early_mutation(config):
    hcm(config)["early_header_mutation_extensions"] = [{"name": "rewrite"}]


def async_processor(config):
    route(config, "prefill")["typed_per_filter_config"][EXT_PROC]["overrides"]["async_mode"] = True


# Where a route's place in the walk starts.
ROUTES = f"{MANAGER}.route_config.virtual_hosts[0].routes"


def _index(name):
    return [
        r.get("name") for r in hcm(SHIPPED)["route_config"]["virtual_hosts"][0]["routes"]
    ].index(name)


@pytest.mark.parametrize(
    ("change", "place"),
    [
        (rewrite_honor_path, f"{ROUTES}[{_index('disaggregated')}].route.path_rewrite"),
        (upstream_filters, "cluster disaggregated.filters"),
        (optional_filter, f"{MANAGER}.http_filters[0].is_optional"),
        (early_mutation, f"{MANAGER}.early_header_mutation_extensions"),
        (
            async_processor,
            f"{ROUTES}[{_index('prefill')}].typed_per_filter_config"
            f"[{EXT_PROC!r}].overrides.async_mode",
        ),
    ],
    ids=lambda x: getattr(x, "__name__", None),
)
def test_a_refused_field_on_a_policed_listener_is_an_error(change, place):
    assert ("field-refused", place) in found(mutated(change))


def test_a_key_that_is_no_field_is_an_error():
    def change(config):
        route(config, "disaggregated")["route"]["clusterr"] = "other"

    place = f"{ROUTES}[{_index('disaggregated')}].route.clusterr"
    assert ("field-unknown", place) in found(mutated(change))


def test_a_json_name_is_read_as_the_field():
    def change(config):
        route(config, "disaggregated")["route"]["pathRewrite"] = "/v1/completions"

    place = f"{ROUTES}[{_index('disaggregated')}].route.path_rewrite"
    assert ("field-refused", place) in found(mutated(change))


def test_a_listener_without_a_policed_route_is_not_walked():
    config = copy.deepcopy(SHIPPED)
    admin = {
        "name": "admin",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 9902}},
        "use_original_dst": True,
        "filter_chains": [{"filters": [{"name": "tcp", "typed_config": {}}]}],
    }
    config["static_resources"]["listeners"].append(admin)
    assert list(coverage(canonical(config)[0], "ext_proc.token_policy")) == []
    # The same field on the policed listener is refused.
    config["static_resources"]["listeners"][0]["use_original_dst"] = True
    assert [f.place for f in coverage(canonical(config)[0], "ext_proc.token_policy")] == [
        f"{GATEWAY}.use_original_dst"
    ]


def test_a_cluster_no_policed_route_reaches_is_not_walked():
    config = copy.deepcopy(SHIPPED)
    config["static_resources"]["clusters"].append(
        {"name": "elsewhere", "upstream_config": {"name": "tcp"}}
    )
    assert list(coverage(canonical(config)[0], "ext_proc.token_policy")) == []


def test_another_services_ext_proc_configuration_is_not_walked():
    def change(config):
        chain = hcm(config)["http_filters"]
        ours = chain[[f["name"] for f in chain].index(EXT_PROC)]
        other = copy.deepcopy(ours)
        other["name"] = "picker"
        other["typed_config"]["request_attributes"] = []
        other["typed_config"]["forward_rules"] = {"allowed_headers": {"patterns": []}}
        chain.insert(chain.index(ours) + 1, other)

    codes = [(code, place) for code, place in found(mutated(change)) if code.startswith("field-")]
    assert codes == []


@pytest.mark.parametrize(
    ("layer", "refused"),
    [
        ({"name": "base", "static_layer": {"re2.max_program_size.error_level": 10}}, False),
        ({"name": "base", "static_layer": {"re2": {"max_program_size": {"warn_level": 1}}}}, False),
        ({"name": "base", "static_layer": {"envoy.reloadable_features.x": False}}, True),
        ({"name": "disk", "disk_layer": {"symlink_root": "/srv/runtime"}}, True),
        ({"name": "rtds", "rtds_layer": {"name": "rtds"}}, True),
    ],
)
def test_the_runtime_holds_known_keys_only(layer, refused):
    def change(config):
        config["layered_runtime"]["layers"].insert(0, layer)

    codes = [code for code, _ in found(mutated(change))]
    assert ("field-refused" in codes) is refused


def test_a_document_that_is_a_listener_alone_is_walked():
    listener = copy.deepcopy(SHIPPED["static_resources"]["listeners"][0])
    listener["use_original_dst"] = True
    assert found(check(listener)) == [("field-refused", f"{GATEWAY}.use_original_dst")]
