"""The record of spent proofs for one processor (ext_proc/edge/record.py)."""

import asyncio
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from ext_proc.core import proof, replay
from ext_proc.core.config import ConfigError
from ext_proc.core.replay import Terms, Ticket, Verdict
from ext_proc.edge import record
from ext_proc.edge.record import BUCKET_SLOTS, LocalRecord
from ext_proc.edge.supervisor import Supervisor
from tests.edge.test_server import one_error_line
from tests.edge.test_supervisor import config as supervised_config
from tests.edge.test_supervisor import pid, supervise, wait_for

NOW = 1000.0


def ticket(n, expires_at=int(NOW) + 30, minted_after=int(NOW)):
    return Ticket(n.to_bytes(16, "big"), expires_at, minted_after)


def test_a_ticket_is_first_once_and_spent_after():
    table = LocalRecord.anonymous(64, lambda: NOW)
    assert table.spend_now(ticket(1)) is Verdict.FIRST
    assert table.spend_now(ticket(1)) is Verdict.SPENT
    assert table.spend_now(ticket(2)) is Verdict.FIRST


def test_a_ticket_is_kept_until_its_expiry_and_its_slot_is_free_after():
    clock = [NOW]
    table = LocalRecord.anonymous(BUCKET_SLOTS, lambda: clock[0])
    for n in range(BUCKET_SLOTS):
        assert table.spend_now(ticket(n, int(NOW) + 10)) is Verdict.FIRST
    clock[0] = NOW + 10
    assert table.spend_now(ticket(0, int(NOW) + 10)) is Verdict.SPENT  # still kept
    clock[0] = NOW + 11
    assert table.spend_now(ticket(BUCKET_SLOTS)) is Verdict.FIRST


def test_a_full_bucket_refuses_rather_than_forgets():
    table = LocalRecord.anonymous(BUCKET_SLOTS, lambda: NOW)  # one bucket
    for n in range(BUCKET_SLOTS):
        assert table.spend_now(ticket(n)) is Verdict.FIRST
    assert table.spend_now(ticket(BUCKET_SLOTS)) is Verdict.FULL
    for n in range(BUCKET_SLOTS):  # none of them forgotten
        assert table.spend_now(ticket(n)) is Verdict.SPENT


def test_its_size_is_fixed_by_the_slots():
    assert LocalRecord.anonymous(65536).size == replay.table_bytes(65536)
    assert replay.table_bytes(65536) < 2 * 1024 * 1024
    assert replay.table_bytes(33) == replay.table_bytes(64)  # whole buckets


def test_a_file_that_is_not_a_table_is_refused(tmp_path):
    path = tmp_path / "other"
    path.write_bytes(b"\0" * 4096)
    with pytest.raises(ValueError, match="not a table"):
        LocalRecord.open(path)


def _spend_all(path, count, out):
    table = LocalRecord.open(path)
    out.put([table.spend_now(ticket(n, 2**40)) is Verdict.FIRST for n in range(count)])


def test_processes_sharing_the_file_honor_each_ticket_once(tmp_path):
    path = tmp_path / "spent"
    record.create(path, 4096, lambda: NOW)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    workers = [context.Process(target=_spend_all, args=(path, 500, out)) for _ in range(3)]
    for worker in workers:
        worker.start()
    results = [out.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    firsts = [sum(column) for column in zip(*results, strict=True)]
    assert firsts == [1] * 500  # each ticket honored by exactly one process
    assert os.path.getsize(path) == replay.table_bytes(4096)


def test_a_proof_minted_before_the_table_began_is_not_honored():
    table = LocalRecord.anonymous(64, lambda: NOW)
    assert table.began == NOW
    assert table.spend_now(ticket(1, minted_after=int(NOW) - 1)) is Verdict.PREDATES
    assert table.spend_now(ticket(1, minted_after=int(NOW))) is Verdict.FIRST
    # A fraction of a second counts as the next second: the table began after it.
    assert LocalRecord.anonymous(64, lambda: NOW + 0.1).began == NOW + 1


def test_a_processor_restarted_whole_honors_no_proof_spent_before_it():
    spent_before = ticket(1, minted_after=int(NOW))
    first = LocalRecord.anonymous(64, lambda: NOW)
    assert first.spend_now(spent_before) is Verdict.FIRST
    restarted = LocalRecord.anonymous(64, lambda: NOW + 3)  # a new table: it forgot
    assert restarted.spend_now(spent_before) is Verdict.PREDATES
    assert restarted.spend_now(ticket(2, minted_after=int(NOW) + 3)) is Verdict.FIRST


def test_a_worker_that_maps_the_table_again_keeps_when_it_began(tmp_path):
    path = tmp_path / "spent"
    record.create(path, 64, lambda: NOW)
    worker = LocalRecord.open(path, lambda: NOW + 1)
    assert worker.spend_now(ticket(1, int(NOW) + 90)) is Verdict.FIRST
    restarted = LocalRecord.open(path, lambda: NOW + 60)  # the supervisor's new worker
    assert restarted.began == NOW
    assert restarted.spend_now(ticket(1, int(NOW) + 90)) is Verdict.SPENT
    assert restarted.spend_now(ticket(2, int(NOW) + 90)) is Verdict.FIRST


# --- a clock that steps back ------------------------------------------------------------

SKEW = 5
TTL = 20
TERMS = Terms(skew=SKEW)


def proven(expiry: int, lifetime: int = TTL) -> tuple[proof.KeySet, dict, bytes]:
    """A proof with ``expiry`` minted ``lifetime`` before it, its keys and its prompt
    digest."""
    keys = proof.KeySet({"k1": b"k" * 32}, "k1")
    params = {"remote_engine_id": "e", "prompt_token_ids": [1, 2, 3]}
    digest = bytes(32)
    params[proof.PROOF_KEY] = proof.mint(keys, params, digest, expiry, minted=expiry - lifetime)
    return keys, params, digest


def spend_if_valid(table: LocalRecord, proven: tuple, now: float) -> Verdict | None:
    """What the record answers for the proof at ``now``; None: it no longer verifies."""
    keys, params, digest = proven
    if proof.verify(keys, params, digest, now, SKEW, lifetime=TTL) is not None:
        return None
    return table.spend_now(proof.ticket(params, SKEW))


def test_a_clock_stepped_back_past_twice_the_skew_honors_no_forgotten_proof(tmp_path):
    """The proof's slot is reused once it is past its time; the clock then steps back
    2 x skew + 1 s, to where the proof verifies again: the table has seen a later time."""
    path = tmp_path / "spent"
    # One bucket, begun before the mint.
    record.create(path, BUCKET_SLOTS, lambda: NOW - 60, terms=TERMS)
    clock = [NOW]
    table = LocalRecord.open(path, lambda: clock[0], terms=TERMS)
    expiry = int(NOW) + TTL
    spent = proven(expiry)
    assert spend_if_valid(table, spent, NOW) is Verdict.FIRST
    kept_until = expiry + 3 * SKEW
    clock[0] = kept_until + 1
    assert spend_if_valid(table, spent, clock[0]) is None  # no processor verifies it now
    # Another proof takes the first free slot: the spent proof's.
    assert table.spend_now(ticket(2, clock[0] + 30, int(NOW))) is Verdict.FIRST
    clock[0] = kept_until + 1 - (2 * SKEW + 1)
    assert spend_if_valid(table, spent, clock[0]) is Verdict.CLOCK_BEHIND
    # Every worker maps the same header: another one's clock is as far behind.
    other = LocalRecord.open(path, lambda: clock[0], terms=TERMS)
    assert spend_if_valid(other, spent, clock[0]) is Verdict.CLOCK_BEHIND
    assert other.spend_now(ticket(3, clock[0] + 60, int(NOW))) is Verdict.CLOCK_BEHIND


def test_a_clock_within_twice_the_skew_of_the_latest_time_seen_is_judged():
    """Processors each within the skew of a minter are up to 2 x skew apart: a clock
    that far behind what the table has seen is judged as before; once the clock is
    back within that, spends are judged again."""
    clock = [NOW]
    table = LocalRecord.anonymous(64, lambda: clock[0], began=NOW, terms=TERMS)
    assert table.spend_now(ticket(1, int(NOW) + 60)) is Verdict.FIRST
    clock[0] = NOW - 2 * SKEW
    assert table.spend_now(ticket(1, int(NOW) + 60)) is Verdict.SPENT
    assert table.spend_now(ticket(2, int(NOW) + 60)) is Verdict.FIRST
    clock[0] = NOW - 2 * SKEW - 1
    assert table.spend_now(ticket(3, int(NOW) + 60)) is Verdict.CLOCK_BEHIND
    clock[0] = NOW + 0.5
    assert table.spend_now(ticket(3, int(NOW) + 60)) is Verdict.FIRST


def test_a_new_table_has_seen_its_beginning():
    clock = [NOW]
    table = LocalRecord.anonymous(64, lambda: clock[0], terms=Terms(skew=0))
    clock[0] = NOW - 1
    # The clock is judged first: whatever the proof, the answer is why.
    assert table.spend_now(ticket(1, int(NOW) + 60, minted_after=0)) is Verdict.CLOCK_BEHIND
    assert table.spend_now(ticket(1, int(NOW) + 60)) is Verdict.CLOCK_BEHIND


# --- writers whose terms differ ---------------------------------------------------------


def spend_under(
    table: LocalRecord, terms: Terms, proven: tuple, now: float, ttl: int = 2
) -> Verdict | None:
    """What the record answers for the proof at ``now``, verified under ``terms`` and
    ``ttl`` and dated under ``terms``; None: it does not verify."""
    keys, params, digest = proven
    if proof.verify(keys, params, digest, now, terms.skew, lifetime=ttl) is not None:
        return None
    return table.spend_now(proof.ticket(params, terms.skew))


def test_a_writer_with_a_larger_skew_never_honors_a_proof_the_table_kept_for_a_smaller_one(
    tmp_path,
):
    """A rolling update raises clock_skew_seconds from 1 to 10: the old processor keeps a
    spent proof until its expiry + 3 s; the new one still verifies it at expiry + 4 s.
    The table knows it kept it for 1 s only: it raises its skew and begins again."""
    old, new = Terms(skew=1), Terms(skew=10)
    path = tmp_path / "spent"
    record.create(path, BUCKET_SLOTS, lambda: NOW - 60, terms=old)  # one bucket
    clock = [NOW]
    first = LocalRecord.open(path, lambda: clock[0], terms=old)
    second = LocalRecord.open(path, lambda: clock[0], terms=new)
    expiry = int(NOW) + 2
    spent = proven(expiry, 2)
    assert spend_under(first, old, spent, NOW) is Verdict.FIRST
    clock[0] = expiry + 4  # past the old processor's keeping (expiry + 3 x 1)
    assert spend_under(first, old, spent, clock[0]) is None  # expired for it
    assert spend_under(second, new, spent, clock[0]) is Verdict.PREDATES  # not again
    assert first.terms == second.terms == new
    assert first.began == second.began == expiry + 4  # it began again
    assert spend_under(second, new, spent, clock[0] + 1) is Verdict.PREDATES


def test_every_writer_keeps_and_dates_a_proof_under_the_largest_terms_the_table_knows(tmp_path):
    """After the rise, the old processor keeps what it spends for the new skew: the new
    one, verifying until expiry + 10 s, finds it spent until then and after."""
    old, new = Terms(skew=1), Terms(skew=10)
    path = tmp_path / "spent"
    record.create(path, BUCKET_SLOTS, lambda: NOW - 60, terms=new)
    clock = [NOW]
    first = LocalRecord.open(path, lambda: clock[0], terms=old)
    second = LocalRecord.open(path, lambda: clock[0], terms=new)
    expiry = int(NOW) + 2
    spent = proven(expiry, 2)
    assert spend_under(first, old, spent, NOW) is Verdict.FIRST  # covered: no beginning
    for clock[0] in (expiry + 4, expiry + 10):
        assert spend_under(second, new, spent, clock[0]) is Verdict.SPENT
    clock[0] = expiry + 3 * 10  # still kept: the slot is not free for another proof
    for n in range(BUCKET_SLOTS - 1):
        assert first.spend_now(ticket(n, clock[0] + 60, int(NOW))) is Verdict.FIRST
    assert first.spend_now(ticket(BUCKET_SLOTS, clock[0] + 60, int(NOW))) is Verdict.FULL
    assert first.terms == new  # a writer with smaller terms never lowers them


def test_a_proof_is_dated_by_the_minting_time_it_states():
    """Whatever lifetime it was minted for, a proof minted a second before the table
    began is dated before it, and one minted a skew after is fresh."""
    began = int(NOW)
    table = LocalRecord.anonymous(64, lambda: NOW + 13, began=began, terms=Terms(skew=1))
    for lifetime in (5, 20):
        before = proven(began - 1 + lifetime, lifetime)
        assert spend_under(table, Terms(skew=1), before, NOW + 1, 20) is Verdict.PREDATES
        after = proven(began + 1 + lifetime, lifetime)
        assert spend_under(table, Terms(skew=1), after, NOW + 1, 20) is Verdict.FIRST


def test_a_processor_restarted_whole_with_a_shorter_lifetime_honors_no_proof_twice():
    """A proof minted for 20 s and honored; the processor is restarted whole with
    ttl_seconds 10 (its new table holds only its new terms). Dated by its own lifetime
    the proof looks minted after the new table began: it must not be honored again."""
    terms, t = Terms(skew=5), int(NOW)
    spent = proven(t + 20, 20)  # minted at t, for 20 s
    old = LocalRecord.anonymous(64, lambda: t + 0.5, began=t - 600, terms=terms)
    assert spend_under(old, terms, spent, t + 0.5, ttl=20) is Verdict.FIRST
    restarted = LocalRecord.anonymous(64, lambda: t + 5, began=t + 1, terms=terms)
    assert spend_under(restarted, terms, spent, t + 5, ttl=10) is not Verdict.FIRST
    # Refused as minted for longer than the restarted processor mints for.
    keys, params, digest = spent
    found = proof.verify(keys, params, digest, t + 5, 5, lifetime=10)
    assert found == "proof_outlives_lease"


def test_a_proof_stating_a_minting_time_ahead_of_every_clock_is_honored_once():
    """A processor whose clock runs 10 s ahead (past the skew) mints for 5 s; verifiers
    mint for 20 s. Its proof is honored, the processor is restarted whole (a table
    that begins a second later), and the proof is presented again: dated by the minting
    time it states, it would look minted after the new table began."""
    terms, t = Terms(skew=1), int(NOW)
    ahead = proven(t + 15, 5)  # states minted at t + 10, for 5 s
    old = LocalRecord.anonymous(64, lambda: t + 0.1, began=t - 600, terms=terms)
    first = spend_under(old, terms, ahead, t + 0.1, ttl=20)
    restarted = LocalRecord.anonymous(64, lambda: t + 2, began=t + 1, terms=terms)
    again = spend_under(restarted, terms, ahead, t + 2, ttl=20)
    assert [first, again].count(Verdict.FIRST) <= 1
    assert first is None  # refused at once: no clock within the skew minted it yet


# --- a processor restarted whole: the table's time outlives it --------------------------


def restart(path, now, terms=TERMS):
    """The processor restarted whole at ``now``: a new table in the old one's file."""
    return LocalRecord.alone(path, BUCKET_SLOTS, lambda: now, terms=terms)


def test_a_processor_restarted_with_its_clock_behind_honors_no_proof_spent_before(tmp_path):
    """It honored a proof at NOW + 5 and is restarted with its clock 1 to 20 s behind:
    the proof verifies again for that clock, but the new table began after the latest
    second the old one saw, and a clock more than 2 x skew behind it is CLOCK_BEHIND."""
    path = tmp_path / "spent"
    clock = [NOW]
    first = LocalRecord.alone(path, BUCKET_SLOTS, lambda: clock[0], terms=TERMS)
    spent = proven(int(NOW) + 5 + TTL, TTL)  # minted at NOW + 5
    clock[0] = NOW + 5.5
    assert spend_if_valid(first, spent, clock[0]) is Verdict.FIRST
    for behind in range(1, 21):
        now = NOW + 5.5 - behind
        table = restart(path, now)
        assert table.began == int(NOW) + 6  # after the second the old table saw
        expected = Verdict.CLOCK_BEHIND if behind > 2 * SKEW else Verdict.PREDATES
        assert spend_if_valid(table, spent, now) in (None, expected)
        assert table.spend_now(ticket(1, int(NOW) + 60, int(NOW) + 5)) is expected


def test_a_clock_behind_the_old_tables_time_is_judged_again_once_it_catches_up(tmp_path):
    path = tmp_path / "spent"
    LocalRecord.alone(path, BUCKET_SLOTS, lambda: NOW, terms=TERMS).spend_now(ticket(1))
    clock = [NOW - 60]
    table = LocalRecord.alone(path, BUCKET_SLOTS, lambda: clock[0], terms=TERMS)
    assert table.spend_now(ticket(2, int(NOW) + 60, int(NOW) + 1)) is Verdict.CLOCK_BEHIND
    clock[0] = NOW - 2 * SKEW
    assert table.spend_now(ticket(2, int(NOW) + 60, int(NOW) + 1)) is Verdict.FIRST
    assert table.spend_now(ticket(3, int(NOW) + 60, int(NOW))) is Verdict.PREDATES


def test_a_time_the_old_table_saw_ahead_is_clock_behind_not_honored(tmp_path):
    """The clock jumped an hour ahead, the table saw it, the clock came back and the
    processor restarted: nothing is honored until the clock reaches that hour."""
    path = tmp_path / "spent"
    ahead = LocalRecord.alone(path, BUCKET_SLOTS, lambda: NOW + 3600, terms=TERMS)
    assert ahead.spend_now(ticket(1, int(NOW) + 4000, int(NOW) + 3600)) is Verdict.FIRST
    table = restart(path, NOW)
    assert table.spend_now(ticket(2, int(NOW) + 60, int(NOW))) is Verdict.CLOCK_BEHIND
    # Restarted again meanwhile, still behind: the mark stays.
    assert restart(path, NOW + 1).spend_now(ticket(2, int(NOW) + 60)) is Verdict.CLOCK_BEHIND


def test_a_table_begun_in_a_new_file_begins_at_the_clock(tmp_path):
    """No file: a new machine or pod. The table begins at the clock, as every record."""
    table = restart(tmp_path / "spent", NOW + 0.5)
    assert table.began == NOW + 1
    assert table.spend_now(ticket(1, int(NOW) + 60, int(NOW) + 1)) is Verdict.FIRST


@pytest.mark.parametrize(
    "old",
    [b"", b"xpspent4", b"\0" * 4096, b"not a table" * 100],
    ids=["empty", "truncated", "zeros", "garbage"],
)
def test_a_previous_file_that_is_not_a_table_begins_at_the_clock_and_says_so(tmp_path, caplog, old):
    path = tmp_path / "spent"
    path.write_bytes(old)
    table = restart(path, NOW)
    assert table.began == NOW  # no later than a new machine's: never earlier
    assert "record_mark_unreadable" in [r.error for r in caplog.records]
    assert restart(path, NOW - 30).spend_now(ticket(1)) is Verdict.CLOCK_BEHIND  # a table now


def test_a_previous_header_past_any_clock_refuses_every_proof(tmp_path):
    path = tmp_path / "spent"
    path.write_bytes(
        replay.TABLE_HEADER.pack(record.MAGIC, 1, bytes(16), 2**63 - 1, 2**63 - 1, 2**32 - 1)
    )
    table = restart(path, NOW)
    assert table.spend_now(ticket(1, 2**40, 2**39)) is Verdict.CLOCK_BEHIND


def test_a_table_whose_slots_were_cut_off_keeps_its_mark(tmp_path):
    path = tmp_path / "spent"
    LocalRecord.alone(path, 4096, lambda: NOW + 100, terms=TERMS).spend_now(ticket(1))
    with path.open("r+b") as cut:
        cut.truncate(replay.TABLE_HEADER.size + 10)
    assert restart(path, NOW).spend_now(ticket(2, int(NOW) + 60)) is Verdict.CLOCK_BEHIND


def test_a_skew_lowered_across_a_restart_begins_the_new_table_later(tmp_path):
    """The old table dated proofs by a 10 s skew: one it honored may be dated up to 9 s
    later under the new 1 s; the new table begins that much later."""
    path = tmp_path / "spent"
    LocalRecord.alone(path, BUCKET_SLOTS, lambda: NOW, terms=Terms(skew=10))
    assert restart(path, NOW, terms=Terms(skew=1)).began == NOW + 1 + 9


def test_the_table_file_is_the_processors_own_and_replaced_at_once(tmp_path):
    path = tmp_path / "spent"
    restart(path, NOW)
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spent", "spent.lock"]
    assert (tmp_path / "spent.lock").stat().st_mode & 0o777 == 0o600
    assert os.path.getsize(path) == replay.table_bytes(BUCKET_SLOTS)


def test_a_table_that_cannot_be_written_stops_the_start(tmp_path):
    with pytest.raises(ConfigError, match="cannot write the table of spent proofs"):
        restart(tmp_path / "missing" / "spent", NOW)


def test_no_temporary_directory_stops_the_start(monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(tempfile, "_candidate_tempdir_list", lambda: ["/nonexistent"])
    with pytest.raises(ConfigError, match="no directory for the table of spent proofs"):
        record.table_path("0.0.0.0:9002")


def test_each_listen_address_has_its_table_in_the_temporary_directory(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert record.table_path("0.0.0.0:9002") == tmp_path / "ext-proc-spent-proofs-0.0.0.0-9002"
    assert record.table_path("unix:/run/x.sock").parent == tmp_path
    assert record.table_path("[::]:9002") != record.table_path("[::]:9003")


def test_a_table_of_one_process_keeps_only_its_header_once_closed(tmp_path):
    """Its slots are no use to the next process; its time is."""
    path = tmp_path / "spent"
    table = LocalRecord.alone(path, 4096, lambda: NOW + 100, terms=TERMS)
    assert table.spend_now(ticket(1, int(NOW) + 200, int(NOW) + 100)) is Verdict.FIRST
    asyncio.run(table.close())
    assert os.path.getsize(path) == replay.TABLE_HEADER.size
    assert restart(path, NOW).spend_now(ticket(2, int(NOW) + 60)) is Verdict.CLOCK_BEHIND


def test_closing_never_cuts_a_table_another_process_put_in_its_place(tmp_path):
    path = tmp_path / "spent"
    table = LocalRecord.alone(path, 4096, lambda: NOW, terms=TERMS)
    restart(path, NOW + 1)  # the next processor, started before this one closed
    asyncio.run(table.close())
    assert os.path.getsize(path) == replay.table_bytes(BUCKET_SLOTS)


def test_a_supervisor_begins_its_workers_table_after_the_time_the_last_one_saw(
    tmp_path, monkeypatch
):
    """Its workers' table is in the file of its listen address, and begins after the
    latest second the previous table there saw (an hour ahead here)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with socket.socket() as free:  # a port of its own: port 0 keeps no table's file
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    settings = supervised_config(listen=f"127.0.0.1:{port}")
    path = record.table_path(settings.listen)
    assert path is not None
    ahead = int(time.time()) + 3600
    LocalRecord.alone(path, BUCKET_SLOTS, lambda: ahead, terms=settings.proof.terms)
    supervisor = Supervisor(settings, backoff=0.1)

    def drive() -> None:
        wait_for(lambda: all(pid(w) for w in supervisor.workers))
        assert supervisor.record_file == path

    assert supervise(supervisor, drive) == 0
    table = LocalRecord.open(path, terms=settings.proof.terms)
    assert table.began == ahead + 1
    assert table.spend_now(ticket(1, ahead + 60, ahead + 1)) is Verdict.CLOCK_BEHIND


# --- another process at the table's file ------------------------------------------------


def _second_processor(path, out):
    """A second processor begun on the same address (it fails to bind, or binds a unix
    socket the first serves): what its start made of the first one's table."""
    try:
        record.begin(path, BUCKET_SLOTS, lambda: NOW + 1, terms=TERMS)
    except ConfigError as exc:
        out.put(str(exc))
    else:
        out.put(None)


def test_a_second_processor_never_replaces_a_live_table(tmp_path):
    """The first keeps serving after a second one began on its address: had the second
    put its table in the file's place, the first would spend into a file no one reads,
    and restarted with its clock a few seconds behind it would begin after the second's
    time, not its own, and honor again a proof it honored."""
    path = tmp_path / "spent"
    clock = [NOW]
    live = LocalRecord.alone(path, BUCKET_SLOTS, lambda: clock[0], terms=TERMS)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    second = context.Process(target=_second_processor, args=(path, out))
    second.start()
    refused = out.get(timeout=60)
    second.join(timeout=60)
    clock[0] = NOW + 50.5
    spent = ticket(1, int(NOW) + 80, int(NOW) + 50)
    assert live.spend_now(spent) is Verdict.FIRST
    asyncio.run(live.close())
    assert restart(path, NOW + 45).spend_now(spent) is not Verdict.FIRST
    assert refused is not None
    assert "another processor" in refused


def test_a_fifo_at_the_tables_path_never_hangs_the_start(tmp_path, caplog):
    """Anyone who can write the temporary directory can put a FIFO there first: reading
    the previous table's time must not wait for a writer that never comes."""
    path = tmp_path / "spent"
    os.mkfifo(path)
    began: list[LocalRecord] = []
    start = threading.Thread(target=lambda: began.append(restart(path, NOW)), daemon=True)
    start.start()
    start.join(timeout=30)
    if start.is_alive():  # release it: open the FIFO's other end
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        start.join(timeout=30)
        pytest.fail("the start waited on a FIFO at the table's path")
    assert began[0].began == NOW
    assert "record_mark_unreadable" in [r.error for r in caplog.records]


def _processor(listen: str, tmp: str) -> subprocess.Popen[str]:
    """The real processor serving ``listen`` alone, its temporary directory ``tmp``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXT_PROC_")}
    command = [sys.executable, "-m", "ext_proc", "serve", "--listen", listen]
    return subprocess.Popen(
        [*command, "--metrics-listen", ""],
        env={**env, "TMPDIR": tmp},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_processor_started_on_a_unix_socket_another_serves_stops_at_start(tmp_path):
    """gRPC takes over a unix socket's path: a second processor would serve beside the
    first (which keeps the gateway's connections it has) with a table of its own in the
    first one's file, so a proof could be honored by each."""
    listen = f"unix:{tmp_path}/ext-proc.sock"
    first = _processor(listen, str(tmp_path))
    try:
        assert first.stderr is not None
        for line in first.stderr:
            if '"serving"' in line:
                break
        table = record.table_path(listen).name
        before = {p.name: p.stat().st_ino for p in tmp_path.iterdir()}
        second = _processor(listen, str(tmp_path))
        try:
            _out, errors = second.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            second.kill()
            _out, errors = second.communicate()
        message = one_error_line(subprocess.CompletedProcess([], second.returncode, "", errors))
        assert message.startswith("another processor keeps its table of spent proofs in ")
        after = {p.name: p.stat().st_ino for p in tmp_path.iterdir()}
        assert after == before  # the first one's socket and table, untouched
        assert table in after
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert first.returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's file needs root")
def test_another_users_file_at_the_tables_path_gives_it_no_time(tmp_path, caplog):
    """Anyone may put a file in a shared /tmp before the processor's first start: its
    header, a time far ahead, would keep a processor running as root (which may replace
    it there) clock_behind for good, its own table carrying that time on."""
    path = tmp_path / "spent"
    far = int(NOW) + 10**9
    path.write_bytes(replay.TABLE_HEADER.pack(record.MAGIC, 1, bytes(16), far, far, SKEW))
    os.chown(path, 65534, 65534)
    table = restart(path, NOW)
    assert table.began == NOW
    assert "record_mark_unreadable" in [r.error for r in caplog.records]
    assert table.spend_now(ticket(1, int(NOW) + 60, int(NOW))) is Verdict.FIRST


@pytest.mark.skipif(os.geteuid() != 0, reason="two users need root")
def test_another_users_files_in_a_shared_tmp_stop_the_start_with_one_line():
    """A processor not running as root, in a sticky directory where another user put
    its file first (the table, or the name the new table is written under): it cannot
    replace them, and says so as a ConfigError (one line), not a traceback."""
    shared = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own is root's alone
    shared.chmod(0o1777)
    try:
        assert _refused_as_another_user(shared) == 0b11
    finally:
        shutil.rmtree(shared)


def _refused_as_another_user(shared: Path) -> int:
    """Which of its two starts a processor running as user 65533 in ``shared``
    refused with a ConfigError (a bit each), after user 65534 put its files there."""
    ready, go = os.pipe()
    child = os.fork()
    if child == 0:  # the processor
        os.read(ready, 1)
        os.setgid(65533)
        os.setuid(65533)
        refused = 0
        for bit, name in enumerate(("written-under", "table")):
            try:
                restart(shared / name, NOW)
            except ConfigError:
                refused |= 1 << bit
            except BaseException:
                pass
        os._exit(refused)
    for name in (f"written-under.{child}.new", "table"):
        (shared / name).write_bytes(b"")
        os.chown(shared / name, 65534, 65534)
    os.write(go, b"x")
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


def _start_on_port_0(directory, out):
    tempfile.tempdir = directory
    try:
        LocalRecord.alone(record.table_path("127.0.0.1:0"), BUCKET_SLOTS, terms=TERMS)
    except ConfigError as exc:
        out.put(str(exc))
    else:
        out.put(None)


def test_processors_on_ephemeral_ports_each_keep_a_table_of_their_own(tmp_path, monkeypatch):
    """Port 0 is a different port for each processor (and for each start): nothing of
    its table is found again, and processors started on it are no two on one address."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first = LocalRecord.alone(record.table_path("127.0.0.1:0"), BUCKET_SLOTS, terms=TERMS)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    second = context.Process(target=_start_on_port_0, args=(str(tmp_path), out))
    second.start()
    refused = out.get(timeout=60)
    second.join(timeout=60)
    assert refused is None
    assert first.spend_now(ticket(1, 2**40, 2**39)) is Verdict.FIRST
