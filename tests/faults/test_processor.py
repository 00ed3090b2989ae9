"""The processor killed (SIGKILL) and started again, frozen (SIGSTOP) past Envoy's
message timeout, and one of its workers killed under the supervisor, all under load:
nothing reaches the upstream un-inspected, twice or cut short, no proof is honored
twice (local and Redis records), and a request the processor did not decide is never
forwarded: the only answers lost after the upstream ran a request are prefill legs
whose response the processor was to sign."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from functools import partial

import pytest

from tests.e2e.stack import Stack
from tests.e2e.test_operations import wait_for
from tests.faults.harness import (
    Counts,
    Load,
    assert_sound,
    count,
    faults_stack,
    kill_processor,
    redis_server,
    restart_processor,
    signal_processor,
    wait_for_workers,
    workers_of,
)

# What a client may get while the processor is away: its own answers, and Envoy's for
# a processor it cannot reach or that did not answer in time: 503 with retry-after
# before the upstream was chosen, 500 (or 504 for a timeout) after.
AWAY = {"200", "500", "503"}
TIMED_OUT = AWAY | {"504"}


def assert_decided_before_forwarded(counts: Counts) -> None:
    """Requests failed by the fault never reached the upstream, but for prefill legs
    (mint), which reach it before the processor signs their response; each that did
    not was told to retry (503 with retry-after, assert_sound)."""
    assert set(counts.lost_kinds) <= {"mint"}, counts
    assert set(counts.unforwarded) <= {"503"}, counts


def replaced(stack: Stack, victim: int) -> bool:
    """The supervisor runs two workers again, ``victim`` not among them."""
    now = workers_of(stack)
    return victim not in now and len(now) == 2


def failed(counts: Counts) -> int:
    return sum(n for status, n in counts.statuses.items() if status != "200")


@pytest.mark.parametrize("record", ["local", "redis"])
def test_processor_killed_and_restarted(tmp_path, record):
    with contextlib.ExitStack() as scope:
        redis = scope.enter_context(redis_server(tmp_path)) if record == "redis" else None
        stack = scope.enter_context(faults_stack(tmp_path, redis=redis))
        with Load(stack, clients=6, seconds=12) as load:
            time.sleep(4)
            kill_processor(stack)
            time.sleep(1)
            restart_processor(stack)
        counts = count(stack, load)
    assert_sound(counts, AWAY)
    assert_decided_before_forwarded(counts)
    assert failed(counts) > 0, counts  # the fault was felt
    assert counts.honored > 0, counts


def test_processor_frozen_past_the_message_timeout(tmp_path):
    with faults_stack(tmp_path) as stack:
        with Load(stack, clients=6, seconds=16) as load:
            time.sleep(3)
            signal_processor(stack, signal.SIGSTOP)
            time.sleep(7)  # past the shipped message_timeout (5 s)
            signal_processor(stack, signal.SIGCONT)
        counts = count(stack, load)
    assert_sound(counts, TIMED_OUT)
    assert_decided_before_forwarded(counts)
    assert failed(counts) > 0, counts


def test_a_worker_killed_under_the_supervisor(tmp_path):
    with faults_stack(tmp_path, workers=2) as stack:
        wait_for_workers(stack, 2)
        with Load(stack, clients=6, seconds=14) as load:
            # Each in turn: every worker is an endpoint of its own, serving a share.
            for victim in sorted(workers_of(stack)):
                time.sleep(3)
                os.kill(victim, signal.SIGKILL)
                wait_for(partial(replaced, stack, victim), timeout=30)
        counts = count(stack, load)
    assert_sound(counts, AWAY)
    assert_decided_before_forwarded(counts)
    assert failed(counts) > 0, counts  # the fault was felt
    assert counts.honored > 0, counts
