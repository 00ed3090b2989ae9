"""The Redis record's failure path, and what it answers for a proof minted before it
began (a real redis-server; the rest through the real Envoy: tests/e2e/test_replay.py)."""

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from bench import tools
from devstack import processes
from ext_proc.core.config import ConfigError
from ext_proc.core.replay import NO_TERMS, Terms, Ticket, Verdict
from ext_proc.edge import redis_record
from ext_proc.edge.redis_record import (
    RecordState,
    RecordUnreachable,
    RedisRecord,
    read_password,
)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_redis_that_refuses_connections_is_unavailable_at_once():
    errors = []
    record = RedisRecord(f"redis://127.0.0.1:{closed_port()}/0", 0.25, lambda: errors.append(1))

    async def spend():
        try:
            return await record.spend(Ticket(b"k" * 16, int(time.time()) + 30, int(time.time())))
        finally:
            await record.close()

    started = time.monotonic()
    assert asyncio.run(spend()) is Verdict.UNAVAILABLE
    assert time.monotonic() - started < 5  # no retries beyond the one attempt
    assert errors == [1]


def test_a_redis_that_never_answers_is_unavailable_after_the_timeout():
    with socket.socket() as silent:  # accepts (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        record = RedisRecord(f"redis://127.0.0.1:{port}/0", 0.2)

        async def spend():
            try:
                return await record.spend(
                    Ticket(b"k" * 16, int(time.time()) + 30, int(time.time()))
                )
            finally:
                await record.close()

        assert asyncio.run(spend()) is Verdict.UNAVAILABLE


def test_a_ticket_past_its_time_is_never_new():
    record = RedisRecord("redis://127.0.0.1:1/0", 0.2)
    assert (
        asyncio.run(record.spend(Ticket(b"k" * 16, int(time.time()) - 1, int(time.time()) - 30)))
        is Verdict.SPENT
    )


def test_the_password_file_is_read_without_its_trailing_newline(tmp_path):
    path = tmp_path / "password"
    path.write_text("s3cret\n")
    assert read_password(str(path)) == "s3cret"
    path.write_text("s3cret")
    assert read_password(str(path)) == "s3cret"
    assert read_password(None) is None


def test_a_password_file_that_cannot_be_read_or_is_empty_stops_the_start(tmp_path):
    with pytest.raises(ConfigError, match="cannot read") as missing:
        RedisRecord("redis://127.0.0.1:1/0", 0.2, password_file=str(tmp_path / "absent"))
    assert "absent" in str(missing.value)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        read_password(str(tmp_path / "empty"))


def test_a_redis_that_does_not_answer_is_unreachable_and_reported_once():
    """Every consultation (the checks serve runs, a spend) finds the same state; the
    state is reported when it changes, not on every consultation."""
    states = []
    url = f"redis://127.0.0.1:{closed_port()}/0"
    record = RedisRecord(url, 0.2, on_state=states.append)

    async def consult():
        try:
            with pytest.raises(RecordUnreachable, match=r"^proof\.record: the Redis cannot be"):
                await record.check()
            assert record.state is RecordState.UNKNOWN  # check only says, for serve
            found = [await record.probe()]
            ticket = Ticket(b"k" * 16, int(time.time()) + 30, int(time.time()))
            assert await record.spend(ticket) is Verdict.UNAVAILABLE
            found.append(await record.probe())
            return found
        finally:
            await record.close()

    assert asyncio.run(consult()) == [RecordState.UNREACHABLE] * 2
    assert states == [RecordState.UNREACHABLE]
    assert record.state is RecordState.UNREACHABLE


# --- a proof minted before the record began (a real redis-server) -----------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Redis]:
    """A real redis-server on a loopback port, persisting nothing."""
    binary = tools.ensure_tools({"redis-server": "redis-server"})["redis-server"]
    port = processes.free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)]
    process = processes.start([*args, "--save", "", "--appendonly", "no"], tmp_path / "log")
    try:
        processes.wait_for_port(port, process)
        with Redis(host="127.0.0.1", port=port, socket_timeout=10) as client:
            yield client
    finally:
        processes.stop(process)


def spent_on(
    client: Redis, *tickets: Ticket, terms: Terms = NO_TERMS, errors: int = 0
) -> list[Verdict]:
    """The verdicts of a record on ``client``'s Redis for ``tickets``, in turn; it
    counted ``errors`` record errors meanwhile."""
    kwargs = client.connection_pool.connection_kwargs
    counted: list[int] = []

    async def run() -> list[Verdict]:
        url = f"redis://{kwargs['host']}:{kwargs['port']}/0"
        record = RedisRecord(url, 1.0, lambda: counted.append(1), terms=terms)
        try:
            return [await record.spend(ticket) for ticket in tickets]
        finally:
            await record.close()

    verdicts = asyncio.run(run())
    assert len(counted) == errors
    return verdicts


def test_a_proof_minted_before_the_record_began_predates_it(server):
    """No retry can vouch for it: PREDATES (unproven), not UNAVAILABLE (a 503 to retry).
    A proof minted after the beginning is honored once."""
    now = int(time.time())
    redis_record.begin(server, now)
    before = Ticket(b"b" * 16, now + 30, now - 1)
    after = Ticket(b"a" * 16, now + 30, now)
    assert spent_on(server, before, after, after, before) == [
        Verdict.PREDATES,
        Verdict.FIRST,
        Verdict.SPENT,
        Verdict.PREDATES,
    ]


def test_a_flushed_redis_begins_the_record_again_and_earlier_proofs_predate_it(server):
    now = int(time.time())
    redis_record.begin(server, now - 60)
    spent = Ticket(b"s" * 16, now + 30, now - 10)
    assert spent_on(server, spent) == [Verdict.FIRST]
    server.flushall()
    assert spent_on(server, spent) == [Verdict.PREDATES]


def test_a_writer_that_raises_the_skew_begins_the_record_again_and_its_proof_predates_it(
    server,
):
    now = int(time.time())
    redis_record.begin(server, now - 60, Terms(skew=0))
    ticket = Ticket(b"r" * 16, now + 30, now - 1)
    assert spent_on(server, ticket, terms=Terms(skew=1)) == [Verdict.PREDATES]


def test_a_redis_that_answers_and_cannot_keep_the_record_stays_unavailable(server):
    """Not the proof's age: the record cannot be consulted, a retry may succeed."""
    now = int(time.time())
    redis_record.begin(server, now - 60)
    server.config_set("maxmemory-policy", "allkeys-lru")
    ticket = Ticket(b"u" * 16, now + 30, now)
    assert spent_on(server, ticket, errors=1) == [Verdict.UNAVAILABLE]
