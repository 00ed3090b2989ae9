"""The processor killed under load and started again with its clock set back
(libfaketime), on its own table and on Redis: no proof honored before the restart is
honored again (on its own table, no proof minted before it at all), the record is
``clock_behind`` until the clock catches up, and its own table honors proofs minted
after that."""

from __future__ import annotations

import contextlib
import itertools
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from bench import tools
from tests.e2e.stack import Stack
from tests.faults.harness import (
    DECODE,
    FORGED,
    ID_HEADER,
    PREFILL,
    PROOF,
    Load,
    Minted,
    assert_sound,
    count,
    faults_stack,
    kill_processor,
    redis_server,
    restart_processor,
)

# A step back past 2 x the skew (the record's allowance) and the restart's few seconds,
# within the proofs' lifetime (ttl_seconds 20).
BEHIND = 12
_ids = itertools.count()


def _chat(rid: str, **extra: Any) -> dict[str, Any]:
    content = f"clock {rid}: summarise the notes"
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], **extra}


def _send(stack: Stack, load: Load, path: str, body: dict[str, Any], rid: str) -> httpx.Response:
    """One request, its outcome noted in ``load``'s tally (the harness counts it)."""
    reply = httpx.post(stack.url + path, json=body, headers={ID_HEADER: rid}, timeout=15)
    load.tally.note(rid, "clock", str(reply.status_code), "retry-after" in reply.headers)
    return reply


def replay(stack: Stack, load: Load, minted: Minted) -> str:
    rid = f"clock-replay-{next(_ids)}"
    body = _chat(rid, messages=minted.messages, kv_transfer_params=minted.params)
    _send(stack, load, DECODE, body, rid)
    return rid


def mint_and_honor(stack: Stack, load: Load) -> str:
    """A proof minted now (by the processor's clock) and presented once; the decode
    leg's request id."""
    rid = f"clock-mint-{next(_ids)}"
    body = _chat(rid, max_tokens=1, return_token_ids=True)
    reply = _send(stack, load, PREFILL, body, rid)
    assert reply.status_code == 200, reply.text
    return replay(stack, load, Minted(body["messages"], reply.json()["kv_transfer_params"]))


def honored(stack: Stack, rids: set[str]) -> set[str]:
    """Which of the requests ``rids`` reached the upstream with their proof."""
    return {
        rid
        for arrival in stack.received()
        if (rid := next(iter(arrival.header(ID_HEADER)), "")) in rids
        and b"token_policy_proof" in arrival.body
        and FORGED.encode() not in arrival.body
    }


def clock_behind(stack: Stack) -> float:
    """``ext_proc_decisions_total{reason="clock_behind"}`` on the processor now."""
    with urllib.request.urlopen(f"http://{stack.metrics}/metrics", timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("ext_proc_decisions_total{") and 'reason="clock_behind"' in line
    )


@pytest.mark.parametrize("record", ["local", "redis"])
def test_processor_restarted_with_its_clock_behind(tmp_path, record):
    # The table's file in this test's own temporary directory.
    env = {"TMPDIR": str(tmp_path)}
    behind = {**env, **tools.libfaketime(f"-{BEHIND}s")}
    with contextlib.ExitStack() as scope:
        redis = scope.enter_context(redis_server(tmp_path)) if record == "redis" else None
        stack = scope.enter_context(faults_stack(tmp_path, redis=redis, processor_env=env))
        with Load(stack, clients=4, seconds=3) as load:
            pass
        spent_before = time.time()  # every proof below was minted and honored by now
        minted = list(load.tally.minted)
        kill_processor(stack)
        restart_processor(stack, behind)
        # Its clock reads more than 2 x skew before what the record saw: nothing honored.
        early = mint_and_honor(stack, load)
        behind_count = clock_behind(stack)
        # Every proof minted before verifies again once the set-back clock reaches its
        # minting time less the skew.
        time.sleep(max(0, spent_before + BEHIND + PROOF["clock_skew_seconds"] + 1 - time.time()))
        with ThreadPoolExecutor(4) as clients:
            replays = set(clients.map(lambda proof: replay(stack, load, proof), minted))
        late = mint_and_honor(stack, load)  # caught up with its own table's time
        counts = count(stack, load)
        again = honored(stack, replays | {early, late})
    assert_sound(counts, {"200"})  # no proof honored twice, across the restart too
    assert len(minted) > 20, counts
    assert behind_count > 0
    assert early not in again
    if record == "local":
        # The new table began after every proof minted before the restart. (Redis's
        # record began before them: one minted and never presented may be honored once,
        # when the clock has caught up with the time Redis carries on.)
        assert again == {late}, (sorted(again), counts)
