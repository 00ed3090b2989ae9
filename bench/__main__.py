"""``python -m bench [--smoke] [--cells SELECTION] [--out DIR]``, ``... profile``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import bodies, profile, run
from ext_proc.version import add_argument as add_version

RESULTS = Path(__file__).resolve().parent / "results"
# The selections of fixed cells, which take no --bodies, --decisions or --concurrency.
FIXED: dict[str, Callable[[], tuple[run.Cell, ...]]] = {
    "targets": run.target_cells,
    "ledger": run.ledger_cells,
    "compiled": run.compiled_cells,
}
SELECTIONS = ("matrix", *FIXED)


def _list(
    kind: Callable[[str], Any], allowed: tuple[Any, ...] | None = None
) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        values = tuple(kind(v) for v in text.split(",") if v)
        if not values or (allowed is not None and any(v not in allowed for v in values)):
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {allowed}")
        return values

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Envoy direct vs naive processor vs this service, side by side.",
    )
    add_version(parser)
    parser.add_argument("--out", type=Path, default=RESULTS, help="output directory")
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny subset, ~1 s per cell (for CI)"
    )
    parser.add_argument("--duration", type=int, help="seconds per round (full 4, smoke 1)")
    parser.add_argument("--warmup", type=int, help="warm-up seconds per round (full 1, smoke 0)")
    parser.add_argument(
        "--rounds", type=int, help="rounds per cell, every arrangement once each (full 3, smoke 1)"
    )
    parser.add_argument(
        "--cells",
        choices=SELECTIONS,
        help="matrix: every size x decision x concurrency (the default; --smoke: 7 cells); "
        "targets: only the cells the targets judge, without the naive arrangement; "
        "ledger: the cost ledger, the service's pieces added one at a time (bench/ledger.py); "
        "compiled: the service with its compiled parts added one at a time (EXT_PROC_NATIVE)",
    )
    sizes, decisions = tuple(bodies.SIZES), bodies.DECISIONS
    parser.add_argument("--bodies", type=_list(str, sizes), help="e.g. 2k,64k,1m")
    parser.add_argument("--decisions", type=_list(str, decisions), help="e.g. allow,strict")
    parser.add_argument("--concurrency", type=_list(int), help="e.g. 1,8,32")
    parser.add_argument(
        "--workers", type=_list(int), default=run.WORKERS, help="service worker counts"
    )
    parser.add_argument("--threads", type=int, default=1, help="wrk threads")
    parser.add_argument(
        "--envoy-concurrency",
        type=int,
        default=1,
        help="each Envoy's worker threads (Envoy's --concurrency; 1 keeps it on one core)",
    )
    parser.add_argument(
        "--records",
        type=_list(str, run.RECORDS),
        default=("local",),
        help="the service's records of spent proofs: local (service-wN) and/or redis "
        "(service-wN-redis, against a redis-server the harness starts), e.g. local,redis",
    )
    commands = parser.add_subparsers(dest="command")
    prof = commands.add_parser("profile", help="py-spy profile of the service under load")
    prof.add_argument("--out", type=Path, default=RESULTS, help="output directory")
    prof.add_argument("--duration", type=int, default=15, help="seconds per scenario")
    prof.add_argument("--rate", type=int, default=200, help="samples per second")
    prof.add_argument("--workers", type=int, default=1)
    prof.add_argument("--native", action="store_true", help="include native frames")
    prof.add_argument("--top", type=int, default=25, help="rows per table")
    prof.add_argument(
        "--scenario",
        action="append",
        metavar="BODY,DECISION,CONCURRENCY",
        help="e.g. 2k,strip,8 (repeatable; default 2k,strip,8 1m,honor,1 "
        "1m,honor-proven,1 1m,deny,1)",
    )
    return parser


def _scenario(text: str) -> tuple[str, str, int]:
    size, decision, concurrency = text.split(",")
    if size not in bodies.SIZES or decision not in bodies.DECISIONS:
        raise SystemExit(f"unknown scenario {text!r}")
    return size, decision, int(concurrency)


def _plan(args: argparse.Namespace) -> run.Plan:
    subset = args.bodies or args.decisions or args.concurrency
    if args.cells in FIXED:
        if subset:
            raise SystemExit(
                f"--cells {args.cells} takes no --bodies, --decisions or --concurrency"
            )
        selection = args.cells
        cells = FIXED[selection]()
    elif args.smoke and not subset and args.cells is None:
        selection, cells = "smoke", run.smoke_cells()
    else:
        selection = "matrix"
        cells = run.full_cells(
            args.bodies or tuple(bodies.SIZES),
            args.decisions or bodies.DECISIONS,
            args.concurrency or run.CONCURRENCY,
        )
    seconds = args.duration if args.duration is not None else (1 if args.smoke else 4)
    warmup = args.warmup if args.warmup is not None else (0 if args.smoke else 1)
    rounds = args.rounds if args.rounds is not None else (1 if args.smoke else 3)
    if rounds < 1:
        raise SystemExit("--rounds must be 1 or more")
    if args.envoy_concurrency < 1:
        raise SystemExit("--envoy-concurrency must be 1 or more")
    return run.Plan(
        cells,
        args.workers,
        seconds,
        warmup,
        args.smoke,
        threads=args.threads,
        selection=selection,
        rounds=rounds,
        records=args.records,
        envoy_concurrency=args.envoy_concurrency,
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "profile":
        scenarios = tuple(_scenario(s) for s in args.scenario or ())
        path = profile.run(
            args.out,
            scenarios=scenarios or profile.DEFAULT_SCENARIOS,
            seconds=args.duration,
            rate=args.rate,
            workers=args.workers,
            native=args.native,
            top=args.top,
        )
    else:
        path = run.run(_plan(args), args.out)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
