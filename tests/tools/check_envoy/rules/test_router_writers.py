"""Nothing after the header step's removal of the router's retry headers writes one back,
on a connection manager with a mint or honor route: each way a filter or a route's
configuration of one could (the header step itself, a second header_mutation, a Lua
script, a route's header_mutation, ext_authz, ext_proc, local_ratelimit) is refused
there and passes before the step."""

import copy

import pytest
import yaml

from ext_proc.tools.check_envoy import check
from tests.tools.check_envoy.shipped import (
    EXT_PROC,
    HCM,
    SHIPPED,
    SHIPPED_DIR,
    clean,
    ext_proc_index,
    found,
    hcm,
    mutated,
    route,
    without,
)

_T = "type.googleapis.com/envoy.extensions.filters.http."
STEP = "envoy.filters.http.header_mutation"
MUTATION = _T + "header_mutation.v3.HeaderMutation"
MUTATION_PER_ROUTE = _T + "header_mutation.v3.HeaderMutationPerRoute"
FILTER_CONFIG = "type.googleapis.com/envoy.config.route.v3.FilterConfig"
# Spelt out here, not taken from the checker: the router's documentation, a third opinion.
ROUTER_HEADERS = [
    "x-envoy-retry-on",
    "x-envoy-retry-grpc-on",
    "x-envoy-max-retries",
    "x-envoy-retriable-status-codes",
    "x-envoy-retriable-header-names",
    "x-envoy-upstream-rq-per-try-timeout-ms",
    "x-envoy-hedge-on-per-try-timeout",
]


def sets(key, value):
    return {"append": {"header": {"key": key, "value": value}}}


def header_mutation(name, *mutations):
    return {
        "name": name,
        "typed_config": {"@type": MUTATION, "mutations": {"request_mutations": list(mutations)}},
    }


LUA = {
    "name": "lua",
    "typed_config": {
        "@type": _T + "lua.v3.Lua",
        "default_source_code": {
            "inline_string": (
                "function envoy_on_request(h) h:headers():replace('x-envoy-retry-on', '5xx') end"
            )
        },
    },
}
# One of each kind of filter that can write a router header.
WRITERS = {
    "lua": LUA,
    "wasm": {"name": "wasm", "typed_config": {"@type": _T + "wasm.v3.Wasm"}},
    "copies-a-client-header": header_mutation("copy", sets("x-envoy-retry-on", "%REQ(x-retry)%")),
    "sets-a-constant": header_mutation("constant", sets("x-envoy-max-retries", "3")),
    "ext_authz-unchecked": {
        "name": "authz",
        "typed_config": {"@type": _T + "ext_authz.v3.ExtAuthz"},
    },
    "ext_authz-envoy-allowed": {
        "name": "authz",
        "typed_config": {
            "@type": _T + "ext_authz.v3.ExtAuthz",
            "decoder_header_mutation_rules": {"allow_envoy": True},
        },
    },
    "ext_authz-expression-allowed": {
        "name": "authz",
        "typed_config": {
            "@type": _T + "ext_authz.v3.ExtAuthz",
            "decoder_header_mutation_rules": {"allow_expression": {"regex": "x-envoy-.*"}},
        },
    },
    "local_ratelimit": {
        "name": "limit",
        "typed_config": {
            "@type": _T + "local_ratelimit.v3.LocalRateLimit",
            "stat_prefix": "x",
            "request_headers_to_add_when_not_enforced": [
                {"header": {"key": "X-Envoy-Retry-On", "value": "5xx"}}
            ],
        },
    },
    "ecds": {"name": "discovered", "config_discovery": {"config_source": {"ads": {}}}},
}
# Filters after the step that write no router header.
QUIET = {
    "ext_authz-checked": {
        "name": "authz",
        "typed_config": {
            "@type": _T + "ext_authz.v3.ExtAuthz",
            "decoder_header_mutation_rules": {},
        },
    },
    "decompressor": {
        "name": "gunzip",
        "typed_config": {"@type": _T + "decompressor.v3.Decompressor"},
    },
    "rbac": {"name": "rbac", "typed_config": {"@type": _T + "rbac.v3.RBAC"}},
    "other-header": header_mutation("picker", sets("x-gateway-destination-endpoint", "a")),
    "removes-one": header_mutation("trim", {"remove": "x-envoy-retry-on"}),
}


def before_processor(entry):
    """An edit: ``entry`` right before this processor's filter (after the header step)."""

    def change(config):
        hcm(config)["http_filters"].insert(ext_proc_index(config), copy.deepcopy(entry))

    return change


def first(entry):
    """An edit: ``entry`` first in the chain, before the header step."""

    def change(config):
        hcm(config)["http_filters"].insert(0, copy.deepcopy(entry))

    return change


def writer(name):
    return [("router-header-writer", f"{HCM} filter {name}")]


@pytest.mark.parametrize("kind", list(WRITERS))
def test_a_filter_after_the_header_step_that_can_write_a_router_header_is_an_error(kind):
    assert found(mutated(before_processor(WRITERS[kind]))) == writer(WRITERS[kind]["name"])


@pytest.mark.parametrize("kind", list(WRITERS))
def test_the_same_filter_before_the_header_step_passes(kind):
    # The step removes every router header after it ran.
    assert clean(mutated(first(WRITERS[kind])))


@pytest.mark.parametrize("kind", list(QUIET))
def test_a_filter_after_the_header_step_that_writes_no_router_header_passes(kind):
    assert clean(mutated(before_processor(QUIET[kind])))


def _step(config):
    (step,) = [f for f in hcm(config)["http_filters"] if f["name"] == STEP]
    return step["typed_config"]["mutations"]["request_mutations"]


@pytest.mark.parametrize("header", ROUTER_HEADERS)
def test_the_header_step_writing_a_router_header_is_an_error(header):
    # The audit's first edit: the step itself sets it, after removing it.
    assert found(mutated(lambda c: _step(c).append(sets(header, "1")))) == writer(STEP)


@pytest.mark.parametrize("header", ROUTER_HEADERS)
def test_without_the_steps_removal_every_filter_before_the_processor_is_judged(header):
    def change(config):
        mutations = _step(config)
        mutations[:] = [m for m in mutations if m.get("remove") != header]
        first(LUA)(config)

    assert found(mutated(change)) == writer("lua")


def test_a_header_step_without_the_removals_and_no_writer_passes():
    # Hand-written configs need not remove them: what matters is that nothing writes one.
    def change(config):
        _step(config)[:] = [m for m in _step(config) if m.get("remove") not in ROUTER_HEADERS]

    assert clean(mutated(change))


def _second_filter(config):
    # An empty header_mutation filter after the step, for routes to configure.
    before_processor(header_mutation("per-route"))(config)


@pytest.mark.parametrize("wrapped", [False, True], ids=["per-route", "filter-config"])
@pytest.mark.parametrize("level", ["route", "virtual_host", "route_config"])
def test_a_routes_header_mutation_writing_a_router_header_is_an_error(level, wrapped):
    # The audit's per-route edit: the filter writes nothing itself; a route's
    # configuration of it sets x-envoy-retry-on.
    per_route = {
        "@type": MUTATION_PER_ROUTE,
        "mutations": {"request_mutations": [sets("x-envoy-retry-on", "5xx")]},
    }
    if wrapped:
        per_route = {"@type": FILTER_CONFIG, "config": per_route}

    def change(config):
        _second_filter(config)
        holder = {
            "route": route(config, "disaggregated"),
            "virtual_host": hcm(config)["route_config"]["virtual_hosts"][0],
            "route_config": hcm(config)["route_config"],
        }[level]
        holder.setdefault("typed_per_filter_config", {})["per-route"] = per_route

    assert found(mutated(change)) == writer("per-route")


def test_a_route_configuring_the_step_undoes_its_removal():
    # Not a removal on every route: what runs before it is judged too.
    def change(config):
        first(LUA)(config)
        route(config, "aggregated")["typed_per_filter_config"] = {
            STEP: {"@type": MUTATION_PER_ROUTE, "mutations": {"request_mutations": []}}
        }

    assert found(mutated(change)) == [("header-step-per-route", HCM), *writer("lua")]


def test_another_ext_proc_allowed_to_write_envoys_headers_is_an_error_beside_its_place():
    picker = {
        "name": "picker",
        "typed_config": {
            "@type": _T + "ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}},
            "mutation_rules": {"allow_envoy": True},
        },
    }
    assert found(mutated(before_processor(picker))) == [
        ("other-ext-proc-first", HCM),
        *writer("picker"),
    ]


def test_a_declared_filter_after_the_decision_is_judged_an_undeclared_one_is_not_twice():
    def change(config):
        chain = hcm(config)["http_filters"]
        chain.insert(len(chain) - 1, copy.deepcopy(LUA))

    assert found(mutated(change, frozenset({"lua"}))) == writer("lua")
    assert found(mutated(change)) == [("filter-after-decision", HCM)]


def test_this_processors_filters_are_not_judged():
    def change(config):
        chain = hcm(config)["http_filters"]
        second = copy.deepcopy(chain[ext_proc_index(config)])
        second["name"] = EXT_PROC + ".second"
        second["typed_config"]["mutation_rules"] = {"allow_envoy": True}
        chain.insert(ext_proc_index(config), second)

    assert "router-header-writer" not in mutated(change).codes()


def test_a_chain_with_no_mint_or_honor_route_may_retry():
    # A second copy of a stripped body spends no proof.
    change = without("prefill", "disaggregated")
    assert clean(mutated(lambda c: (change(c), before_processor(LUA)(c))))


@pytest.mark.parametrize("name", ["envoy.yaml", "envoy-turns.yaml", "envoy-decompress.yaml"])
def test_every_audit_edit_is_refused_on_the_shipped_configs(name):
    # envoy-turns.yaml: a turn's read-back would reach the prefill server twice.
    for edit, place in [
        (lambda c: _step(c).append(sets("x-envoy-retry-on", "5xx")), STEP),
        (before_processor(WRITERS["copies-a-client-header"]), "copy"),
        (before_processor(LUA), "lua"),
    ]:
        config = yaml.safe_load((SHIPPED_DIR / name).read_text())
        edit(config)
        assert found(check(config)) == writer(place), name


def test_the_shipped_step_removes_every_router_header_last():
    removed = [m["remove"] for m in _step(copy.deepcopy(SHIPPED)) if "remove" in m]
    assert removed[-len(ROUTER_HEADERS) :] == ROUTER_HEADERS
