"""llm-d's coordinator architecture against the real NIXL pair: ``make run`` with
envoy/envoy-coordinator.yaml, the coordinator (tests/e2e/coordinator.py, llm-d's
behaviour) behind its route, and the prefill and decode picks of the pool's endpoint
picker standing for the pair's two servers. The coordinator's hand-off moves the KV
cache; a client's own parameters and a forged EPP-Profile move nothing."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ext_proc.core.address import HostPort
from tests.e2e.coordinator import PROFILE, Coordinator
from tests.e2e.test_coordinator import CLIENT_PARAMS
from tests.pd.conftest import Gateway, make_run
from tests.pd.pair import Pair
from tests.pd.test_nixl_handoff import (
    CHAT,
    assert_moved,
    assert_recomputed,
    decisions,
    messages,
    report,
    settled,
)
from tests.test_devstack import free_ports

CONFIG = Path(__file__).resolve().parents[2] / "envoy" / "envoy-coordinator.yaml"


class Coordinated:
    def __init__(self, gateway: Gateway, coordinator: Coordinator) -> None:
        self.gateway = gateway
        self.coordinator = coordinator

    def post(self, body: dict[str, Any], profile: str | None = None) -> httpx.Response:
        headers = {PROFILE: profile} if profile else {}
        return httpx.post(self.gateway.url + CHAT, json=body, headers=headers, timeout=120)


@pytest.fixture(scope="module")
def coordinated(pair: Pair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinated]:
    ports = free_ports()
    gateway = HostPort("127.0.0.1", int(ports["GATEWAY_PORT"]))
    with Coordinator(gateway).running() as coordinator:
        env = {"ENVOY_CONFIG": str(CONFIG), "COORDINATOR_UPSTREAM": str(coordinator.address)}
        tmp = tmp_path_factory.mktemp("pd-coordinator")
        with make_run(pair, tmp, env, ports) as running:
            yield Coordinated(running, coordinator)


def test_the_coordinators_hand_off_moves_the_kv_cache(coordinated: Coordinated, pair: Pair) -> None:
    gateway = coordinated.gateway
    gateway.prefill.clear()
    gateway.decode.clear()
    before, decided = pair.kv_counters(), decisions(gateway)
    chat = messages()
    body = {"model": "tiny", "messages": chat, "max_tokens": 8, "kv_transfer_params": CLIENT_PARAMS}
    reply = coordinated.post(body)
    assert reply.status_code == 200, reply.text
    tokens = reply.json()["usage"]["prompt_tokens"]
    delta = settled(pair, before, tokens)
    assert_moved(delta, tokens)
    # The client's parameters were removed before the coordinator saw the request.
    assert "kv_transfer_params" not in coordinated.coordinator.received[-1]
    for recorder in (gateway.prefill, gateway.decode):
        assert b"203.0.113.77" not in recorder.received()
    # The decode request is forwarded as the coordinator sent it, its proof included.
    assert b"token_policy_proof" not in gateway.prefill.received()
    assert b"token_policy_proof" in gateway.decode.received()
    assert b'"do_remote_decode":true' in gateway.prefill.received()
    legs = decisions(gateway) - decided
    assert legs == Counter(
        {
            ("coordinator", "strip", "stripped_by_policy"): 1,
            ("coordinator-prefill", "strip", "unproven"): 1,
            ("coordinator-prefill", "mint", "minted"): 1,
            ("coordinator-decode", "honor", "trusted_proof"): 1,
        }
    ), legs
    report("coordinator (envoy/envoy-coordinator.yaml)", legs, delta, tokens)


def test_a_forged_decode_profile_moves_nothing(coordinated: Coordinated, pair: Pair) -> None:
    gateway = coordinated.gateway
    gateway.decode.clear()
    before = pair.kv_counters()
    chat = messages()
    body = {"model": "tiny", "messages": chat, "max_tokens": 8, "kv_transfer_params": CLIENT_PARAMS}
    reply = coordinated.post(body, "decode")
    assert reply.status_code == 200, reply.text
    tokens = reply.json()["usage"]["prompt_tokens"]
    assert_recomputed(settled(pair, before, tokens), tokens)
    received = gateway.decode.received()
    assert b"kv_transfer_params" not in received
    assert json.dumps(chat[0]["content"]).encode()[1:-1] in received
