"""Synthetic wheels for the inventory's tests: a zip of Python files, built in tmp_path."""

from __future__ import annotations

import textwrap
import zipfile
from collections.abc import Mapping
from pathlib import Path

from devstack.inventory.pysource import Package


def wheel(path: Path, files: Mapping[str, str]) -> Path:
    """A wheel at ``path`` holding ``files`` (archive path -> source, dedented)."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, textwrap.dedent(text))
        archive.writestr("demo-1.0.dist-info/METADATA", "Name: demo\n")
    return path


def package(tmp_path: Path, files: Mapping[str, str]) -> Package:
    return Package.from_wheel(wheel(tmp_path / "demo-1.0-py3-none-any.whl", files))
