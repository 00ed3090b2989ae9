"""``python -m devstack``: the local stack behind ``make run``;
``python -m devstack upstream --listen HOST:PORT``: the recording stand-in alone;
``python -m devstack generate``: every generated file (``devstack/generated.py``), and
``python -m devstack NAME`` one generator's (envoy-configs, envoy-fields, protos, llm-d, ingress,
monitoring, dashboard, route-policy-docs, connector-keys-docs, module-map);
``python -m devstack code-figures``: size by layer, longest functions, the stream's state."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

from devstack import code_figures, generated, release, stack, upstream
from ext_proc.core.address import HostPort
from ext_proc.version import add_argument as add_version

# Set in the second pass of `generate` (main).
_AGAIN = "EXT_PROC_GENERATE_AGAIN"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devstack")
    add_version(parser)
    parser.add_argument("--config", type=Path, help="processor YAML configuration file")
    commands = parser.add_subparsers(dest="command")
    stand_in = commands.add_parser("upstream", help="run the recording stand-in upstream")
    stand_in.add_argument("--listen", type=HostPort.parse, default=HostPort("127.0.0.1", 8081))
    commands.add_parser("generate", help="write every generated file")
    released = commands.add_parser(
        "release", help="build the sdist, the wheel and (with a Docker engine) the image"
    )
    released.add_argument("--image", help="the image's name (default: pyproject.toml's)")
    for generator in generated.GENERATORS:
        commands.add_parser(generator.name, help=f"write {generator.summary}")
    figures = commands.add_parser(
        "code-figures", help="print the package's size and longest functions"
    )
    figures.add_argument("--root", type=Path, default=code_figures.REPO, help="another checkout")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "upstream":
        asyncio.run(upstream.serve_forever(args.listen))
        return 0
    if args.command == "release":
        return release.release(args.image)
    if args.command == "code-figures":
        print(code_figures.report(args.root))
        return 0
    if args.command == "generate" or args.command in generated.BY_NAME:
        chosen = (
            generated.GENERATORS
            if args.command == "generate"
            else [generated.BY_NAME[args.command]]
        )
        written = False
        for generator in chosen:
            for path in generated.write(generator):
                written = True
                print(f"{generator.name}: wrote {path.relative_to(generated.REPO)}")
        if written and args.command == "generate" and not os.environ.get(_AGAIN):
            # Generators import what others write (ext_proc/core/classified.py): a second
            # pass in a fresh interpreter reads the files this one wrote, so one
            # `make generate` leaves nothing stale.
            again = [sys.executable, "-m", "devstack", "generate"]
            return subprocess.run(again, env={**os.environ, _AGAIN: "1"}, check=False).returncode
        return 0
    return stack.run(args.config)


if __name__ == "__main__":
    sys.exit(main())
