import contextlib

import pytest

from ext_proc.core import memory, reading
from ext_proc.core.budget import Budget
from ext_proc.core.errors import ProtocolError
from ext_proc.core.events import (
    Reject,
    RequestBody,
    TimedOut,
    Unexpected,
)
from tests.core.messages import BUFFERED, DUPLEX, IDS, JSON, error_body, headers, new, only


def test_acquire_up_to_the_limit_and_release():
    budget = Budget(10)
    assert budget.try_acquire(6)
    assert not budget.try_acquire(5)  # 11 > 10: refused, nothing taken
    assert budget.used == 6
    assert budget.try_acquire(4)
    assert (budget.used, budget.peak) == (10, 10)
    budget.release(10)
    assert (budget.used, budget.peak) == (0, 10)  # the peak stays
    assert budget.try_acquire(0)


@pytest.mark.parametrize("size", [-1, 4])
def test_releasing_what_was_not_held_is_a_bug(size):
    budget = Budget(10)
    budget.try_acquire(3)
    with pytest.raises(ValueError, match="releasing"):
        budget.release(size)
    assert budget.used == 3


def test_a_negative_reservation_is_a_bug():
    with pytest.raises(ValueError, match="negative"):
        Budget(10).try_acquire(-1)


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_exhausted_budget_answers_503_with_retry_after(mode):
    budget = Budget(400)
    holder = new(budget=budget)
    holder.handle(headers(mode=DUPLEX))
    holder.handle(RequestBody(b"x" * 80, False))
    assert budget.used == memory.held(80) == 320
    stream = new(budget=budget)
    stream.handle(headers(mode=mode))
    actions = stream.handle(RequestBody(b"y" * 30, mode is BUFFERED))
    assert error_body(actions)["code"] == 503
    assert actions[0].headers == (("retry-after", b"1"),)
    holder.close()
    assert budget.used == 0


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_an_announced_body_is_charged_only_when_it_arrives(mode):
    # Announcing a large body and never sending it costs the gateway nothing: streams
    # that only announce cannot starve the ones that send.
    budget = Budget(memory.cost(1 << 20, 262_144))
    announced = (*JSON, ("content-length", str(1 << 20).encode()))
    idle = [new(budget=budget) for _ in range(16)]
    for stream in idle:
        stream.handle(headers(mode=mode, extra=announced))
    assert budget.used == 0
    sender = new(budget=budget)
    sender.handle(headers(mode=mode, extra=(*JSON, ("content-length", str(len(IDS)).encode()))))
    out = sender.handle(RequestBody(IDS.encode(), True))
    assert not isinstance(out[0], Reject)
    assert budget.peak == memory.cost(len(IDS), reading.scan(IDS.encode()).values)
    assert budget.used == 0


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_a_rewritten_body_stays_charged_until_it_is_sent(mode):
    # The rewrite and its protobuf message are held while gRPC sends them.
    budget = Budget(1 << 20)
    stream = new(budget=budget)
    stream.handle(headers(mode=mode))
    stream.handle(RequestBody(IDS.encode(), True), sent=False)
    assert stream.decision.action == "strip"
    assert budget.used == memory.cost(len(IDS), reading.scan(IDS.encode()).values)
    stream.release()
    assert budget.used == 0


SLOW_BODIES = {
    # orjson refuses NaN: json.loads reads it; empty parameters, nothing is written back.
    "json.loads": b'{"n": NaN, "messages": [], "kv_transfer_params": {}}',
    # orjson reads 300 levels but writes only 254: json.dumps writes the stripped body.
    "json.dumps": ('{"d": ' + "[" * 300 + "]" * 300 + ', "kv_transfer_params": {"x": 1}}').encode(),
}


@pytest.mark.parametrize("slow", sorted(SLOW_BODIES))
def test_the_slow_path_is_charged_before_it_runs(slow):
    raw = SLOW_BODIES[slow]
    budget = Budget(1 << 20)
    stream = new(budget=budget)
    stream.handle(headers())
    assert not isinstance(only(stream.handle(RequestBody(raw, True))), Reject)
    shape = reading.scan(raw)
    assert budget.peak == memory.cost(len(raw), shape.values) + memory.slow_extra(len(raw))
    # Not affordable: refused before the slow parser or writer runs.
    tight = Budget(memory.cost(len(raw), shape.values))
    stream = new(budget=tight)
    stream.handle(headers())
    assert error_body(stream.handle(RequestBody(raw, True)))["code"] == 503
    assert tight.used == 0


@pytest.mark.parametrize("mode", [BUFFERED, DUPLEX])
def test_budget_released_on_every_ending(mode):
    budget = Budget(1000)
    for ending in (TimedOut(), RequestBody(b"not json", True), Unexpected("response_body")):
        stream = new(budget=budget)
        stream.handle(headers(mode=mode, extra=(*JSON, ("content-length", b"9"))))
        if mode is DUPLEX:
            stream.handle(RequestBody(b"{", False))
            assert budget.used == memory.held(1)
        with contextlib.suppress(ProtocolError):
            stream.handle(ending)
        assert budget.used == 0  # released by the stream itself, not by the caller
    assert budget.peak > 0
