"""The cost of verifying proofs and of the Redis record, on synthetic results."""

from __future__ import annotations

from bench import judge, markdown, results_model, synthetic, verification
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


def test_the_latency_each_adds_over_direct_proven_over_unproven_per_round() -> None:
    run = synthetic.records_run()

    def rounds(*p50s: float) -> list[dict[str, float]]:
        return [{"rps": 100.0, "p50_ms": p} for p in p50s]

    p50s = {
        ("honor", "direct"): (1.0, 1.2, 0.8),
        ("honor", DEFAULT): (5.0, 5.2, 4.8),  # adds 4.0 in every round
        ("honor-proven", "direct"): (1.0, 1.0, 1.0),
        ("honor-proven", DEFAULT): (5.4, 5.0, 6.0),  # adds 4.4, 4.0, 5.0
    }
    for cell in run["cells"]:
        found = p50s.get((cell["decision"], cell["arrangement"]))
        if found is not None:
            cell["rounds"] = rounds(*found)
    (row, redis) = verification.rows(judge.judge(results_model.from_json(run)))
    assert row.added_ratio_rounds == (1.1, 1.0, 1.25)
    assert row.added_ratio == 1.1
    assert redis.added_ratio is None  # its rounds were not kept
    # The report shows it, and reads it back.
    rendered = markdown.render(judge.judge(results_model.from_json(run)))
    assert "| 1.10x (1.10x, 1.00x, 1.25x) |" in rendered
