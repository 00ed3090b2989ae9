"""The Helm chart's memory limit, from the memory model: ``resources.limits.memory`` in
values.yaml is ``memory.pod_limit`` of the chart's own ``config`` (its budget, body
limit and workers), with the comment that says so. deploy/kubernetes/deployment.yaml is
the chart's render (devstack/helm.py), so it follows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import yaml

from ext_proc.core import memory

REPO: Final = Path(__file__).resolve().parents[1]
VALUES: Final = REPO / "deploy" / "helm" / "ext-proc-token-policy" / "values.yaml"
# The comment above ``resources:`` and the limit's line under it (cpu comes first).
_BLOCK: Final = re.compile(
    r"(?m)^(?:#[^\n]*\n)*resources:\n(?P<requests>  requests:\n(?:    [^\n]*\n)+)"
    r"  limits:\n    cpu: (?P<cpu>[^\n]+)\n    memory: [^\n]+\n"
)


def limit(values: dict[str, Any]) -> int:
    """The memory limit, in bytes, of a pod of the chart with these values."""
    config = values["config"]
    workers = int(config.get("extra", {}).get("workers", 1))
    return memory.pod_limit(config["inflightBudgetBytes"], config["maxBodyBytes"], workers)


def updated(text: str) -> str:
    """values.yaml's ``text`` with its memory limit and the comment above it written."""
    mib = limit(yaml.safe_load(text)) // memory.MiB
    comment = (
        "# The memory limit is generated (`make generate`) from the memory model: "
        "memory.pod_limit\n# of config's inflightBudgetBytes, maxBodyBytes and workers "
        "(docs/operations.md#memory).\n# Raise it with any of them; lower it only with them.\n"
    )

    def block(match: re.Match[str]) -> str:
        return (
            f"{comment}resources:\n{match['requests']}  limits:\n"
            f"    cpu: {match['cpu']}\n    memory: {mib}Mi\n"
        )

    new, count = _BLOCK.subn(block, text)
    if count != 1:
        raise ValueError(f"{VALUES}: no resources block with requests and limits")
    return new


def files() -> dict[Path, str]:
    return {VALUES: updated(VALUES.read_text())}
