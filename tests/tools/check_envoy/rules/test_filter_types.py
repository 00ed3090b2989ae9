"""Every HTTP filter of a policed chain is of a type in the table, and a per-route
configuration sets only what the table allows its filter's type; the table names real
Envoy 1.40 messages and fields (envoy-data-plane's)."""

import dataclasses
import importlib
import warnings

import pytest
from envoy_data_plane.message_pool import default_message_pool

from ext_proc.tools.check_envoy.rules.filter_types import (
    EVERY,
    KEEPS_THE_REQUEST,
    REFUSED,
    TABLE,
    WRITES_NO_HEADER,
)
from tests.tools.check_envoy.shipped import (
    BUFFER,
    BUFFER_PER_ROUTE,
    EXT_PROC,
    FILTER_CONFIG,
    HCM,
    PER_ROUTE,
    at,
    clean,
    found,
    hcm,
    mutated,
    route,
)

_TYPES = "type.googleapis.com/"
_T = _TYPES + "envoy.extensions.filters.http."
ROUTER = "envoy.filters.http.router"
HONOR = at("disaggregated")


def _class(url):
    """The envoy-data-plane class of a type URL (its package imported first)."""
    name = url.removeprefix(_TYPES)
    module = ".".join(part for part in name.split(".") if part[:1].islower())
    with warnings.catch_warnings():
        # Some generated modules use validators pydantic deprecates.
        warnings.simplefilter("ignore", DeprecationWarning)
        importlib.import_module(f"envoy_data_plane.{module}")
    by_url = {u: cls for cls, u in default_message_pool.type_to_url.items()}
    return by_url[url]


def _has_path(cls, path):
    for part in path.split("."):
        names = {f.name for f in dataclasses.fields(cls)}
        assert part in names, (cls.__name__, path)
        cls = cls._betterproto.cls_by_field.get(part)
    return True


def test_the_table_names_envoys_messages_and_fields():
    for url, kind in TABLE.items():
        assert kind.reason, url
        _class(url)
        for per_route, allowed in kind.per_route.items():
            cls = _class(per_route)
            for path in allowed - EVERY:
                assert _has_path(cls, path)
    for url in REFUSED:
        _class(url)


def test_what_keeps_the_request_and_writes_no_header_is_read_from_the_table():
    assert {url.removeprefix(_T) for url in KEEPS_THE_REQUEST} == {
        "router.v3.Router",
        "upstream_codec.v3.UpstreamCodec",
        "buffer.v3.Buffer",
        "cors.v3.Cors",
        "rbac.v3.RBAC",
        "fault.v3.HTTPFault",
        "health_check.v3.HealthCheck",
    }
    assert KEEPS_THE_REQUEST | {_T + "decompressor.v3.Decompressor"} == WRITES_NO_HEADER


UNKNOWN = {
    "wasm": {"name": "wasm", "typed_config": {"@type": _T + "wasm.v3.Wasm"}},
    "composite": {"name": "composite", "typed_config": {"@type": _T + "composite.v3.Composite"}},
    "on_demand": {"name": "odcds", "typed_config": {"@type": _T + "on_demand.v3.OnDemand"}},
    "ecds": {"name": "discovered", "config_discovery": {"config_source": {"ads": {}}}},
    "grpc_json_transcoder": {
        "name": "transcoder",
        "typed_config": {"@type": _T + "grpc_json_transcoder.v3.GrpcJsonTranscoder"},
    },
    "typed-struct-of-unknown": {
        "name": "packed",
        "typed_config": {
            "@type": "type.googleapis.com/xds.type.v3.TypedStruct",
            "type_url": "type.googleapis.com/example.filters.Mystery",
            "value": {},
        },
    },
}


def first(entry):
    def change(config):
        hcm(config)["http_filters"].insert(0, entry)

    return change


@pytest.mark.parametrize("kind", list(UNKNOWN))
def test_a_filter_of_an_unknown_type_before_the_processor_is_an_error(kind):
    assert found(mutated(first(UNKNOWN[kind]))) == [("filter-type-unknown", HCM)]


def test_a_filter_of_an_unknown_type_after_the_processor_is_an_error_too():
    def change(config):
        filters = hcm(config)["http_filters"]
        filters.insert(len(filters) - 1, UNKNOWN["wasm"])

    assert ("filter-type-unknown", HCM) in found(mutated(change))


def test_an_upstream_filter_of_an_unknown_type_is_an_error():
    def change(config):
        router = hcm(config)["http_filters"][-1]["typed_config"]
        router["upstream_http_filters"] = [
            UNKNOWN["wasm"],
            {"name": "codec", "typed_config": {"@type": _T + "upstream_codec.v3.UpstreamCodec"}},
        ]

    assert ("filter-type-unknown", f"{HCM} filter {ROUTER}") in found(mutated(change))


def test_a_known_filter_before_the_processor_passes():
    rbac = {"name": "rbac", "typed_config": {"@type": _T + "rbac.v3.RBAC"}}
    assert clean(mutated(first(rbac)))


# --- per-route configurations --------------------------------------------------------------


def on_honor(name, config):
    def change(config_, name=name, given=config):
        route(config_, "disaggregated").setdefault("typed_per_filter_config", {})[name] = given

    return change


def overrides(**fields):
    return {"@type": PER_ROUTE, "overrides": fields}


LOCAL_RATELIMIT = {
    "name": "limit",
    "typed_config": {"@type": _T + "local_ratelimit.v3.LocalRateLimit", "stat_prefix": "x"},
}


def with_limit(name, given):
    def change(config):
        first(dict(LOCAL_RATELIMIT))(config)
        on_honor(name, given)(config)

    return change


REFUSED_PER_ROUTE = {
    "ext-proc-async": (on_honor(EXT_PROC, overrides(async_mode=True)), "overrides.async_mode"),
    "ext-proc-attributes": (
        on_honor(EXT_PROC, overrides(request_attributes=["xds.route_name"])),
        "overrides.request_attributes",
    ),
    "ext-proc-modifier": (
        on_honor(
            EXT_PROC,
            overrides(processing_request_modifier={"name": "m", "typed_config": {}}),
        ),
        "overrides.processing_request_modifier",
    ),
    "wrapped-ext-proc-async": (
        on_honor(
            EXT_PROC,
            {"@type": FILTER_CONFIG, "config": overrides(async_mode=True)},
        ),
        "overrides.async_mode",
    ),
    "buffer-given-another-type": (
        on_honor(
            BUFFER,
            {"@type": _T + "header_mutation.v3.HeaderMutationPerRoute", "mutations": {}},
        ),
        "HeaderMutationPerRoute, which the filter does not read",
    ),
    "local-ratelimit-adds-headers": (
        with_limit(
            "limit",
            {
                **LOCAL_RATELIMIT["typed_config"],
                "request_headers_to_add_when_not_enforced": [
                    {"header": {"key": "x-envoy-max-retries", "value": "1"}}
                ],
            },
        ),
        "request_headers_to_add_when_not_enforced",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED_PER_ROUTE))
def test_a_per_route_field_the_table_does_not_allow_is_an_error(case):
    change, named = REFUSED_PER_ROUTE[case]
    report = mutated(change)
    name = "limit" if case.startswith("local") else EXT_PROC
    name = BUFFER if case.startswith("buffer") else name
    # The field table may refuse an ExtProcPerRoute field as well (coverage).
    assert ("per-route-field-refused", f"{HONOR} {name}") in found(report)
    (finding,) = [f for f in report.findings if f.code == "per-route-field-refused"]
    assert named in finding.message


ALLOWED_PER_ROUTE = {
    "ext-proc-metadata-options": on_honor(
        EXT_PROC, overrides(metadata_options={"receiving_namespaces": {"untyped": ["x"]}})
    ),
    "ext-proc-initial-metadata": on_honor(
        EXT_PROC, overrides(grpc_initial_metadata=[{"key": "k", "value": "v"}])
    ),
    "wrapped-ext-proc-metadata-options": on_honor(
        EXT_PROC,
        {
            "@type": FILTER_CONFIG,
            "config": overrides(metadata_options={"receiving_namespaces": {"untyped": ["x"]}}),
        },
    ),
    "buffer-limit": on_honor(
        BUFFER, {"@type": BUFFER_PER_ROUTE, "buffer": {"max_request_bytes": 16777216}}
    ),
    "local-ratelimit-limit": with_limit(
        "limit",
        {
            **LOCAL_RATELIMIT["typed_config"],
            "token_bucket": {"max_tokens": 5, "fill_interval": "1s"},
        },
    ),
}


@pytest.mark.parametrize("case", list(ALLOWED_PER_ROUTE))
def test_a_per_route_field_the_table_allows_passes(case):
    assert clean(mutated(ALLOWED_PER_ROUTE[case]))
