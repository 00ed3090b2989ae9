"""The Redis record of spent proofs restarted, paused and killed under load: a decode
leg whose proof the record cannot be consulted for is refused with 503 and retry-after
(nothing forwarded), a proof minted before the record began again is unproven (the
decode recomputes), and no proof is honored twice."""

from __future__ import annotations

import signal
import time

import pytest

from tests.e2e.test_replay import Redis
from tests.faults.harness import Load, assert_sound, count, faults_stack, redis_server


def restart(redis: Redis) -> None:
    redis.stop()
    time.sleep(1)
    redis.start()


def pause(redis: Redis) -> None:
    redis.signal(signal.SIGSTOP)
    time.sleep(3)
    redis.signal(signal.SIGCONT)


def kill(redis: Redis) -> None:
    redis.stop(signal.SIGKILL)
    time.sleep(3)
    redis.start()


# Each fault, and whether the record begins again after it (a redis-server without
# persistence that restarted forgot every spent proof).
FAULTS = {"restart": (restart, True), "pause": (pause, False), "kill": (kill, True)}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_redis_fault(tmp_path, fault):
    action, forgets = FAULTS[fault]
    with redis_server(tmp_path) as redis, faults_stack(tmp_path, redis=redis) as stack:
        with Load(stack, clients=6, seconds=12) as load:
            time.sleep(4)
            action(redis)
        counts = count(stack, load)
    decided = load.decisions()
    print(decided)
    assert_sound(counts, {"200", "503"})
    assert counts.lost_answers == 0, counts
    assert counts.statuses.get("503", 0) > 0, counts  # the record was away
    assert decided["proof_record_unavailable"] == counts.statuses["503"], decided
    assert decided["trusted_proof"] == counts.honored > 0, decided
    # Proofs minted before a restart recompute; a pause forgets nothing.
    assert (decided["proof_predates_record"] > 0) == forgets, decided
