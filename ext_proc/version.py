"""The package's version, read from its installed metadata: pyproject.toml's ``version``
is the one place it is stated (a checkout installed with ``pip install -e`` has the same
metadata)."""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
from typing import Final

DISTRIBUTION: Final = "ext-proc-token-policy"


@functools.cache
def version() -> str:
    """The installed distribution's version (read once per process)."""
    return importlib.metadata.version(DISTRIBUTION)


def add_argument(parser: argparse.ArgumentParser) -> None:
    """``--version`` on ``parser``: prints its program's name and the version, exits 0."""
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {version()}", help="print the version"
    )
