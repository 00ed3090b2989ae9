"""A proof is honored once, through the real Envoy (ext_proc/core/replay.py): on another
worker of the same processor, through a second processor sharing a real Redis, and not
at all while that Redis is down; and never after the connector's lease.

The stand-in answers every prefill leg alike (devstack.tokens): what makes two proofs
of one prompt differ is their nonce alone."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from bench import tools
from devstack import processes, tokens
from tests.e2e.conftest import KEY_ID
from tests.e2e.stack import Stack, new_key
from tests.e2e.test_gateway import chat
from tests.e2e.test_handoff import (
    DECODE,
    assert_not_honored,
    minted,
    post,
    proof_parts,
    request_id,
    sent_upstream,
)
from tests.e2e.test_operations import (
    _is_worker,
    access_log,
    children_of,
    metric,
    metrics_text,
    wait_for,
)


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=20) as c:
        yield c


def assert_honored(stack: Stack, sent: dict[str, Any], rid: str) -> None:
    """The decode leg reached the upstream with the proven parameters as sent, their
    proof included."""
    _received, document = sent_upstream(stack)
    params = sent["kv_transfer_params"]
    assert document["kv_transfer_params"] == params
    assert params["prompt_token_ids"]
    assert {k: params[k] for k in tokens.CONNECTOR_REPLY} == tokens.CONNECTOR_REPLY
    assert access_log(stack, rid)["policy_reason"] == "trusted_proof"


def decode(client: httpx.Client, stack: Stack, sent: dict[str, Any]) -> str:
    stack.clear()
    rid = request_id()
    post(client, stack, DECODE, sent, rid)
    return rid


# --- one processor, two workers ---------------------------------------------------------


def one_stream_per_connection(config: dict[str, Any]) -> None:
    """Envoy opens a new connection to the processor for every stream, so the kernel
    (SO_REUSEPORT) spreads the streams over the workers."""
    (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "ext_proc"]
    options = cluster["typed_extension_protocol_options"]
    (http,) = options.values()
    http["common_http_protocol_options"] = {"max_requests_per_connection": 1}


def decisions_by_worker(supervisor: int, scratch: Path) -> dict[int, dict[str, float]]:
    """Each worker's ext_proc_decisions_total by reason, read from its own metric file."""
    workers = {pid for pid in children_of(supervisor) if _is_worker(pid)}
    found: dict[int, dict[str, float]] = {}
    for pid in workers:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        (entry,) = [e for e in environ if e.startswith(b"PROMETHEUS_MULTIPROC_DIR=")]
        source = Path(entry.split(b"=", 1)[1].decode()) / f"counter_{pid}.db"
        alone = scratch / str(pid)
        alone.mkdir(exist_ok=True)
        if source.exists():
            shutil.copy(source, alone / source.name)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(alone))
        reasons: dict[str, float] = {}
        for family in registry.collect():
            if family.name == "ext_proc_decisions":
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        reason = sample.labels["reason"]
                        reasons[reason] = reasons.get(reason, 0) + sample.value
        found[pid] = reasons
    return found


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(
        tmp_path_factory.mktemp("two-workers"),
        proof_keys={KEY_ID: new_key()},
        workers=2,
        edit=one_stream_per_connection,
    ).start()
    try:
        supervisor = stack.children["processor"].pid
        wait_for(lambda: len({p for p in children_of(supervisor) if _is_worker(p)}) == 2)
        yield stack
    finally:
        stack.stop()


def test_a_proof_replayed_on_another_worker_is_refused(two_workers, client, tmp_path):
    stack = two_workers
    supervisor = stack.children["processor"].pid
    sent = chat(minted(client, stack))
    assert_honored(stack, sent, decode(client, stack, sent))
    (honoring,) = [
        pid
        for pid, reasons in decisions_by_worker(supervisor, tmp_path).items()
        if reasons.get("trusted_proof")
    ]
    for _ in range(40):  # until a replay lands on the other worker (2**-40 it never does)
        assert_not_honored(stack, sent, decode(client, stack, sent), "proof_replayed")
        by_worker = decisions_by_worker(supervisor, tmp_path)
        if any(r.get("proof_replayed") for pid, r in by_worker.items() if pid != honoring):
            break
    else:
        pytest.fail("no replay reached the other worker")
    assert sum(r.get("trusted_proof", 0) for r in by_worker.values()) == 1


def test_two_proofs_of_one_prompt_are_each_honored_once(two_workers, client):
    stack = two_workers
    first, second = minted(client, stack), minted(client, stack)
    assert proof_parts(first).nonce != proof_parts(second).nonce
    for params in (first, second):
        sent = chat(params)
        assert_honored(stack, sent, decode(client, stack, sent))
    for params in (first, second):
        sent = chat(params)
        assert_not_honored(stack, sent, decode(client, stack, sent), "proof_replayed")


# --- the connector's lease -------------------------------------------------------------


@pytest.fixture(scope="module")
def short_lease(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A deployment whose connector keeps blocks 3 s: proofs live 1 s, clocks 1 s apart."""
    config = {"proof": {"ttl_seconds": 1, "clock_skew_seconds": 1, "kv_lease_seconds": 3}}
    stack = Stack(
        tmp_path_factory.mktemp("lease"), proof_keys={KEY_ID: new_key()}, processor_config=config
    ).start()
    try:
        yield stack
    finally:
        stack.stop()


def test_a_proof_first_presented_after_the_lease_is_refused(short_lease, client):
    minted_at = time.time()
    params = minted(client, short_lease)
    assert proof_parts(params).expiry <= minted_at + 2
    while time.time() <= minted_at + 3.2:  # the lease has run out
        time.sleep(0.1)
    sent = chat(params)
    assert_not_honored(short_lease, sent, decode(client, short_lease, sent), "proof_expired")


# --- processors sharing Redis -----------------------------------------------------------


class Redis:
    """A real redis-server on a loopback port, stopped and started again at will."""

    def __init__(self, workdir: Path) -> None:
        self.binary = tools.ensure_tools({"redis-server": "redis-server"})["redis-server"]
        self.port = processes.free_port()
        self.log = workdir / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        self.process = processes.start(args, self.log)
        processes.wait_for_port(self.port, self.process)

    def stop(self) -> None:
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=20)
            self.process = None


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Redis]:
    server = Redis(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


# Proofs live 2 s, clocks 1 s apart: a record that begins honors after 2 + 3 x 1 s.
SHORT = {"ttl_seconds": 2, "clock_skew_seconds": 1, "kv_lease_seconds": 5}
WARM_UP = 5


@pytest.fixture(scope="module")
def sharing(
    redis: Redis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, Stack]]:
    """Two gateways, each its own Envoy and processor, one key and one Redis."""
    key = new_key()
    config = {"proof": {"record": redis.url, **SHORT}}
    stacks = [
        Stack(tmp_path_factory.mktemp(name), proof_keys={KEY_ID: key}, processor_config=config)
        for name in ("first", "second")
    ]
    try:
        for stack in stacks:
            stack.start()
        yield stacks[0], stacks[1]
    finally:
        for stack in stacks:
            stack.stop()


def warmed_up(client: httpx.Client, stack: Stack) -> None:
    """A record that has just begun honors nothing until every proof honored before it
    began (by a Redis since restarted or flushed) has expired; then it honors."""
    began = time.monotonic()
    sent = chat(minted(client, stack))
    assert_not_honored(stack, sent, decode(client, stack, sent), "proof_record_unavailable")
    assert "record_warming_up" in stack.logs("processor")
    while time.monotonic() < began + WARM_UP + 0.5:
        time.sleep(0.1)
    sent = chat(minted(client, stack))
    assert_honored(stack, sent, decode(client, stack, sent))


def test_a_proof_replayed_through_a_second_processor_is_refused(sharing, client):
    first, second = sharing
    warmed_up(client, first)
    sent = chat(minted(client, first))
    assert_honored(first, sent, decode(client, first, sent))
    assert_not_honored(second, sent, decode(client, second, sent), "proof_replayed")
    # And the other way round: whichever processor sees a proof first honors it.
    sent = chat(minted(client, first))
    assert_honored(second, sent, decode(client, second, sent))
    assert_not_honored(first, sent, decode(client, first, sent), "proof_replayed")


def test_no_proof_is_honored_while_redis_is_down_and_honoring_resumes(sharing, redis, client):
    first, _second = sharing
    errors = {"store": "redis"}
    before = metric(metrics_text(first), "ext_proc_proof_record_errors_total", **errors)
    redis.stop()
    try:
        sent = chat(minted(client, first))
        rid = decode(client, first, sent)
        assert_not_honored(first, sent, rid, "proof_record_unavailable")
    finally:
        redis.start()
    after = metric(metrics_text(first), "ext_proc_proof_record_errors_total", **errors)
    assert after >= before + 1
    assert "proof record unavailable" in first.logs("processor")
    # The restarted Redis is empty: nothing is honored until what it forgot expired,
    # then a proof is honored once.
    warmed_up(client, first)
    sent = chat(minted(client, first))
    assert_honored(first, sent, decode(client, first, sent))
    assert_not_honored(first, sent, decode(client, first, sent), "proof_replayed")
