"""What verifying a proof costs: ``honor-proven`` against ``honor`` in the same run.

Both carry the same ids in a body of the same size; ``honor`` is validated and forwarded
unchanged on a route that trusts any caller, ``honor-proven`` is verified (the HMAC over
the parameters, the prompt digest), validated, and forwarded without its proof (the
body rewritten). The difference of their p50s, and of the processor's CPU time per
request, is the price of honoring only what the deployment minted.

Each proof is honored once: the processor spends it in its record of spent proofs, its
own table (``service-wN``) or Redis (``service-wN-redis``, ``python -m bench --records
local,redis``). ``record_rows`` sets the proven cell of both beside ``honor``, as
latencies added over Envoy direct and their ratios.
"""

from __future__ import annotations

from typing import Any

Record = dict[str, Any]
UNPROVEN = "honor"
PROVEN = "honor-proven"
REDIS = "-redis"


def _cost(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(b - a, 3)


def rows(results: dict[str, Any]) -> list[Record]:
    """One row per service arrangement, body size and concurrency measured both ways."""
    found: dict[tuple[str, str, int, str], Record] = {
        (r["arrangement"], r["body"], r["concurrency"], r["decision"]): r
        for r in results["cells"]
        if r["decision"] in (UNPROVEN, PROVEN)
    }
    services = [a["name"] for a in results["arrangements"] if a["kind"] == "service"]
    out = []
    for (name, body, concurrency, decision), unproven in found.items():
        proven = found.get((name, body, concurrency, PROVEN))
        if decision != UNPROVEN or name not in services or proven is None:
            continue
        cpu = "processor_cpu_ms_per_req"
        out.append(
            {
                "arrangement": name,
                "body": body,
                "body_bytes": unproven["body_bytes"],
                "id_count": unproven["id_count"],
                "concurrency": concurrency,
                "honor_p50_ms": unproven["p50_ms"],
                "proven_p50_ms": proven["p50_ms"],
                "added_p50_ms": _cost(unproven["p50_ms"], proven["p50_ms"]),
                "honor_cpu_ms_per_req": unproven.get(cpu),
                "proven_cpu_ms_per_req": proven.get(cpu),
                "added_cpu_ms_per_req": _cost(unproven.get(cpu), proven.get(cpu)),
                "ok": unproven["ok"] and proven["ok"],
            }
        )
    return sorted(out, key=lambda r: (r["body_bytes"], r["concurrency"], r["arrangement"]))


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def markdown(results: dict[str, Any]) -> list[str]:
    """The section of results.md; nothing when no cell was measured both ways."""
    if not results["verification"]:
        return []
    lines = [
        "## Proof verification",
        "",
        "`honor-proven` (ids + proof on `/pd/v1/`: verified, validated, the proof removed) "
        "against `honor` (the same ids on `/pd-any/v1/`, `trust_any_caller`: validated, "
        "forwarded unchanged), same body size, same run. Added = proven minus unproven.",
        "",
        "| body | ids | c | arrangement | p50 honor ms | p50 proven ms | added p50 ms | "
        "processor CPU honor ms/req | proven ms/req | added CPU ms/req |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["verification"]:
        mark = "" if r["ok"] else " !"
        lines.append(
            f"| {r['body_bytes']:,} B | {r['id_count']:,} | {r['concurrency']} | "
            f"{r['arrangement']}{mark} | {r['honor_p50_ms']:.3f} | {r['proven_p50_ms']:.3f} | "
            f"{_num(r['added_p50_ms'])} | {_num(r['honor_cpu_ms_per_req'])} | "
            f"{_num(r['proven_cpu_ms_per_req'])} | {_num(r['added_cpu_ms_per_req'])} |"
        )
    return [*lines, ""]


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else round(a / b, 2)


def record_rows(results: dict[str, Any]) -> list[Record]:
    """Per body size, concurrency and service arrangement measured with both records
    (``X`` and ``X-redis``): the latency each adds over Envoy direct for ``honor`` (on
    ``X``) and ``honor-proven`` (local: ``X``, Redis: ``X-redis``), the ratios, and the
    processor's CPU per request. Expects the records enriched (``added_p50_ms``)."""
    found = {
        (r["arrangement"], r["body"], r["concurrency"], r["decision"]): r for r in results["cells"]
    }
    names = {a["name"] for a in results["arrangements"] if a["kind"] == "service"}
    out = []
    for (name, body, concurrency, decision), local in found.items():
        if decision != PROVEN or name + REDIS not in names:
            continue
        honor = found.get((name, body, concurrency, UNPROVEN))
        shared = found.get((name + REDIS, body, concurrency, PROVEN))
        if honor is None or shared is None:
            continue
        cpu = "processor_cpu_ms_per_req"
        added = [r.get("added_p50_ms") for r in (honor, local, shared)]
        out.append(
            {
                "arrangement": name,
                "redis_arrangement": name + REDIS,
                "body": body,
                "body_bytes": local["body_bytes"],
                "concurrency": concurrency,
                "honor_added_p50_ms": added[0],
                "local_added_p50_ms": added[1],
                "redis_added_p50_ms": added[2],
                "local_x_honor": _ratio(added[1], added[0]),
                "redis_x_honor": _ratio(added[2], added[0]),
                "redis_x_local": _ratio(added[2], added[1]),
                "redis_minus_local_p50_ms": _cost(added[1], added[2]),
                "honor_cpu_ms_per_req": honor.get(cpu),
                "local_cpu_ms_per_req": local.get(cpu),
                "redis_cpu_ms_per_req": shared.get(cpu),
                "ok": honor["ok"] and local["ok"] and shared["ok"],
            }
        )
    return sorted(out, key=lambda r: (r["body_bytes"], r["concurrency"], r["arrangement"]))


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def record_markdown(results: dict[str, Any]) -> list[str]:
    """The section of results.md; nothing unless a proven cell ran with both records."""
    rows = results.get("records", [])
    if not rows:
        return []
    lines = [
        "## Record of spent proofs: local table vs Redis",
        "",
        "Each proof is honored once: `honor-proven` spends it in the processor's record, "
        "its own table (`service-wN`) or a Redis on loopback (`service-wN-redis`, one "
        "`SET NX` script per proof). Added = p50 minus Envoy direct's p50 in the same "
        "cell; `honor` (no proof, no record) on the local arrangement. Ratios are of "
        "added latencies.",
        "",
        "| body | c | arrangement | +p50 honor ms | +p50 proven local ms | "
        "+p50 proven Redis ms | local / honor | Redis / honor | Redis / local | "
        "Redis - local ms | processor CPU ms/req honor / local / Redis |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = "" if r["ok"] else " !"
        cpu = " / ".join(
            _num(r[k])
            for k in ("honor_cpu_ms_per_req", "local_cpu_ms_per_req", "redis_cpu_ms_per_req")
        )
        lines.append(
            f"| {r['body_bytes']:,} B | {r['concurrency']} | {r['arrangement']}{mark} | "
            f"{_num(r['honor_added_p50_ms'])} | {_num(r['local_added_p50_ms'])} | "
            f"{_num(r['redis_added_p50_ms'])} | {_x(r['local_x_honor'])} | "
            f"{_x(r['redis_x_honor'])} | {_x(r['redis_x_local'])} | "
            f"{_num(r['redis_minus_local_p50_ms'])} | {cpu} |"
        )
    return [*lines, ""]
