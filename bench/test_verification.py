"""The cost of verifying proofs and of the Redis record, on synthetic results."""

from __future__ import annotations

from bench import judge, results_model, synthetic, verification
from bench.results_model import Results

DEFAULT = synthetic.DEFAULT


def record_run() -> Results:
    return judge.judge(results_model.from_json(synthetic.records_run()))


def test_the_record_section_sets_local_and_redis_beside_honor() -> None:
    results = record_run()
    (row,) = verification.record_rows(results)
    assert results.judged.records == (row,)
    assert (row.honor_added_p50_ms, row.local_added_p50_ms) == (4.0, 6.0)
    assert (row.local_x_honor, row.redis_x_honor, row.redis_x_local) == (1.5, 2.0, 1.33)
    assert row.redis_minus_local_p50_ms == 2.0


def test_proven_against_honor_per_service_arrangement() -> None:
    rows = verification.rows(record_run())
    assert [r.arrangement for r in rows] == [DEFAULT, DEFAULT + "-redis"]
    assert [(r.added_p50_ms, r.added_cpu_ms_per_req) for r in rows] == [(2.0, 2.0), (4.0, 4.0)]
