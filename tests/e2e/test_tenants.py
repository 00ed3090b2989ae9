"""Tenants through the real Envoy, in every body arrangement: Envoy's jwt_authn sets the
tenant header from a verified token's claim, after a header_mutation removed a client's
copy; the processor writes each tenant's cache_salt (combined with the client's own),
the header step removes a client's x-tenant-id, and a request naming no tenant gets a
401 in vLLM's error shape. What arrived is what the recording stand-in read, byte for
byte."""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ext_proc.core import tenants
from ext_proc.tools import carrier_headers, check_envoy, envoygen
from tests.e2e.conftest import BODY_MODES, ENVOY, KEY_ID
from tests.e2e.stack import Stack, new_key, route
from tests.e2e.test_gateway import chat, only_request
from tests.e2e.test_operations import access_log

TENANT_HEADER = "x-auth-tenant"
TENANT_KEY = b"tenant-key-of-this-deployment-32b!"
JWT_SECRET = b"jwt-signing-secret-of-the-identity-provider"
PREFIX = "/tenant/v1/"
URL = f"{PREFIX}chat/completions"
# A tenant route that sets llm-d's fairness id from the tenant.
FAIR = "/fair/v1/"
FAIRNESS = {"fairness_id": True}
FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def token(tenant: str, secret: bytes = JWT_SECRET) -> str:
    """An HS256 JWT whose ``tenant`` claim the identity filter copies into the header."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k"}).encode())
    claims = _b64(json.dumps({"iss": "idp", "sub": "user", "tenant": tenant}).encode())
    signed = f"{header}.{claims}".encode()
    return f"{header}.{claims}.{_b64(hmac.digest(secret, signed, hashlib.sha256))}"


JWKS = json.dumps({"keys": [{"kty": "oct", "alg": "HS256", "kid": "k", "k": _b64(JWT_SECRET)}]})


JWT_AUTHN_TYPE = "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication"


def identity_filters() -> list[dict[str, Any]]:
    """A client's tenant header removed, then set from a verified token (a request
    without a token passes without one: the processor refuses it)."""
    guard = {
        "name": "tenant-guard",
        "typed_config": {
            "@type": carrier_headers.FILTER_TYPE,
            "mutations": {"request_mutations": [{"remove": TENANT_HEADER}]},
        },
    }
    jwt = {
        "name": "envoy.filters.http.jwt_authn",
        "typed_config": {
            "@type": JWT_AUTHN_TYPE,
            "providers": {
                "idp": {
                    "issuer": "idp",
                    "local_jwks": {"inline_string": JWKS},
                    "claim_to_headers": [{"header_name": TENANT_HEADER, "claim_name": "tenant"}],
                    "forward": True,
                }
            },
            "rules": [
                {
                    "match": {"prefix": "/"},
                    "requires": {
                        "requires_any": {
                            "requirements": [{"provider_name": "idp"}, {"allow_missing": {}}]
                        }
                    },
                }
            ],
        },
    }
    return [guard, jwt]


EXT_PROC = "envoy.filters.http.ext_proc"
PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"


def edit(config: dict[str, Any]) -> None:
    """The identity filters first; each tenant route sent its request headers where the
    filter skips them (one message per request), as envoy-config writes it."""
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    chain = hcm["typed_config"]["http_filters"]
    chain[:0] = identity_filters()
    (mode,) = [e["typed_config"]["processing_mode"] for e in chain if e["name"] == EXT_PROC]
    if mode.get("request_header_mode") != "SKIP":
        return
    sending = {**mode, "request_header_mode": "SEND"}
    for _, entry in tenant_routes(config):
        entry.setdefault("typed_per_filter_config", {})[EXT_PROC] = {
            "@type": PER_ROUTE,
            "overrides": {"processing_mode": sending},
        }


def tenant_routes(config: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Each route whose policy names a tenant source, with its virtual host."""
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    for vhost in hcm["typed_config"]["route_config"]["virtual_hosts"]:
        for entry in vhost["routes"]:
            policy = entry.get("metadata", {}).get("filter_metadata", {})
            if "tenant" in policy.get("ext_proc.token_policy", {}):
                yield vhost, entry


def tenant_stack(
    workdir: Path, source: Path, routes: list[dict[str, Any]], change: Any, **more: Any
) -> Iterator[Stack]:
    """The stack of ``routes`` behind ``source`` edited by ``change``, with a tenant key
    (and ``more`` of the stack's settings)."""
    key_file = workdir / "tenant.key"
    key_file.write_bytes(TENANT_KEY)
    stack = Stack(
        workdir,
        source=source,
        routes=routes,
        processor_config={"tenants": {"key_file": str(key_file)}},
        edit=change,
        **more,
    )
    with stack as running:
        yield running


@pytest.fixture(scope="module", params=list(BODY_MODES))
def tenanted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    routes = [
        route("tenant", PREFIX, {"action": "strip", "tenant": f"header:{TENANT_HEADER}"}),
        route("team-route", "/team/v1/", {"action": "strip", "tenant": "route:team-c"}),
        route("team-root", "/team-root/", {"action": "strip", "tenant": "route:team-d"}, "/"),
        route("fair", FAIR, {"action": "strip", "tenant": f"header:{TENANT_HEADER}", **FAIRNESS}),
    ]
    workdir = tmp_path_factory.mktemp(f"tenants-{request.param}")
    yield from tenant_stack(workdir, BODY_MODES[request.param], routes, edit)


@pytest.fixture
def gateway(tenanted: Stack) -> Stack:
    tenanted.clear()
    return tenanted


def salt(tenant: str, part: str | None = None) -> str:
    return tenants.salt(tenants.key_for(TENANT_KEY, tenant), part)


def by_header(value: str) -> str:
    """The tenant the processor reads from the header's value (its bytes, typed by the
    header's name)."""
    return f"header:{TENANT_HEADER}:{value.encode().decode('latin-1')}"


def post(stack: Stack, body: dict[str, Any], path: str = URL, **headers: str) -> httpx.Response:
    return httpx.post(stack.url + path, json=body, headers=headers, timeout=30)


def exact(document: dict[str, Any]) -> bytes:
    """The bytes the processor writes a document as (compact, UTF-8)."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def test_the_edited_config_passes_check_envoy(tenanted: Stack) -> None:
    written = yaml.safe_load((tenanted.workdir / "envoy.yaml").read_text())
    report = check_envoy.check(written)
    assert [f for f in report.findings if f.code.startswith("tenant-")] == []
    # The check sees what is at stake: without the override, one message fails it.
    for vhost in written["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]["route_config"]["virtual_hosts"]:
        for entry in vhost["routes"]:
            entry.get("typed_per_filter_config", {}).pop(EXT_PROC, None)
    skipped = [f.code for f in check_envoy.check(written).findings if f.code.startswith("tenant-")]
    one_message = "tenants-one-message" in tenanted.workdir.name
    assert skipped == (["tenant-headers-skipped"] * 4 if one_message else [])


def test_two_tenants_get_their_own_salts_whatever_they_send(gateway: Stack) -> None:
    for tenant in ("team-a", "team-b"):
        gateway.clear()
        sent = chat()
        # A forged tenant header, a forged Dynamo tenant and a forged salt header (vLLM
        # PR #57609's, which would win over the body's): none names the partition.
        forged = {TENANT_HEADER: "team-z", "x-tenant-id": "team-z", "x-cache-salt": "z"}
        answer = post(gateway, sent, authorization=f"Bearer {token(tenant)}", **forged)
        assert answer.status_code == 200, answer.text
        received = only_request(gateway)
        assert received.body == exact({**sent, "cache_salt": salt(by_header(tenant))})
        assert received.header("x-tenant-id") == []
        assert received.header("x-cache-salt") == []
        assert received.header(TENANT_HEADER) == [tenant]


def partition(tenant: str) -> str:
    """The partition id the processor reports for ``tenant`` (tenants.tag)."""
    return tenants.tag(tenants.key_for(TENANT_KEY, tenant))


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_the_fairness_id_reaching_llm_d_is_the_tenants_own(gateway: Stack, method: str) -> None:
    """Whatever copies the client sends, the upstream reads one fairness id: the
    partition id of the tenant the token names, in every arrangement, with a body or
    without."""
    forged = [(FAIRNESS_HEADER, "team-z"), (FAIRNESS_HEADER, "team-y"), (TENANT_HEADER, "team-z")]
    headers = [("authorization", f"Bearer {token('team-a')}"), *forged]
    path = f"{FAIR}chat/completions" if method == "POST" else f"{FAIR}models"
    body = json.dumps(chat()).encode() if method == "POST" else None
    sent = [*headers, ("content-type", "application/json")] if body else headers
    answer = httpx.request(method, gateway.url + path, headers=sent, content=body, timeout=30)
    assert answer.status_code == 200, answer.text
    (received,) = gateway.received()
    assert received.header(FAIRNESS_HEADER) == [partition(by_header("team-a"))]
    assert received.header(TENANT_HEADER) == ["team-a"]
    assert FAIRNESS_HEADER.encode() + b": " + partition(by_header("team-a")).encode() in (
        received.raw
    )
    # Without a token the route refuses the request, the client's copy with it.
    gateway.clear()
    refused = httpx.request(method, gateway.url + path, headers=forged, content=body)
    assert refused.status_code == 401, refused.text
    assert gateway.received() == []


def test_a_clients_salt_is_combined_with_its_tenant(gateway: Stack) -> None:
    stolen = salt(by_header("team-a"))
    sent = chat(cache_salt=stolen)
    answer = post(gateway, sent, authorization=f"Bearer {token('team-b')}")
    assert answer.status_code == 200, answer.text
    received = only_request(gateway)
    assert received.body == exact({**sent, "cache_salt": salt(by_header("team-b"), stolen)})


def test_a_route_tenant_needs_no_credential(gateway: Stack) -> None:
    sent = chat()
    answer = post(gateway, sent, "/team/v1/chat/completions")
    assert answer.status_code == 200, answer.text
    assert only_request(gateway).body == exact({**sent, "cache_salt": salt("route:team-c")})


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {TENANT_HEADER: "team-a"},  # a client's own copy: removed before the token is read
        {"x-tenant-id": "team-a"},
    ],
    ids=["nothing", "forged-header", "dynamo-header"],
)
def test_a_request_naming_no_tenant_is_refused(gateway: Stack, headers: dict[str, str]) -> None:
    answer = post(gateway, chat(), **headers)
    assert answer.status_code == 401
    error = answer.json()["error"]
    assert error["type"] == "UnauthorizedError"
    assert error["code"] == 401
    assert TENANT_HEADER in error["message"]
    assert gateway.received() == []


def test_a_token_of_another_signer_names_no_tenant(gateway: Stack) -> None:
    forged = token("team-a", secret=b"not-the-identity-providers-secret!!")
    answer = post(gateway, chat(), authorization=f"Bearer {forged}")
    assert answer.status_code == 401  # jwt_authn refuses the token itself
    assert gateway.received() == []


def test_tenants_beyond_latin_1_are_told_apart(gateway: Stack) -> None:
    """The identity filter writes a claim's UTF-8 into the header; every arrangement
    reads those bytes, so no two tenants share a salt."""
    seen = set()
    for tenant in ("研究所", "ラボ部", "???"):
        gateway.clear()
        sent = chat()
        answer = post(gateway, sent, authorization=f"Bearer {token(tenant)}")
        assert answer.status_code == 200, answer.text
        received = only_request(gateway)
        assert received.body == exact({**sent, "cache_salt": salt(by_header(tenant))})
        seen.add(received.body)
    assert len(seen) == 3


def test_a_tenant_holding_a_comma_is_refused(gateway: Stack) -> None:
    """With one message per request Envoy hands two values over joined by a comma: a
    comma names no tenant in any arrangement."""
    answer = post(gateway, chat(), authorization=f"Bearer {token('team-a,team-b')}")
    assert answer.status_code == 401, answer.text
    assert gateway.received() == []


@pytest.mark.parametrize(
    "path",
    [
        "/team/v1/messages",
        "/team/v1/embeddings",
        "/team-root/api/chat",
        "/team-root/api/generate",
        "/team-root/vertex_generate",
        "/team-root/cohere/v2/chat",
        "/team-root/v2/embed",
        "/team-root/invocations",
        "/team-root/v1/not-an-endpoint",
    ],
)
def test_an_endpoint_that_does_not_carry_the_salt_is_refused(gateway: Stack, path: str) -> None:
    body = {"instances": [{"text": "hi"}], "parameters": {"cache_salt": salt("route:team-c")}}
    answer = post(gateway, {**chat(), **body}, path)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "BadRequestError"
    assert "cache_salt" in error["message"]
    assert gateway.received() == []


@pytest.mark.parametrize(
    "path", ["/team-root/generate", "/team-root/v1/completions", "/team/v1/tokenize"]
)
def test_what_carries_the_salt_or_caches_nothing_is_served(gateway: Stack, path: str) -> None:
    sent = {"model": "m", "prompt": "hi", "text": "hi"}
    answer = post(gateway, sent, path)
    assert answer.status_code == 200, answer.text
    tenant = "route:team-d" if path.startswith("/team-root/") else "route:team-c"
    # Every body of a tenant route is written with its salt (an engine ignores it where
    # its model has none).
    assert only_request(gateway).body == exact({**sent, "cache_salt": salt(tenant)})


STORED = "/v1/responses/resp_0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"/tenant{STORED}"),
        ("POST", f"/tenant{STORED}/cancel"),
        ("DELETE", f"/tenant{STORED}"),
        ("GET", "/tenant/v1/models"),
    ],
)
def test_a_bodiless_request_naming_no_tenant_is_refused(
    gateway: Stack, method: str, path: str
) -> None:
    """A stored response is read and cancelled by its id alone: without a body the
    request must still reach the processor and name its tenant, in every arrangement."""
    answer = httpx.request(method, gateway.url + path, headers={TENANT_HEADER: "team-a"})
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["type"] == "UnauthorizedError"
    assert gateway.received() == []


def test_a_bodiless_request_of_a_tenant_is_served(gateway: Stack) -> None:
    answer = httpx.get(
        gateway.url + f"/tenant{STORED}", headers={"authorization": f"Bearer {token('team-a')}"}
    )
    assert answer.status_code == 200, answer.text
    (received,) = gateway.received()
    assert (received.method, received.target, received.body) == ("GET", STORED, b"")
    assert received.header(TENANT_HEADER) == ["team-a"]
    # A route's tenant needs no credential.
    gateway.clear()
    assert httpx.get(gateway.url + f"/team{STORED}").status_code == 200
    (received,) = gateway.received()
    assert (received.target, received.body) == (STORED, b"")


@pytest.mark.parametrize(
    "path", ["/team/v1/realtime", "/team-root/api/chat", "/team-root/static/x/v1/models"]
)
def test_a_bodiless_request_to_an_endpoint_not_served_is_refused(gateway: Stack, path: str) -> None:
    answer = httpx.get(gateway.url + path)
    assert answer.status_code == 400, answer.text
    assert "cache_salt" in answer.json()["error"]["message"]
    assert gateway.received() == []


def test_a_websocket_upgrade_reaches_no_upstream(gateway: Stack) -> None:
    """vLLM's realtime API is a WebSocket: the upgrade is a request without a body on a
    path a tenant route does not serve."""
    upgrade = {
        "connection": "Upgrade",
        "upgrade": "websocket",
        "sec-websocket-version": "13",
        "sec-websocket-key": base64.b64encode(b"0123456789abcdef").decode(),
    }
    for path in ("/team/v1/realtime", f"/tenant{STORED}"):
        answer = httpx.get(gateway.url + path, headers=upgrade)
        assert answer.status_code in (400, 401, 403), answer.text
    assert gateway.received() == []


def _json_name(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(part.title() for part in rest)


def _respelt(how: str) -> Any:
    """``edit``, then each tenant route's request headers skipped in a spelling Envoy's
    parser reads alike: SKIP by its enum number in the route's override; or the
    override sending them moved to the virtual host and the route's own, more
    specific, skipping them with its fields by their JSON names or inside a
    TypedStruct. check-envoy reads each as headers sent."""

    def change(config: dict[str, Any]) -> None:
        edit(config)
        for vhost, entry in tenant_routes(config):
            configs = entry["typed_per_filter_config"]
            override = configs[EXT_PROC]
            mode = override["overrides"]["processing_mode"]
            if how == "enum-number":
                mode["request_header_mode"] = 2
                continue
            vhost.setdefault("typed_per_filter_config", {})[EXT_PROC] = dict(override)
            skipping = {**mode, "request_header_mode": "SKIP"}
            if how == "typed-struct":
                configs[EXT_PROC] = {
                    "@type": "type.googleapis.com/xds.type.v3.TypedStruct",
                    "type_url": PER_ROUTE,
                    "value": {"overrides": {"processing_mode": skipping}},
                }
            else:
                camel = {_json_name(k): v for k, v in skipping.items()}
                configs[EXT_PROC] = {"@type": PER_ROUTE, "overrides": {"processingMode": camel}}

    return change


RESPELLINGS = ["enum-number", "json-names", "typed-struct"]


@pytest.fixture(scope="module", params=RESPELLINGS)
def respelt(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    routes = [route("tenant", PREFIX, {"action": "strip", "tenant": f"header:{TENANT_HEADER}"})]
    workdir = tmp_path_factory.mktemp(f"tenants-respelt-{request.param}")
    yield from tenant_stack(workdir, BODY_MODES["one-message"], routes, _respelt(request.param))


def test_a_config_check_envoy_passes_forwards_no_request_naming_no_tenant(
    respelt: Stack,
) -> None:
    """check-envoy's word that a tenant route is sent its request headers must hold in
    the real Envoy, however the config spells it: else a stored response's read is
    forwarded naming no tenant."""
    written = yaml.safe_load((respelt.workdir / "envoy.yaml").read_text())
    found = [f.code for f in check_envoy.check(written).findings if f.code.startswith("tenant-")]
    bodiless = httpx.get(respelt.url + f"/tenant{STORED}")
    assert found or bodiless.status_code == 401, (bodiless.status_code, respelt.received())


# --- a prefill/decode pair knows its tenant -----------------------------------------------

# Copies of the shipped prefill (mint) and decode (honor) routes, by prefix: the tenant
# source each names (None: none), every honor route refusing unproven parameters (400).
PAIR_ROUTES = {
    "/team-a/prefill/v1/": ("prefill", "route:team-a"),
    "/team-a/v1/": ("disaggregated", "route:team-a"),
    "/team-b/v1/": ("disaggregated", "route:team-b"),
    "/untenanted/v1/": ("disaggregated", None),
}


def pair_routes(config: dict[str, Any]) -> None:
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    (vhost,) = hcm["typed_config"]["route_config"]["virtual_hosts"]
    shipped = {entry.get("name"): entry for entry in vhost["routes"]}
    at = vhost["routes"].index(shipped["prefill"])
    for prefix, (name, source) in PAIR_ROUTES.items():
        entry = copy.deepcopy(shipped[name])
        entry["name"] = f"pair{prefix.replace('/', '-')}"
        entry["match"] = {"prefix": prefix}
        policy = entry["metadata"]["filter_metadata"]["ext_proc.token_policy"]
        if source is not None:
            policy["tenant"] = source
        if name == "disaggregated":
            policy["unproven"] = "deny"
        envoygen.state_rewrite(entry)
        vhost["routes"].insert(at, entry)


@pytest.fixture(scope="module")
def paired(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("tenant-pairs")
    yield from tenant_stack(
        workdir, BODY_MODES["one-message"], [], pair_routes, proof_keys={KEY_ID: new_key()}
    )


def test_a_proof_reaches_no_upstream_on_a_route_of_another_partition(paired: Stack) -> None:
    """vLLM caches the KV a decode leg loads under the decode request's salt: a proof
    minted on team a's route, honored on team b's or on one of no tenant, would put team
    a's prompt in that partition; and the reverse. Each is refused before anything is
    forwarded; on team a's own decode route it is honored."""
    prefill = chat(max_tokens=1, return_token_ids=True)
    minted = {}
    for path in ("/team-a/prefill/v1/", "/pd/prefill/v1/"):
        reply = post(paired, prefill, path + "chat/completions")
        assert reply.status_code == 200, reply.text
        minted[path] = reply.json()["kv_transfer_params"]
    team_a, untenanted = minted["/team-a/prefill/v1/"], minted["/pd/prefill/v1/"]
    for index, (path, params) in enumerate(
        [("/team-b/v1/", team_a), ("/untenanted/v1/", team_a), ("/team-a/v1/", untenanted)]
    ):
        paired.clear()
        rid = f"pair-{index}"
        answer = post(paired, chat(params), path + "chat/completions", **{"x-request-id": rid})
        assert answer.status_code == 400, answer.text
        assert paired.received_count() == 0
        assert access_log(paired, rid)["policy_reason"] == "proof_partition_mismatch"
    paired.clear()
    sent = chat(team_a)
    answer = post(paired, sent, "/team-a/v1/chat/completions")
    assert answer.status_code == 200, answer.text
    assert only_request(paired).body == exact({**sent, "cache_salt": salt("route:team-a")})


RATE_LIMITED = ENVOY / "envoy-ratelimit.yaml"
JWT_ROUTE = "/jwt/v1/"


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """envoy-ratelimit.yaml as shipped (its route tenants), with a route whose tenant
    a verified token names."""
    routes = [route("jwt", JWT_ROUTE, {"action": "strip", "tenant": f"header:{TENANT_HEADER}"})]
    workdir = tmp_path_factory.mktemp("tenants-rate-limited")
    yield from tenant_stack(workdir, RATE_LIMITED, routes, edit)


def bucket_size() -> int:
    config = yaml.safe_load(RATE_LIMITED.read_text())
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    chain = hcm["typed_config"]["http_filters"]
    (limit,) = [f for f in chain if f["name"] == "envoy.filters.http.local_ratelimit"]
    (descriptor,) = limit["typed_config"]["descriptors"]
    return int(descriptor["token_bucket"]["max_tokens"])


def test_a_tenant_over_its_bucket_gets_429_while_the_others_pass(limited: Stack) -> None:
    """Each tenant is counted in its own bucket, keyed on the partition id only the
    processor reports: headers naming another tenant (its identity header, Dynamo's,
    llm-d's fairness id) change nothing, and a request naming no tenant is refused
    before it takes anyone's token."""
    assert check_envoy.check(yaml.safe_load(RATE_LIMITED.read_text())).errors == []
    written = yaml.safe_load((limited.workdir / "envoy.yaml").read_text())
    found = check_envoy.check(written).findings
    assert [f for f in found if f.code.startswith(("tenant-", "filter-"))] == []
    url = f"{limited.url}{JWT_ROUTE}chat/completions"
    forged = {TENANT_HEADER: "team-b", "x-tenant-id": "team-b", FAIRNESS_HEADER: "team-b"}

    def as_tenant(name: str, **headers: str) -> httpx.Response:
        return httpx.post(
            url, json=chat(), headers={"authorization": f"Bearer {token(name)}", **headers}
        )

    size = bucket_size()
    for _ in range(size):
        assert as_tenant("team-a", **forged).status_code == 200
    for _ in range(3):
        assert httpx.post(url, json=chat(), headers=forged).status_code == 401
    limited.clear()
    over = as_tenant("team-a", **forged)
    assert over.status_code == 429, over.text
    assert over.json()["error"] == {
        "message": "the tenant's rate limit is exceeded",
        "type": "RateLimitError",
        "param": None,
        "code": 429,
    }
    assert limited.received() == []
    # Team b's bucket was never charged by team a's forged headers, nor by the refused.
    for _ in range(size):
        assert as_tenant("team-b").status_code == 200
    assert as_tenant("team-b").status_code == 429
    # A route's tenant has its own bucket; the routes without one share another.
    assert post(limited, chat(), "/team-a/v1/chat/completions").status_code == 200
    assert post(limited, chat(), "/v1/chat/completions").status_code == 200
