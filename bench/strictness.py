"""What a ``strict_body`` route costs: ``strict`` against ``allow`` in the same run.

Both send the same bytes, a chat request without ids (bench/bodies.py); ``allow`` goes
to the shipped aggregated route, where the byte scan lets a body without carriers
through unparsed, and ``strict`` to its copy naming an engine (``/strict/v1/``,
``strict_body``), where every body is parsed and its members checked against what the
engine declares (all are, so it is forwarded unchanged). Strict over allow, per service
arrangement, body size and concurrency: requests/s, p50, the processor's CPU per
request. Informational: no target reads it. Its section of results.md is
bench/markdown.py's.

The two are different cells, measured minutes apart (the rounds pair arrangements
within a cell, not cells), so each row also shows the floor's requests/s in both: a
processor that does no work, which the route cannot change, moves only with the
machine; ``rps_ratio_over_floor`` sets each cell's requests/s over its floor's first.
"""

from __future__ import annotations

from bench.results_model import Record, Results, StrictCost

BASE = "allow"
STRICT = "strict"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else round(a / b, 3)


def _added(record: Record) -> float | None:
    return None if record.relative is None else record.relative.added_p50_ms


def _over_floor(
    allow: Record, strict: Record, floor_allow: float | None, floor_strict: float | None
) -> float | None:
    """Strict's req/s over the floor's in its cell, over allow's over the floor's."""
    if floor_allow is None or floor_strict is None or floor_strict <= 0:
        return None
    return _ratio(strict.rps * floor_allow, allow.rps * floor_strict)


def rows(results: Results, floor: str) -> tuple[StrictCost, ...]:
    """One row per service arrangement, body size and concurrency measured both ways,
    with the requests/s of the arrangement ``floor``. Expects the records enriched
    (added p50)."""
    found = {(r.arrangement, r.body, r.concurrency, r.decision): r for r in results.cells}
    services = {a.name for a in results.arrangements if a.kind == "service"}
    out = []
    for (name, body, concurrency, decision), allow in found.items():
        strict = found.get((name, body, concurrency, STRICT))
        if decision != BASE or name not in services or strict is None:
            continue
        floors = [found.get((floor, body, concurrency, d)) for d in (BASE, STRICT)]
        floor_allow, floor_strict = (None if f is None else f.rps for f in floors)
        out.append(
            StrictCost(
                arrangement=name,
                body=body,
                body_bytes=allow.body_bytes,
                concurrency=concurrency,
                allow_rps=allow.rps,
                strict_rps=strict.rps,
                rps_ratio=_ratio(strict.rps, allow.rps),
                allow_p50_ms=allow.p50_ms,
                strict_p50_ms=strict.p50_ms,
                p50_ratio=_ratio(strict.p50_ms, allow.p50_ms),
                allow_added_p50_ms=_added(allow),
                strict_added_p50_ms=_added(strict),
                allow_cpu_ms_per_req=allow.cpu.processor,
                strict_cpu_ms_per_req=strict.cpu.processor,
                cpu_ratio=_ratio(strict.cpu.processor, allow.cpu.processor),
                floor_allow_rps=floor_allow,
                floor_strict_rps=floor_strict,
                rps_ratio_over_floor=_over_floor(allow, strict, floor_allow, floor_strict),
                ok=allow.ok and strict.ok,
            )
        )
    return tuple(sorted(out, key=lambda r: (r.body_bytes, r.concurrency, r.arrangement)))
