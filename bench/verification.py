"""What verifying a proof costs: ``honor-proven`` against ``honor`` in the same run.

Both carry the same ids in a body of the same size; ``honor`` is validated and forwarded
unchanged on a route that trusts any caller, ``honor-proven`` is verified (the HMAC over
the parameters, the prompt digest), validated, and forwarded without its proof (the
body rewritten). The difference of their p50s, and of the processor's CPU time per
request, is the price of honoring only what the deployment minted.
"""

from __future__ import annotations

from typing import Any

Record = dict[str, Any]
UNPROVEN = "honor"
PROVEN = "honor-proven"


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
