"""The case table the conformance tier prints at the end of its run, and writes as JSON
to ``$EXT_PROC_CONFORMANCE_RESULTS`` when that is set (``matrix.py`` reads it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

OUTPUT_VARIABLE = "EXT_PROC_CONFORMANCE_RESULTS"

RESULTS: dict[tuple[str, str], str] = {}


def record(case: str, column: str, value: object) -> None:
    RESULTS[(case, column)] = str(value)


def table() -> str:
    columns = list(dict.fromkeys(column for _, column in RESULTS))
    cases = list(dict.fromkeys(case for case, _ in RESULTS))
    lines = ["| case | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for case in cases:
        cells = [RESULTS.get((case, column), "") for column in columns]
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write() -> Path | None:
    """The recorded cells as ``[[case, column, value], ...]`` to the file named by
    ``$EXT_PROC_CONFORMANCE_RESULTS``, if set; returns the file."""
    target = os.environ.get(OUTPUT_VARIABLE)
    if not target:
        return None
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    cells = [[case, column, value] for (case, column), value in RESULTS.items()]
    path.write_text(json.dumps(cells, indent=1) + "\n")
    return path
