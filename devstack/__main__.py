"""``python -m devstack``: the local stack behind ``make run``;
``python -m devstack upstream --listen HOST:PORT``: the recording stand-in alone;
``python -m devstack monitoring``: the PrometheusRule generated from the rules file;
``python -m devstack dashboard``: the Grafana dashboard (deploy/monitoring/dashboard.json);
``python -m devstack llm-d``: the generated parts of deploy/llm-d/;
``python -m devstack module-map``: README.md's module map, from the package tree;
``python -m devstack code-figures``: size by layer, longest functions, the stream's state."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from devstack import code_figures, dashboard, llmd, module_map, monitoring, stack, upstream
from ext_proc.core.address import HostPort


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devstack")
    parser.add_argument("--config", type=Path, help="processor YAML configuration file")
    commands = parser.add_subparsers(dest="command")
    stand_in = commands.add_parser("upstream", help="run the recording stand-in upstream")
    stand_in.add_argument("--listen", type=HostPort.parse, default=HostPort("127.0.0.1", 8081))
    commands.add_parser("monitoring", help="write deploy/kubernetes/monitoring/prometheusrule.yaml")
    commands.add_parser("dashboard", help="write deploy/monitoring/dashboard.json")
    commands.add_parser("llm-d", help="write the generated parts of deploy/llm-d/")
    commands.add_parser("module-map", help="write README.md's module map")
    commands.add_parser("code-figures", help="print the package's size and longest functions")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "upstream":
        asyncio.run(upstream.serve_forever(args.listen))
        return 0
    if args.command == "monitoring":
        monitoring.write()
        return 0
    if args.command == "code-figures":
        print(code_figures.report())
        return 0
    if args.command == "module-map":
        module_map.write()
        return 0
    if args.command == "dashboard":
        dashboard.write()
        return 0
    if args.command == "llm-d":
        llmd.write()
        return 0
    return stack.run(args.config)


if __name__ == "__main__":
    sys.exit(main())
