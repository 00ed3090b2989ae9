"""The fault tier's harness: the real stack (tests/e2e/stack.py: the real Envoy on the
shipped envoy/envoy.yaml, the processor, the recording stand-in upstream, a real
redis-server when the record is Redis), the faults done to each part, and a bounded
load of N client threads for S seconds whose outcome is counted at both ends.

At the client: each answer's status (or ``reset``, ``refused``, ``timeout`` for a
connection that failed) and whether it carried ``retry-after``. At the upstream: the
arrivals, a request arriving more than once (``duplicates``), a forged
``kv_transfer_params`` that reached it (``uninspected``), a body cut short
(``half_sent``: the stand-in saw a request whose connection ended before its body, or
recorded a body that is not the whole document sent), one proof honored more than once
(``double_honors``), and requests the upstream received whose client got no answer
and no answer or an error (``lost_answers``: a client that retries them runs the
inference twice).

Each request carries its own id in the ``x-fault-request`` header, so an arrival is
matched to the request that made it whatever the processor rewrote in its body.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from devstack import processes
from devstack.upstream import DELAY_HEADER
from tests.e2e.conftest import KEY_ID
from tests.e2e.stack import Stack, new_key, wait_for_fresh_record
from tests.e2e.test_operations import _is_worker, children_of, wait_for
from tests.e2e.test_replay import Redis

STRIP = "/v1/chat/completions"  # the shipped aggregated route: a client's parameters removed
PREFILL = "/pd/prefill/v1/chat/completions"  # mints a proof for the response's parameters
DECODE = "/pd/v1/chat/completions"  # honors a proof the prefill route minted, once
ID_HEADER = "x-fault-request"  # each request's own id
FORGED = "FORGED-"  # the marker of a client's own parameters; never upstream
OK = frozenset({"200"})  # the answers a client does not retry
# The kinds of request each client sends, in turn.
KINDS = ("legit", "forged", "mint", "honor", "replay")
# Proofs live long enough to be replayed across a fault; clocks 1 s apart.
PROOF = {"ttl_seconds": 20, "clock_skew_seconds": 1, "kv_lease_seconds": 30}


def faults_stack(
    workdir: Path,
    *,
    workers: int = 1,
    redis: Redis | None = None,
    hot_restart: bool = False,
    processor_env: dict[str, str] | None = None,
    processor_config: dict[str, Any] | None = None,
) -> Stack:
    """A stack on the shipped envoy/envoy.yaml with a signing key (mint and honor
    routes), its record local or on ``redis``; not started. ``hot_restart``: Envoy runs
    at restart epoch 0 so ``hot_restart_envoy`` can take over from it."""
    config = dict(processor_config or {})
    proof = {**PROOF, **config.get("proof", {})}
    if redis is not None:
        proof["record"] = redis.url
    config["proof"] = proof
    return Stack(
        workdir,
        proof_keys={KEY_ID: new_key()},
        processor_config=config,
        workers=workers,
        processor_env=dict(processor_env or {}),
        envoy_epoch=0 if hot_restart else None,
    )


# --- faults ------------------------------------------------------------------------------


def signal_processor(stack: Stack, number: int) -> None:
    """``number`` to the processor's process group (its workers included)."""
    os.killpg(stack.children["processor"].pid, number)


def kill_processor(stack: Stack) -> None:
    """SIGKILL to the processor and its workers; nothing drains."""
    process = stack.children.pop("processor")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=20)


def restart_processor(stack: Stack, env: dict[str, str] | None = None) -> None:
    """The processor started again on the same port and config (``env``: its
    environment this time, e.g. a clock set back), once it listens."""
    if env is not None:
        stack.processor_env = env
    stack.start_processor()


def workers_of(stack: Stack) -> set[int]:
    """The pids of the supervisor's workers now."""
    supervisor = stack.children["processor"].pid
    return {pid for pid in children_of(supervisor) if _is_worker(pid)}


def wait_for_workers(stack: Stack, count: int, timeout: float = 30) -> None:
    wait_for(lambda: len(workers_of(stack)) == count, timeout)


def restart_envoy(stack: Stack) -> None:
    """A plain restart: Envoy stopped (SIGTERM, its connections closed), then started
    again on the same config."""
    processes.stop(stack.children.pop("envoy"))
    stack.start_envoy()


def hot_restart_envoy(stack: Stack) -> subprocess.Popen[bytes]:
    """Envoy's hot restart: a new Envoy at the next epoch takes over the listeners and
    the old one drains and exits by itself; returns the old one (still draining)."""
    assert stack.envoy_epoch is not None, "the stack was not started with hot_restart"
    old = stack.children.pop("envoy")
    stack.envoy_epoch += 1
    stack.start_envoy()
    return old


# --- load --------------------------------------------------------------------------------

_ids = itertools.count()


def _chat(rid: str, **extra: Any) -> dict[str, Any]:
    """A chat request with its own id, its prompt its own too unless ``extra`` names
    one (a decode leg keeps its prefill leg's prompt: the proof binds it)."""
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"request {rid}: summarise the notes"}],
        "max_tokens": 7,
        **extra,
    }


def prime(stack: Stack) -> None:
    """A Redis record begins at its first spend, and honors only proofs minted a skew
    after: one proof minted and spent, then that wait, so that the load's proofs are
    honored from the start (a local record began before the processor served)."""
    proof = stack.processor_config["proof"]
    if not proof.get("record"):
        return
    with httpx.Client(timeout=15) as client:
        prompt = _chat("prime", max_tokens=1, return_token_ids=True)
        params = client.post(stack.url + PREFILL, json=prompt).json()["kv_transfer_params"]
        decode = _chat("prime", messages=prompt["messages"], kv_transfer_params=params)
        client.post(stack.url + DECODE, json=decode).raise_for_status()
    wait_for_fresh_record(proof["clock_skew_seconds"])


def _forged(rid: str) -> dict[str, Any]:
    return {
        "prompt_token_ids": [1, 2, 3],
        "remote_block_ids": [7, 8],
        "remote_host": f"{FORGED}{rid}",
        "do_remote_prefill": True,
    }


@dataclass(frozen=True)
class Minted:
    messages: list[dict[str, Any]]
    params: dict[str, Any]


@dataclass
class Tally:
    """What the clients saw."""

    statuses: Counter[str] = field(default_factory=Counter)
    retry_after: Counter[str] = field(default_factory=Counter)  # statuses with retry-after
    outcome: dict[str, str] = field(default_factory=dict)  # request id -> status or error
    kind: dict[str, str] = field(default_factory=dict)  # request id -> one of KINDS
    kinds: Counter[str] = field(default_factory=Counter)
    # Each proof minted: the prefill leg's messages and the parameters it returned.
    minted: list[Minted] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, rid: str, kind: str, outcome: str, retry_after: bool) -> None:
        with self.lock:
            self.statuses[outcome] += 1
            self.retry_after[outcome] += retry_after
            self.outcome[rid] = outcome
            self.kind[rid] = kind
            self.kinds[kind] += 1


def _send(
    client: httpx.Client, url: str, rid: str, body: dict[str, Any], delay: float
) -> httpx.Response:
    headers = {ID_HEADER: rid, **({DELAY_HEADER: str(delay)} if delay else {})}
    return client.post(url, json=body, headers=headers)


def _failure(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "refused"  # never sent: safe to retry
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    return "reset"


@dataclass
class Load:
    """``clients`` threads sending ``KINDS`` in turn for ``seconds`` through ``stack``;
    a context manager: the load runs while its block does the faults, and leaving it
    waits for the clients to finish. ``delay``: seconds the upstream takes to answer
    each request (requests in flight at the upstream when a fault lands)."""

    stack: Stack
    clients: int = 8
    seconds: float = 15
    delay: float = 0.0
    timeout: float = 15.0
    tally: Tally = field(default_factory=Tally)
    threads: list[threading.Thread] = field(default_factory=list)
    before: Counter[str] = field(default_factory=Counter)  # the decisions before the load

    def __enter__(self) -> Load:
        prime(self.stack)
        self.stack.clear()
        self.before = reasons(self.stack)
        end = time.monotonic() + self.seconds
        for number in range(self.clients):
            thread = threading.Thread(target=self._client, args=(number, end), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        for thread in self.threads:
            thread.join(self.seconds + self.timeout + 30)
        assert not any(t.is_alive() for t in self.threads), "a client did not finish"

    def decisions(self) -> Counter[str]:
        """The processor's decisions since the load began (Envoy's access log, by reason)."""
        return reasons(self.stack) - self.before

    def _client(self, number: int, end: float) -> None:
        rng = random.Random(number)  # which proof to replay: not a secret
        fresh: list[Minted] = []
        with httpx.Client(timeout=self.timeout) as client:
            for kind in itertools.cycle(KINDS):
                if time.monotonic() >= end:
                    return
                self._one(client, kind, fresh, rng)

    def _one(
        self, client: httpx.Client, kind: str, fresh: list[Minted], rng: random.Random
    ) -> None:
        rid = f"fault-{next(_ids)}"
        path, body = STRIP, _chat(rid)
        if kind == "forged":
            body["kv_transfer_params"] = _forged(rid)
        elif kind == "mint":
            path, body = PREFILL, _chat(rid, max_tokens=1, return_token_ids=True)
        elif kind in ("honor", "replay"):
            with self.tally.lock:
                pool = fresh if kind == "honor" else self.tally.minted
                params = pool.pop() if kind == "honor" and pool else None
                if kind == "replay" and pool:
                    params = rng.choice(pool)
            if params is None:
                return
            path = DECODE
            body = _chat(rid, messages=params.messages, kv_transfer_params=params.params)
        try:
            reply = _send(client, self.stack.url + path, rid, body, self.delay)
        except httpx.HTTPError as exc:
            self.tally.note(rid, kind, _failure(exc), False)
            return
        self.tally.note(rid, kind, str(reply.status_code), "retry-after" in reply.headers)
        if kind == "mint" and reply.status_code == 200:
            minted = Minted(body["messages"], reply.json()["kv_transfer_params"])
            with self.tally.lock:
                self.tally.minted.append(minted)
            fresh.append(minted)


# --- counts at the upstream --------------------------------------------------------------


@dataclass
class Counts:
    """The load's outcome at both ends."""

    requests: int
    statuses: dict[str, int]
    retry_after: dict[str, int]
    arrivals: int
    duplicates: int
    uninspected: int
    half_sent: int
    honored: int
    double_honors: int
    lost_answers: int
    lost_kinds: dict[str, int]  # the lost answers by kind of request
    # The failed requests that never reached the upstream, by status: safe to retry.
    unforwarded: dict[str, int]

    def row(self, fault: str) -> str:
        """One row of docs/operations.md's fault table."""
        shown = ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items()))
        return (
            f"| {fault} | {self.requests} | {shown} | {self.honored} | {self.uninspected}"
            f" | {self.duplicates} | {self.double_honors} | {self.half_sent}"
            f" | {self.lost_answers} |"
        )


def _document(body: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(body)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def count(stack: Stack, load: Load) -> Counts:
    """Every arrival since the load began, matched to the requests sent."""
    received = stack.received()
    incomplete = stack.incomplete_count()
    seen: Counter[str] = Counter()
    honors: Counter[str] = Counter()
    uninspected = malformed = 0
    for arrival in received:
        uninspected += FORGED.encode() in arrival.body
        document = _document(arrival.body)
        rid = next(iter(arrival.header(ID_HEADER)), "")
        if document is None or "messages" not in document or rid not in load.tally.outcome:
            malformed += 1
            continue
        seen[rid] += 1
        params = document.get("kv_transfer_params")
        if isinstance(params, dict) and "token_policy_proof" in params:
            honors[str(params["token_policy_proof"])] += 1
    outcome = load.tally.outcome
    lost = Counter(load.tally.kind[rid] for rid in seen if outcome[rid] not in OK)
    unforwarded = Counter(o for rid, o in outcome.items() if o not in OK and rid not in seen)
    return Counts(
        requests=sum(load.tally.statuses.values()),
        statuses=dict(load.tally.statuses),
        retry_after={k: v for k, v in load.tally.retry_after.items() if v},
        arrivals=len(received),
        duplicates=sum(n - 1 for n in seen.values()),
        uninspected=uninspected,
        half_sent=incomplete + malformed,
        honored=sum(honors.values()),
        double_honors=sum(n - 1 for n in honors.values() if n > 1),
        lost_answers=lost.total(),
        lost_kinds=dict(lost),
        unforwarded=dict(unforwarded),
    )


def assert_sound(counts: Counts, allowed: set[str], fault: str = "") -> None:
    """Nothing un-inspected, duplicated, honored twice or half-sent, and every status
    one of ``allowed`` (strings: "200", "503", "reset", ...); the counts printed, as a
    row of the fault table when ``fault`` names it."""
    print(counts)
    if fault:
        print(counts.row(fault))
    assert counts.uninspected == 0, counts
    assert counts.duplicates == 0, counts
    assert counts.double_honors == 0, counts
    assert counts.half_sent == 0, counts
    assert set(counts.statuses) <= allowed, counts
    # A 503 is an answer to retry: it says when (the processor's and Envoy's alike).
    assert counts.retry_after.get("503", 0) == counts.statuses.get("503", 0), counts
    assert counts.statuses.get("200", 0) > 0, counts


def reasons(stack: Stack) -> Counter[str]:
    """The processor's decisions as Envoy's access log names them (policy_reason), every
    Envoy of the stack so far (none for a stack whose Envoy logs elsewhere)."""
    found: Counter[str] = Counter()
    log = stack.workdir / "envoy.log"
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("policy_reason"):
                found[str(entry["policy_reason"])] += 1
    return found


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[Redis]:
    """A real redis-server on a loopback port (installed with apt-get if missing)."""
    server = Redis(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
