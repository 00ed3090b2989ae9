"""The proven cells' proofs: a pool of distinct valid proofs, spliced into the document's
bytes by wrk's script, one per request, never twice in a run (no service is started)."""

from __future__ import annotations

import http.server
import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from bench import bodies, load, proofs, run, stack, tools
from ext_proc.core import proof
from ext_proc.core.config import Config
from ext_proc.core.vllm_request import KV_KEY


def _split(pool: bytes) -> list[bytes]:
    assert len(pool) % proofs.WIDTH == 0
    return [pool[at : at + proofs.WIDTH] for at in range(0, len(pool), proofs.WIDTH)]


def test_the_pool_holds_distinct_proofs_the_service_verifies() -> None:
    body = bodies.build("2k", "honor-proven")
    tokens = _split(proofs.mint_pool(body.data, 500))
    assert len(set(tokens)) == 500
    document = json.loads(body.data)
    digest = proof.prompt_digest(document, orjson_safe=False, endpoint=proofs.ENDPOINT)
    assert digest is not None
    now = time.time()
    for token in tokens:
        params = {**document[KV_KEY], proof.PROOF_KEY: token.decode()}
        verdict = proof.verify(
            proofs.KEYS, params, digest, now, proofs.SKEW, lifetime=proofs.LIFETIME
        )
        assert verdict is None
    # Their records' keys differ too: no proof of the pool is a replay of another.
    keys = {proof.ticket({proof.PROOF_KEY: t.decode()}, proofs.SKEW).key for t in tokens}
    assert len(keys) == 500
    # The fixed body's placeholder outlives any lease the service accepts.
    placeholder = document[KV_KEY]
    verdict = proof.verify(proofs.KEYS, placeholder, digest, now, 5, lifetime=proofs.LIFETIME)
    assert verdict == "proof_outlives_lease"


@pytest.mark.parametrize("size", sorted(bodies.SIZES))
def test_a_spliced_body_is_the_document_with_another_proof(size: str) -> None:
    body = bodies.build(size, "honor-proven")
    (token,) = _split(proofs.mint_pool(body.data, 1))
    data = body.with_proof(token)
    assert len(data) == bodies.SIZES[size]
    assert data == body.prefix + token + body.suffix
    spliced, original = json.loads(data), json.loads(body.data)
    assert spliced[KV_KEY].pop(proof.PROOF_KEY) == token.decode()
    original[KV_KEY].pop(proof.PROOF_KEY)
    assert spliced == original


def test_the_processor_config_loads_and_its_budget_holds_the_table(tmp_path: Path) -> None:
    settings = proofs.processor_config(tmp_path, record_slots=1 << 20)
    loaded = Config.model_validate(settings)
    assert loaded.proof.ttl_seconds == proofs.LIFETIME
    assert loaded.inflight_budget_bytes > proofs.BODY_BUDGET


def test_each_round_and_run_of_a_cell_has_its_own_slice() -> None:
    cells = (run.Cell("1m", "honor-proven", 8),)
    plan = run.Plan(cells, (1,), 4, 1, smoke=False, threads=3, rounds=3)
    layout = run.ProofPlan.of(plan, plan.cells[0])
    assert layout.threads == 3
    taken: list[range] = [range(0, 1)]  # the probes'
    for number in range(plan.rounds):
        for piece in layout.slices(number):
            taken.append(range(piece.first, piece.first + piece.per_thread * layout.threads))
    ends = sorted((r.start, r.stop) for r in taken)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ends))  # disjoint
    assert ends[-1][1] == layout.count
    # Enough for PEAK_RPS through each run, and a table that records them all.
    assert layout.measure * layout.threads >= run.PEAK_RPS["1m"] * plan.seconds
    assert run.record_slots(plan) >= layout.count


class _Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        type(self).bodies.append(self.rfile.read(length))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[bytes]]]:
    received: list[bytes] = []
    handler = type("Handler", (_Recorder,), {"bodies": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{bodies.DISAGGREGATED}", received
    finally:
        server.shutdown()
        server.server_close()


def _script(tmp_path: Path, body: bodies.Body, count: int) -> tuple[Path, list[bytes]]:
    pool = proofs.mint_pool(body.data, count)
    files = {}
    for part, data in (("prefix", body.prefix), ("suffix", body.suffix), ("pool", pool)):
        files[part] = tmp_path / part
        files[part].write_bytes(data)
    lua = load.spliced_script(tmp_path, "proven", **files, width=proofs.WIDTH)
    return lua, _split(pool)


def _wrk() -> str:
    wrk = tools.which("wrk")
    if wrk is None:
        pytest.skip("wrk is not installed (python -m bench installs it)")
    return wrk


def test_wrk_sends_each_proof_of_its_slice_once(
    tmp_path: Path, recorder: tuple[str, list[bytes]]
) -> None:
    wrk = _wrk()
    url, received = recorder
    body = bodies.build("2k", "honor-proven")
    piece = load.Slice(first=7, per_thread=20_000)
    lua, tokens = _script(tmp_path, body, 7 + 2 * piece.per_thread + 5)
    result = load.run(wrk, url, lua, concurrency=4, seconds=1, threads=2, proofs=piece)
    assert result.requests > 0
    assert len(received) >= result.requests
    sent = [data[len(body.prefix) : len(body.prefix) + proofs.WIDTH] for data in received]
    # Exactly the document's bytes around a proof, each proof from a thread's slice.
    assert all(data == body.with_proof(token) for data, token in zip(received, sent, strict=True))
    assert len(set(sent)) == len(sent)
    slices = set(tokens[7 : 7 + 2 * piece.per_thread])
    assert set(sent) <= slices
    # Each thread starts at its own end of the slice (wrk builds one request of the
    # first thread before the run, to check the script: that proof is never sent).
    assert {tokens[8], tokens[7 + piece.per_thread]} <= set(sent)


def test_wrk_fails_when_a_thread_used_its_slice_up(
    tmp_path: Path, recorder: tuple[str, list[bytes]]
) -> None:
    wrk = _wrk()
    url, _ = recorder
    lua, _ = _script(tmp_path, bodies.build("2k", "honor-proven"), 10)
    with pytest.raises(load.LoadError, match="ran out"):
        load.run(wrk, url, lua, concurrency=1, seconds=1, proofs=load.Slice(2, 3))


def test_the_redis_arrangement_is_named_and_never_the_default() -> None:
    redis = stack.Arrangement("service", 1, record="redis")
    assert (redis.name, redis.default) == ("service-w1-redis", False)
    chosen, _ = run.arrangements((1, 2), flag=True, records=("local", "redis"))
    names = [a.name for a in chosen]
    assert names[-5:] == [
        "service-w1",
        "service-w1-redis",
        "service-w2",
        "service-w2-redis",
        "service-w1-2msg",
    ]
    assert [a.name for a in chosen if a.default] == ["service-w1"]
