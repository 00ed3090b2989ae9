"""Which implementation runs each hot part: the compiled module the project's install
builds from its C source (``ext_proc/**/_*.c``, setup.py), or the pure-Python reference
beside it, which the differential tests compare it with. The two give the same answers;
the compiled one is faster. The reference runs where a module was not built (a source
checkout never installed) or when ``EXT_PROC_NATIVE=0`` asks for it; the server states
at start which runs (``implementations``)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Final

# Each compiled part, by its module's name under ext_proc (tests/core/test_native.py
# holds the list to the C sources).
PARTS: Final = ("core._scan", "core._ids", "core._shape", "edge._wire")
# Set to 0 to run the pure-Python reference of every part.
ENVIRONMENT: Final = "EXT_PROC_NATIVE"


def module(part: str) -> ModuleType | None:
    """The compiled module of ``part``, None where the reference runs instead."""
    if part not in PARTS:
        raise ValueError(f"{part!r} is not one of {PARTS}")
    if os.environ.get(ENVIRONMENT, "1") == "0":
        return None
    try:
        return importlib.import_module(f"ext_proc.{part}")
    except ImportError:
        return None


def implementations() -> dict[str, str]:
    """Each part and what runs it: ``compiled`` or ``python``."""
    return {part: "compiled" if module(part) is not None else "python" for part in PARTS}
