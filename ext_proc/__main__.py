"""Command line: ``python -m ext_proc serve|devstack``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from ext_proc import logs
from ext_proc.config import Config, ConfigError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ext_proc")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the ext_proc gRPC processor")
    serve.add_argument("--config", type=Path, help="YAML configuration file")
    serve.add_argument("--listen", help="gRPC listen address, host:port")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    stack = commands.add_parser("devstack", help="run processor, Envoy and a stand-in upstream")
    stack.add_argument("--config", type=Path, help="processor YAML configuration file")
    upstream = commands.add_parser("upstream", help="run the recording stand-in upstream")
    upstream.add_argument("--listen", default="127.0.0.1:8081", help="host:port")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "upstream":
        from ext_proc.devstack import upstream

        host, _, port = args.listen.rpartition(":")
        asyncio.run(upstream.serve_forever(host, int(port)))
        return 0
    if args.command == "devstack":
        from ext_proc.devstack import stack

        return stack.run(args.config)
    try:
        config = Config.load(args.config, listen=args.listen, log_level=args.log_level)
    except ConfigError as exc:
        print(f"ext_proc: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.log_level)
    from ext_proc.server import serve

    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
