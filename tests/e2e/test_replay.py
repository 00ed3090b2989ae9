"""A proof is honored once, through the real Envoy (ext_proc/core/replay.py): on another
worker of the same processor, through a second processor sharing a real Redis, and not
at all while that Redis is down (the decode leg answered 503 to retry, never forwarded
to recompute); a proof minted before the record began (a processor restarted whole, a
Redis that forgot) is unproven (removed, the decode recomputes), not a 503 no retry
could clear; and never after the connector's lease.

The stand-in answers every prefill leg alike (devstack.tokens): what makes two proofs
of one prompt differ is their nonce alone."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from redis import Redis as RedisClient
from redis.exceptions import ResponseError

from bench import tools
from devstack import processes, tokens
from ext_proc.core import proof
from ext_proc.core.config import Config, ConfigError
from ext_proc.core.replay import Terms, Ticket, Verdict
from ext_proc.edge import redis_record
from ext_proc.edge.redis_record import RedisRecord
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


UNAVAILABLE = "proof_record_unavailable"
PREDATES = "proof_predates_record"


def decisions_count(stack: Stack, reason: str, action: str) -> float:
    """ext_proc_decisions_total for ``action`` and ``reason``, every route and mode."""
    pattern = rf'ext_proc_decisions_total\{{(.*reason="{reason}".*)\}} (\S+)'
    return sum(
        float(match.group(2))
        for match in map(re.compile(pattern).fullmatch, metrics_text(stack).splitlines())
        if match and f'action="{action}"' in match.group(1)
    )


def unavailable_count(stack: Stack) -> float:
    """The refusals of proofs the record could not be consulted for (action deny,
    reason proof_record_unavailable)."""
    return decisions_count(stack, UNAVAILABLE, "deny")


def refused_unavailable(client: httpx.Client, stack: Stack, sent: dict[str, Any]) -> str:
    """The decode leg ``sent`` refused because the record of spent proofs cannot be
    consulted for its proof: a 503 in vLLM's error shape with retry-after, nothing upstream (no
    decode recomputes), the access log and the decision counter naming the reason."""
    stack.clear()
    before = unavailable_count(stack)
    rid = request_id()
    reply = client.post(stack.url + DECODE, json=sent, headers={"x-request-id": rid})
    assert reply.status_code == 503, reply.text
    assert reply.headers["retry-after"] == "1"
    error = reply.json()["error"]
    assert (error["type"], error["code"]) == ("ServiceUnavailableError", 503)
    assert "record of spent proofs" in error["message"]
    line = access_log(stack, rid)
    assert (line["policy_action"], line["policy_reason"]) == ("deny", UNAVAILABLE), line
    assert stack.received_count() == 0
    wait_for(lambda: unavailable_count(stack) == before + 1)
    return rid


# --- one processor, two workers ---------------------------------------------------------


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
        # One Envoy thread: one round robin over the workers' endpoints, a stream each.
        envoy_concurrency=1,
    ).start()
    try:
        supervisor = stack.children["processor"].pid
        wait_for(lambda: len({p for p in children_of(supervisor) if _is_worker(p)}) == 2)
        yield stack
    finally:
        stack.stop()


def test_a_proof_replayed_on_another_worker_is_refused(two_workers, client, tmp_path):
    """Each worker serves its own port and Envoy's one thread takes the endpoints in
    turn, a stream each: of two replays in a row, one reaches the worker that did not
    honor the proof, which refuses it from the shared record."""
    stack = two_workers
    supervisor = stack.children["processor"].pid
    sent = chat(minted(client, stack))
    assert_honored(stack, sent, decode(client, stack, sent))
    (honoring,) = [
        pid
        for pid, reasons in decisions_by_worker(supervisor, tmp_path).items()
        if reasons.get("trusted_proof")
    ]
    for _ in range(2):
        assert_not_honored(stack, sent, decode(client, stack, sent), "proof_replayed")
    by_worker = decisions_by_worker(supervisor, tmp_path)
    (other,) = set(by_worker) - {honoring}
    assert by_worker[other].get("proof_replayed"), by_worker
    assert by_worker[honoring].get("proof_replayed"), by_worker
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
    """A real redis-server on a loopback port, stopped and started again at will, on the
    same port and working directory (``extra``: further settings)."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        self.binary = tools.ensure_tools({"redis-server": "redis-server"})["redis-server"]
        self.port = processes.free_port()
        self.workdir = workdir
        self.log = workdir / "redis.log"
        self.extra = extra or ("--save", "", "--appendonly", "no")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> RedisClient:
        return RedisClient(host="127.0.0.1", port=self.port, socket_timeout=10)

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--dir", str(self.workdir), "--daemonize", "no", *self.extra]
        self.process = processes.start(args, self.log)
        processes.wait_for_port(self.port, self.process)

    def stop(self, how: int = signal.SIGTERM) -> None:
        if self.process is not None:
            os.killpg(self.process.pid, how)
            self.process.wait(timeout=20)
            self.process = None

    def signal(self, number: int) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, number)


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Redis]:
    server = Redis(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


# Proofs live 2 s, clocks 1 s apart.
SHORT = {"ttl_seconds": 2, "clock_skew_seconds": 1, "kv_lease_seconds": 5}
SKEW = SHORT["clock_skew_seconds"]


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


def refusals(stack: Stack, error: str) -> int:
    """How many times the processor logged the record's refusal ``error``."""
    return stack.logs("processor").count(f'"error":"{error}"')


def assert_record_refused(
    client: httpx.Client, stack: Stack, sent: dict[str, Any], error: str
) -> float:
    """The decode leg is refused (503) because the record could not be consulted for its proof
    for ``error``; when."""
    before = refusals(stack, error)
    refused_unavailable(client, stack, sent)
    refused_at = time.time()
    wait_for(lambda: refusals(stack, error) == before + 1)
    return refused_at


def predated(
    client: httpx.Client, stack: Stack, sent: dict[str, Any], error: str = "record_began_after_mint"
) -> float:
    """The decode leg ``sent`` decided unproven because its proof was minted before the
    record began (logged as ``error``): forwarded without its parameters (the decode
    recomputes; no retry of it could be honored, so no 503), the access log and the
    strip counter naming proof_predates_record; when."""
    before = refusals(stack, error), decisions_count(stack, PREDATES, "strip")
    assert_not_honored(stack, sent, decode(client, stack, sent), PREDATES)
    refused_at = time.time()
    wait_for(
        lambda: (
            (refusals(stack, error), decisions_count(stack, PREDATES, "strip"))
            == (before[0] + 1, before[1] + 1)
        )
    )
    return refused_at


def warmed_up(client: httpx.Client, stack: Stack) -> None:
    """A record that has just begun (a new Redis, or one restarted, restored, failed over
    or flushed) honors only proofs minted after it began, a skew included: the first,
    minted before, is unproven; one minted after is honored."""
    honored_after(client, stack, predated(client, stack, chat(minted(client, stack))))


def honored_after(client: httpx.Client, stack: Stack, began: float) -> None:
    """A proof minted a skew (rounded up) after a record began at ``began`` is honored."""
    fresh = math.ceil(began) + SKEW + 1
    time.sleep(max(0.0, fresh - time.time()))
    sent = chat(minted(client, stack))
    assert_honored(stack, sent, decode(client, stack, sent))


def reconnect(client: httpx.Client, stack: Stack) -> None:
    """A decode leg whose only use is to let the processor find its Redis again (its
    connection died with the server it knew; the first command on it fails: a 503)."""
    sent = chat(minted(client, stack))
    stack.clear()
    reply = client.post(stack.url + DECODE, json=sent)
    assert reply.status_code in (200, 503), reply.text


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


def test_a_proof_is_refused_to_retry_while_redis_is_down_and_honoring_resumes(
    sharing, redis, client
):
    """Redis killed under a running processor: the decode leg answers 503 to retry
    (nothing recomputes it upstream), a retry after Redis is back is honored."""
    first, _second = sharing
    errors = {"store": "redis"}
    before = metric(metrics_text(first), "ext_proc_proof_record_errors_total", **errors)
    redis.stop(signal.SIGKILL)
    try:
        sent = chat(minted(client, first))
        refused_unavailable(client, first, sent)
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


# --- a Redis that lost writes --------------------------------------------------------------


@pytest.fixture
def persisted(tmp_path: Path) -> Iterator[tuple[Redis, Stack]]:
    """A gateway whose Redis writes RDB snapshots and an AOF when told (``SAVE``), and
    reloads them when it starts again."""
    server = Redis(tmp_path, "--save", "", "--appendonly", "yes", "--appendfsync", "always")
    server.start()
    config = {"proof": {"record": server.url, **SHORT}}
    stack = Stack(tmp_path / "gateway", proof_keys={KEY_ID: new_key()}, processor_config=config)
    (tmp_path / "gateway").mkdir()
    try:
        stack.start()
        yield server, stack
    finally:
        stack.stop()
        server.stop()


def test_a_redis_restarted_from_a_snapshot_honors_no_proof_it_forgot(persisted, client):
    """The snapshot holds the record's beginning but not a proof honored after it:
    the restarted server is another incarnation, so the record begins again."""
    server, stack = persisted
    warmed_up(client, stack)
    server.client().config_set("appendonly", "no")  # the snapshot alone comes back
    server.client().save()
    sent = chat(minted(client, stack))
    assert_honored(stack, sent, decode(client, stack, sent))
    server.stop(signal.SIGKILL)
    server.extra = ("--save", "", "--appendonly", "no")
    server.start()
    assert server.client().exists(redis_record.SINCE)  # the snapshot came back
    reconnect(client, stack)
    honored_after(client, stack, predated(client, stack, sent))


def test_a_redis_restored_from_an_older_aof_honors_no_proof_it_forgot(persisted, client):
    """A backup of the append-only file, taken before a proof was honored, restored
    after a crash: the record begins again."""
    server, stack = persisted
    warmed_up(client, stack)
    backup = server.workdir / "backup"
    shutil.copytree(server.workdir / "appendonlydir", backup)
    sent = chat(minted(client, stack))
    assert_honored(stack, sent, decode(client, stack, sent))
    server.stop(signal.SIGKILL)
    shutil.rmtree(server.workdir / "appendonlydir")
    shutil.copytree(backup, server.workdir / "appendonlydir")
    server.start()
    assert server.client().exists(redis_record.SINCE)  # the AOF came back
    reconnect(client, stack)
    honored_after(client, stack, predated(client, stack, sent))


@pytest.fixture
def failover(tmp_path: Path) -> Iterator[tuple[Redis, Redis, Stack, Stack]]:
    """A master and its replica, a gateway on each (the second reaches the replica, as a
    gateway reaches whichever server a failover made master), one key."""
    (tmp_path / "master").mkdir()
    (tmp_path / "replica").mkdir()
    master = Redis(tmp_path / "master")
    master.start()
    # A master when its gateway starts (a processor starts only on a Redis that can
    # keep the record), made a replica after.
    replica = Redis(tmp_path / "replica", "--save", "", "--appendonly", "no")
    replica.start()
    key = new_key()
    stacks = []
    try:
        for name, server in (("on-master", master), ("on-replica", replica)):
            config = {"proof": {"record": server.url, **SHORT}}
            (tmp_path / name).mkdir()
            stack = Stack(tmp_path / name, proof_keys={KEY_ID: key}, processor_config=config)
            stacks.append(stack)
            stack.start()
        replica.client().replicaof("127.0.0.1", master.port)
        wait_for(lambda: replica.client().info("replication")["master_link_status"] == "up")
        yield master, replica, stacks[0], stacks[1]
    finally:
        for stack in stacks:
            stack.stop()
        replica.stop()
        master.stop()


def replicated(master: Redis, replica: Redis) -> None:
    """The replica holds everything the master wrote so far."""
    wait_for(
        lambda: (
            master.client().info("replication")["master_repl_offset"]
            == replica.client().info("replication").get("slave_repl_offset")
        )
    )


def test_a_promoted_replica_honors_no_proof_its_master_did_not_pass_on(failover, client):
    master, replica, on_master, on_replica = failover
    warmed_up(client, on_master)
    replicated(master, replica)
    assert replica.client().exists(redis_record.SINCE)
    # A replica keeps no record of its own: writing to one would split the record. No
    # processor starts on one.
    with pytest.raises(ConfigError, match="cannot keep the record: redis_not_master: "):
        asyncio.run(checked(RedisRecord(replica.url, 1.0)))
    sent = chat(minted(client, on_replica))
    assert_record_refused(client, on_replica, sent, "redis_not_master")
    # The replica is cut off; a proof honored on the master never reaches it; the master
    # dies and the replica is promoted.
    replica.signal(signal.SIGSTOP)
    try:
        master.client().client_kill_filter(_type="replica")
        sent = chat(minted(client, on_master))
        assert_honored(on_master, sent, decode(client, on_master, sent))
        master.stop(signal.SIGKILL)
    finally:
        replica.signal(signal.SIGCONT)
    replica.client().replicaof("NO", "ONE")
    assert replica.client().exists(redis_record.SINCE)  # what the master passed on
    honored_after(client, on_replica, predated(client, on_replica, sent))


def test_a_redis_that_may_evict_keys_keeps_no_record(redis, tmp_path, client):
    """An evicted key is a forgotten proof: only noeviction keeps the record."""
    server = Redis(tmp_path)
    server.start()
    config = {"proof": {"record": server.url, **SHORT}}
    (tmp_path / "gateway").mkdir()
    stack = Stack(tmp_path / "gateway", proof_keys={KEY_ID: new_key()}, processor_config=config)
    try:
        stack.start()
        # Reconfigured under the running processor: each spend judges the Redis it meets.
        server.client().config_set("maxmemory-policy", "allkeys-lru")
        sent = chat(minted(client, stack))
        assert_record_refused(client, stack, sent, "redis_evicts_keys")
        server.client().config_set("maxmemory-policy", "noeviction")
        warmed_up(client, stack)
    finally:
        stack.stop()
        server.stop()


# --- a processor restarted whole -------------------------------------------------------


def test_a_processor_restarted_whole_honors_no_proof_spent_before(tmp_path, client):
    """Its own table is new: a proof spent in the one before is not honored again."""
    stack = Stack(tmp_path, proof_keys={KEY_ID: new_key()}).start()
    try:
        sent = chat(minted(client, stack))
        assert_honored(stack, sent, decode(client, stack, sent))
        processes.stop(stack.children["processor"])
        stack.start_processor()  # returns once a proof minted now is fresh
        predated(client, stack, sent)
        sent = chat(minted(client, stack))
        assert_honored(stack, sent, decode(client, stack, sent))
    finally:
        stack.stop()


def test_workers_die_with_their_supervisor_and_leave_no_table_behind(tmp_path, client):
    """A supervisor killed alone takes its workers with it, so the restarted processor
    serves the port alone, with its new table: a proof spent before is honored by no
    worker."""
    stack = Stack(tmp_path, proof_keys={KEY_ID: new_key()}, workers=2).start()
    try:
        supervisor = stack.children["processor"].pid
        wait_for(lambda: len({p for p in children_of(supervisor) if _is_worker(p)}) == 2)
        workers = {p for p in children_of(supervisor) if _is_worker(p)}
        sent = chat(minted(client, stack))
        assert_honored(stack, sent, decode(client, stack, sent))
        os.kill(supervisor, signal.SIGKILL)
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), 5)
        stack.children["processor"].wait(timeout=5)
        stack.start_processor()
        stack.wait_for_workers()
        for _ in range(10):  # Envoy takes the workers' endpoints in turn
            predated(client, stack, sent)
    finally:
        stack.stop()


# --- clocks apart ----------------------------------------------------------------------


def test_verifiers_whose_clocks_are_apart_never_honor_a_proof_twice(redis):
    """The minter's clock is true; the verifier that honors first runs ahead by just
    under the skew (it forgets first), the other behind by just under it (it verifies
    longest): the second verifier refuses the proof on every try until it expires by
    its own clock."""
    ttl, skew = 1, 1
    keys = proof.KeySet({KEY_ID: b"k" * 32}, KEY_ID)
    params = {"remote_engine_id": "e", "prompt_token_ids": [1, 2, 3]}
    digest = bytes(32)
    terms = Terms(skew=skew)
    with redis.client() as seed:  # the record began well before the proof was minted
        redis_record.begin(seed, int(time.time()) - 60, terms)
    expiry = int(time.time()) + ttl
    params[proof.PROOF_KEY] = proof.mint(keys, params, digest, expiry, minted=expiry - ttl)

    async def run() -> list[Verdict]:
        ahead = RedisRecord(redis.url, 1.0, clock=lambda: time.time() + 0.9, terms=terms)
        behind = RedisRecord(redis.url, 1.0, clock=lambda: time.time() - 0.9, terms=terms)
        verdicts = []
        try:
            for record, offset in ((ahead, 0.9), (behind, -0.9)):
                while True:
                    now = time.time() + offset
                    if proof.verify(keys, params, digest, now, skew, lifetime=ttl):
                        break  # expired by this verifier's clock
                    ticket = proof.ticket(params, skew)
                    verdicts.append(await record.spend(ticket))
                    if record is ahead:
                        break
                    await asyncio.sleep(0.05)
        finally:
            await ahead.close()
            await behind.close()
        return verdicts

    verdicts = asyncio.run(run())
    assert verdicts[0] is Verdict.FIRST
    assert len(verdicts) > 20  # the second verifier tried for about three seconds
    assert set(verdicts[1:]) == {Verdict.SPENT}


# --- a Redis whose data went back in time without a restart ----------------------------


def began_at(server: Redis) -> int:
    """When the record on ``server`` began (unix seconds), as it states."""
    with server.client() as client:
        since = client.get(redis_record.SINCE)
    assert since is not None
    return int(since.split(b" ")[1])


def spend(server: Redis, ticket: Ticket) -> Verdict:
    async def once() -> Verdict:
        record = RedisRecord(server.url, 1.0)
        try:
            return await record.spend(ticket)
        finally:
            await record.close()

    return asyncio.run(once())


def after(moment: int) -> None:
    """Until the clock has passed ``moment`` (unix seconds)."""
    while time.time() <= moment:
        time.sleep(0.05)


def test_a_database_swapped_back_begins_the_record_again(tmp_path):
    server = Redis(tmp_path)
    server.start()
    try:
        with server.client() as client:
            redis_record.begin(client, int(time.time()) - 60)
            client.swapdb(0, 1)  # the record is elsewhere now: this one begins anew
            assert spend(server, Ticket(b"a" * 16, int(time.time()) + 30, 0)) is Verdict.PREDATES
            began = began_at(server)
            proof = Ticket(b"p" * 16, began + 30, began)  # minted after the new record began
            assert spend(server, proof) is Verdict.FIRST
            assert spend(server, proof) is Verdict.SPENT
            client.swapdb(0, 1)  # the older record is back, without the proof
            after(began)
            assert spend(server, proof) is Verdict.PREDATES
            assert began_at(server) > began  # it began again
    finally:
        server.stop()


def test_keys_evicted_while_a_policy_allowed_it_begin_the_record_again(tmp_path):
    server = Redis(tmp_path)
    server.start()
    try:
        with server.client() as client:
            now = int(time.time())
            redis_record.begin(client, now - 60)
            proof = Ticket(b"p" * 16, now + 30, now)
            assert spend(server, proof) is Verdict.FIRST
            # For a while keys may be evicted: the proof's (the one with a lifetime) is.
            used = client.info("memory")["used_memory"]
            client.config_set("maxmemory-policy", "volatile-lru")
            client.config_set("maxmemory", used + 64 * 1024)
            with contextlib.suppress(ResponseError):
                client.set("filler", b"x" * 256 * 1024)
            assert client.info("stats")["evicted_keys"] >= 1
            assert not client.exists(
                redis_record.PREFIX + base64.urlsafe_b64encode(proof.key).decode()
            )
            client.delete("filler")
            client.config_set("maxmemory", 0)
            client.config_set("maxmemory-policy", "noeviction")
            after(now)
            assert spend(server, proof) is Verdict.PREDATES  # the record began again
    finally:
        server.stop()


def evicted(server: Redis, client: RedisClient) -> Ticket:
    """A proof honored, then evicted while a policy allowed it."""
    now = int(time.time())
    proof = Ticket(b"p" * 16, now + 30, now)
    assert spend(server, proof) is Verdict.FIRST
    used = client.info("memory")["used_memory"]
    client.config_set("maxmemory-policy", "volatile-lru")
    client.config_set("maxmemory", used + 64 * 1024)
    with contextlib.suppress(ResponseError):
        client.set("filler", b"x" * 256 * 1024)
    assert not client.exists(redis_record.PREFIX + base64.urlsafe_b64encode(proof.key).decode())
    client.delete("filler")
    client.config_set("maxmemory", 0)
    client.config_set("maxmemory-policy", "noeviction")
    return proof


def swapped(server: Redis, client: RedisClient) -> Ticket:
    """The record swapped away, a proof honored by the one begun in its place, and the
    older record swapped back."""
    client.swapdb(0, 1)
    assert spend(server, Ticket(b"a" * 16, int(time.time()) + 30, 0)) is Verdict.PREDATES
    began = began_at(server)
    proof = Ticket(b"p" * 16, began + 30, began)
    after(began)
    assert spend(server, proof) is Verdict.FIRST
    client.swapdb(0, 1)
    return proof


def reloaded(server: Redis, client: RedisClient) -> Ticket:
    """A dump saved before a proof was honored, loaded in place of the data after."""
    client.save()
    now = int(time.time())
    proof = Ticket(b"p" * 16, now + 30, now)
    assert spend(server, proof) is Verdict.FIRST
    client.execute_command("DEBUG", "RELOAD", "NOSAVE")
    return proof


async def checked(record: RedisRecord) -> None:
    try:
        await record.check()
    finally:
        await record.close()


def stats_reset(caplog: pytest.LogCaptureFixture) -> bool:
    return any(getattr(r, "error", None) == "redis_stats_reset" for r in caplog.records)


@pytest.mark.parametrize("roll_back", [evicted, swapped, reloaded])
def test_statistics_reset_after_the_data_went_back_honor_no_proof_again(
    tmp_path, caplog, roll_back
):
    """Whatever put older data in place of the record, a CONFIG RESETSTAT after it
    erases the counts the record's history is read from: the record then refuses every
    proof until the redis-server restarts."""
    server = Redis(tmp_path, "--save", "", "--appendonly", "no", "--enable-debug-command", "yes")
    server.start()
    try:
        with server.client() as client:
            redis_record.begin(client, int(time.time()) - 60)
            proof = roll_back(server, client)
            client.config_resetstat()
        after(proof.minted_after)
        assert spend(server, proof) is Verdict.UNAVAILABLE
        assert stats_reset(caplog)
        now = int(time.time())
        assert spend(server, Ticket(b"f" * 16, now + 30, now)) is Verdict.UNAVAILABLE
    finally:
        server.stop()


def test_a_redis_whose_statistics_were_reset_keeps_no_record_until_it_restarts(tmp_path, caplog):
    server = Redis(tmp_path)
    server.start()
    try:
        with server.client() as client:
            redis_record.begin(client, int(time.time()) - 60)
            client.config_resetstat()
        # No processor starts on it.
        with pytest.raises(ConfigError, match="cannot keep the record: redis_stats_reset: "):
            asyncio.run(checked(RedisRecord(server.url, 1.0)))
        now = int(time.time())
        assert spend(server, Ticket(b"p" * 16, now + 30, now)) is Verdict.UNAVAILABLE
        assert stats_reset(caplog)
        server.stop()
        server.start()  # a new process, whose statistics saw all it did
        with server.client() as client:
            redis_record.begin(client, now - 60)
        assert spend(server, Ticket(b"p" * 16, now + 30, now)) is Verdict.FIRST
    finally:
        server.stop()


def test_a_clock_stepped_back_past_twice_the_skew_honors_no_proof_whose_key_expired(redis):
    """A processor honors a proof; its key expires (expiry + 3 x skew, by Redis's clock);
    a processor whose clock was stepped back 2 x skew + 1.5 s verifies the proof again:
    the record has seen a later time, carried on by Redis's clock, and refuses it."""
    ttl, skew, timeout = 1, 1, 0.25
    keys = proof.KeySet({KEY_ID: b"k" * 32}, KEY_ID)
    params = {"remote_engine_id": "e", "prompt_token_ids": [1, 2, 3]}
    digest = bytes(32)
    terms = Terms(skew=skew)
    with redis.client() as seed:
        redis_record.begin(seed, int(time.time()) - 60, terms)
    expiry = int(time.time()) + ttl
    params[proof.PROOF_KEY] = proof.mint(keys, params, digest, expiry, minted=expiry - ttl)
    name = base64.urlsafe_b64encode(proof.ticket(params, skew).key).decode()
    key = redis_record.PREFIX + name

    async def run() -> tuple[Verdict, Verdict]:
        steady = RedisRecord(redis.url, timeout, terms=terms)
        stepped = RedisRecord(
            redis.url, timeout, clock=lambda: time.time() - 2 * skew - 1.5, terms=terms
        )
        try:
            first = await steady.spend(proof.ticket(params, skew))
            with redis.client() as client:
                while client.exists(key):  # until Redis forgot it
                    await asyncio.sleep(0.05)
            behind = time.time() - 2 * skew - 1.5
            assert proof.verify(keys, params, digest, behind, skew, lifetime=ttl) is None
            return first, await stepped.spend(proof.ticket(params, skew))
        finally:
            await steady.close()
            await stepped.close()

    assert asyncio.run(run()) == (Verdict.FIRST, Verdict.CLOCK_BEHIND)


def test_every_record_url_a_processor_accepts_reaches_the_one_record(tmp_path):
    """Processors on two databases of one Redis would keep two records, a proof honored
    in each: a configuration names database 0 or none, so whichever form each processor
    was given, they share one."""
    server = Redis(tmp_path)
    server.start()
    try:
        bare = f"redis://127.0.0.1:{server.port}"
        with pytest.raises(ConfigError, match="database 0"):
            Config.load(environ={}, proof={"record": f"{bare}/1"})
        urls = [
            Config.load(environ={}, proof={"record": u}).proof.record
            for u in (bare, f"{bare}/", f"{bare}/0")
        ]
        with server.client() as client:
            redis_record.begin(client, int(time.time()) - 60)
        now = int(time.time())
        ticket = Ticket(b"p" * 16, now + 30, now)

        async def each() -> list[Verdict]:
            records = [RedisRecord(url, 1.0) for url in urls]
            try:
                return [await record.spend(ticket) for record in records]
            finally:
                for record in records:
                    await record.close()

        assert asyncio.run(each()) == [Verdict.FIRST, Verdict.SPENT, Verdict.SPENT]
    finally:
        server.stop()


def serve_on(record: str) -> subprocess.CompletedProcess[str]:
    """``serve`` with ``record`` as its record of spent proofs, until it exits."""
    listen = f"127.0.0.1:{processes.free_port()}"
    command = [sys.executable, "-m", "ext_proc", "serve", "--listen", listen]
    environ = {**os.environ, "EXT_PROC_PROOF": f'{{record: "{record}"}}'}
    return subprocess.run(
        [*command, "--metrics-listen", ""],
        env=environ,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_serve_refuses_to_start_on_a_redis_that_answers_and_cannot_keep_the_record(tmp_path):
    server = Redis(
        tmp_path, "--save", "", "--appendonly", "no", "--maxmemory-policy", "allkeys-lru"
    )
    server.start()
    try:
        done = serve_on(server.url)
    finally:
        server.stop()
    assert done.returncode == 2
    # One line naming the setting, nothing served (no "serving" line, no traceback).
    assert done.stderr.startswith("ext_proc: proof.record: ")
    assert "cannot keep the record: redis_evicts_keys: " in done.stderr
    assert done.stderr.count("\n") == 1


def record_up(stack: Stack) -> float | None:
    """The processor's ext_proc_proof_record_up{store="redis"}; None when absent."""
    for line in metrics_text(stack).splitlines():
        if line.startswith('ext_proc_proof_record_up{store="redis"} '):
            return float(line.split()[1])
    return None


def check_config(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ext_proc", "check-config", *args, str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


def test_a_processor_started_while_redis_is_down_serves_and_honors_once_redis_can_keep_the_record(
    tmp_path, client
):
    """No Redis at start-up: the processor serves. A strip route through the real Envoy
    as ever; an honor route's proof answered 503 to retry (proof_record_unavailable,
    nothing upstream: no decode recomputes, as when Redis goes away under a running
    processor); the record reported down. A Redis that then answers and may evict keys
    is checked as at start-up and keeps nothing; once it can keep the record, honoring
    resumes."""
    for name in ("redis", "gateway"):
        (tmp_path / name).mkdir()
    server = Redis(
        tmp_path / "redis", "--save", "", "--appendonly", "no", "--maxmemory-policy", "allkeys-lru"
    )
    config = {"proof": {"record": server.url, **SHORT}}
    with Stack(
        tmp_path / "gateway", proof_keys={KEY_ID: new_key()}, processor_config=config
    ) as stack:
        assert "proof record: serving without it" in stack.logs("processor")
        assert record_up(stack) == 0
        offered = chat(kv_transfer_params={"do_remote_prefill": True, "remote_block_ids": [1]})
        rid = request_id()
        post(client, stack, "/v1/chat/completions", offered, rid)
        assert_not_honored(stack, offered, rid, "stripped_by_policy")
        sent = chat(minted(client, stack))
        refused_unavailable(client, stack, sent)
        checked = check_config(stack.workdir / "processor.yaml", "--connect")
        assert checked.returncode == 1
        assert ": proof.record: the Redis cannot be consulted (" in checked.stderr
        server.start()
        try:
            wait_for(lambda: '"state":"unsafe"' in stack.logs("processor"))
            assert "redis_evicts_keys" in stack.logs("processor")
            assert record_up(stack) == 0
            assert_record_refused(client, stack, chat(minted(client, stack)), "redis_evicts_keys")
            checked = check_config(stack.workdir / "processor.yaml", "--connect")
            assert checked.returncode == 1
            assert "cannot keep the record: redis_evicts_keys: " in checked.stderr
            with server.client() as admin:
                admin.config_set("maxmemory-policy", "noeviction")
            wait_for(lambda: record_up(stack) == 1)
            checked = check_config(stack.workdir / "processor.yaml", "--connect")
            assert checked.returncode == 0, checked.stderr
            assert checked.stdout.endswith(": OK; proof.record answers and can keep the record\n")
            warmed_up(client, stack)
            sent = chat(minted(client, stack))
            assert_honored(stack, sent, decode(client, stack, sent))
            assert_not_honored(stack, sent, decode(client, stack, sent), "proof_replayed")
        finally:
            server.stop()


# --- writers whose terms differ ---------------------------------------------------------

# A rolling update that raises clock_skew_seconds from 1 to 10: the old processor keeps a
# spent proof's key until its expiry + 3 s, the new one verifies the proof until its
# expiry + 10 s.
ROLLOUT = {"ttl_seconds": 1, "kv_lease_seconds": 21, "turn_ttl_seconds": 300}
OLD_SKEW, NEW_SKEW = 1, 10


def test_records_whose_writers_skews_differ_never_honor_a_proof_twice(tmp_path, caplog):
    """Two records on one Redis, one per side of the rollout, clocks set by the test: the
    new one presents the proof after the old one's key expired. The record knows its keys
    lived for a skew of 1 s: it refuses, raises its skew to 10 s and begins again; from
    then on the old processor's keys live for 10 s of skew too."""
    ttl, timeout = ROLLOUT["ttl_seconds"], 0.05
    old, new = Terms(skew=OLD_SKEW), Terms(skew=NEW_SKEW)
    keys = proof.KeySet({KEY_ID: b"k" * 32}, KEY_ID)
    digest = bytes(32)

    def minted_for(expiry: int) -> dict[str, Any]:
        params: dict[str, Any] = {"remote_engine_id": "e", "prompt_token_ids": [1, 2, 3]}
        params[proof.PROOF_KEY] = proof.mint(keys, params, digest, expiry, minted=expiry - ttl)
        return params

    clock = [time.time()]

    async def spend(record: RedisRecord, terms: Terms, params: dict[str, Any]) -> Verdict:
        assert proof.verify(keys, params, digest, clock[0], terms.skew, lifetime=ttl) is None
        return await record.spend(proof.ticket(params, terms.skew))

    async def rollout(first: RedisRecord, second: RedisRecord) -> None:
        expiry = int(clock[0]) + ttl
        spent = minted_for(expiry)
        clock[0] = expiry + OLD_SKEW - 0.1  # the last moment the old processor verifies it
        assert await spend(first, old, spent) is Verdict.FIRST
        await asyncio.sleep(2 * OLD_SKEW + 0.1 + timeout + 0.2)  # its key expired
        clock[0] = expiry + 3 * OLD_SKEW + 1
        assert await spend(second, new, spent) is Verdict.PREDATES
        assert [r.error for r in caplog.records if hasattr(r, "error")] == ["record_terms_raised"]
        # Raised: a proof minted after the record began again is kept for 10 s of skew by
        # the old processor too.
        clock[0] = math.ceil(clock[0]) + NEW_SKEW + 1
        expiry = int(clock[0]) + ttl
        later = minted_for(expiry)
        clock[0] = expiry + OLD_SKEW - 0.1
        assert await spend(first, old, later) is Verdict.FIRST
        for moment in (expiry + 3 * OLD_SKEW + 1, expiry + NEW_SKEW):
            clock[0] = moment
            assert await spend(second, new, later) is Verdict.SPENT

    async def run() -> None:
        first = RedisRecord(server.url, timeout, clock=lambda: clock[0], terms=old)
        second = RedisRecord(server.url, timeout, clock=lambda: clock[0], terms=new)
        try:
            await rollout(first, second)
        finally:
            await first.close()
            await second.close()

    server = Redis(tmp_path)
    server.start()
    try:
        with server.client() as seed:  # the record the old processors kept
            redis_record.begin(seed, int(clock[0]) - 60, old)
        asyncio.run(run())
    finally:
        server.stop()


def test_two_processors_whose_skews_differ_never_honor_a_proof_twice(tmp_path_factory, client):
    """The same rollout through two real gateways and processors on one real Redis: the
    proof honored through the old processor is not honored again through the new one
    after the old one's key expired (before, it was: trusted_proof)."""
    server = Redis(tmp_path_factory.mktemp("redis"))
    server.start()
    key = new_key()
    configs = [
        {"proof": {"record": server.url, "clock_skew_seconds": s, **ROLLOUT}}
        for s in (OLD_SKEW, NEW_SKEW)
    ]
    old, new = (
        Stack(tmp_path_factory.mktemp(name), proof_keys={KEY_ID: key}, processor_config=config)
        for name, config in zip(("old", "new"), configs, strict=True)
    )
    try:
        old.start()
        new.start()
        terms = Config.load(environ={}, **configs[0]).proof.terms
        with server.client() as seed:  # the record the old processors kept
            redis_record.begin(seed, int(time.time()) - 60, terms)
        sent = chat(minted(client, old))
        expiry = proof_parts(sent["kv_transfer_params"]).expiry
        assert_honored(old, sent, decode(client, old, sent))
        # The old processor's key lives until expiry + 3 x its skew (+ record_timeout).
        time.sleep(max(0.0, expiry + 3 * OLD_SKEW + 0.25 + 0.5 - time.time()))
        assert time.time() < expiry + NEW_SKEW  # the new processor still verifies it
        predated(client, new, sent, "record_terms_raised")
        assert refusals(new, "record_terms_raised") == 1
    finally:
        old.stop()
        new.stop()
        server.stop()


def test_a_record_without_terms_begins_again_once_and_smaller_terms_never_begin_it(
    tmp_path, caplog
):
    """A record an earlier release began states no terms: the first spend that keeps
    terms begins it again. A writer with smaller terms then begins nothing, and its keys
    live for the record's larger skew."""
    terms, smaller = Terms(skew=1), Terms(skew=0)
    clock = [time.time()]
    now = int(clock[0])
    server = Redis(tmp_path)
    server.start()

    async def run() -> list[Verdict]:
        record = RedisRecord(server.url, 1.0, clock=lambda: clock[0], terms=terms)
        lower = RedisRecord(server.url, 1.0, clock=lambda: clock[0], terms=smaller)
        try:
            verdicts = [await record.spend(Ticket(b"a" * 16, now + 30, now - 10))]
            clock[0] += 3
            verdicts.append(await record.spend(Ticket(b"b" * 16, now + 30, now + 3)))
            verdicts.append(await lower.spend(Ticket(b"c" * 16, now + 30, now + 3)))
            return verdicts
        finally:
            await record.close()
            await lower.close()

    try:
        with server.client() as client:
            redis_record.begin(client, now - 60, terms)
            client.delete(redis_record.TERMS)  # as a record an earlier release began
            assert asyncio.run(run()) == [Verdict.PREDATES, Verdict.FIRST, Verdict.FIRST]
            assert [r.error for r in caplog.records if hasattr(r, "error")] == [
                "record_terms_raised"
            ]
            assert began_at(server) == math.ceil(clock[0] - 3)  # it began again once
            stated = client.get(redis_record.TERMS)
            assert stated is not None
            assert stated.split(b" ")[1:] == [str(began_at(server)).encode(), b"1"]
            # The smaller writer's key lives until expiry + 3 x the record's skew.
            name = redis_record.PREFIX + base64.urlsafe_b64encode(b"c" * 16).decode()
            assert client.pttl(name) > (now + 30 + 3 * terms.skew - clock[0]) * 1000 - 500
    finally:
        server.stop()


# --- a proof minted for longer than its verifier's lifetime ------------------------------


async def honored_under(
    record: RedisRecord, terms: Terms, ttl: int, params: dict[str, Any], now: float
) -> Verdict | str:
    """What a processor of ``terms`` whose proofs live ``ttl`` decides for ``params`` at
    ``now``: why they do not verify, else the record's verdict."""
    keys = proof.KeySet({KEY_ID: b"k" * 32}, KEY_ID)
    why = proof.verify(keys, params, bytes(32), now, terms.skew, lifetime=ttl)
    if why is not None:
        return why
    return await record.spend(proof.ticket(params, terms.skew))


def minted_for(lifetime: int, expiry: int) -> dict[str, Any]:
    """Parameters with a proof minted for ``lifetime`` to expire at ``expiry``."""
    keys = proof.KeySet({KEY_ID: b"k" * 32}, KEY_ID)
    params: dict[str, Any] = {"remote_engine_id": "e", "prompt_token_ids": [1, 2, 3]}
    params[proof.PROOF_KEY] = proof.mint(keys, params, bytes(32), expiry, minted=expiry - lifetime)
    return params


def test_a_redis_flushed_under_writers_of_other_lifetimes_honors_no_proof_twice(tmp_path):
    """Writers whose ttl_seconds differ (10 s and 2 s) share a Redis; it is flushed and
    the 2 s writer begins it again, its terms alone. A proof minted for 10 s and spent
    before the flush is not honored again by the 2 s writer."""
    terms, long, short = Terms(skew=1), 10, 2
    now = int(time.time())
    clock = [now + 0.1]
    server = Redis(tmp_path)

    async def run() -> list[Verdict | str]:
        first = RedisRecord(server.url, 1.0, clock=lambda: clock[0], terms=terms)
        second = RedisRecord(server.url, 1.0, clock=lambda: clock[0], terms=terms)
        try:
            spent = minted_for(long, now + long)  # minted at now, for 10 s
            verdicts = [await honored_under(first, terms, long, spent, clock[0])]
            with server.client() as client:
                client.flushall()
            # The 2 s writer begins the record again.
            verdicts.append(await second.spend(Ticket(b"q" * 16, now + 30, now - 100)))
            clock[0] = now + long - short - terms.skew
            verdicts.append(await honored_under(second, terms, short, spent, clock[0]))
            return verdicts
        finally:
            await first.close()
            await second.close()

    server.start()
    try:
        with server.client() as client:
            redis_record.begin(client, now - 60, terms)
        spent, began, again = asyncio.run(run())
        assert (spent, began) == (Verdict.FIRST, Verdict.PREDATES)
        assert again is not Verdict.FIRST
        assert again == "proof_outlives_lease"  # minted for longer than it mints for
    finally:
        server.stop()


def _presented_across_a_flush(
    tmp_path: Path, ttl: int, lifetime: int, expiry: int, *, beginner_behind: float | None
) -> tuple[Verdict | str, Verdict | str, Verdict | str]:
    """A proof minted for ``lifetime`` s, expiring ``expiry`` s after now, is presented to
    a verifier living ``ttl`` s (skew 1); the Redis is flushed and begun again, by a
    second writer whose clock reads ``beginner_behind`` s behind (None: by the verifier
    itself); the proof is presented again. The three verdicts, the beginning's between."""
    verifiers = Terms(skew=1)
    base = int(time.time())
    clock = [base + 0.1]
    server = Redis(tmp_path)

    async def run() -> list[Verdict | str]:
        spender = RedisRecord(server.url, 1.0, clock=lambda: clock[0], terms=verifiers)
        beginner = spender
        if beginner_behind is not None:
            behind = beginner_behind
            beginner = RedisRecord(
                server.url, 1.0, clock=lambda: clock[0] - behind, terms=verifiers
            )
        try:
            spent = minted_for(lifetime, base + expiry)
            verdicts = [await honored_under(spender, verifiers, ttl, spent, clock[0])]
            with server.client() as client:
                client.flushall()
            clock[0] = base + 0.2
            verdicts.append(await beginner.spend(Ticket(b"q" * 16, base + 30, base - 100)))
            clock[0] = base + 0.3
            verdicts.append(await honored_under(spender, verifiers, ttl, spent, clock[0]))
            return verdicts
        finally:
            await spender.close()
            if beginner is not spender:
                await beginner.close()

    server.start()
    try:
        with server.client() as client:
            redis_record.begin(client, base - 60, verifiers)
        first, began, again = asyncio.run(run())
        return first, began, again
    finally:
        server.stop()


def test_a_proof_a_minter_minted_for_longer_than_the_verifiers_is_honored_once(tmp_path):
    """The verifiers live 2 s; a processor that only mints mints for 3 s. The Redis
    forgets, and the processor that begins it again reads within the skew behind: the
    proof spent before must not be honored again."""
    # Minted at now, for 3 s.
    first, began, again = _presented_across_a_flush(tmp_path, 2, 3, 3, beginner_behind=1.0)
    assert began is Verdict.PREDATES  # the record began again
    assert [first, again].count(Verdict.FIRST) <= 1
    assert again is not Verdict.FIRST
    # Refused at its first presentation already: minted for longer than 2 s.
    assert first == again == "proof_outlives_lease"


def test_a_proof_stating_a_minting_time_ahead_of_every_clock_is_honored_once(tmp_path):
    """A processor whose clock runs 10 s ahead (past the skew) mints for 5 s; the
    verifiers live 20 s. Its proof is spent, the Redis is flushed and begun again at
    once: the proof must not be honored a second time."""
    # States minted at now + 10, for 5 s.
    first, began, again = _presented_across_a_flush(tmp_path, 20, 5, 15, beginner_behind=None)
    assert began is Verdict.PREDATES  # the record began again
    assert [first, again].count(Verdict.FIRST) <= 1
    assert first == again == "proof_outlives_lease"  # minted ahead of this clock
