"""Which implementation runs each hot part: the compiled module the project's install
builds from its C source (``ext_proc/**/_*.c``, setup.py), or the pure-Python reference
beside it, which the differential tests compare it with. The two give the same answers;
the compiled one is faster. The reference runs where a module was not built (a source
checkout never installed) or where ``EXT_PROC_NATIVE`` asks for it: ``0`` runs every
part's reference, a comma-separated list of part names (``core._scan,edge._wire``) runs
those parts compiled and the others' reference, ``1`` or unset runs every part compiled.
A name that is not a part is an error, never ignored: a misspelt list would otherwise
measure or run something other than what it says. The server states at start which runs
(``implementations``)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Final

# Each compiled part, by its module's name under ext_proc (tests/core/test_native.py
# holds the list to the C sources).
PARTS: Final = ("core._scan", "core._ids", "core._shape", "edge._wire")
# Which parts run compiled: 0 none, 1 (or unset, or empty) all, else a comma-separated
# list of names from PARTS.
ENVIRONMENT: Final = "EXT_PROC_NATIVE"


def chosen() -> frozenset[str]:
    """The parts ``EXT_PROC_NATIVE`` asks to run compiled (whether built or not).

    Raises ValueError naming the valid parts where an entry of the list is not one."""
    return parse(os.environ.get(ENVIRONMENT))


def parse(value: str | None) -> frozenset[str]:
    """The parts an ``EXT_PROC_NATIVE`` value (None: unset) asks to run compiled."""
    value = (value or "").strip()
    if value in ("", "1"):
        return frozenset(PARTS)
    if value == "0":
        return frozenset()
    names = frozenset(name.strip() for name in value.split(","))
    unknown = sorted(names - set(PARTS))
    if unknown:
        raise ValueError(
            f"{ENVIRONMENT}={value!r}: {', '.join(map(repr, unknown))} not one of {PARTS} "
            "(or 0 for none, 1 for all)"
        )
    return names


def module(part: str) -> ModuleType | None:
    """The compiled module of ``part``, None where the reference runs instead."""
    if part not in PARTS:
        raise ValueError(f"{part!r} is not one of {PARTS}")
    if part not in chosen():
        return None
    try:
        return importlib.import_module(f"ext_proc.{part}")
    except ImportError:
        return None


def implementations() -> dict[str, str]:
    """Each part and what runs it: ``compiled`` or ``python``."""
    return {part: "compiled" if module(part) is not None else "python" for part in PARTS}
