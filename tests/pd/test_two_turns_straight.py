"""Two turns of one conversation straight to a bidirectional pair (no gateway).

Turn 1 is an ordinary hand-off: the decode server reads the prompt's KV from the
prefill server. With ``bidirectional_kv_xfer`` the decode server then keeps its blocks
and answers with ``kv_transfer_params`` (``do_remote_decode: true``, its blocks, engine,
side channel, ``remote_num_tokens``). Turn 2's prefill request carries those verbatim:
the prefill server reads the first ``remote_num_tokens`` tokens' KV back from the
decode server (less what its own prefix cache still holds of turn 1's prompt) and
computes only the rest, then answers with parameters for turn 2's decode leg.

The oracle is each server's own counters. vLLM reads back ``remote_num_tokens`` tokens
(turn 1's prompt and all its output tokens but the last) whatever turn 2's prompt holds
at those positions: it compares no token ids. Where the re-rendered conversation
tokenises the answer differently from the tokens the decode server produced, the KV of
those positions is the decode server's, not that of turn 2's prompt. (With the tiny
random model that happens at its first byte-fallback output token: one such id comes
back from the rendered answer as the three ids of U+FFFD.)

Measured (block size 128): turn 1 of 235 prompt tokens and 8 output tokens leaves
``remote_num_tokens`` 242; turn 2's 382-token prompt then takes 128 tokens from the
prefill server's own prefix cache, reads 114 back (one block) and computes 140.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.pd.conftest import RESULTS
from tests.pd.pair import KvCounters, Pair
from tests.pd.test_nixl_handoff import ORCHESTRATOR  # turn 1's prefill leg

CHAT = "/v1/chat/completions"
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")


def user(n: int, words: int) -> dict[str, str]:
    """A user message of a few hundred tokens no earlier request shared."""
    text = " ".join(WORDS[(n + i) % len(WORDS)] for i in range(words))
    return {"role": "user", "content": f"turn {n} {time.time_ns()} {text}"}


def chat(url: str, messages: list[dict[str, str]], max_tokens: int, params: Any) -> Any:
    body = {
        "model": "tiny",
        "messages": messages,
        "max_tokens": max_tokens,
        "return_token_ids": True,
        "kv_transfer_params": params,
    }
    reply = httpx.post(url + CHAT, json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def settled(counters: Callable[[], KvCounters], before: KvCounters, tokens: int) -> KvCounters:
    """The counters' change once the server published the request's prompt tokens."""
    deadline = time.monotonic() + 10
    while True:
        delta = counters() - before
        if delta.external + delta.local + delta.cached >= tokens or time.monotonic() > deadline:
            return delta
        time.sleep(0.1)


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    answer = call()
    return answer, time.monotonic() - started


def test_the_second_turn_reads_the_first_turns_kv_back(bidirectional_pair: Pair) -> None:
    pair = bidirectional_pair
    first = [user(1, 40)]

    # Turn 1, prefill leg: the prefill server keeps its blocks for the decode server.
    answer, prefill1_s = timed(lambda: chat(pair.prefill, first, 1, ORCHESTRATOR))
    prompt1 = answer["prompt_token_ids"]
    assert len(prompt1) == answer["usage"]["prompt_tokens"]

    # Turn 1, decode leg: every prompt token's KV read from the prefill server.
    before = pair.kv_counters()
    params = answer["kv_transfer_params"]
    answer, decode1_s = timed(lambda: chat(pair.decode, first, 8, params))
    decode1 = settled(pair.kv_counters, before, len(prompt1))
    assert decode1 == KvCounters(len(prompt1), 0, decode1.nixl_bytes, 0), decode1
    assert decode1.nixl_bytes > 0, decode1
    assert answer["prompt_token_ids"] == prompt1
    output1 = answer["choices"][0]["token_ids"]
    assert len(output1) == answer["usage"]["completion_tokens"] == 8
    back = answer["kv_transfer_params"]
    assert back["do_remote_decode"] is True, back
    assert back["do_remote_prefill"] is False, back
    # The decode server holds KV for its prompt and all its output tokens but the last
    # (that one was sampled, never fed back).
    assert back["remote_num_tokens"] == len(prompt1) + len(output1) - 1, back
    assert back["remote_blocks_expiry_time"] is not None, back

    # Turn 2, prefill leg, with the decode server's parameters verbatim.
    second = [
        *first,
        {"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
        user(2, 20),
    ]
    before = pair.kv_counters("prefill")
    answer, prefill2_s = timed(lambda: chat(pair.prefill, second, 1, back))
    prompt2 = answer["prompt_token_ids"]
    assert len(prompt2) == answer["usage"]["prompt_tokens"]
    prefill2 = settled(lambda: pair.kv_counters("prefill"), before, len(prompt2))
    read_back = back["remote_num_tokens"]
    assert prompt2[: len(prompt1)] == prompt1
    # What the prefill server's prefix cache holds of turn 1's prompt is not read again;
    # the rest of the decode server's tokens is, and only turn 2's new tokens computed.
    assert prefill2.cached <= len(prompt1), prefill2
    assert prefill2.external == read_back - prefill2.cached > 0, prefill2
    assert prefill2.local == len(prompt2) - read_back, prefill2
    assert prefill2.nixl_bytes > 0, prefill2
    onward = answer["kv_transfer_params"]
    assert onward["do_remote_prefill"] is True, onward
    assert onward["remote_num_tokens"] == len(prompt2), onward

    # Turn 2, decode leg: the decode server's own cache, the rest read from the prefill
    # server, nothing computed.
    before = pair.kv_counters()
    answer, decode2_s = timed(lambda: chat(pair.decode, second, 8, onward))
    decode2 = settled(pair.kv_counters, before, len(prompt2))
    assert decode2.external + decode2.cached == len(prompt2), decode2
    assert decode2.external > 0, decode2
    assert decode2.local == 0, decode2

    joined = prompt1 + output1
    diverged = next(
        (i for i, (a, b) in enumerate(zip(joined, prompt2, strict=False)) if a != b), None
    )
    RESULTS.append(
        f"two turns straight to a bidirectional pair: turn 1 {len(prompt1)} prompt + "
        f"{len(output1)} output tokens, remote_num_tokens {read_back}; turn 2 "
        f"{len(prompt2)} prompt tokens, prefill server external +{prefill2.external:.0f} "
        f"cached +{prefill2.cached:.0f} local +{prefill2.local:.0f} "
        f"nixl bytes +{prefill2.nixl_bytes:.0f}; decode server external "
        f"+{decode2.external:.0f} cached +{decode2.cached:.0f}; turn 2's prompt ids follow "
        f"turn 1's prompt + output ids up to index {diverged} of {len(joined)}"
    )
    RESULTS.append(
        f"two turns straight, legs (s): turn 1 prefill {prefill1_s:.3f} decode "
        f"{decode1_s:.3f}, turn 2 prefill {prefill2_s:.3f} decode {decode2_s:.3f}"
    )
