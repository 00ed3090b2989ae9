"""The external programs the harness drives, installed from Debian's packages if missing.

CI runs on a clean machine, so the harness installs what it needs itself (as root, with
apt-get) instead of assuming a prepared host.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

# command -> Debian package providing it
SYSTEM_TOOLS = {"nginx": "nginx", "wrk": "wrk"}
# The record of spent proofs shared through Redis (the `-redis` arrangements).
REDIS_TOOLS = {"redis-server": "redis-server"}
_SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"])


class ToolError(RuntimeError):
    pass


def which(command: str) -> str | None:
    return shutil.which(command, path=_SEARCH)


def ensure_system_tools() -> dict[str, str]:
    """Absolute paths of nginx and wrk, installing their packages first if needed."""
    return ensure_tools(SYSTEM_TOOLS)


def ensure_tools(tools: dict[str, str]) -> dict[str, str]:
    """Absolute paths of ``tools`` (command -> Debian package), installing the packages
    of those missing first (as root, with apt-get; otherwise ``ToolError`` says what to
    run)."""
    missing = sorted({tools[c] for c in tools if which(c) is None})
    if missing:
        _apt_install(missing)
    found = {command: which(command) for command in tools}
    absent = [command for command, path in found.items() if path is None]
    if absent:
        raise ToolError(f"still missing after apt-get install: {', '.join(absent)}")
    return {command: path for command, path in found.items() if path is not None}


def _apt_install(packages: list[str]) -> None:
    apt = which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise ToolError(
            f"missing {', '.join(packages)}: run `apt-get install -y {' '.join(packages)}` "
            "as root (the harness installs them itself only when it runs as root)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print(f"installing {', '.join(packages)} with apt-get", file=sys.stderr, flush=True)
    subprocess.run([apt, "update", "-qq"], check=True, env=env)
    subprocess.run(
        [apt, "install", "-y", "-qq", "--no-install-recommends", *packages],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )


def libfaketime(offset: str) -> dict[str, str]:
    """The environment that sets a process's clock ``offset`` from the real one
    (libfaketime's ``FAKETIME``, e.g. ``-10s``), its package installed first if needed:
    the package of the ``faketime`` command brings the library."""
    ensure_tools({"faketime": "faketime"})
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    found += sorted(Path("/usr/lib/faketime").glob("libfaketime.so.1"))
    if not found:
        raise ToolError("libfaketime.so.1 not found under /usr/lib after installing faketime")
    return {"LD_PRELOAD": str(found[0]), "FAKETIME": offset}


def py_spy() -> str:
    """py-spy from the project's virtual environment (a dev dependency) or PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else which("py-spy")
    if found is None:
        raise ToolError(f"py-spy not found: {sys.executable} -m pip install py-spy")
    return found


def version(args: list[str]) -> str:
    """First line a program prints about its version (some print it on stderr)."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    except OSError as exc:
        return f"unknown ({exc})"
    lines = (done.stdout + done.stderr).strip().splitlines()
    if not lines:
        return "unknown"
    # A program that names itself by the path it was run from (envoy) is named by its
    # file name: a report says which version ran, not where this machine keeps it.
    return lines[0].strip().replace(args[0], Path(args[0]).name)


def cpu_model() -> str | None:
    """The processor's model name, as the kernel reports it."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in info.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "model name":
            return value.strip()
    return None


def commit(root: Path) -> str | None:
    """The checkout measured: ``git describe --always --dirty`` (None outside git)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty"],  # noqa: S607
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return None
    return done.stdout.strip() or None


# The Python packages the processor's speed depends on.
PACKAGES = ("grpcio", "protobuf", "orjson", "numpy", "blake3", "stringzilla", "prometheus-client")


def packages() -> tuple[str, ...]:
    """``name version`` of each of ``PACKAGES`` installed here."""
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return tuple(found)


def serve_options() -> frozenset[str]:
    """The long options ``python -m ext_proc serve`` has (``--workers`` came later)."""
    done = subprocess.run(
        [sys.executable, "-m", "ext_proc", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise ToolError(f"python -m ext_proc serve --help failed: {done.stderr}")
    return frozenset(re.findall(r"(?<![\w-])--[a-z][a-z-]*", done.stdout))
