"""``make run`` (python -m devstack) end to end: the README's two requests, Ctrl-C, cleanup."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from devstack import processes
from tests.test_devstack import REPO, VARIABLES, free_ports

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def start(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    base = {k: v for k, v in os.environ.items() if k not in VARIABLES and "UPSTREAM" not in k}
    # Its temporary folder lands in tmp_path, where the test looks for leftovers.
    return processes.start(
        [sys.executable, "-m", "devstack", *args],
        tmp_path / "make-run.log",
        cwd=REPO,
        env={**base, **env, "TMPDIR": str(tmp_path)},
    )


def leftovers(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("ext_proc-stack-*"))


def test_make_run_serves_both_routes_and_cleans_up_on_ctrl_c(tmp_path):
    ports = free_ports()
    run = start(tmp_path, ports)
    try:
        gateway = f"http://127.0.0.1:{ports['GATEWAY_PORT']}"
        log = tmp_path / "make-run.log"
        deadline = time.monotonic() + 60
        while "gateway ready" not in log.read_text():
            assert run.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert len(leftovers(tmp_path)) == 1
        stripped = {**CHAT, "kv_transfer_params": {"prompt_token_ids": [1, 2, 3], "x": 1}}
        denied = {**CHAT, "kv_transfer_params": {"prompt_token_ids": [1, True, -3]}}
        with httpx.Client(timeout=20) as client:
            reply = client.post(gateway + "/v1/chat/completions", json=stripped)
            assert reply.status_code == 200
            received = json.loads(reply.json()["stub_received"]["body"])
            assert received["kv_transfer_params"] == {"x": 1}
            reply = client.post(gateway + "/pd/v1/chat/completions", json=denied)
            assert reply.status_code == 400
            metrics = client.get(f"http://127.0.0.1:{ports['METRICS_PORT']}/metrics")
            assert metrics.status_code == 200
        os.kill(run.pid, signal.SIGINT)
        assert run.wait(timeout=30) == 0
    finally:
        processes.stop(run)
    assert "Traceback" not in (tmp_path / "make-run.log").read_text()
    assert leftovers(tmp_path) == []
    for name, port in ports.items():
        assert processes.port_is_free(int(port)), f"{name} {port} still bound"


def test_a_child_dying_at_start_up_gives_one_line(tmp_path):
    bad = tmp_path / "processor.yaml"
    bad.write_text(yaml.safe_dump({"max_body_bytes": -1}))
    run = start(tmp_path, free_ports(), "--config", str(bad))
    try:
        assert run.wait(timeout=60) == 1
    finally:
        processes.stop(run)
    output = (tmp_path / "make-run.log").read_text()
    assert "Traceback" not in output
    (line,) = [line for line in output.splitlines() if line.startswith("make run:")]
    assert re.fullmatch(
        r"make run: python\S* -m ext_proc serve exited with status 2 while starting; "
        r"its output is above",
        line,
    ), line
    assert leftovers(tmp_path) == []
