"""Nothing after the header step writes back what it took from the client: a header the
router retries or hedges by (any value, on a connection manager with a mint or honor
route), a header carrier or the request id (a client's value). Each kind of writer (the
header step itself, a second header_mutation, a route's configuration of one, Lua, Wasm,
a filter from ECDS, ext_authz, ext_proc, local_ratelimit) against each class of header:
refused after the step, passing before it; a declared filter after the decision (the
endpoint picker) is trusted with the carriers it chooses, never with the router's
headers."""

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
    filter_names,
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
EXT_PROC_TYPE = _T + "ext_proc.v3.ExternalProcessor"
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
ROUTER = "router-header-writer"
REWRITTEN = "header-rewritten-by-filter"
# One header of each class, and the words a finding names its class with.
CLASSES = {
    "router": ("x-envoy-retry-on", "a header the router retries or hedges by"),
    "carrier": ("x-prefiller-host-port", "a header carrier"),
    "request-id": ("x-request-id", "the request id"),
}
# A client's header, copied.
CLIENTS = "%REQ(x-mine)%"


def sets(key, value):
    return {"append": {"header": {"key": key, "value": value}}}


def header_mutation(name, *mutations):
    return {
        "name": name,
        "typed_config": {"@type": MUTATION, "mutations": {"request_mutations": list(mutations)}},
    }


def lua(header):
    source = f"function envoy_on_request(h) h:headers():replace('{header}', '5xx') end"
    return {
        "name": "lua",
        "typed_config": {
            "@type": _T + "lua.v3.Lua",
            "default_source_code": {"inline_string": source},
        },
    }


LUA = lua("x-envoy-retry-on")


def ext_authz(rules=None):
    config = {"@type": _T + "ext_authz.v3.ExtAuthz"}
    if rules is not None:
        config["decoder_header_mutation_rules"] = rules
    return {"name": "authz", "typed_config": config}


def local_ratelimit(header, value):
    return {
        "name": "limit",
        "typed_config": {
            "@type": _T + "local_ratelimit.v3.LocalRateLimit",
            "stat_prefix": "x",
            "request_headers_to_add_when_not_enforced": [
                {"header": {"key": header.title(), "value": value}}
            ],
        },
    }


# Writers whose configuration states the header and value: (filter, value) for a header.
STATED = {
    "header_mutation": lambda h, v: header_mutation("copy", sets(h, v)),
    "local_ratelimit": local_ratelimit,
}
# Writers that choose at run time (each a filter), and the codes each is refused with
# after the step: Envoy's mutation rules keep x-envoy-* from a server unless allowed.
EVERY_CLASS = [ROUTER, REWRITTEN]
CHOOSERS = {
    "lua": (LUA, EVERY_CLASS),
    "wasm": ({"name": "wasm", "typed_config": {"@type": _T + "wasm.v3.Wasm"}}, EVERY_CLASS),
    "composite": (
        {"name": "composite", "typed_config": {"@type": _T + "composite.v3.Composite"}},
        EVERY_CLASS,
    ),
    "ecds": (
        {"name": "discovered", "config_discovery": {"config_source": {"ads": {}}}},
        EVERY_CLASS,
    ),
    "ext_authz-unchecked": (ext_authz(), EVERY_CLASS),
    "ext_authz-checked": (ext_authz({}), [REWRITTEN]),
    "ext_authz-envoy-allowed": (ext_authz({"allow_envoy": True}), EVERY_CLASS),
    "ext_authz-expression-allowed": (
        ext_authz({"allow_expression": {"regex": "x-envoy-.*"}, "disallow_all": True}),
        [ROUTER],
    ),
    "ext_authz-unreadable-expression": (
        # Python's re cannot read it: the allowing expression is taken to allow.
        ext_authz({"allow_expression": {"regex": "(?P<"}, "disallow_all": True}),
        EVERY_CLASS,
    ),
    "ext_authz-all-disallowed": (ext_authz({"disallow_all": True}), []),
    "ext_authz-disallowed-by-expression": (
        # The disallowing expression comes before allow_envoy.
        ext_authz({"allow_envoy": True, "disallow_expression": {"regex": "x-.*"}}),
        [],
    ),
}


# Of a type no table entry bounds, refused wherever it runs (rules.filter_types).
UNKNOWN = {"wasm", "composite", "ecds"}


def unknown(kind):
    return [("filter-type-unknown", HCM)] if kind in UNKNOWN else []


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


def before_the_router(entry):
    """An edit: ``entry`` after this processor's decision, right before the router."""

    def change(config):
        hcm(config)["http_filters"].insert(len(filter_names(config)) - 1, copy.deepcopy(entry))

    return change


def at(name):
    return f"{HCM} filter {name}"


def writer(name, *codes):
    return [(code, at(name)) for code in codes or [ROUTER]]


def said(report, code):
    (finding,) = [f for f in report.findings if f.code == code]
    return finding.message


# --- each writer kind against each class of header ----------------------------------------


@pytest.mark.parametrize("header_class", list(CLASSES))
@pytest.mark.parametrize("kind", list(STATED))
def test_a_stated_copy_of_a_clients_header_after_the_step_is_an_error(kind, header_class):
    header, label = CLASSES[header_class]
    entry = STATED[kind](header, CLIENTS)
    report = mutated(before_processor(entry))
    code = ROUTER if header_class == "router" else REWRITTEN
    assert found(report) == writer(entry["name"], code)
    assert label in said(report, code)
    assert header in said(report, code)


@pytest.mark.parametrize("header_class", list(CLASSES))
@pytest.mark.parametrize("kind", list(STATED))
def test_a_stated_constant_after_the_step_is_an_error_for_the_router_headers_only(
    kind, header_class
):
    # A value no client chose is its writer's business, unless the router retries by it.
    header, _ = CLASSES[header_class]
    entry = STATED[kind](header, "3")
    expected = writer(entry["name"]) if header_class == "router" else []
    assert found(mutated(before_processor(entry))) == expected


def test_a_fresh_request_id_after_the_step_is_no_clients():
    entry = header_mutation("renew", sets("x-request-id", "%UNIQUE_ID%"))
    assert clean(mutated(before_processor(entry)))


@pytest.mark.parametrize("kind", list(CHOOSERS))
def test_a_filter_that_chooses_what_it_writes_after_the_step_is_judged_by_what_it_may_write(kind):
    entry, codes = CHOOSERS[kind]
    expected = writer(entry["name"], *codes) if codes else []
    assert found(mutated(before_processor(entry))) == unknown(kind) + expected


@pytest.mark.parametrize("header_class", ["carrier", "request-id"])
def test_a_finding_names_the_class_a_chooser_may_write(header_class):
    _, label = CLASSES[header_class]
    assert label in said(mutated(before_processor(LUA)), REWRITTEN)


@pytest.mark.parametrize("kind", [*CHOOSERS, "header_mutation", "local_ratelimit"])
def test_the_same_filter_before_the_header_step_passes(kind):
    # The step removes every carrier and router header, and renews the id, after it ran.
    entries = (
        [CHOOSERS[kind][0]]
        if kind in CHOOSERS
        else [STATED[kind](header, CLIENTS) for header, _ in CLASSES.values()]
    )
    for entry in entries:
        assert found(mutated(first(entry))) == unknown(kind), entry


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "gunzip", "typed_config": {"@type": _T + "decompressor.v3.Decompressor"}},
        {"name": "rbac", "typed_config": {"@type": _T + "rbac.v3.RBAC"}},
        header_mutation("picker", sets("x-gateway-destination-endpoint", "a")),
        header_mutation("trim", {"remove": "x-envoy-retry-on"}, {"remove": "x-prefill-dp-rank"}),
        header_mutation("other", sets("x-mine-too", CLIENTS)),
    ],
    ids=["decompressor", "rbac", "constant-carrier", "removes", "other-header"],
)
def test_a_filter_after_the_step_that_writes_nothing_guarded_passes(entry):
    assert clean(mutated(before_processor(entry)))


def test_another_ext_proc_may_write_carriers_beside_its_place():
    picker = {
        "name": "picker",
        "typed_config": {
            "@type": EXT_PROC_TYPE,
            "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}},
        },
    }
    assert found(mutated(before_processor(picker))) == [
        ("other-ext-proc-first", HCM),
        *writer("picker", REWRITTEN),
    ]
    picker["typed_config"]["mutation_rules"] = {"allow_envoy": True}
    assert found(mutated(before_processor(picker))) == [
        ("other-ext-proc-first", HCM),
        *writer("picker", ROUTER, REWRITTEN),
    ]


# --- the step itself, and routes' configurations of a header_mutation ----------------------


def _step(config):
    (step,) = [f for f in hcm(config)["http_filters"] if f["name"] == STEP]
    return step["typed_config"]["mutations"]["request_mutations"]


@pytest.mark.parametrize("header", ROUTER_HEADERS)
def test_the_header_step_writing_a_router_header_is_an_error(header):
    # The step itself sets it, after removing it.
    assert found(mutated(lambda c: _step(c).append(sets(header, "1")))) == writer(STEP)


def test_a_step_that_writes_a_carrier_back_is_no_step_and_reported_once():
    # header_step's rule: the step lets a client's carrier through; nothing clears the
    # carriers, so no writer after it is judged for them twice.
    def change(config):
        _step(config).append(sets("x-prefiller-host-port", CLIENTS))
        before_processor(lua("x-prefiller-host-port"))(config)

    assert found(mutated(change)) == [("header-step-missing", HCM), *writer("lua")]


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


@pytest.mark.parametrize("header_class", list(CLASSES))
@pytest.mark.parametrize("wrapped", [False, True], ids=["per-route", "filter-config"])
@pytest.mark.parametrize("level", ["route", "virtual_host", "route_config"])
def test_a_routes_header_mutation_writing_a_guarded_header_is_an_error(
    level, wrapped, header_class
):
    # The filter writes nothing itself; a route's configuration of it writes the header
    # from a client's.
    header, label = CLASSES[header_class]
    per_route = {
        "@type": MUTATION_PER_ROUTE,
        "mutations": {"request_mutations": [sets(header, CLIENTS)]},
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

    report = mutated(change)
    code = ROUTER if header_class == "router" else REWRITTEN
    assert found(report) == writer("per-route", code)
    assert label in said(report, code)


def test_a_route_configuring_the_step_undoes_its_removal_of_the_router_headers():
    # Not a removal on every route: what runs before it is judged too. The carriers are
    # header_step's (header-step-per-route).
    def change(config):
        first(LUA)(config)
        route(config, "aggregated")["typed_per_filter_config"] = {
            STEP: {"@type": MUTATION_PER_ROUTE, "mutations": {"request_mutations": []}}
        }

    assert found(mutated(change)) == [("header-step-per-route", HCM), *writer("lua")]


# --- after the decision: declared filters ---------------------------------------------------


def test_a_declared_filter_after_the_decision_is_trusted_with_carriers_not_router_headers():
    change = before_the_router(LUA)
    assert found(mutated(change, frozenset({"lua"}))) == writer("lua")
    # Undeclared, it is after_decision's, once.
    assert found(mutated(change)) == [("filter-after-decision", HCM)]


@pytest.mark.parametrize("header_class", ["carrier", "request-id"])
def test_a_declared_filter_stating_a_clients_value_is_held_to_the_step(header_class):
    header, _ = CLASSES[header_class]
    change = before_the_router(header_mutation("restore", sets(header, CLIENTS)))
    assert found(mutated(change, frozenset({"restore"}))) == writer("restore", REWRITTEN)
    # Its own choice (a constant here) is not a client's.
    change = before_the_router(header_mutation("picker", sets(header, "10.0.0.5:8000")))
    assert clean(mutated(change, frozenset({"picker"})))


def _endpoint_picker(**rules):
    return {
        "name": "picker",
        "typed_config": {
            "@type": EXT_PROC_TYPE,
            "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}},
            "mutation_rules": {"disallow_system": True, **rules},
        },
    }


def test_a_declared_endpoint_picker_may_write_carriers():
    assert clean(mutated(before_the_router(_endpoint_picker()), frozenset({"picker"})))


def test_a_declared_endpoint_picker_an_expression_lets_write_router_headers_is_an_error():
    # after_decision refuses allow_envoy; an allow_expression lets them through as well.
    entry = _endpoint_picker(allow_expression={"regex": "x-envoy-retry-.*"})
    assert found(mutated(before_the_router(entry), frozenset({"picker"}))) == writer("picker")
    entry = _endpoint_picker(allow_envoy=True)
    report = mutated(before_the_router(entry), frozenset({"picker"}))
    assert found(report) == [("declared-filter-unbounded", HCM)]


def test_this_processors_filters_are_not_judged():
    def change(config):
        chain = hcm(config)["http_filters"]
        second = copy.deepcopy(chain[ext_proc_index(config)])
        second["name"] = EXT_PROC + ".second"
        second["typed_config"]["mutation_rules"] = {"allow_envoy": True}
        chain.insert(ext_proc_index(config), second)

    codes = mutated(change).codes()
    assert ROUTER not in codes
    assert REWRITTEN not in codes


def test_a_chain_with_no_mint_or_honor_route_may_retry_but_keeps_its_carriers():
    # A second copy of a stripped body spends no proof; a carrier is read all the same.
    change = without("prefill", "disaggregated")
    report = mutated(lambda c: (change(c), before_processor(LUA)(c)))
    assert found(report) == writer("lua", REWRITTEN)


# --- the shipped configs ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["envoy.yaml", "envoy-turns.yaml", "envoy-decompress.yaml"])
def test_every_edit_is_refused_on_the_shipped_configs(name):
    # envoy-turns.yaml: a turn's read-back would reach the prefill server twice.
    copies = {h: header_mutation("copy", sets(h, CLIENTS)) for h in ROUTER_HEADERS[:1]}
    copies["x-dynamo-dp-rank"] = header_mutation("copy", sets("x-dynamo-dp-rank", CLIENTS))
    for edit, place, codes in [
        (lambda c: _step(c).append(sets("x-envoy-retry-on", "5xx")), STEP, [ROUTER]),
        (before_processor(copies["x-envoy-retry-on"]), "copy", [ROUTER]),
        (before_processor(copies["x-dynamo-dp-rank"]), "copy", [REWRITTEN]),
        (before_processor(LUA), "lua", EVERY_CLASS),
    ]:
        config = yaml.safe_load((SHIPPED_DIR / name).read_text())
        edit(config)
        assert found(check(config)) == writer(place, *codes), name


def test_the_shipped_step_removes_every_router_header_last():
    removed = [m["remove"] for m in _step(copy.deepcopy(SHIPPED)) if "remove" in m]
    assert removed[-len(ROUTER_HEADERS) :] == ROUTER_HEADERS
