"""``make run``: processor, Envoy and (unless both routes point elsewhere) the stand-in
upstream, in the foreground. Ctrl-C stops everything.

Environment: GATEWAY_PORT (8080), AGGREGATED_UPSTREAM / DISAGGREGATED_UPSTREAM /
PREFILL_UPSTREAM (host:port of real vLLM servers for the aggregated route, the decode
leg and the prefill leg of the P/D hand-off; default the stand-in), COORDINATOR_UPSTREAM
(host:port of llm-d's coordinator, for ENVOY_CONFIG=envoy/envoy-coordinator.yaml),
PROCESSOR_PORT (50051), METRICS_PORT (9464, the processor's Prometheus endpoint),
ENVOY_ADMIN_PORT (9901), STUB_PORT (8081), ENVOY_CONFIG (envoy/envoy.yaml; any shipped
variant, e.g. envoy/envoy-decompress.yaml), EXT_PROC_PROOF (the processor's signing
keys, as YAML; without it, and without ``proof`` in --config, a throwaway key is
generated for the run).

Every port is checked before anything starts: a port in use, or a child that dies while
starting, ends the run with one line on stderr naming what to change.

SIGHUP restarts Envoy by hot restart (``kill -HUP <pid of make run>``): a new Envoy at
the next restart epoch takes over the listeners and the previous one drains its
connections and exits, so no request in flight is cut off. A plain restart would reset
requests the upstream already received, which a client that retries runs twice.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

import yaml

from devstack import envoy_config, processes
from ext_proc.core.address import HostPort
from ext_proc.core.config import Config, ConfigError
from ext_proc.tools import preflight

PROG = "make run"
_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
_STRIPPED = json.dumps({**_CHAT, "kv_transfer_params": {"prompt_token_ids": [1, 2, 3], "x": 1}})
_PREFILL = json.dumps({**_CHAT, "max_tokens": 1, "return_token_ids": True})
# The decode request: the same chat with the prefill response's kv_transfer_params,
# copied verbatim as an orchestrator does; a few tokens, so that it stays short on a real
# CPU pair too. (JSON of strings and integers is a Python literal too; double quotes keep
# the shell quoting plain.)
DECODE_CHAT = {**_CHAT, "max_tokens": 16}
_DECODE = (
    f"import json, sys; chat = {json.dumps(DECODE_CHAT)}; "
    'chat["kv_transfer_params"] = json.load(sys.stdin)["kv_transfer_params"]; '
    "print(json.dumps(chat))"
)
_SHOW = 'import json, sys; print(json.dumps(json.load(sys.stdin)["kv_transfer_params"]))'
PROOF_VARIABLE = "EXT_PROC_PROOF"
THROWAWAY_KEY_ID = "throwaway"
THROWAWAY_NOTICE = (
    f"{PROG}: no signing key configured; generated a throwaway key for this run ({PROOF_VARIABLE})"
)


# Upstreams of clusters that only some configs have: each variable and its cluster.
OTHER_UPSTREAMS: Final = {"COORDINATOR_UPSTREAM": "coordinator"}


class StackError(Exception):
    """A reason not to run, stated in one line for the person at the terminal."""


def handoff_lines(gateway: HostPort) -> list[str]:
    """The prefill/decode hand-off as shell lines to paste: the prefill leg, the minted
    parameters shown, the decode request built from them, the decode leg."""
    json_header = "-H 'content-type: application/json'"
    return [
        f"prefill=$(curl -s http://{gateway}/pd/prefill/v1/chat/completions {json_header} "
        f"-d {shlex.quote(_PREFILL)})",
        f'echo "$prefill" | python3 -c {shlex.quote(_SHOW)}',
        f'decode=$(echo "$prefill" | python3 -c {shlex.quote(_DECODE)})',
        f'curl -s http://{gateway}/pd/v1/chat/completions {json_header} -d "$decode"',
    ]


def _examples(gateway: HostPort, metrics: HostPort) -> str:
    handoff = "".join(f"    {line}\n" for line in handoff_lines(gateway))
    return f"""\
gateway ready on http://{gateway} (processor metrics: http://{metrics}/metrics)
  a client's own parameters (removed on every route):
    curl -s http://{gateway}/v1/chat/completions -H 'content-type: application/json' \\
      -d '{_STRIPPED}'
  prefill/decode hand-off (ids signed on the prefill leg, honored on the decode leg):
{handoff}Ctrl-C stops everything.
"""


def _env_port(name: str, default: int) -> HostPort:
    value = os.environ.get(name, str(default))
    try:
        return HostPort.parse(f"{processes.LOCAL}:{value}")
    except ValueError:
        raise StackError(f"{name} must be a port number in 1..65535, got {value!r}") from None


def _env_upstream(name: str) -> HostPort | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return HostPort.parse(value)
    except ValueError as exc:
        raise StackError(f"{name}: {exc}") from None


def check_ports(ports: dict[str, HostPort]) -> None:
    """Every port (by the variable that sets it) distinct and free to bind."""
    owners: dict[int, str] = {}
    for variable, address in ports.items():
        other = owners.setdefault(address.port, variable)
        if other != variable:
            raise StackError(
                f"{other} and {variable} are both {address.port}; set {variable} to another port"
            )
        if not processes.port_is_free(address.port, address.host):
            raise StackError(
                f"port {address.port} ({variable}) is in use; set {variable} to a free port"
            )


@dataclass(frozen=True)
class Plan:
    """What one run binds and starts, read from the environment and checked."""

    ports: dict[str, HostPort]  # by the variable that sets each
    envoy: dict[str, Any]  # the rendered Envoy configuration
    processor_config: Path | None
    stub: bool  # whether the stand-in upstream runs
    throwaway_key: bool  # whether the run generates its own signing key

    def port(self, variable: str) -> HostPort:
        return self.ports[variable]


def plan(processor_config: Path | None) -> Plan:
    """Everything a run needs, each setting checked and every port free, or StackError."""
    ports = {
        "GATEWAY_PORT": _env_port("GATEWAY_PORT", 8080),
        "ENVOY_ADMIN_PORT": _env_port("ENVOY_ADMIN_PORT", 9901),
        "PROCESSOR_PORT": _env_port("PROCESSOR_PORT", 50051),
        "METRICS_PORT": _env_port("METRICS_PORT", 9464),
    }
    aggregated = _env_upstream("AGGREGATED_UPSTREAM")
    disaggregated = _env_upstream("DISAGGREGATED_UPSTREAM")
    prefill = _env_upstream("PREFILL_UPSTREAM")
    # Upstreams of clusters only some configs have, by the cluster each names.
    others = {
        cluster: address
        for variable, cluster in OTHER_UPSTREAMS.items()
        if (address := _env_upstream(variable)) is not None
    }
    stub = _env_port("STUB_PORT", 8081)
    if aggregated is None or disaggregated is None or prefill is None:
        ports["STUB_PORT"] = stub
    source = Path(os.environ.get("ENVOY_CONFIG", envoy_config.SHIPPED))
    if not source.is_file():
        raise StackError(f"ENVOY_CONFIG: no file {source}")
    if processor_config is not None and not processor_config.is_file():
        raise StackError(f"--config: no file {processor_config}")
    _check_routes(source, processor_config)
    try:
        processes.envoy_binary()
    except FileNotFoundError as exc:
        raise StackError(str(exc)) from None
    check_ports(ports)
    try:
        envoy = envoy_config.render(
            gateway=ports["GATEWAY_PORT"],
            admin=ports["ENVOY_ADMIN_PORT"],
            processor=ports["PROCESSOR_PORT"],
            aggregated=aggregated or stub,
            disaggregated=disaggregated or stub,
            prefill=prefill or stub,
            source=source,
            others=others,
        )
    except envoy_config.MissingCluster as exc:
        (variable,) = [v for v, cluster in OTHER_UPSTREAMS.items() if cluster == exc.name]
        raise StackError(
            f"{variable} is set but ENVOY_CONFIG {_shown(source)} has no cluster "
            f"{exc.name!r}; unset {variable} or set ENVOY_CONFIG to a config with that "
            "cluster (envoy/envoy-coordinator.yaml)"
        ) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise StackError(
            f"ENVOY_CONFIG {_shown(source)} is not laid out as the shipped configs are "
            f"(admin, one listener, static clusters ext_proc and the upstreams): "
            f"{type(exc).__name__} {exc}"
        ) from None
    throwaway = PROOF_VARIABLE not in os.environ and not _configures_proof(processor_config)
    return Plan(ports, envoy, processor_config, stub="STUB_PORT" in ports, throwaway_key=throwaway)


def _check_routes(source: Path, processor_config: Path | None) -> None:
    """The processor's own check of the routes it will serve (it runs it again at its
    start), made before anything starts so that the line names ENVOY_CONFIG's file."""
    try:
        namespace = Config.load(processor_config).route_metadata_namespace
    except ConfigError:
        return  # the processor says why; it does not serve
    try:
        preflight.routes(source, namespace)
    except ConfigError as exc:
        raise StackError(f"ENVOY_CONFIG {exc}") from None


def _shown(path: Path) -> str:
    """``path`` relative to the checkout when it lies inside it, else as given."""
    inside = path.resolve().is_relative_to(envoy_config.REPO)
    return str(path.resolve().relative_to(envoy_config.REPO)) if inside else str(path)


def _configures_proof(processor_config: Path | None) -> bool:
    """Whether the --config file sets signing keys (an unreadable one fails in the
    processor, which names the problem)."""
    if processor_config is None:
        return False
    try:
        document = yaml.safe_load(processor_config.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(document, dict) and "proof" in document


def throwaway_proof(workdir: Path) -> str:
    """A fresh signing key in ``workdir`` (owner-only), as the EXT_PROC_PROOF value
    naming it. 32 random bytes, hex-encoded: the processor strips whitespace around a
    key file's content, which could shorten raw bytes below the 32 it requires."""
    path = workdir / "proof.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as key:
        key.write(secrets.token_hex(32))
    # JSON is YAML: the path needs no quoting rules of its own.
    return json.dumps({"keys": [{"id": THROWAWAY_KEY_ID, "file": str(path)}]})


def run(processor_config: Path | None) -> int:
    try:
        return _run(plan(processor_config))
    except StackError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr, flush=True)
        return 1


@dataclass
class _Asked:
    """What the run's signals asked for."""

    stopping: bool = False  # SIGINT, SIGTERM
    restarts: int = 0  # hot restarts of Envoy (SIGHUP)

    def stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def restart(self, signum: int, frame: object) -> None:
        self.restarts += 1


def _run(plan: Plan) -> int:
    children: list[subprocess.Popen[bytes]] = []
    asked = _Asked()
    signal.signal(signal.SIGINT, asked.stop)
    signal.signal(signal.SIGTERM, asked.stop)
    signal.signal(signal.SIGHUP, asked.restart)
    # Nothing routes around a local stack: Ctrl-C need not wait out the drain window.
    os.environ.setdefault("EXT_PROC_DRAIN_SECONDS", "0")
    with tempfile.TemporaryDirectory(prefix="ext_proc-stack-") as workdir:
        if plan.throwaway_key:
            os.environ[PROOF_VARIABLE] = throwaway_proof(Path(workdir))
            print(THROWAWAY_NOTICE, flush=True)
        try:
            for args, cwd, ready in _commands(plan, Path(workdir)):
                children.append(child := processes.start(args, cwd=cwd))
                with _starting():
                    ready(child)
            # Everything serves: the processor's record began before now.
            _until_proofs_are_honored(plan, time.time())
            if not asked.stopping:
                print(_examples(plan.port("GATEWAY_PORT"), plan.port("METRICS_PORT")), flush=True)
            _watch(plan, Path(workdir), children, asked)
            return 0
        finally:
            for child in reversed(children):
                processes.stop(child)


def _watch(
    plan: Plan, workdir: Path, children: list[subprocess.Popen[bytes]], asked: _Asked
) -> None:
    """Until a stop is asked: a child that exits ends the run, and each hot restart
    asked replaces Envoy (the last child) with one at the next restart epoch."""
    draining: list[subprocess.Popen[bytes]] = []  # Envoys a hot restart took over from
    epoch = 0
    try:
        while not asked.stopping:
            while epoch < asked.restarts:
                epoch += 1
                draining.append(children[-1])
                children[-1] = _hot_restart(plan, workdir, epoch)
            draining = [old for old in draining if old.poll() is None]
            for child in children:
                if child.poll() is not None:
                    raise StackError(
                        f"{processes.describe(child)} exited with status "
                        f"{child.returncode}; stopping"
                    )
            time.sleep(0.2)
    finally:
        for old in draining:
            processes.stop(old)


def _hot_restart(plan: Plan, workdir: Path, epoch: int) -> subprocess.Popen[bytes]:
    """Envoy at restart ``epoch`` on the run's config, once ready: it took over the
    listeners, and the one before drains its connections and exits by itself."""
    admin = plan.port("ENVOY_ADMIN_PORT")
    args = processes.envoy_args(workdir / "envoy.yaml", admin.port, epoch)
    envoy = processes.start(args)
    with _starting():
        processes.wait_for_envoy(admin.port, envoy)
    print(
        f"{PROG}: Envoy hot-restarted (restart epoch {epoch}); the previous one drains "
        f"its connections for {processes.HOT_RESTART_DRAIN_SECONDS} s and exits",
        flush=True,
    )
    return envoy


Ready = Callable[[subprocess.Popen[bytes]], None]


def _until_proofs_are_honored(plan: Plan, serving: float) -> None:
    """Ready means every route works, the hand-off included: the processor's record of
    spent proofs honors only proofs minted a skew after it began (ext_proc/edge/record.py),
    so the run waits that out before it says the stack is up."""
    try:
        skew = Config.load(plan.processor_config).proof.clock_skew_seconds
    except ConfigError:
        return  # the processor said why; it does not serve
    time.sleep(max(0.0, math.ceil(serving) + skew + 1 - time.time()))


def _commands(plan: Plan, workdir: Path) -> Iterator[tuple[list[str], Path | None, Ready]]:
    """In order: each child's command line, working folder and readiness check."""
    if plan.stub:
        stub = plan.port("STUB_PORT")
        yield (
            processes.stand_in_args(stub),
            envoy_config.REPO,
            partial(processes.wait_for_port, stub.port),
        )
    processor = plan.port("PROCESSOR_PORT")
    path = envoy_config.write(plan.envoy, workdir / "envoy.yaml")
    serve = [sys.executable, "-m", "ext_proc", "serve", "--listen", str(processor)]
    serve += ["--metrics-listen", str(plan.port("METRICS_PORT")), "--envoy-config", str(path)]
    if plan.processor_config is not None:
        serve += ["--config", str(plan.processor_config)]
    yield serve, None, partial(processes.wait_for_port, processor.port)
    admin = plan.port("ENVOY_ADMIN_PORT")
    yield (
        processes.envoy_args(path, admin.port, restart_epoch=0),
        None,
        partial(processes.wait_for_envoy, admin.port),
    )


@contextlib.contextmanager
def _starting() -> Iterator[None]:
    """A readiness check whose failure becomes one line."""
    try:
        yield
    except processes.ChildExited as exc:
        raise StackError(f"{exc} while starting; its output is above") from None
    except TimeoutError as exc:
        raise StackError(str(exc)) from None
