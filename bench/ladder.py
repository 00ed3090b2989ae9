"""The cost ledger's rows: each rung of a ladder against the rung before.

A ``--cells ledger`` run measures two ladders side by side in every cell
(bench/ledger.py, bench/stack.py): Envoy's, from Envoy direct without its 404 routes and
access log up to the floor (the naive processor behind the shipped config), and the
processor's, from the floor up to the shipped default. A ``--cells compiled`` run
measures a third: Envoy direct, the floor, then the service with no compiled part
(``EXT_PROC_NATIVE=0``), one compiled part more at each rung, up to the shipped default.
Each row gives a rung's requests/s, p50 and added p50 (over Envoy direct in the cell),
the CPU per request of the processor and of Envoy, what it adds over the rung before
(the medians' difference) and its figures over the floor's, the ratios the targets
judge. Its section of results.md is bench/markdown.py's.
"""

from __future__ import annotations

from bench import ledger, stack
from bench.results_model import Cpu, LedgerRow, Record, Results


def envoy_ladder(floor: str) -> list[tuple[str, str]]:
    """Envoy's rungs in order: (arrangement, what it adds over the one before)."""
    names = {
        "bare": "direct-bare",
        "routes": "direct-routes",
        "log": "direct",
        "header_step": "direct-header_step",
        "ext_proc": f"{floor}-ext_proc",
        "attributes": floor,
    }
    return [(names[rung], stack.ENVOY_ADDS[rung]) for rung in stack.ENVOY_RUNGS]


def processor_ladder(floor: str, default: str) -> list[tuple[str, str]]:
    """The processor's rungs in order, from the floor to the shipped default."""
    rungs = [(f"ledger-{rung}", ledger.ADDS[rung]) for rung in ledger.RUNGS]
    return [(floor, "the floor"), *rungs, (default, ledger.ADDS["service"])]


def compiled_ladder(floor: str, default: str) -> list[tuple[str, str]]:
    """The compiled ladder's rungs in order: Envoy direct, the floor, the service with
    no compiled part and one more at each rung, up to the shipped default."""
    rungs = [
        (stack.Arrangement("service", 1, native=value).name, stack.COMPILED_ADDS[value])
        for value in stack.COMPILED_RUNGS
    ]
    return [
        ("direct", "Envoy direct: no processor"),
        (floor, "the floor: ext_proc and a processor that does no work"),
        *rungs,
        (default, stack.COMPILED_ADDS[""]),
    ]


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 4)


def _over(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else round(a / b, 3)


def rows(results: Results, floor: str) -> tuple[LedgerRow, ...] | None:
    """Every rung measured, per cell and ladder, in the ladder's order, against the
    arrangement ``floor``; None when the run measured no rung of the ledger."""
    if results.default is None:
        return None
    ladders = {}
    if any(a.kind == "ledger" for a in results.arrangements):
        ladders["envoy"] = envoy_ladder(floor)
        ladders["processor"] = processor_ladder(floor, results.default)
    compiled = compiled_ladder(floor, results.default)
    # The ladder is measured where its rungs below the default are (the default and the
    # floor are in every run).
    if {name for name, _ in compiled[2:-1]} & set(results.names):
        ladders["compiled"] = compiled
    if not ladders:
        return None
    found: dict[tuple[str, str, int], dict[str, Record]] = {}
    for measured in results.cells:
        key = (measured.body, measured.decision, measured.concurrency)
        found.setdefault(key, {})[measured.arrangement] = measured
    out = []
    for (body, decision, concurrency), cell in found.items():
        base = cell.get(floor)
        floor_cpu = Cpu() if base is None else base.cpu
        for name, ladder in ladders.items():
            before: Record | None = None
            for arrangement, adds in ladder:
                if (record := cell.get(arrangement)) is None:
                    continue
                # A rung with none before it, or a cell without the floor, has no figure
                # to compare with: every CPU figure of an empty Cpu is None.
                prior = Cpu() if before is None else before.cpu
                out.append(
                    LedgerRow(
                        ladder=name,
                        arrangement=arrangement,
                        adds=adds,
                        body=body,
                        body_bytes=record.body_bytes,
                        decision=decision,
                        concurrency=concurrency,
                        rps=record.rps,
                        processor_cpu_ms_per_req=record.cpu.processor,
                        envoy_cpu_ms_per_req=record.cpu.envoy,
                        processor_added_ms=_minus(record.cpu.processor, prior.processor),
                        envoy_added_ms=_minus(record.cpu.envoy, prior.envoy),
                        rps_x_floor=_over(record.rps, None if base is None else base.rps),
                        processor_x_floor=_over(record.cpu.processor, floor_cpu.processor),
                        envoy_x_floor=_over(record.cpu.envoy, floor_cpu.envoy),
                        ok=record.ok,
                        p50_ms=record.p50_ms,
                        added_p50_ms=None
                        if record.relative is None
                        else record.relative.added_p50_ms,
                    )
                )
                before = record
    return tuple(out)
