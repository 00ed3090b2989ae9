"""The case table the conformance tier prints at the end of its run."""

from __future__ import annotations

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
