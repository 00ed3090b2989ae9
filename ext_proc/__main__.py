"""Command line: ``python -m ext_proc COMMAND`` (``--help`` lists the commands)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ext_proc.core.config import Config, ConfigError
from ext_proc.edge import logs
from ext_proc.version import add_argument as add_version

LEVELS = ["debug", "info", "warning", "error"]
# `envoy-config` runs on the optional extra of that name (pyproject.toml); these are the
# modules it brings that the generator imports. `serve` needs none of them.
GENERATOR_EXTRA = "ext-proc-token-policy[envoy-config]"
GENERATOR_MODULES = frozenset({"envoy_data_plane", "betterproto2", "dateutil"})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ext_proc")
    add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the ext_proc gRPC processor")
    _serve_arguments(serve)
    check = commands.add_parser("check-config", help="validate a processor config file")
    check.add_argument("file", type=Path)
    check.add_argument(
        "--connect",
        action="store_true",
        help="also reach proof.record's Redis and run serve's checks on it",
    )
    check_envoy = commands.add_parser(
        "check-envoy", help="check the token policy of every route in an Envoy config"
    )
    _check_envoy_arguments(check_envoy)
    # Parsed by the generator's own parser (_envoy_config) but for --version, which
    # needs no extra.
    envoy_config = commands.add_parser(
        "envoy-config",
        help="write a fail-closed Envoy bootstrap from a short YAML input "
        f"(needs {GENERATOR_EXTRA})",
    )
    for command in (serve, check, check_envoy, envoy_config):
        add_version(command)
    return parser


def _serve_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--config", type=Path, help="YAML configuration file")
    serve.add_argument("--listen", help="gRPC address: host:port or unix:/path")
    serve.add_argument("--log-level", choices=LEVELS)
    serve.add_argument(
        "--workers", type=int, help="processes, worker i on the listen port plus i (TCP only)"
    )
    serve.add_argument("--metrics-listen", help="Prometheus host:port ('' disables)")
    serve.add_argument("--audit", action="store_true", default=None, help="audit mode")
    serve.add_argument(
        "--envoy-config",
        type=Path,
        help="the Envoy configuration this processor serves: every route's policy "
        "metadata is checked before serving",
    )


def _check_envoy_arguments(check_envoy: argparse.ArgumentParser) -> None:
    check_envoy.add_argument("file", type=Path)
    check_envoy.add_argument("--namespace", help="route metadata namespace")
    check_envoy.add_argument(
        "--listener",
        action="append",
        help="check only this listener (repeatable): the ones in front of model servers",
    )
    check_envoy.add_argument(
        "--declared-filter",
        action="append",
        help="a filter after this processor's that may change the request by design "
        "(repeatable): llm-d's endpoint picker",
    )
    check_envoy.add_argument(
        "--processor-config",
        type=Path,
        help="the processor's configuration file: where its `tls` demands TLS or a client "
        "certificate, the processor's cluster must have them",
    )
    check_envoy.add_argument(
        "--no-envoy-validate",
        action="store_true",
        help="skip `envoy --mode validate` (run by default with the envoy beside this "
        "Python, else the first on PATH; without one the check fails)",
    )


def _serve(args: argparse.Namespace) -> int:
    try:
        config = Config.load(
            args.config,
            listen=args.listen,
            log_level=args.log_level,
            workers=args.workers,
            metrics_listen=args.metrics_listen,
            audit=args.audit,
        )
    except ConfigError as exc:
        print(f"ext_proc: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.log_level)
    from ext_proc.tools import preflight

    try:
        preflight.check_all(config, args.envoy_config)
    except ConfigError as exc:
        print(f"ext_proc: {exc}", file=sys.stderr)
        return 2
    if config.workers > 1:
        from ext_proc.edge.supervisor import run

        return run(config)
    from ext_proc.edge.server import run

    return run(config)


def _check_config(path: Path, *, connect: bool) -> int:
    """The configuration and its key files; with ``connect``, its Redis record too.
    One line either way."""
    from ext_proc.tools import preflight

    try:
        config = Config.load(path, environ={})
        preflight.keys(config)
        if connect:
            preflight.record(config, reach=True)
    except ConfigError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 1
    if not connect:
        print(f"{path}: OK")
    elif config.proof.record:
        print(f"{path}: OK; proof.record answers and can keep the record")
    else:
        print(f"{path}: OK; proof.record is the processor's own table: nothing to reach")
    return 0


def _envoy_config(argv: list[str]) -> int:
    try:
        from ext_proc.tools import envoygen
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in GENERATOR_MODULES:
            raise
        print(
            f"envoy-config: the generator needs the optional 'envoy-config' dependencies "
            f"(no module named {missing!r}): pip install '{GENERATOR_EXTRA}'",
            file=sys.stderr,
        )
        return 2
    # Its own parser: options may come before or after the input file.
    return envoygen.main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["envoy-config"] and "--version" not in argv[1:]:
        return _envoy_config(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "check-config":
        return _check_config(args.file, connect=args.connect)
    from ext_proc.tools import check_envoy
    from ext_proc.tools.check_envoy.envoy_validate import find_envoy

    listeners = frozenset(args.listener) if args.listener else None
    declared = frozenset(args.declared_filter or ())
    validate = not args.no_envoy_validate
    envoy = find_envoy() if validate else None
    return check_envoy.main(
        args.file,
        args.namespace,
        listeners,
        declared,
        envoy,
        validate=validate,
        processor=args.processor_config,
    )


if __name__ == "__main__":
    sys.exit(main())
