"""The chart's memory limit is the memory model's (devstack/memory_limit.py): it follows
the chart's budget, body limit and workers, and only the limit's line and its comment
are written."""

from __future__ import annotations

import yaml

from devstack import memory_limit
from ext_proc.core import memory


def limit_of(text: str) -> int:
    memory_text = yaml.safe_load(text)["resources"]["limits"]["memory"]
    return int(memory_text.removesuffix("Mi")) * memory.MiB


def test_the_shipped_limit_is_the_models_for_the_shipped_values():
    values = yaml.safe_load(memory_limit.VALUES.read_text())
    config = values["config"]
    expected = memory.pod_limit(config["inflightBudgetBytes"], config["maxBodyBytes"])
    assert limit_of(memory_limit.VALUES.read_text()) == expected


def test_the_limit_follows_the_budget_the_body_limit_and_the_workers():
    text = memory_limit.VALUES.read_text()
    shipped = limit_of(memory_limit.updated(text))
    budget = yaml.safe_load(text)["config"]["inflightBudgetBytes"]
    larger = text.replace(
        f"inflightBudgetBytes: {budget}", f"inflightBudgetBytes: {budget + memory.LIMIT_STEP}"
    )
    assert limit_of(memory_limit.updated(larger)) == shipped + memory.LIMIT_STEP
    workers = text.replace("  extra: {}", "  extra: {workers: 2}")
    assert limit_of(memory_limit.updated(workers)) >= 2 * shipped - memory.LIMIT_STEP
    # Nothing else of the file changes.
    updated = memory_limit.updated(larger).splitlines()
    assert len(updated) == len(larger.splitlines())
    changed = [a for a, b in zip(updated, larger.splitlines(), strict=True) if a != b]
    assert all(line.startswith("    memory: ") for line in changed), changed
