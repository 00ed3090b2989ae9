"""vLLM's token-in endpoints are not public: the real Envoy answers them 404 in vLLM's
error shape whatever spelling of the path a client tries, and forwards nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.e2e.envoy_alone import REPO, Gateway, request, running

NOT_FOUND = {"error": {"message": "not found", "type": "NotFoundError", "param": None, "code": 404}}
IDS = json.dumps({"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 1}}).encode()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running(REPO / "envoy" / "envoy.yaml", tmp_path_factory.mktemp("token")) as running_:
        yield running_


@pytest.mark.parametrize(
    "path",
    [
        "/inference/v1/generate",
        "/render",
        "/derender",
        "/render/sub",
        "/render?x=1",
        # Spellings the path normalisation brings back to a token endpoint.
        "//render",
        "//inference//v1/generate",
        "/./render",
        "/v1/../derender",
        "/pd/v1/../../inference/v1/generate",
        "/v1/%2e%2e/render",
        "/%72ender",
        # Any case.
        "/RENDER",
        "/Inference/v1/generate",
    ],
)
def test_token_endpoints_answer_404(gateway: Gateway, path: str) -> None:
    reply = gateway.exchange(request("POST", path, IDS))
    assert reply.status == 404, reply
    assert reply.headers["content-type"] == "application/json"
    assert json.loads(reply.body) == NOT_FOUND
    assert gateway.forwarded() == []


@pytest.mark.parametrize(
    ("path", "normalised"),
    [("/v1/..%2Frender", "/render"), ("/%2Finference/v1/generate", "/inference/v1/generate")],
)
def test_escaped_slashes_redirect_to_the_normalised_path(
    gateway: Gateway, path: str, normalised: str
) -> None:
    reply = gateway.exchange(request("POST", path, IDS))
    assert reply.status == 307
    assert reply.headers["location"] == normalised
    assert gateway.forwarded() == []


def test_other_paths_reach_the_policy_routes(gateway: Gateway) -> None:
    # A policy route asks the processor first; there is none here, so it fails closed
    # (500) instead of answering 404: the token routes catch only their own paths.
    for path in ("/v1/render", "/inferences", "/pd/v1/render"):
        reply = gateway.exchange(request("POST", path, IDS))
        assert reply.status == 500, (path, reply)
    assert gateway.forwarded() == []
