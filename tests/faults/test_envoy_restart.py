"""Envoy restarted under load, requests in flight at the upstream: a plain restart (stop,
start) resets connections whose request the upstream already received, so a client
that retries runs the inference twice; a hot restart (a new Envoy at the next restart
epoch takes over the listeners, the old one drains) loses no answer, and make run
restarts Envoy so on SIGHUP. Neither lets a request through un-inspected, twice or cut
short."""

from __future__ import annotations

import os
import signal
import time

from devstack import processes
from ext_proc.core.address import HostPort
from tests.e2e.stack import LOCAL, Stack
from tests.e2e.test_make_run import start, wait_ready
from tests.faults.harness import (
    Load,
    assert_sound,
    count,
    faults_stack,
    hot_restart_envoy,
    restart_envoy,
)
from tests.test_devstack import free_ports

# Requests wait this long at the upstream: each client has one in flight there nearly
# all the time, so a restart finds some.
IN_FLIGHT = 0.3


def test_a_plain_restart_loses_answers_the_upstream_ran(tmp_path):
    with faults_stack(tmp_path) as stack:
        with Load(stack, clients=6, seconds=10, delay=IN_FLIGHT) as load:
            time.sleep(4)
            restart_envoy(stack)
        counts = count(stack, load)
    assert_sound(counts, {"200", "reset", "refused"})
    assert counts.lost_answers > 0, counts


def test_a_hot_restart_loses_nothing(tmp_path):
    with faults_stack(tmp_path, hot_restart=True) as stack:
        with Load(stack, clients=6, seconds=12, delay=IN_FLIGHT) as load:
            time.sleep(4)
            old = hot_restart_envoy(stack)
        counts = count(stack, load)
        old.wait(timeout=30)  # the old Envoy drained and exited by itself
    assert_sound(counts, {"200"})
    assert counts.lost_answers == 0, counts


def test_make_run_hot_restarts_envoy_on_sighup_and_loses_nothing(tmp_path):
    ports = free_ports()
    run = start(tmp_path, ports)
    log = tmp_path / "make-run.log"
    try:
        wait_ready(run, log)
        # Only the gateway and the stand-in are reached: make run's record is local.
        stack = Stack(
            tmp_path,
            gateway=HostPort(LOCAL, int(ports["GATEWAY_PORT"])),
            upstream=HostPort(LOCAL, int(ports["STUB_PORT"])),
            processor_config={"proof": {}},
        )
        with Load(stack, clients=6, seconds=12, delay=IN_FLIGHT) as load:
            time.sleep(4)
            os.kill(run.pid, signal.SIGHUP)
        counts = count(stack, load)
        assert run.poll() is None, log.read_text()
        assert "Envoy hot-restarted (restart epoch 1)" in log.read_text()
    finally:
        processes.stop(run, grace=30)  # it stops its children first
    assert_sound(counts, {"200"})
    assert counts.lost_answers == 0, counts
