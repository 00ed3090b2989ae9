"""``python -m devstack.inventory COMMAND``: ``refresh`` (wheels -> inventory.json,
with the committed stacks.json merged in), ``stacks`` (source trees -> stacks.json) and
``report`` (per source: counts, and the names new against the previous release)."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from devstack.inventory import model, report, wheels
from devstack.inventory.model import Inventory, InventoryError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devstack.inventory")
    commands = parser.add_subparsers(dest="command", required=True)
    refresh = commands.add_parser(
        "refresh", help="read every wheel (downloaded when missing) and write inventory.json"
    )
    refresh.add_argument("--output", type=Path, default=model.INVENTORY)
    refresh.add_argument("--stacks", type=Path, default=model.STACKS, help="merged when present")
    refresh.add_argument(
        "--cache", type=Path, help="wheel directory (default: $EXT_PROC_CACHE/wheels)"
    )
    refresh.add_argument(
        "--check", action="store_true", help="write nothing; fail when the output differs"
    )
    commands.add_parser("stacks", help="read source trees into stacks.json (--help for more)")
    show = commands.add_parser("report", help="counts and new names per source")
    show.add_argument("--inventory", type=Path, default=model.INVENTORY)
    return parser


def build(cache: Path, stacks: Path) -> Inventory:
    """Every wheel's source, then the stacks snapshot's sources when the file exists."""
    sources = []
    for wheel in wheels.WHEELS:
        started = time.monotonic()
        reading = wheels.read(wheel, cache)
        sources.append(reading.source)
        took = time.monotonic() - started
        print(f"{reading.source.key}: {took:.1f} s", file=sys.stderr)
        for name in reading.unreadable:
            print(f"  {name}: not parsed by this Python; binds nothing", file=sys.stderr)
    if stacks.is_file():
        sources.extend(model.loads(stacks.read_text()).sources.values())
    return model.inventory(sources)


def _refresh(args: argparse.Namespace) -> int:
    text = model.dumps(build(args.cache or wheels.cache(), args.stacks))
    if args.check:
        current = args.output.read_text() if args.output.is_file() else ""
        if current != text:
            print(f"{args.output} differs from the wheels: run refresh", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _report(args: argparse.Namespace) -> int:
    for line in report.lines(model.loads(args.inventory.read_text())):
        print(line)
    return 0


def main(argv: list[str]) -> int:
    # `stacks` parses its own options: everything after the word is its.
    # It is imported only then: nothing else needs what it reads source trees with.
    if argv[:1] == ["stacks"]:
        stacks = importlib.import_module("devstack.inventory.stacks")
        return int(stacks.main(argv[1:]))
    args = _parser().parse_args(argv)
    try:
        return _refresh(args) if args.command == "refresh" else _report(args)
    except InventoryError as exc:
        print(f"inventory: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
