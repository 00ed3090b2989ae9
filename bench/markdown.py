"""results.md: a judged run (bench/judge.py) as markdown, section by section."""

from __future__ import annotations

import re
from collections import defaultdict

from bench.judge import FLOOR
from bench.results_model import LABEL, LedgerRow, Meta, ProofCost, Results, by_cell


def _num(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def render(results: Results) -> str:
    """The whole of results.md."""
    lines = [
        *_introduction(results),
        *_notes(results),
        *_targets_md(results),
        *_ledger_md(results),
        *_proof_md(results),
        *_records_md(results),
        *_strict_md(results),
        *_slopes_md(results),
        *_cells_md(results),
    ]
    return "\n".join(lines) + "\n"


def _machine(meta: Meta) -> str:
    return meta.machine if meta.cpu_model is None else f"{meta.cpu_model}; {meta.machine}"


def _code(meta: Meta) -> str:
    return "" if meta.commit is None else f"code at {meta.commit}; "


def _packages(meta: Meta) -> str:
    return f" ({', '.join(meta.packages)})" if meta.packages else ""


def _introduction(results: Results) -> list[str]:
    meta = results.meta
    only = {
        "targets": ", the targets' cells",
        "ledger": ", the cost ledger",
        "compiled": ", the compiled ladder",
    }.get(meta.cells or "", "")
    return [
        f"# ext_proc benchmark ({meta.mode}{only})",
        "",
        f"Started {meta.started} on {meta.cpus} CPUs ({_machine(meta)}); "
        f"{_code(meta)}Python {meta.python}{_packages(meta)}; {meta.envoy}; {meta.nginx}; "
        f"{meta.wrk}.",
        f"Each cell: {1 if meta.rounds is None else meta.rounds} round(s), each arrangement "
        f"once per round: {meta.seconds_per_cell} s of closed-loop HTTP/1.1 keep-alive load "
        f"from wrk ({meta.wrk_threads} thread) after {meta.warmup_seconds} s of warm-up, "
        "arrangements one after another in an order that rotates from round to round. "
        "Each figure is the median over the rounds; the targets also show each round's "
        "ratio (the arrangements of one round ran within seconds of each other).",
        "",
        "Arrangements, each behind its own Envoy (`--concurrency 1`, rendered from "
        "`envoy/envoy.yaml` or the arrangement's config) in front of one nginx answering a "
        "small JSON 200 after reading the whole body:",
        "",
        *(f"- {text}" for text in _arrangement_notes(results)),
        "",
        "Bodies (ids: 200 at 2 KiB, 8000 at 64 KiB, 131072 at 1 MiB): `allow` = chat request "
        "without ids on `/v1/`; `strip` = ids on `/v1/` (removed, body rewritten); `deny` = "
        "ids with a `true` on `/pd-any/v1/` (400 from the service); `honor` = valid ids and a "
        "proof on `/pd-any/v1/` (`trust_any_caller`: validated, forwarded unchanged, the "
        "proof unchecked); `honor-proven` = the same bytes on `/pd/v1/` (the gateway's proof "
        "verified, spent in the record of spent proofs, the ids validated, forwarded "
        "unchanged); both with a different proof in every request (a pool minted for the "
        "cell, spliced in by wrk's script in every arrangement); `strict` = the `allow` "
        "bytes on `/strict/v1/` (the aggregated route with `strict_body: vllm 0.32.0`: "
        "parsed whatever it holds, its members checked against vLLM's request model, "
        "forwarded unchanged). "
        "Direct and naive forward every body.",
        "",
    ]


def _arrangement_notes(results: Results) -> list[str]:
    """One line per kind of arrangement the run measured; the default is named."""
    names = results.names
    default = results.default
    notes = {
        "direct": "`direct`: the shipped config with the ext_proc filter removed;",
        "naive": "`naive`: `bench/naive.py`, a grpc.aio processor answering headers and body "
        "with empty continue responses, no parsing, behind `envoy/envoy-two-message.yaml` "
        "(two gRPC messages per request);",
        FLOOR: f"`{FLOOR}`: the naive processor behind `envoy/envoy.yaml`: the floor, what "
        "one grpc.aio round trip per request costs with no work at all, against which the "
        "targets are judged (it polices nothing; its deny cells are forwarded);",
        "service-wN": "`service-wN`: `python -m ext_proc serve` (N workers) behind "
        "`envoy/envoy.yaml` (headers skipped: one gRPC message per request); each worker "
        "serves its own port (the processor's port plus i), an endpoint of Envoy's "
        "processor cluster, which picks one per stream;",
        "service-w1-2msg": "`service-w1-2msg`: the same behind `envoy/envoy-two-message.yaml` "
        "(headers, then body: two gRPC messages per request);",
        "service-wN-redis": "`service-wN-redis`: `service-wN` keeping its spent proofs in a "
        "`redis-server` on loopback (`proof.record: redis://...`) instead of its own table;",
        "ledger": "`direct-*`, `naive-1msg-ext_proc` and `ledger-*`: the cost ledger's rungs "
        "(`bench/ledger.py`, `bench/stack.py`), each adding one piece to the rung before "
        "it; the section Cost ledger lists them;",
        "native": "`service-wN-native-*`: `service-wN` with `EXT_PROC_NATIVE` set in its "
        "environment: the compiled parts named after `native-` run compiled, the others "
        "their pure-Python reference (`none`: every part its reference); the compiled "
        "ladder's rungs, which the section Cost ledger lists;",
    }
    if any(a.kind == "ledger" for a in results.arrangements):
        names.append("ledger")
    if any(re.fullmatch(r"service-w\d+-native-.+", name) for name in names):
        names.append("native")
    if any(re.fullmatch(r"service-w\d+", name) for name in names):
        names.append("service-wN")
    if any(re.fullmatch(r"service-w\d+-redis", name) for name in names):
        names.append("service-wN-redis")
    lines = [text for key, text in notes.items() if key in names]
    if default is not None:
        lines.append(f"`{default}` is the shipped default arrangement, the one judged.")
    return lines


def _notes(results: Results) -> list[str]:
    """The run's notes, Envoy's connections to each processor, unexpected answers."""
    connections = {
        name: stats.get("cluster.ext_proc.upstream_cx_total")
        for name, stats in results.envoy_stats.items()
        if name != "direct"
    }
    notes = [*results.notes]
    notes.append(
        "Envoy -> processor HTTP/2 connections opened during the run: "
        + ", ".join(f"{name} {count}" for name, count in connections.items())
        + "."
    )
    bad = [r for r in results.cells if not r.ok]
    if bad:
        notes.append(
            f"{len(bad)} measurement(s) saw unexpected statuses or socket errors "
            "(marked `!` below)."
        )
    return ["Notes:", "", *(f"- {note}" for note in notes), ""]


def _status(status: str) -> str:
    return "**missed**" if status == "missed" else status


def _targets_md(results: Results) -> list[str]:
    default = results.default
    judged = "no single arrangement marked default" if default is None else f"`{default}`"
    lines = [
        "## Targets",
        "",
        f"Judged only on the shipped default arrangement ({judged}) against the floor "
        f"`{FLOOR}` measured in the same run: each value is the default's figure over the "
        "floor's, measured in rounds: the median of the rounds' ratios (the figures "
        "shown are the medians of each). Added p50 = p50 minus `direct`'s p50 in the "
        "same cell (and round). A target is met "
        "when every check of it is and missed when any is; it is not measured when a "
        "cell it needs was not measured in this run (`python -m bench --cells targets` "
        "measures them all). Informational rows count for nothing.",
        "",
        "| # | target | status | checks met |",
        "|---|---|---|---|",
    ]
    for s in results.judged.target_summary:
        lines.append(
            f"| {s.target} | {s.title} | {_status(s.status)} | {s.checks_met}/{s.checks} |"
        )
    lines += [
        "",
        f"| # | cell | measure | value | threshold | {default or 'default'} vs floor | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results.judged.targets:
        status = _status(row.status)
        if row.informational:
            status += " (informational)"
        lines.append(
            f"| {row.target} | {row.cell} | {row.measure} | "
            f"{_num(row.value, 2, 'x')} | {row.threshold} | {row.detail} | {status} |"
        )
    return [*lines, ""]


# What each ladder is, for the Cost ledger section's introduction (those measured).
_LADDERS = {
    "envoy": "Envoy's ladder runs from Envoy direct without its 404 routes and access log "
    f"to the floor `{FLOOR}` (`python -m bench --cells ledger`, `bench/stack.py`).",
    "processor": "The processor's runs from the floor to the shipped default, the service's "
    "pieces added one at a time (`python -m bench --cells ledger`, `bench/ledger.py`); its "
    "rungs below `ledger-encode` answer every body with an empty continue (a strip is "
    "forwarded unchanged there).",
    "compiled": "The compiled ladder runs from Envoy direct and the floor to the service "
    "with none of its compiled parts (`EXT_PROC_NATIVE=0`: each part's pure-Python "
    "reference, the same answers), then compiles one part more at each rung: the carrier "
    "scan (`core._scan`), the wire reader of the raw message bytes (`edge._wire`), and "
    "last the body's shape and the id checks (`core._shape`, `core._ids`), which is the "
    "shipped default (`python -m bench --cells compiled`, `ext_proc/core/native.py`). A "
    "rung's `+` figures are the gain of the part it compiles (negative: it saves).",
}


def _ledger_md(results: Results) -> list[str]:
    """The ladders measured, every rung per cell; nothing without one."""
    rows = results.judged.ledger
    if not rows:
        return []
    floor = next((r for r in rows if r.arrangement == FLOOR), None)
    measured = [name for name in _LADDERS if any(r.ladder == name for r in rows)]
    lines = [
        "## Cost ledger",
        "",
        "Each rung adds one piece to the rung before it on its ladder, all measured side "
        "by side in each round. "
        + " ".join(_LADDERS[name] for name in measured)
        + " `+` columns: the rung's figure minus the rung before's (medians over the "
        "rounds, so a piece's figure carries the noise of two: one within that noise of "
        "zero says nothing). Added p50: the rung's p50 minus Envoy direct's in the cell. "
        "`x floor`: the rung's figure over the floor's in the cell. "
        f"CPU: {_machine(results.meta)}"
        + (
            ""
            if floor is None
            else f"; the floor's Envoy CPU per request in the first cell "
            f"{_num(floor.envoy_cpu_ms_per_req, 3)} ms and its processor's "
            f"{_num(floor.processor_cpu_ms_per_req, 3)} ms"
        )
        + ".",
        "",
    ]
    cells = sorted({(r.body_bytes, r.decision, r.concurrency) for r in rows})
    for size, decision, concurrency in cells:
        lines += [
            f"### {size:,} B {decision}, c={concurrency}",
            "",
            "| ladder | rung | adds | req/s | x floor | p50 ms | added p50 ms | + ms "
            "| processor CPU ms/req | + ms | x floor | Envoy CPU ms/req | + ms | x floor |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for ladder in measured:
            before: LedgerRow | None = None
            for r in rows:
                if r.ladder != ladder:
                    continue
                if (r.body_bytes, r.decision, r.concurrency) != (size, decision, concurrency):
                    continue
                mark = "" if r.ok else " !"
                p50_added = None if before is None else _minus(r.p50_ms, before.p50_ms)
                lines.append(
                    f"| {r.ladder} | `{r.arrangement}`{mark} | {r.adds} | {r.rps:.0f} | "
                    f"{_num(r.rps_x_floor, 2, 'x')} | {_num(r.p50_ms, 3)} | "
                    f"{_num(r.added_p50_ms, 3)} | {_num(p50_added, 3)} | "
                    f"{_num(r.processor_cpu_ms_per_req, 3)} | "
                    f"{_num(r.processor_added_ms, 3)} | {_num(r.processor_x_floor, 2, 'x')} | "
                    f"{_num(r.envoy_cpu_ms_per_req, 3)} | {_num(r.envoy_added_ms, 3)} | "
                    f"{_num(r.envoy_x_floor, 2, 'x')} |"
                )
                before = r
        lines.append("")
    return lines


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _over_direct(row: ProofCost) -> str:
    if row.added_ratio is None:
        return "n/a"
    rounds = ", ".join(f"{x:.2f}x" for x in row.added_ratio_rounds or ())
    return f"{row.added_ratio:.2f}x ({rounds})"


def _proof_md(results: Results) -> list[str]:
    """What verifying a proof costs; nothing when no cell was measured both ways."""
    if not results.judged.verification:
        return []
    lines = [
        "## Proof verification",
        "",
        "`honor-proven` (ids + proof on `/pd/v1/`: verified, validated, forwarded unchanged) "
        "against `honor` (the same bytes on `/pd-any/v1/`, `trust_any_caller`: validated, "
        "forwarded unchanged, the proof unchecked), same body size, same run. "
        "Added = proven minus unproven; proven / honor over direct = the latency each adds "
        "over Envoy direct, proven over unproven, the median of the rounds' ratios (the "
        "decode leg's target: at most 1.1x at 1 MiB, c=1, on the default arrangement).",
        "",
        "| body | ids | c | arrangement | p50 honor ms | p50 proven ms | added p50 ms | "
        "proven / honor over direct (rounds) | "
        "processor CPU honor ms/req | proven ms/req | added CPU ms/req |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results.judged.verification:
        mark = "" if r.ok else " !"
        lines.append(
            f"| {r.body_bytes:,} B | {r.id_count:,} | {r.concurrency} | "
            f"{r.arrangement}{mark} | {r.honor_p50_ms:.3f} | {r.proven_p50_ms:.3f} | "
            f"{_num(r.added_p50_ms, 3)} | {_over_direct(r)} | "
            f"{_num(r.honor_cpu_ms_per_req, 3)} | "
            f"{_num(r.proven_cpu_ms_per_req, 3)} | {_num(r.added_cpu_ms_per_req, 3)} |"
        )
    return [*lines, ""]


def _records_md(results: Results) -> list[str]:
    """The local record of spent proofs against Redis; nothing unless a proven cell ran
    with both."""
    rows = results.judged.records
    if not rows:
        return []
    lines = [
        "## Record of spent proofs: local table vs Redis",
        "",
        "Each proof is honored once: `honor-proven` spends it in the processor's record, "
        "its own table (`service-wN`) or a Redis on loopback (`service-wN-redis`, one "
        "`SET NX` script per proof). Added = p50 minus Envoy direct's p50 in the same "
        "cell; `honor` (the proof unchecked, no record) on the local arrangement. Ratios are of "
        "added latencies.",
        "",
        "| body | c | arrangement | +p50 honor ms | +p50 proven local ms | "
        "+p50 proven Redis ms | local / honor | Redis / honor | Redis / local | "
        "Redis - local ms | processor CPU ms/req honor / local / Redis |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = "" if r.ok else " !"
        cpu = " / ".join(
            _num(v, 3)
            for v in (r.honor_cpu_ms_per_req, r.local_cpu_ms_per_req, r.redis_cpu_ms_per_req)
        )
        lines.append(
            f"| {r.body_bytes:,} B | {r.concurrency} | {r.arrangement}{mark} | "
            f"{_num(r.honor_added_p50_ms, 3)} | {_num(r.local_added_p50_ms, 3)} | "
            f"{_num(r.redis_added_p50_ms, 3)} | {_num(r.local_x_honor, 2, 'x')} | "
            f"{_num(r.redis_x_honor, 2, 'x')} | {_num(r.redis_x_local, 2, 'x')} | "
            f"{_num(r.redis_minus_local_p50_ms, 3)} | {cpu} |"
        )
    return [*lines, ""]


def _strict_md(results: Results) -> list[str]:
    """What a strict_body route costs; nothing unless a cell ran both ways."""
    rows = results.judged.strict
    if not rows:
        return []
    lines = [
        "## Strict bodies",
        "",
        "`strict` (the `allow` bytes on `/strict/v1/`, `strict_body: vllm 0.32.0`: every "
        "body parsed, its members checked against vLLM's request model) against `allow` "
        "(on `/v1/`, where the byte scan lets a body without carriers through unparsed), "
        "each figure strict over allow, of the cells' medians. Informational: no target "
        f"reads it. The two cells ran minutes apart: `{FLOOR}`'s req/s in each (the route "
        "changes nothing for it) shows how the machine moved between them, and "
        "`over floor` is strict / allow of each cell's req/s over the floor's.",
        "",
        "| body | c | arrangement | req/s allow / strict | strict / allow | "
        "p50 allow / strict ms | strict / allow | +p50 allow / strict ms | "
        "processor CPU allow / strict ms/req | strict / allow | floor req/s allow / strict | "
        "req/s strict / allow over floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = "" if r.ok else " !"
        lines.append(
            f"| {r.body_bytes:,} B | {r.concurrency} | {r.arrangement}{mark} | "
            f"{r.allow_rps:.0f} / {r.strict_rps:.0f} | {_num(r.rps_ratio, 2, 'x')} | "
            f"{r.allow_p50_ms:.3f} / {r.strict_p50_ms:.3f} | {_num(r.p50_ratio, 2, 'x')} | "
            f"{_num(r.allow_added_p50_ms, 3)} / {_num(r.strict_added_p50_ms, 3)} | "
            f"{_num(r.allow_cpu_ms_per_req, 3)} / {_num(r.strict_cpu_ms_per_req, 3)} | "
            f"{_num(r.cpu_ratio, 2, 'x')} | "
            f"{_num(r.floor_allow_rps, 0)} / {_num(r.floor_strict_rps, 0)} | "
            f"{_num(r.rps_ratio_over_floor, 2, 'x')} |"
        )
    return [*lines, ""]


def _slopes_md(results: Results) -> list[str]:
    slopes = results.judged.slopes
    concurrencies = sorted({r.concurrency for r in slopes})
    lines = [
        "## Added p50 latency per MiB of body",
        "",
        "Least-squares slope of `p50(x) - p50(direct)` over the body sizes measured, "
        "ms per MiB (1,048,576 bytes).",
        "",
        "| arrangement | decision | " + " | ".join(f"c={c}" for c in concurrencies) + " |",
        "|---|---|" + "---|" * len(concurrencies),
    ]
    table: dict[tuple[str, str], dict[int, float | None]] = defaultdict(dict)
    for row in slopes:
        table[row.arrangement, row.decision][row.concurrency] = row.ms_per_mib
    for (name, decision), values in table.items():
        cols = " | ".join(_num(values.get(c), 2) for c in concurrencies)
        lines.append(f"| {name} | {decision} | {cols} |")
    return [*lines, ""]


def _cells_md(results: Results) -> list[str]:
    lines = [
        "## All cells",
        "",
        "`+p50` = p50 minus direct's p50 in the same cell; `+p50 / naive` = that added "
        "latency over naive's added latency; CPU columns = CPU time (user + system, from "
        "/proc) of the processor (all its processes) and of Envoy during the measurement, "
        "per request; `!` = unexpected statuses or socket errors.",
        "",
        "| body | decision | c | arrangement | p50 ms | p99 ms | req/s | +p50 ms | "
        "p50 / direct | req/s / direct | +p50 / naive | req/s / naive | "
        "processor CPU ms/req | Envoy CPU ms/req |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {name: i for i, name in enumerate(results.names)}
    for (body, decision, concurrency), group in by_cell(results.cells).items():
        for name in sorted(group, key=order.__getitem__):
            r = group[name]
            if r.relative is None:
                raise ValueError("the records are not enriched (bench/judge.py judge)")
            mark = "" if r.ok else " !"
            rel = r.relative
            lines.append(
                f"| {LABEL[body]} | {decision} | {concurrency} | {name}{mark} | "
                f"{r.p50_ms:.3f} | {r.p99_ms:.3f} | {r.rps:.0f} | "
                f"{_num(rel.added_p50_ms, 3)} | {_num(rel.p50_x_direct, 2, 'x')} | "
                f"{_num(rel.rps_x_direct, 2, 'x')} | {_num(rel.added_x_naive, 2, 'x')} | "
                f"{_num(rel.rps_x_naive, 2, 'x')} | "
                f"{_num(r.cpu.processor, 3)} | {_num(r.cpu.envoy, 3)} |"
            )
    return [*lines, ""]
