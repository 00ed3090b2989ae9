"""A proof is honored once and within the connector's lease, against the real NIXL pair:
a decode leg that presents a spent proof, or one whose lease ran out, recomputes, and
the prefill server never sees a read of blocks it no longer holds for that request
(vLLM's "Potentially invalid KV blocks" error)."""

from __future__ import annotations

import time
from pathlib import Path

from ext_proc.core.config import Config
from tests.conformance import vllm_env
from tests.pd.conftest import Gateway
from tests.pd.pair import Pair
from tests.pd.test_nixl_handoff import (
    ORCHESTRATOR,
    PREFILL,
    assert_moved,
    assert_recomputed,
    decisions,
    decode,
    messages,
    post,
    prefill,
    report,
)

# vLLM's NIXL prefill server: a read of blocks it no longer holds for the request, and
# the lease running out on blocks no decode read (nixl/pull_worker.py, base_worker.py).
INVALID_READ = "Potentially invalid KV blocks"
EXPIRED = "Releasing expired KV blocks"
# The pair runs NIXL's default kv_lease_duration (tests/pd/pair.py sets none).
NIXL_LEASE_SECONDS = 30


def prefill_log(pair: Pair) -> Path:
    port = int(pair.prefill.rsplit(":", 1)[1])
    return vllm_env.log_dir() / f"vllm-{port}.log"


def test_a_replayed_proof_recomputes(gateway: Gateway, pair: Pair) -> None:
    chat = messages()
    minted = prefill(gateway, chat)
    before = decisions(gateway)
    delta, tokens = decode(gateway, pair, chat, minted)
    assert_moved(delta, tokens)
    delta, tokens = decode(gateway, pair, chat, minted)
    # Nothing read from the prefill server (the decode server may serve the prompt from
    # its own prefix cache now: the first decode left it there).
    assert delta.external == 0, delta
    assert delta.nixl_bytes == 0, delta
    legs = decisions(gateway) - before
    assert legs == {
        ("disaggregated", "honor", "trusted_proof"): 1,
        ("disaggregated", "strip", "proof_replayed"): 1,
    }, legs
    report("a replayed proof", legs, delta, tokens)
    assert INVALID_READ not in prefill_log(pair).read_text(errors="replace")


def test_a_proof_first_presented_after_the_lease_recomputes(gateway: Gateway, pair: Pair) -> None:
    # The default lifetime fits in NIXL's default lease (the configuration says so).
    assert Config().proof.kv_lease_seconds == NIXL_LEASE_SECONDS
    log = prefill_log(pair)
    chat = messages()
    body = {
        "model": "tiny",
        "messages": chat,
        "max_tokens": 1,
        "return_token_ids": True,
        "kv_transfer_params": ORCHESTRATOR,
    }
    reply = post(gateway, PREFILL, body)
    assert reply.status_code == 200, reply.text
    minted_at = time.monotonic()
    minted = reply.json()["kv_transfer_params"]
    # vLLM names the request by the response's id and a suffix of its own.
    freed = f"{EXPIRED} for request {reply.json()['id']}"
    deadline = minted_at + NIXL_LEASE_SECONDS + 30
    while freed not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, "the prefill server never freed the blocks"
        time.sleep(0.5)
    assert time.monotonic() - minted_at >= NIXL_LEASE_SECONDS - 1
    before = decisions(gateway)
    delta, tokens = decode(gateway, pair, chat, minted)
    assert_recomputed(delta, tokens)
    legs = decisions(gateway) - before
    assert legs == {("disaggregated", "strip", "proof_expired"): 1}, legs
    report("a proof presented after the lease", legs, delta, tokens)
    assert INVALID_READ not in log.read_text(errors="replace")
