"""check-envoy reads one spelling of what Envoy reads in several."""

import copy

import pytest
import yaml

from ext_proc.tools.check_envoy.spelling import ENUMS, canonical, proto_name
from ext_proc.tools.envoygen.output import core, ext_proc, hcm  # Envoy's protos, imported quietly
from tests.tools.check_envoy import shipped
from tests.tools.check_envoy.rules.test_after_decision import EPP, _declared
from tests.tools.check_envoy.rules.test_tenant import (
    APPEND,
    COPY,
    EMPTY,
    REMOVE,
    guard,
    tenant_route,
)
from tests.tools.check_envoy.shipped import (
    EXT_PROC,
    SHIPPED_CONFIGS,
    at,
    found,
    mutated,
    route,
)

PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"


@pytest.mark.parametrize(
    ("field", "enum"),
    [
        ("request_header_mode", ext_proc.ProcessingModeHeaderSendMode),
        ("response_header_mode", ext_proc.ProcessingModeHeaderSendMode),
        ("request_trailer_mode", ext_proc.ProcessingModeHeaderSendMode),
        ("response_trailer_mode", ext_proc.ProcessingModeHeaderSendMode),
        ("request_body_mode", ext_proc.ProcessingModeBodySendMode),
        ("response_body_mode", ext_proc.ProcessingModeBodySendMode),
        ("append_action", core.HeaderValueOptionHeaderAppendAction),
        ("path_with_escaped_slashes_action", hcm.HttpConnectionManagerPathWithEscapedSlashesAction),
        ("headers_with_underscores_action", core.HttpProtocolOptionsHeadersWithUnderscoresAction),
    ],
)
def test_each_enum_is_named_at_its_number_as_in_envoys_protos(field, enum):
    assert ENUMS[field] == tuple(member.name for member in sorted(enum, key=int))


@pytest.mark.parametrize(
    ("given", "name"),
    [
        ("processingMode", "processing_mode"),
        ("failureModeAllow", "failure_mode_allow"),
        ("http2ProtocolOptions", "http2_protocol_options"),
        ("processing_mode", "processing_mode"),
        ("@type", "@type"),
        ("envoy.filters.http.ext_proc", "envoy.filters.http.ext_proc"),
        ("X-Auth-Tenant", "X-Auth-Tenant"),
    ],
)
def test_a_json_name_reads_as_its_proto_name(given, name):
    assert proto_name(given) == name


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_is_already_in_the_one_spelling(path):
    config = yaml.safe_load(path.read_text())
    assert canonical(config) == (config, [])


def test_json_names_enum_numbers_and_typed_structs_read_as_the_fields_they_stand_for():
    given = {
        "typedPerFilterConfig": {
            "myFilter": {
                "@type": "type.googleapis.com/xds.type.v3.TypedStruct",
                "typeUrl": PER_ROUTE,
                "value": {"overrides": {"processingMode": {"requestHeaderMode": 2}}},
            }
        },
        "metadata": {"filterMetadata": {"ext_proc.token_policy": {"keepOtherKeys": True}}},
        "requestHeadersToAdd": [{"header": {"key": "k"}, "appendAction": 2}],
    }
    assert canonical(given) == (
        {
            "typed_per_filter_config": {
                "myFilter": {
                    "@type": PER_ROUTE,
                    "overrides": {"processing_mode": {"request_header_mode": "SKIP"}},
                }
            },
            # The policy metadata is the processor's to read, by its own keys.
            "metadata": {"filter_metadata": {"ext_proc.token_policy": {"keepOtherKeys": True}}},
            "request_headers_to_add": [
                {"header": {"key": "k"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
            ],
        },
        [],
    )


def test_a_field_given_both_ways_is_reported():
    config, twice = canonical({"a": [{"failure_mode_allow": False, "failureModeAllow": True}]})
    assert twice == [".a[0].failure_mode_allow"]
    assert config == {"a": [{"failure_mode_allow": True}]}


# Envoy parses enums case-insensitively (MessageUtil::loadFromJson sets
# case_insensitive_enum_parsing) and takes an enum's number given as a string: envoy
# 1.40 --mode validate accepts each of these as request_header_mode SKIP (and rejects
# "bogus" as an unknown enum value).
@pytest.mark.parametrize("skip", ["skip", "Skip", "2", " 2"])
def test_an_enum_in_another_case_or_as_a_numeric_string_reads_as_its_name(skip):
    def change(config):
        tenant_route(guard(REMOVE))(config)
        mode = route(config, "aggregated")["typed_per_filter_config"][EXT_PROC]["overrides"]
        mode["processing_mode"]["request_header_mode"] = skip

    assert found(mutated(change)) == [("tenant-headers-skipped", at("aggregated"))]


def test_an_enum_name_in_lower_case_reads_as_its_name():
    def change(config):
        shipped.hcm(config)["common_http_protocol_options"]["headers_with_underscores_action"] = (
            "allow"
        )

    assert "underscore-headers" in mutated(change).codes()


# Envoy takes a bool given as a JSON string ("false" is false): envoy 1.40 --mode validate
# accepts both configurations below. Python reads the string "false" as true.
def test_a_writer_disabled_by_the_string_false_still_runs():
    """A header_mutation after the guard copies the client's tenant back."""

    def change(config):
        copier = {**guard(COPY), "name": "copier", "disabled": "false"}
        tenant_route(guard(REMOVE), copier)(config)

    assert found(mutated(change)) == [("tenant-header-unguarded", at("aggregated"))]


def test_keep_empty_value_the_string_false_writes_no_empty_value():
    """The guard's last mutation overwrites with an empty value Envoy does not write:
    the client's appended copy stays."""
    empty = {"append": {**EMPTY["append"], "keep_empty_value": "false"}}

    def change(config):
        tenant_route(guard(APPEND, empty))(config)

    assert found(mutated(change)) == [("tenant-header-unguarded", at("aggregated"))]


# Envoy takes a type URL by the name after its last "/", whatever comes before it
# (protobuf's Any; Envoy's factory lookup, TypedStruct's type_url too): envoy 1.40
# accepts each configuration below and, run, forwards a request on a route whose
# ExtProcPerRoute is "example.com/...ExtProcPerRoute" {disabled: true} without calling
# its processor, through a connection manager typed "example.com/...HttpConnectionManager".
PER_ROUTE_NAME = PER_ROUTE.removeprefix("type.googleapis.com/")
HCM_TYPE = (
    "type.googleapis.com/"
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)


def _disabled_on_aggregated(typed):
    def change(config):
        route(config, "aggregated")["typed_per_filter_config"][EXT_PROC] = typed

    return change


@pytest.mark.parametrize(
    "typed",
    [
        {"@type": "example.com/" + PER_ROUTE_NAME, "disabled": True},
        {"@type": "a/b/" + PER_ROUTE_NAME, "disabled": True},
        {
            "@type": "type.googleapis.com/xds.type.v3.TypedStruct",
            "type_url": "example.com/" + PER_ROUTE_NAME,
            "value": {"disabled": True},
        },
        {
            "@type": "example.com/xds.type.v3.TypedStruct",
            "type_url": PER_ROUTE,
            "value": {"disabled": True},
        },
        {"@type": "example.com/envoy.config.route.v3.FilterConfig", "disabled": True},
    ],
    ids=["any", "any-two-slashes", "typed-struct-type-url", "typed-struct-itself", "wrapper"],
)
def test_a_type_url_reads_by_the_name_after_its_last_slash(typed):
    usual = found(mutated(_disabled_on_aggregated({"@type": PER_ROUTE, "disabled": True})))
    assert usual == [("ext-proc-not-running", at("aggregated"))]
    assert found(mutated(_disabled_on_aggregated(typed))) == usual


def _second_listener(hcm_type):
    def change(config):
        listeners = config["static_resources"]["listeners"]
        second = copy.deepcopy(listeners[0])
        second["name"] = "second"
        second["address"]["socket_address"]["port_value"] = 18099
        manager = second["filter_chains"][0]["filters"][0]["typed_config"]
        manager["@type"] = hcm_type
        manager["http_filters"] = [f for f in manager["http_filters"] if f["name"] != EXT_PROC]
        listeners.append(second)

    return change


def test_a_connection_manager_typed_under_another_host_is_checked():
    usual = found(mutated(_second_listener(HCM_TYPE)))
    assert ("ext-proc-missing", "http_connection_manager[1]") in usual
    other = "example.com/" + HCM_TYPE.removeprefix("type.googleapis.com/")
    assert found(mutated(_second_listener(other))) == usual


# Envoy takes a wrapper (google.protobuf.BoolValue...) also as its message, {"value": x},
# and a bool as a string: envoy 1.40 accepts a declared endpoint picker whose
# mutation_rules.disallow_system is {"value": false} or "false" (false: it may change
# :path after the decision).
@pytest.mark.parametrize("allowed", [{"value": False}, "false"], ids=["wrapper", "string"])
def test_a_wrapper_given_as_its_message_or_string_reads_as_its_value(allowed):
    def picker(disallow_system):
        entry = copy.deepcopy(EPP)
        entry["typed_config"]["mutation_rules"] = {"disallow_system": disallow_system}
        return found(_declared(entry, {"picker"}))

    assert picker(False) == [("declared-filter-unbounded", shipped.HCM)]
    assert picker(allowed) == picker(False)


def _cluster_retries(host):
    """The honor route's cluster retries on 5xx (its HttpProtocolOptions typed under
    ``host``): envoy 1.40 accepts both hosts."""
    options = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

    def change(config):
        (cluster,) = [
            c for c in config["static_resources"]["clusters"] if c["name"] == "disaggregated"
        ]
        cluster.setdefault("typed_extension_protocol_options", {})[options] = {
            "@type": f"{host}/{options}",
            "explicit_http_config": {"http_protocol_options": {}},
            "retry_policy": {"retry_on": "5xx", "num_retries": 1},
        }

    return change


def test_cluster_options_typed_under_another_host_are_read():
    usual = found(mutated(_cluster_retries("type.googleapis.com")))
    assert usual == [("body-retried", f"{at('disaggregated')} cluster 'disaggregated'")]
    assert found(mutated(_cluster_retries("example.com"))) == usual


# Envoy reads a field given as null as not given (protobuf's JSON mapping): envoy 1.40
# accepts both configurations below. The check raises (a refusal, not a pass).
def _nulled(holder, key):
    def change(config):
        holder(config)[key] = None

    return change


def _deleted(holder, key):
    def change(config):
        del holder(config)[key]

    return change


@pytest.mark.parametrize(
    ("holder", "key"),
    [
        (shipped.ext_proc, "processing_mode"),
        (lambda config: route(config, "aggregated"), "typed_per_filter_config"),
    ],
    ids=["processing_mode", "typed_per_filter_config"],
)
def test_a_field_given_as_null_reads_as_not_given(holder, key):
    assert found(mutated(_nulled(holder, key))) == found(mutated(_deleted(holder, key)))
