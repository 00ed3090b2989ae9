"""What verifying a proof costs: ``honor-proven`` against ``honor`` in the same run.

Both send the same bytes (ids and a proof, bench/bodies.py); ``honor`` is validated and
forwarded unchanged on a route that trusts any caller, the proof unchecked;
``honor-proven`` is verified (the MAC over the parameters, the prompt digest), spent,
validated, and forwarded unchanged. The difference of their p50s, and of the
processor's CPU time per request, is the price of honoring only what the deployment
minted; ``added_ratio`` is the latency each adds over Envoy direct, proven over
unproven (the decode leg's target: at most 1.1x at 1 MiB, c=1).

Each proof is honored once: the processor spends it in its record of spent proofs, its
own table (``service-wN``) or Redis (``service-wN-redis``, ``python -m bench --records
local,redis``). ``record_rows`` sets the proven cell of both beside ``honor``, as
latencies added over Envoy direct and their ratios. Their section of results.md is
bench/markdown.py's.
"""

from __future__ import annotations

import statistics

from bench.results_model import ProofCost, Record, RecordCost, Results

UNPROVEN = "honor"
PROVEN = "honor-proven"
REDIS = "-redis"


def _cost(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(b - a, 3)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else round(a / b, 2)


def _found(results: Results) -> dict[tuple[str, str, int, str], Record]:
    """The records by arrangement, body, concurrency and decision."""
    return {(r.arrangement, r.body, r.concurrency, r.decision): r for r in results.cells}


def _services(results: Results) -> set[str]:
    return {a.name for a in results.arrangements if a.kind == "service"}


def _added_ratios(
    found: dict[tuple[str, str, int, str], Record], proven: Record, unproven: Record
) -> tuple[float, ...] | None:
    """Each round's latency added over direct, proven over unproven."""
    mine = proven.added_rounds(found.get(("direct", proven.body, proven.concurrency, PROVEN)))
    base = unproven.added_rounds(
        found.get(("direct", unproven.body, unproven.concurrency, UNPROVEN))
    )
    if mine is None or base is None or len(mine) != len(base) or min(base) <= 0:
        return None
    return tuple(round(a / b, 3) for a, b in zip(mine, base, strict=True))


def rows(results: Results) -> tuple[ProofCost, ...]:
    """One row per service arrangement, body size and concurrency measured both ways."""
    found = _found(results)
    services = _services(results)
    out = []
    for (name, body, concurrency, decision), unproven in found.items():
        proven = found.get((name, body, concurrency, PROVEN))
        if decision != UNPROVEN or name not in services or proven is None:
            continue
        ratios = _added_ratios(found, proven, unproven)
        out.append(
            ProofCost(
                arrangement=name,
                body=body,
                body_bytes=unproven.body_bytes,
                id_count=unproven.id_count,
                concurrency=concurrency,
                honor_p50_ms=unproven.p50_ms,
                proven_p50_ms=proven.p50_ms,
                added_p50_ms=_cost(unproven.p50_ms, proven.p50_ms),
                honor_cpu_ms_per_req=unproven.cpu.processor,
                proven_cpu_ms_per_req=proven.cpu.processor,
                added_cpu_ms_per_req=_cost(unproven.cpu.processor, proven.cpu.processor),
                ok=unproven.ok and proven.ok,
                added_ratio=None if not ratios else round(statistics.median(ratios), 3),
                added_ratio_rounds=ratios,
            )
        )
    return tuple(sorted(out, key=lambda r: (r.body_bytes, r.concurrency, r.arrangement)))


def _added(record: Record) -> float | None:
    return None if record.relative is None else record.relative.added_p50_ms


def record_rows(results: Results) -> tuple[RecordCost, ...]:
    """Per body size, concurrency and service arrangement measured with both records
    (``X`` and ``X-redis``): the latency each adds over Envoy direct for ``honor`` (on
    ``X``) and ``honor-proven`` (local: ``X``, Redis: ``X-redis``), the ratios, and the
    processor's CPU per request. Expects the records enriched (added p50)."""
    found = _found(results)
    names = _services(results)
    out = []
    for (name, body, concurrency, decision), local in found.items():
        if decision != PROVEN or name + REDIS not in names:
            continue
        honor = found.get((name, body, concurrency, UNPROVEN))
        shared = found.get((name + REDIS, body, concurrency, PROVEN))
        if honor is None or shared is None:
            continue
        added = [_added(r) for r in (honor, local, shared)]
        out.append(
            RecordCost(
                arrangement=name,
                redis_arrangement=name + REDIS,
                body=body,
                body_bytes=local.body_bytes,
                concurrency=concurrency,
                honor_added_p50_ms=added[0],
                local_added_p50_ms=added[1],
                redis_added_p50_ms=added[2],
                local_x_honor=_ratio(added[1], added[0]),
                redis_x_honor=_ratio(added[2], added[0]),
                redis_x_local=_ratio(added[2], added[1]),
                redis_minus_local_p50_ms=_cost(added[1], added[2]),
                honor_cpu_ms_per_req=honor.cpu.processor,
                local_cpu_ms_per_req=local.cpu.processor,
                redis_cpu_ms_per_req=shared.cpu.processor,
                ok=honor.ok and local.ok and shared.ok,
            )
        )
    return tuple(sorted(out, key=lambda r: (r.body_bytes, r.concurrency, r.arrangement)))
