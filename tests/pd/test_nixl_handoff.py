"""The prefill/decode hand-off through the gateway, against a real NIXL pair.

The oracle is the decode server's own counters: ``external`` prompt tokens (their KV
read from the prefill server) and the bytes NIXL moved, against ``local`` ones
(recomputed). The recorders show what reached each server.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from tests.e2e.test_handoff import PREFILL_REQUEST_PARAMS
from tests.e2e.test_make_run import pasted_handoff
from tests.pd.conftest import RESULTS, Gateway
from tests.pd.pair import KvCounters, Pair

CHAT = "/v1/chat/completions"
PREFILL = "/pd/prefill" + CHAT
DECODE = "/pd" + CHAT
# What every P/D orchestrator sends on the prefill leg (the tests' own statement of it,
# not the package's connector request: an oracle apart from the code under test).
ORCHESTRATOR = PREFILL_REQUEST_PARAMS
# The connector's keys a prefill response carries for the decode server.
CONNECTOR_KEYS = {"do_remote_prefill", "remote_engine_id", "remote_block_ids", "remote_host"}
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")
_prompts = itertools.count()


def messages() -> list[dict[str, str]]:
    """A prompt of a few hundred tokens no earlier request shared (no prefix cache
    hit on either server)."""
    n = next(_prompts)
    words = " ".join(WORDS[(n + i) % len(WORDS)] for i in range(40))
    return [{"role": "user", "content": f"hand-off {n} {time.time_ns()} {words}"}]


def post(gateway: Gateway, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(gateway.url + path, json=body, timeout=120)


def prefill(gateway: Gateway, chat: list[dict[str, str]], params: Any = ORCHESTRATOR) -> Any:
    # return_token_ids: the minted parameters carry the prompt's ids too, as in make run's
    # example, and the decode server runs on them.
    body: dict[str, Any] = {
        "model": "tiny",
        "messages": chat,
        "max_tokens": 1,
        "return_token_ids": True,
    }
    if params is not None:
        body["kv_transfer_params"] = params
    reply = post(gateway, PREFILL, body)
    assert reply.status_code == 200, reply.text
    minted = reply.json()["kv_transfer_params"]
    assert set(minted) >= CONNECTOR_KEYS, minted
    assert minted["token_policy_proof"].startswith("tp4.")
    return minted


def settled(pair: Pair, before: KvCounters, prompt_tokens: int) -> KvCounters:
    """The counters' change once the decode server published the request's prompt
    tokens (its metrics follow its responses by a moment)."""
    deadline = time.monotonic() + 10
    while True:
        delta = pair.kv_counters() - before
        if delta.external + delta.local >= prompt_tokens or time.monotonic() > deadline:
            return delta
        time.sleep(0.1)


def decode(
    gateway: Gateway, pair: Pair, chat: list[dict[str, str]], params: Any
) -> tuple[KvCounters, int]:
    """The decode leg: the counters' change and the prompt's tokens."""
    before = pair.kv_counters()
    body = {"model": "tiny", "messages": chat, "max_tokens": 8, "kv_transfer_params": params}
    reply = post(gateway, DECODE, body)
    assert reply.status_code == 200, reply.text
    tokens = reply.json()["usage"]["prompt_tokens"]
    return settled(pair, before, tokens), tokens


def assert_moved(delta: KvCounters, tokens: int) -> None:
    assert delta.external == tokens, delta
    assert delta.local == 0, delta
    assert delta.nixl_bytes > 0, delta


def assert_recomputed(delta: KvCounters, tokens: int) -> None:
    assert delta.external == 0, delta
    assert delta.nixl_bytes == 0, delta
    assert delta.local == tokens, delta


_DECISIONS = re.compile(r"^ext_proc_decisions_total\{([^}]*)\} ([0-9.e+]+)$", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def decisions(gateway: Gateway) -> Counter[tuple[str, str, str]]:
    """The processor's decisions so far: (route, action, reason) -> count."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for labels, value in _DECISIONS.findall(httpx.get(gateway.metrics, timeout=10).text):
        label = dict(_LABEL.findall(labels))
        counts[label["route"], label["action"], label["reason"]] += int(float(value))
    return counts


def report(what: str, legs: Counter[tuple[str, str, str]], delta: KvCounters, tokens: int) -> None:
    """One line of the tier's summary: a hand-off's decisions and what the decode server
    did with its prompt."""
    RESULTS.append(
        f"{what}: decisions "
        + ", ".join(f"{route} {action}/{reason}" for route, action, reason in legs)
        + f"; decode server: external_kv_transfer +{delta.external:.0f}, "
        f"local_compute +{delta.local:.0f}, nixl bytes +{delta.nixl_bytes:.0f} "
        f"({tokens} prompt tokens)"
    )


def test_the_printed_hand_off_moves_the_kv_cache(gateway: Gateway, pair: Pair) -> None:
    """make run's hand-off, pasted as printed: its prefill request carries no transfer
    parameters; the route writes the connector request and the KV cache moves."""
    gateway.prefill.clear()
    gateway.decode.clear()
    before = pair.kv_counters()
    decided = decisions(gateway)
    shown, decoded = pasted_handoff(gateway.output.read_text(), timeout=300)
    assert set(json.loads(shown)) >= CONNECTOR_KEYS
    tokens = json.loads(decoded)["usage"]["prompt_tokens"]
    delta = settled(pair, before, tokens)
    assert_moved(delta, tokens)
    assert b'"do_remote_decode":true' in gateway.prefill.received()
    # The proven decode request reaches the decode server as sent, proof included.
    assert b"token_policy_proof" in gateway.decode.received()
    # One decision per leg: the prefill request, its response, the decode request.
    legs = decisions(gateway) - decided
    assert legs == Counter(
        {
            ("prefill", "strip", "connector_written"): 1,
            ("prefill", "mint", "minted"): 1,
            ("disaggregated", "honor", "trusted_proof"): 1,
        }
    ), legs
    report("make run's printed hand-off", legs, delta, tokens)


def test_a_clients_connector_keys_never_reach_the_prefill_server(
    gateway: Gateway, pair: Pair
) -> None:
    chat = messages()
    steering = {
        "do_remote_decode": True,
        "do_remote_prefill": True,
        "remote_engine_id": "client-chosen-engine",
        "remote_block_ids": [7, 8, 9],
        "remote_host": "203.0.113.77",
        "remote_port": 47931,
    }
    gateway.prefill.clear()
    minted = prefill(gateway, chat, steering)
    forwarded = gateway.prefill.received()
    for value in (b"client-chosen-engine", b"203.0.113.77", b"47931", b"[7,8,9]"):
        assert value not in forwarded
    assert b'"do_remote_decode":true' in forwarded
    assert minted["remote_host"] == "127.0.0.1"  # the prefill server's own side channel
    delta, tokens = decode(gateway, pair, chat, minted)
    assert_moved(delta, tokens)


def _shifted(blocks: list[Any]) -> list[Any]:
    """Each block id one further (the ids come in one list per KV cache group)."""
    return [_shifted(b) if isinstance(b, list) else b + 1 for b in blocks]


def _other_blocks(params: dict[str, Any]) -> dict[str, Any]:
    return {**params, "remote_block_ids": _shifted(params["remote_block_ids"])}


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(_other_blocks, id="other-blocks"),
        pytest.param(lambda p: {**p, "remote_port": p["remote_port"] + 1}, id="other-port"),
        pytest.param(lambda p: {**p, "remote_host": "127.0.0.2"}, id="other-host"),
        pytest.param(
            lambda p: {k: v for k, v in p.items() if k != "token_policy_proof"}, id="no-proof"
        ),
        pytest.param(
            lambda p: {**p, "prompt_token_ids": p["prompt_token_ids"][1:]}, id="other-ids"
        ),
    ],
)
def test_tampered_parameters_move_nothing(gateway: Gateway, pair: Pair, tamper: Any) -> None:
    """Tampered parameters reach the decode server as nothing (it recomputes); the same
    parameters untouched then move blocks, which were there all along (only those past
    what the recomputation left in the decode server's prefix cache)."""
    chat = messages()
    minted = prefill(gateway, chat)
    gateway.decode.clear()
    delta, tokens = decode(gateway, pair, chat, tamper(minted))
    assert_recomputed(delta, tokens)
    assert b"kv_transfer_params" not in gateway.decode.received()
    delta, tokens = decode(gateway, pair, chat, minted)
    assert delta.external > 0, delta
    assert delta.nixl_bytes > 0, delta
    assert delta.local == 0, delta


def test_a_proof_for_another_prompt_moves_nothing(gateway: Gateway, pair: Pair) -> None:
    minted = prefill(gateway, messages())
    other = messages()
    delta, tokens = decode(gateway, pair, other, minted)
    assert_recomputed(delta, tokens)


def _hand_off(
    pair: Pair, prefill_at: str, decode_at: str, chat: list[dict[str, str]]
) -> tuple[float, float, KvCounters, int]:
    """One hand-off, the prefill leg sent to ``prefill_at`` and the decode leg to
    ``decode_at`` with what the prefill leg answered: the two legs' seconds (nothing
    else inside the spans), then the decode server's counters once settled."""
    body: dict[str, Any] = {
        "model": "tiny",
        "messages": chat,
        "max_tokens": 1,
        "return_token_ids": True,
        "kv_transfer_params": ORCHESTRATOR,
    }
    before = pair.kv_counters()
    started = time.monotonic()
    reply = httpx.post(prefill_at, json=body, timeout=120)
    handed = time.monotonic()
    assert reply.status_code == 200, reply.text
    params = reply.json()["kv_transfer_params"]
    body = {"model": "tiny", "messages": chat, "max_tokens": 8, "kv_transfer_params": params}
    reply = httpx.post(decode_at, json=body, timeout=120)
    done = time.monotonic()
    assert reply.status_code == 200, reply.text
    tokens = reply.json()["usage"]["prompt_tokens"]
    return handed - started, done - handed, settled(pair, before, tokens), tokens


def test_twenty_hand_offs_each_move_the_kv_cache(gateway: Gateway, pair: Pair) -> None:
    """Twenty hand-offs through the gateway and twenty straight to the pair, taken in
    turn, each arm timing the same spans (the prefill leg, the decode leg, both; the
    metrics' settling outside them), for the record (the summary), never asserted on:
    a shared machine's speed says nothing about the code."""
    arms = {
        "through the gateway": (gateway.url + PREFILL, gateway.url + DECODE),
        "straight to the pair": (pair.prefill + CHAT, pair.decode + CHAT),
    }
    spans: dict[str, dict[str, list[float]]] = {
        arm: {"prefill leg": [], "decode leg": [], "whole hand-off": []} for arm in arms
    }
    for _ in range(20):
        for arm, (prefill_at, decode_at) in arms.items():
            first, second, delta, tokens = _hand_off(pair, prefill_at, decode_at, messages())
            assert_moved(delta, tokens)
            spans[arm]["prefill leg"].append(first)
            spans[arm]["decode leg"].append(second)
            spans[arm]["whole hand-off"].append(first + second)
    for arm, by_span in spans.items():
        for span, values in by_span.items():
            RESULTS.append(f"{arm}, {span} (s): {_spread(values)}")
    gateway_spans, straight = spans["through the gateway"], spans["straight to the pair"]
    for span, values in gateway_spans.items():
        RESULTS.append(f"the gateway adds, {span} (ms): {_added(values, straight[span])}")


def _added(through: list[float], straight: list[float]) -> str:
    """The gateway arm's median and p90 minus the straight arm's, in milliseconds."""
    return (
        f"median {1000 * (statistics.median(through) - statistics.median(straight)):+.1f}, "
        f"p90 {1000 * (_p90(through) - _p90(straight)):+.1f}"
    )


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.9 * (len(ordered) - 1))]


def _spread(values: list[float]) -> str:
    ordered = sorted(values)
    return (
        f"n={len(values)} min {ordered[0]:.3f} median {statistics.median(ordered):.3f} "
        f"p90 {_p90(ordered):.3f} max {ordered[-1]:.3f}"
    )
