"""The Redis record's failure path (a real redis-server: tests/e2e/test_replay.py)."""

import asyncio
import socket
import time

import pytest

from ext_proc.core.config import ConfigError
from ext_proc.core.replay import Ticket, Verdict
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
