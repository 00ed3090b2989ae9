"""Smoke test of the benchmark harness: it runs end to end and reports every arrangement.

No speed is asserted: the numbers of a shared CI machine mean little. Selected with
``pytest -m bench``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"
KINDS = ("direct", "naive", "service")

# apt-get may have to install nginx and wrk first on a clean machine.
pytestmark = [pytest.mark.bench, pytest.mark.timeout(900)]


def test_smoke_run_reports_every_arrangement(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    results = json.loads((out / "results.json").read_text())
    kinds = {a["kind"] for a in results["arrangements"]}
    assert kinds == set(KINDS)
    # Exactly one arrangement is the shipped default, a service: the one the targets judge.
    (default,) = [a for a in results["arrangements"] if a["default"]]
    assert default["kind"] == "service"
    names = [a["name"] for a in results["arrangements"]]
    # Behind envoy/envoy.yaml (one message): the default and the floor; behind
    # envoy/envoy-two-message.yaml: naive and the service's two-message column.
    assert default["name"] == "service-w1"
    assert {"naive", "naive-1msg", "service-w1-2msg"} <= set(names)
    measured = {
        (c["body"], c["decision"], c["concurrency"], c["arrangement"]) for c in results["cells"]
    }
    cells = {key[:3] for key in measured}
    assert cells, "no cell measured"
    assert measured == {(*cell, name) for cell in cells for name in names}
    assert all(c["requests"] > 0 for c in results["cells"])
    # Every answer as the cell expects: 200, or the service's 400 for deny bodies.
    assert [c for c in results["cells"] if not c["ok"]] == []
    # Every target once, judged on the default; the smoke cells leave some unmeasured.
    summary = results["target_summary"]
    assert [t["target"] for t in summary] == [1, 2, 3, 4, 5]
    assert {t["arrangement"] for t in summary} == {default["name"]}
    statuses = {"met", "missed", "not measured", "undetermined"}
    assert {t["status"] for t in summary} <= statuses
    assert {t["arrangement"] for t in results["targets"]} == {default["name"]}

    markdown = (out / "results.md").read_text()
    for name in names:
        assert f"| {name} |" in markdown
    headings = (
        "## Targets",
        "## Proof verification",
        "## Strict bodies",
        "## Added p50 latency per MiB of body",
    )
    for heading in (*headings, "## All cells"):
        assert heading in markdown

    for png in ("latency_vs_body.png", "throughput_vs_concurrency.png"):
        assert (out / png).read_bytes().startswith(PNG)
