"""Endpoints whose prompt is token ids (``classified.TOKEN_ENDPOINTS``: SGLang's
``/generative_scoring``, its query and items given as ids) through the real Envoy, in
every body arrangement, however the path is spelled (dot segments, a route's prefix,
case, escapes; each sent exactly as written), and nothing reaches the stand-in: the
shipped routes answer them 404 before the processor (``refused_paths``: with a body or
without); a route without those 404s (the e2e stack's test routes) reaches the
processor, which refuses them, 400 ``token_endpoint_refused``; a route whose policy has
``accept: token_endpoints`` serves them.

Unlike vLLM's token-in endpoints (tests/e2e/test_token_endpoints.py: 404s in the config
before every route, whatever a route accepts), these are judged per route: by its
policy, from the upstream path."""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest

from ext_proc.core import classified
from ext_proc.tools import envoygen
from ext_proc.tools.token_endpoints import is_token_path
from tests.e2e.conftest import BODY_MODES
from tests.e2e.stack import BODY_LIMIT, Stack, extra_routes
from tests.e2e.test_operations import access_log

# The token endpoints the processor judges: those Envoy does not answer 404 itself
# (vLLM's /inference/v1/generate is: tests/e2e/test_token_endpoints.py).
PROCESSOR_JUDGED = tuple(e for e in classified.TOKEN_ENDPOINTS if not is_token_path(e))

# The token ids SGLang's generative scoring takes: a query and the items scored after it.
SCORING = {"model": "tiny", "query": [5, 6, 7], "items": [[8, 9]]}
# A route to the aggregated stand-in at the root, its policy accepting token endpoints.
ACCEPTING = "/scoring/"


def spellings(endpoint: str) -> dict[str, str]:
    """``endpoint`` as a client may reach it through the shipped and test routes, by the
    name of the spelling (each on a route that forwards to the upstream: the root ``/``,
    ``/v1/``, ``/pd/v1/``, ``/pd/prefill/v1/`` and the deny route)."""
    head, _, last = endpoint.rpartition("/")
    return {
        "plain": endpoint,
        "dot-segment-v1": f"/v1/..{endpoint}",
        "dot-segments-pd": f"/pd/v1/../..{endpoint}",
        "escaped-dots": f"/v1/%2e%2e{endpoint}",
        "under-v1": f"/v1{endpoint}",
        "under-pd": f"/pd/v1{endpoint}",
        "under-prefill": f"/pd/prefill/v1{endpoint}",
        "under-deny": f"/deny/v1{endpoint}",
        "behind-a-root-path": f"/x{endpoint}",
        "upper": endpoint.upper(),
        "trailing-slash": f"{endpoint}/",
        "doubled-slash": f"/{endpoint}",
        "query": f"{endpoint}?stream=false",
        "escaped-letter": f"{head}/%{ord(last[0]):02x}{last[1:]}",
        # The upstream percent-decodes it and Starlette's "$" matches before it.
        "escaped-newline": f"{endpoint}%0A",
    }


# Through the shipped routes: their own 404s answer.
ANSWERED = {
    f"{name}:{path}": path
    for endpoint in PROCESSOR_JUDGED
    for name, path in spellings(endpoint).items()
    if name != "under-deny"
}
# Through the deny test route, which has no 404s of its own: the processor refuses.
REFUSED = {
    f"{name}:{path}": path
    for endpoint in PROCESSOR_JUDGED
    for name, path in spellings(endpoint).items()
    if name in ("under-deny", "upper", "trailing-slash", "escaped-letter", "escaped-newline")
    for path in (path if name == "under-deny" else f"/deny/v1{path}",)
}
NOT_FOUND = {"error": {"message": "not found", "type": "NotFoundError", "param": None, "code": 404}}


class Reply(NamedTuple):
    status: int
    body: bytes


def post(stack: Stack, path: str, body: dict[str, Any], rid: str = "") -> Reply:
    """One POST with ``path`` sent exactly as written (no client-side normalisation)."""
    connection = http.client.HTTPConnection(stack.gateway.host, stack.gateway.port, timeout=20)
    headers = {"content-type": "application/json", "connection": "close"}
    if rid:
        headers["x-request-id"] = rid
    try:
        connection.request("POST", path, json.dumps(body).encode(), headers)
        reply = connection.getresponse()
        return Reply(reply.status, reply.read())
    finally:
        connection.close()


@pytest.fixture(scope="module", params=list(BODY_MODES))
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The e2e stack with one more route: ``/scoring/`` to the upstream's root, its
    policy the aggregated one accepting token endpoints."""
    accepting = {
        "name": "scoring",
        "match": {"prefix": ACCEPTING},
        "route": {"cluster": "aggregated", "prefix_rewrite": "/"},
        "metadata": {
            "filter_metadata": {
                "ext_proc.token_policy": {"action": "strip", "accept": "token_endpoints"}
            }
        },
        "request_body_buffer_limit": BODY_LIMIT,
    }
    envoygen.state_rewrite(accepting)
    workdir = tmp_path_factory.mktemp(f"token-endpoints-{request.param}")
    source = BODY_MODES[request.param]
    with Stack(workdir, source=source, routes=[*extra_routes(), accepting]) as running:
        yield running


@pytest.mark.parametrize("path", ANSWERED.values(), ids=ANSWERED.keys())
def test_a_shipped_route_answers_a_token_endpoint_however_it_is_reached(gateway, path):
    reply = post(gateway, path, SCORING)
    assert (reply.status, json.loads(reply.body)) == (404, NOT_FOUND), reply
    assert gateway.received() == []


@pytest.mark.parametrize("path", REFUSED.values(), ids=REFUSED.keys())
def test_the_processor_refuses_a_token_endpoint_where_no_404_answers_it(gateway, path):
    rid = f"scoring-{uuid.uuid4()}"
    reply = post(gateway, path, SCORING, rid)
    assert reply.status == 400, reply
    error = json.loads(reply.body)["error"]
    assert error["type"] == "BadRequestError"
    assert any(endpoint in error["message"] for endpoint in PROCESSOR_JUDGED)
    line = access_log(gateway, rid)
    assert (line["policy_action"], line["policy_reason"]) == ("deny", "token_endpoint_refused")
    assert gateway.received() == []


@pytest.mark.parametrize("endpoint", PROCESSOR_JUDGED)
def test_a_route_accepting_token_endpoints_serves_them_byte_for_byte(gateway, endpoint):
    reply = post(gateway, ACCEPTING.rstrip("/") + endpoint, SCORING)
    assert reply.status == 200, reply
    (received,) = gateway.received()
    assert received.target == endpoint
    assert received.body == json.dumps(SCORING).encode()


@pytest.mark.parametrize("endpoint", PROCESSOR_JUDGED)
def test_an_accepted_token_endpoint_still_loses_a_clients_carriers(gateway, endpoint):
    sent = {**SCORING, "rid": "r___prefill_addr_10.0.0.9:1", "bootstrap_host": "10.0.0.9"}
    reply = post(gateway, ACCEPTING.rstrip("/") + endpoint, sent)
    assert reply.status == 200, reply
    (received,) = gateway.received()
    assert json.loads(received.body) == SCORING


@pytest.mark.parametrize("endpoint", PROCESSOR_JUDGED)
def test_a_path_that_only_ends_like_one_is_served(gateway, endpoint):
    head, _, last = endpoint.rpartition("/")
    for path in (f"/v1{head}/my_{last}", f"/v1{endpoint}_x", f"/v1{endpoint}/x"):
        gateway.clear()
        assert post(gateway, path, SCORING).status == 200, path
        (received,) = gateway.received()
        assert received.target == path
