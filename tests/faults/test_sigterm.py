"""SIGTERM to the processor under load through the real Envoy: to its own process, as a
rollout sends it, or under ``--workers`` to the whole process group (each worker gets it
as well as the supervisor, which forwards its own): the load goes on for a second after
the signal, then stops as a gateway moving away stops sending.
With no drain window (``make run``'s) and a grace longer than the longest request, no
request fails: the streams begun after the signal, and those gRPC had received and not
yet handed over when it came, are all served; the processor exits 0."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.faults.harness import Load, assert_sound, count, faults_stack, signal_processor

# Longer than any request of the load (the upstream answers within DELAY).
GRACE_SECONDS = 10
DELAY = 0.05
SIGNAL_AFTER = 3.0  # seconds of load before the signal
LOAD_SECONDS = SIGNAL_AFTER + 1.0


@pytest.mark.parametrize(("workers", "to_group"), [(1, False), (2, True)])
def test_sigterm_under_load_fails_no_request(tmp_path, workers, to_group):
    settings = {"drain_seconds": 0, "shutdown_grace_seconds": GRACE_SECONDS}
    with faults_stack(tmp_path, workers=workers, processor_config=settings) as stack:
        processor = stack.children["processor"]
        with Load(stack, clients=8, seconds=LOAD_SECONDS, delay=DELAY) as load:
            time.sleep(SIGNAL_AFTER)
            if to_group:
                signal_processor(stack, signal.SIGTERM)
            else:
                os.kill(processor.pid, signal.SIGTERM)
        status = processor.wait(timeout=GRACE_SECONDS + 20)
        counts = count(stack, load)
    assert_sound(counts, {"200"})
    assert status == 0
    assert counts.lost_answers == 0, counts
    assert counts.honored > 0, counts
