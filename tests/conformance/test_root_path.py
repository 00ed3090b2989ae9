"""vLLM's token-in and echo endpoints behind its root path, against a real vLLM started
with ``--root-path /x`` (and the scale-out endpoints).

Starlette strips the root path before routing, so such a server also serves
``/x/inference/v1/generate`` and ``/x/v1/chat/completions/render``: a client's chosen ids
run there with no template (``usage`` counts exactly them). Through the shipped gateway,
whose default route forwards ``/x/...`` unchanged, those paths are answered 404 in vLLM's
error shape and nothing reaches vLLM (a recorder sits between Envoy and vLLM), while the
chat endpoint under the same root path is still served, its ids stripped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from devstack import processes
from ext_proc.core.address import HostPort
from tests.conformance import vllm_env
from tests.conformance.results import record
from tests.conformance.test_vllm import IDS, chat_body, post, prompt_count
from tests.e2e.stack import Stack
from tests.recorder import Recorder

ROOT = "/x"
NOT_FOUND = {"error": {"message": "not found", "type": "NotFoundError", "param": None, "code": 404}}
GENERATE = {"model": "tiny", "token_ids": IDS, "sampling_params": {"max_tokens": 1}}
# Each token endpoint behind the root path, with a body it accepts.
BEHIND_ROOT = {
    "/inference/v1/generate": GENERATE,
    "/v1/chat/completions/render": chat_body(),
    "/v1/completions/render": {"model": "tiny", "prompt": "hello"},
    "/v1/chat/completions/derender": {**chat_body(), "generate_response": {"choices": []}},
    "/v1/completions/derender": {"model": "tiny", "generate_responses": []},
}


@pytest.fixture(scope="module")
def rooted() -> Iterator[str]:
    args = [*vllm_env.scale_out_args(), "--root-path", ROOT]
    with vllm_env.run_vllm(processes.free_port(), extra_args=args) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def recorder(rooted: str) -> Iterator[Recorder]:
    with Recorder(HostPort.parse(rooted.removeprefix("http://"))).running() as running:
        yield running


@pytest.fixture(scope="module")
def gateway(recorder: Recorder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    assert recorder.address is not None
    with Stack(tmp_path_factory.mktemp("rooted"), real_upstream=recorder.address) as stack:
        yield stack


def test_the_token_in_api_runs_a_clients_ids_behind_the_root_path(rooted: str) -> None:
    # The finding: straight to vLLM, the ids are the whole prompt.
    count = prompt_count(post(rooted, ROOT + "/inference/v1/generate", GENERATE))
    record("straight, --root-path /x", "/x/inference/v1/generate", count)
    assert count == len(IDS)
    reply = post(rooted, ROOT + "/v1/chat/completions/render", chat_body())
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("path", BEHIND_ROOT)
def test_the_gateway_answers_them_404_behind_the_root_path(
    gateway: Stack, recorder: Recorder, path: str
) -> None:
    recorder.clear()
    reply = post(gateway.url, ROOT + path, BEHIND_ROOT[path])
    record("gateway, --root-path /x", ROOT + path, reply.status_code)
    assert reply.status_code == 404, reply.text
    assert json.loads(reply.content) == NOT_FOUND
    assert recorder.received() == b""


def test_the_chat_endpoint_behind_the_root_path_is_still_served_templated(
    gateway: Stack, recorder: Recorder, rooted: str
) -> None:
    # The 404s are the gateway's own: vLLM is reachable under its root path, and a
    # client's ids are stripped there as anywhere.
    templated = prompt_count(post(rooted, ROOT + "/v1/chat/completions", chat_body()))
    recorder.clear()
    body = chat_body(kv_transfer_params={"prompt_token_ids": IDS})
    count = prompt_count(post(gateway.url, ROOT + "/v1/chat/completions", body))
    assert count == templated > len(IDS)
    assert b"POST /x/v1/chat/completions " in recorder.received()
    assert b"prompt_token_ids" not in recorder.received()
