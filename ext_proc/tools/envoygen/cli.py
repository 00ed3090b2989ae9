"""``python -m ext_proc envoy-config INPUT.yaml... [-o OUT | --output-dir DIR]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ext_proc.tools.envoygen.inputs import GeneratorError, load_input, read_input
from ext_proc.tools.envoygen.output import render


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ext_proc envoy-config",
        description="Write a fail-closed Envoy bootstrap for the token-id policy processor.",
    )
    parser.add_argument("input", type=Path, nargs="+", help="generator input (YAML)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", type=Path, help="output file (default: stdout)")
    where.add_argument(
        "--output-dir", type=Path, help="write each input to DIR under the input's file name"
    )
    return parser


def generate(path: Path) -> str:
    """The configuration ``path`` describes, as the file it is written to."""
    try:
        return render(load_input(read_input(path)), source=path.as_posix())
    except GeneratorError as exc:
        raise GeneratorError(f"{path}: {exc}") from None


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if len(args.input) > 1 and args.output_dir is None:
        parser.error("several inputs need --output-dir")
    try:
        # Every input is generated before anything is written.
        texts = [(path, generate(path)) for path in args.input]
    except GeneratorError as exc:
        print(f"envoy-config: {exc}", file=sys.stderr)
        return 2
    for path, text in texts:
        if args.output_dir is not None:
            (args.output_dir / path.name).write_text(text)
        elif args.output is not None:
            args.output.write_text(text)
        else:
            sys.stdout.write(text)
    return 0
