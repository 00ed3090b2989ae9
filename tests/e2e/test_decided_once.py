"""A decode body the processor honored once reaches the upstream once, on the real Envoy:
the shipped honor route delivers one copy; the same route with a retry, a hedge or a
mirror delivers two (Envoy resends the decided body without running ext_proc again), and
with a Lua filter after the processor's the upstream gets a path the processor never
judged. A filter that writes the router's retry headers after the header step (the step
itself, a second header_mutation copying a client's headers, a Lua script, a route's
configuration of a header_mutation) delivers two; the same filter before the step, one
(the step removes them). check-envoy passes the shipped config and fails each edit with
its own code, so its claims are checked against Envoy here.

The stand-in upstream answers 200 to everything: the retry edit retries on 200
(``retriable_status_codes``), the mechanism a 503 would trigger, made certain; the hedge
edit hedges on a per-try timeout the stand-in's delay header exceeds. Istio's default
retry policy on the Istio gateway's honor route (the last section) meets a real first
failure: the stand-in fails the first copy of the decode request, 503 or gRPC
UNAVAILABLE."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import yaml

from devstack.upstream import FIRST_GRPC_STATUS_HEADER, FIRST_STATUS_HEADER
from ext_proc.tools import check_envoy
from tests.e2e import gateway_assembly
from tests.e2e.conftest import ENVOY, KEY_ID
from tests.e2e.gateway_assembly import ISTIO_1_23_RETRY_POLICY, ISTIO_RETRY_POLICY
from tests.e2e.stack import Received, Stack, new_key
from tests.e2e.test_deploy import httproutes, istio_filter, routes_of
from tests.e2e.test_gateway import chat
from tests.e2e.test_handoff import DECODE, UPSTREAM_PATH, minted

Edit = Callable[[dict[str, Any]], None]
LUA = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
ROUTER = "envoy.filters.http.router"
EXT_PROC = "envoy.filters.http.ext_proc"
DELAY = "x-stub-delay-seconds"
SHIPPED = ENVOY / "envoy.yaml"


def _hcm(config: dict[str, Any]) -> dict[str, Any]:
    manager: dict[str, Any] = config["static_resources"]["listeners"][0]["filter_chains"][0][
        "filters"
    ][0]["typed_config"]
    return manager


def _decode_action(config: dict[str, Any]) -> dict[str, Any]:
    (vhost,) = _hcm(config)["route_config"]["virtual_hosts"]
    (route,) = [r for r in vhost["routes"] if r.get("name") == "disaggregated"]
    action: dict[str, Any] = route["route"]
    return action


def retried(config: dict[str, Any]) -> None:
    _decode_action(config)["retry_policy"] = {
        "retry_on": "retriable-status-codes",
        "retriable_status_codes": [200],
        "num_retries": 1,
    }


def hedged(config: dict[str, Any]) -> None:
    _decode_action(config).update(
        retry_policy={"retry_on": "5xx", "num_retries": 1, "per_try_timeout": "0.3s"},
        hedge_policy={"hedge_on_per_try_timeout": True},
    )


def mirrored(config: dict[str, Any]) -> None:
    _decode_action(config)["request_mirror_policies"] = [{"cluster": "disaggregated"}]


def path_rewritten(config: dict[str, Any]) -> None:
    # The audit's filter: after the processor passed the request, another endpoint.
    filters = _hcm(config)["http_filters"]
    at = [f["name"] for f in filters].index(ROUTER)
    source = "function envoy_on_request(h) h:headers():replace(':path', '/v1/completions') end"
    filters.insert(
        at,
        {
            "name": "rewrite",
            "typed_config": {"@type": LUA, "default_source_code": {"inline_string": source}},
        },
    )


# The router's retry headers, asking it to retry the stand-in's 200 once; with the others
# of its retry and hedge headers, every one the header step removes.
RETRY_HEADERS = {
    "x-envoy-retry-on": "retriable-status-codes",
    "x-envoy-retriable-status-codes": "200",
    "x-envoy-max-retries": "1",
}


ROUTER_HEADERS = (
    *RETRY_HEADERS,
    "x-envoy-retry-grpc-on",
    "x-envoy-retriable-header-names",
    "x-envoy-upstream-rq-per-try-timeout-ms",
    "x-envoy-hedge-on-per-try-timeout",
)


def retry_headers_added(config: dict[str, Any]) -> None:
    # The audit's edit: the honor route adds them; the router reads them after.
    (vhost,) = _hcm(config)["route_config"]["virtual_hosts"]
    (route,) = [r for r in vhost["routes"] if r.get("name") == "disaggregated"]
    route["request_headers_to_add"] = [
        {"header": {"key": key, "value": value}} for key, value in RETRY_HEADERS.items()
    ]


def loopback_internal(config: dict[str, Any]) -> None:
    # The audit's edit: the test client (on loopback) is internal, its retry headers kept.
    _hcm(config).update(
        use_remote_address=True,
        internal_address_config={"cidr_ranges": [{"address_prefix": "127.0.0.0", "prefix_len": 8}]},
    )


def loopback_internal_by_default(config: dict[str, Any]) -> None:
    # Set but empty: Envoy's private ranges are internal, loopback among them.
    _hcm(config).update(use_remote_address=True, internal_address_config={})


def loopback_internal_headers_removed(config: dict[str, Any]) -> None:
    # The honor route removes the kept headers before the router reads them: one copy,
    # yet still refused (the check does not weigh removals against other levels).
    loopback_internal(config)
    (vhost,) = _hcm(config)["route_config"]["virtual_hosts"]
    (route,) = [r for r in vhost["routes"] if r.get("name") == "disaggregated"]
    route["request_headers_to_remove"] = list(RETRY_HEADERS)


def step_keeps_router_headers(config: dict[str, Any]) -> None:
    # A hand-written header step that removes only the routing headers: a retry header
    # that reaches it reaches the router.
    step = _hcm(config)["http_filters"][0]["typed_config"]["mutations"]
    step["request_mutations"] = [
        m for m in step["request_mutations"] if m.get("remove") not in ROUTER_HEADERS
    ]


def loopback_internal_step_keeps(config: dict[str, Any]) -> None:
    loopback_internal(config)
    step_keeps_router_headers(config)


def loopback_internal_by_default_step_keeps(config: dict[str, Any]) -> None:
    loopback_internal_by_default(config)
    step_keeps_router_headers(config)


def xff_trusted(config: dict[str, Any]) -> None:
    # Which address is judged, not which are internal: still none is.
    _hcm(config).update(use_remote_address=True, xff_num_trusted_hops=1)


# --- Filters that write the router's retry headers --------------------------------------
#
# The header step removes every header the router retries or hedges by; a filter after
# it (before the processor's, where the check judges what runs) that writes them back
# retries the decided body. The audit's edits: the step itself, a second header_mutation
# copying a client's headers, a Lua script, a route's configuration of a header_mutation;
# the route's request_headers_to_add is "retry-header-added" above.

HEADER_MUTATION = (
    "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation"
)
MUTATION_PER_ROUTE = (
    "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutationPerRoute"
)
# The client's own headers a copying filter reads, and the router header each becomes.
CLIENT_COPIES = {f"x-client-{name.removeprefix('x-envoy-')}": name for name in RETRY_HEADERS}


def _sets(values: dict[str, str]) -> list[dict[str, Any]]:
    return [{"append": {"header": {"key": key, "value": value}}} for key, value in values.items()]


def _before_processor(config: dict[str, Any], entry: dict[str, Any], at: int | None = None) -> None:
    filters = _hcm(config)["http_filters"]
    position = [f["name"] for f in filters].index(EXT_PROC) if at is None else at
    filters.insert(position, entry)


def step_sets_retry_headers(config: dict[str, Any]) -> None:
    step = _hcm(config)["http_filters"][0]["typed_config"]["mutations"]
    step["request_mutations"] += _sets(RETRY_HEADERS)


def _copying_filter() -> dict[str, Any]:
    copies = {router: f"%REQ({client})%" for client, router in CLIENT_COPIES.items()}
    return {
        "name": "copy",
        "typed_config": {
            "@type": HEADER_MUTATION,
            "mutations": {"request_mutations": _sets(copies)},
        },
    }


def client_headers_copied(config: dict[str, Any]) -> None:
    _before_processor(config, _copying_filter())


def client_headers_copied_before_the_step(config: dict[str, Any]) -> None:
    # The same filter first in the chain: the step removes what it wrote.
    _before_processor(config, _copying_filter(), at=0)


def lua_sets_retry_headers(config: dict[str, Any]) -> None:
    calls = " ".join(f"h:headers():add('{k}', '{v}')" for k, v in RETRY_HEADERS.items())
    source = f"function envoy_on_request(h) {calls} end"
    _before_processor(
        config,
        {
            "name": "lua",
            "typed_config": {"@type": LUA, "default_source_code": {"inline_string": source}},
        },
    )


def route_sets_retry_headers(config: dict[str, Any]) -> None:
    # A header_mutation filter that writes nothing itself; the honor route's
    # configuration of it writes the retry headers.
    _before_processor(
        config,
        {"name": "per-route", "typed_config": {"@type": HEADER_MUTATION, "mutations": {}}},
    )
    (vhost,) = _hcm(config)["route_config"]["virtual_hosts"]
    (route,) = [r for r in vhost["routes"] if r.get("name") == "disaggregated"]
    route["typed_per_filter_config"]["per-route"] = {
        "@type": MUTATION_PER_ROUTE,
        "mutations": {"request_mutations": _sets(RETRY_HEADERS)},
    }


# Each edit, the code check-envoy fails it with, how many copies reach the upstream and
# at which path.
CASES: dict[str, tuple[Edit | None, list[str], int, str]] = {
    "shipped": (None, [], 1, UPSTREAM_PATH),
    "retry-header-added": (retry_headers_added, ["retry-header-added"], 2, UPSTREAM_PATH),
    # The client's retry headers pass the connection manager; the header step removes
    # them, unless it is one that keeps them. Refused either way.
    "retry-header-trusted": (loopback_internal, ["retry-header-trusted"], 1, UPSTREAM_PATH),
    "internal-empty": (loopback_internal_by_default, ["retry-header-trusted"], 1, UPSTREAM_PATH),
    "internal-step-keeps": (
        loopback_internal_step_keeps,
        ["retry-header-trusted"],
        2,
        UPSTREAM_PATH,
    ),
    "internal-empty-step-keeps": (
        loopback_internal_by_default_step_keeps,
        ["retry-header-trusted"],
        2,
        UPSTREAM_PATH,
    ),
    "internal-removed": (
        loopback_internal_headers_removed,
        ["retry-header-trusted"],
        1,
        UPSTREAM_PATH,
    ),
    "xff-trusted-hops": (xff_trusted, [], 1, UPSTREAM_PATH),
    "retry": (retried, ["body-retried"], 2, UPSTREAM_PATH),
    "hedge": (hedged, ["body-retried", "body-hedged"], 2, UPSTREAM_PATH),
    "mirror": (mirrored, ["body-mirrored"], 2, UPSTREAM_PATH),
    "lua-path": (path_rewritten, ["filter-after-decision"], 1, "/v1/completions"),
    "step-sets-retry": (step_sets_retry_headers, ["router-header-writer"], 2, UPSTREAM_PATH),
    "client-copied": (client_headers_copied, ["router-header-writer"], 2, UPSTREAM_PATH),
    "client-copied-before-step": (client_headers_copied_before_the_step, [], 1, UPSTREAM_PATH),
    "lua-retry": (
        lua_sets_retry_headers,
        ["router-header-writer", "header-rewritten-by-filter"],
        2,
        UPSTREAM_PATH,
    ),
    "route-header-mutation": (route_sets_retry_headers, ["router-header-writer"], 2, UPSTREAM_PATH),
}
# What the client adds to the proven decode request, by case: the router's retry headers
# where the edit is about who may send them (with an x-forwarded-for that names an
# internal address, were any).
SENT: dict[str, dict[str, str]] = {
    "retry-header-trusted": RETRY_HEADERS,
    "internal-empty": RETRY_HEADERS,
    "internal-step-keeps": RETRY_HEADERS,
    "internal-empty-step-keeps": RETRY_HEADERS,
    "client-copied": {client: RETRY_HEADERS[router] for client, router in CLIENT_COPIES.items()},
    "client-copied-before-step": {
        client: RETRY_HEADERS[router] for client, router in CLIENT_COPIES.items()
    },
    "internal-removed": RETRY_HEADERS,
    "xff-trusted-hops": {**RETRY_HEADERS, "x-forwarded-for": "127.0.0.1"},
}


@pytest.fixture(scope="module", params=list(CASES))
def case(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, dict[str, str], int, str]]:
    edit, _codes, copies, path = CASES[request.param]
    workdir = tmp_path_factory.mktemp(request.param)
    with Stack(workdir, proof_keys={KEY_ID: new_key()}, edit=edit) as running:
        yield running, SENT.get(request.param, {}), copies, path


def _copies(stack: Stack, expected: int) -> list[Received]:
    # A mirror and a hedge reach the upstream beside the answered request: wait for
    # them a little, then for anything more.
    deadline = time.monotonic() + 3
    while stack.received_count() < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    return stack.received()


@pytest.mark.parametrize("name", list(CASES))
def test_check_envoy_fails_exactly_the_edits(name):
    # The shipped config with the edit the stack runs (the stack adds test routes of
    # its own, with policies no shipped config has).
    edit, codes, _copies, _path = CASES[name]
    config = yaml.safe_load(SHIPPED.read_text())
    if edit is not None:
        edit(config)
    assert check_envoy.check(config).codes() == codes


def proven_decode(stack: Stack, headers: dict[str, str]) -> tuple[httpx.Response, bytes]:
    """A decode leg whose proof the gateway minted just before, sent with ``headers``:
    the answer and the body sent."""
    with httpx.Client(timeout=20) as client:
        params = minted(client, stack)
        raw = json.dumps(chat(params, max_tokens=8)).encode()
        reply = client.post(
            stack.url + DECODE,
            content=raw,
            headers={"content-type": "application/json", **headers},
        )
    return reply, raw


def test_a_proven_decode_body_reaches_the_upstream_once_unless_edited(case):
    stack, sent, copies, path = case
    reply, raw = proven_decode(stack, {DELAY: "1", **sent})
    assert reply.status_code == 200, reply.text
    received = _copies(stack, copies)
    # Each copy is the proven body, its proof included: one decision, `copies` uses.
    assert [(r.target, r.body) for r in received] == [(path, raw)] * copies


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("shipped"), proof_keys={KEY_ID: new_key()}) as running:
        yield running


def test_a_clients_retry_headers_make_no_second_copy(shipped):
    # The router's retry headers, from a client: the connection manager removes them
    # from external requests, and with no internal_address_config every request is
    # external, so the body goes out once.
    with httpx.Client(timeout=20) as client:
        params = minted(client, shipped)
        reply = client.post(
            shipped.url + DECODE,
            json=chat(params, max_tokens=8),
            headers={
                "x-envoy-retry-on": "retriable-status-codes",
                "x-envoy-retriable-status-codes": "200",
                "x-envoy-max-retries": "1",
            },
        )
    assert reply.status_code == 200, reply.text
    assert len(_copies(shipped, 2)) == 1


# --- Istio's default retry policy ------------------------------------------------------
#
# The honor route of the Istio gateway (deploy/istio with the example HTTPRoutes, as
# tests/e2e/gateway_assembly.py assembles it) carries the retry policy istiod gives
# every route; the EnvoyFilter replaces its retry_on. Here that route's policy, with the
# EnvoyFilter's override and without, goes on the shipped config's honor route, and
# the stand-in fails the first copy of the decode request.

ISTIO_HONOR = "llm-d.llama-pd.0"
FAILED_503 = {FIRST_STATUS_HEADER: "503"}
# A 503 with grpc-status 14 (UNAVAILABLE): what Istio's "unavailable" condition retries.
FAILED_UNAVAILABLE = {FIRST_STATUS_HEADER: "503", FIRST_GRPC_STATUS_HEADER: "14"}


def istio_honor_retry_policy(default: dict[str, Any], shipped: bool) -> dict[str, Any]:
    """The Istio honor route's retry policy when istiod's is ``default``: with the
    EnvoyFilter as shipped, or without its retry override."""
    envoy_filter = istio_filter()
    if not shipped:
        for patch in envoy_filter["spec"]["configPatches"]:
            patch["patch"]["value"].pop("route", None)
    config = gateway_assembly.istio_bootstrap(envoy_filter, httproutes(), default)
    (route,) = [r for r in routes_of(config) if r["name"] == ISTIO_HONOR]
    policy: dict[str, Any] = route["route"]["retry_policy"]
    return policy


def with_retry_policy(policy: dict[str, Any]) -> Edit:
    def edit(config: dict[str, Any]) -> None:
        _decode_action(config)["retry_policy"] = policy

    return edit


# istiod's policy, the EnvoyFilter's override or not, how the first copy fails, the
# code check-envoy fails the shipped config with that policy with, how many copies
# reach the upstream, and the status the client gets.
ISTIO_CASES: dict[str, tuple[dict[str, Any], bool, dict[str, str], list[str], int, int]] = {
    # Istio up to 1.23: a 503 is retried, the proven body delivered twice.
    "1.23-default-503": (ISTIO_1_23_RETRY_POLICY, False, FAILED_503, ["body-retried"], 2, 200),
    "1.23-shipped-503": (ISTIO_1_23_RETRY_POLICY, True, FAILED_503, [], 1, 503),
    # Istio since 1.24 retries no status code, but a gRPC UNAVAILABLE status.
    "default-503": (ISTIO_RETRY_POLICY, False, FAILED_503, ["body-retried"], 1, 503),
    "default-unavailable": (
        ISTIO_RETRY_POLICY,
        False,
        FAILED_UNAVAILABLE,
        ["body-retried"],
        2,
        200,
    ),
    "shipped-unavailable": (ISTIO_RETRY_POLICY, True, FAILED_UNAVAILABLE, [], 1, 503),
}


@pytest.mark.parametrize("name", list(ISTIO_CASES))
def test_check_envoy_fails_istios_retry_on_the_honor_route_unless_overridden(name):
    default, shipped, _failed, codes, _copies, _status = ISTIO_CASES[name]
    config = yaml.safe_load(SHIPPED.read_text())
    with_retry_policy(istio_honor_retry_policy(default, shipped))(config)
    assert check_envoy.check(config).codes() == codes


@pytest.fixture(scope="module", params=list(ISTIO_CASES))
def istio_case(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, dict[str, str], int, int]]:
    default, shipped, failed, _codes, copies, status = ISTIO_CASES[request.param]
    edit = with_retry_policy(istio_honor_retry_policy(default, shipped))
    workdir = tmp_path_factory.mktemp(f"istio-{request.param}")
    with Stack(workdir, proof_keys={KEY_ID: new_key()}, edit=edit) as running:
        yield running, failed, copies, status


def test_istios_retry_delivers_a_proven_body_once_only_with_the_envoyfilter(istio_case):
    stack, failed, copies, status = istio_case
    reply, raw = proven_decode(stack, failed)
    assert reply.status_code == status, reply.text
    received = _copies(stack, copies)
    assert [(r.target, r.body) for r in received] == [(UPSTREAM_PATH, raw)] * copies
