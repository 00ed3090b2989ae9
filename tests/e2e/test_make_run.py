"""``make run`` (python -m devstack) end to end: the printed requests, the P/D hand-off
pasted as printed, the throwaway signing key, Ctrl-C, cleanup."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from devstack import processes, stack, tokens
from tests.test_devstack import REPO, VARIABLES, free_ports

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def start(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in VARIABLES and "UPSTREAM" not in k and k != stack.PROOF_VARIABLE
    }
    # Its temporary folder lands in tmp_path, where the test looks for leftovers.
    return processes.start(
        [sys.executable, "-m", "devstack", *args],
        tmp_path / "make-run.log",
        cwd=REPO,
        env={**base, **env, "TMPDIR": str(tmp_path)},
    )


def leftovers(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("ext_proc-stack-*"))


def handoff_script(output: str) -> str:
    """The hand-off lines exactly as printed, as one shell script."""
    lines = output.splitlines()
    first = next(i for i, line in enumerate(lines) if "prefill/decode hand-off" in line)
    script = [line.strip() for line in lines[first + 1 : first + 5]]
    assert lines[first + 5] == "Ctrl-C stops everything.", output
    return "set -e\n" + "\n".join(script) + "\n"


def pasted_handoff(output: str, timeout: float = 60) -> tuple[str, str]:
    """The hand-off pasted into a shell as printed: the minted parameters it shows and
    the decode leg's reply (it must exit 0)."""
    pasted = subprocess.run(
        ["bash", "-c", handoff_script(output)],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    assert pasted.returncode == 0, pasted.stderr
    shown, decoded = pasted.stdout.splitlines()
    return shown, decoded


def wait_ready(run: subprocess.Popen[bytes], log: Path) -> None:
    """Until make run prints that the stack is up (it fails if the run ends first)."""
    deadline = time.monotonic() + 60
    while "Ctrl-C stops everything." not in log.read_text():
        assert run.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


def test_make_run_serves_the_routes_and_the_hand_off_and_cleans_up_on_ctrl_c(tmp_path):
    ports = free_ports()
    run = start(tmp_path, ports)
    log = tmp_path / "make-run.log"
    try:
        gateway = f"http://127.0.0.1:{ports['GATEWAY_PORT']}"
        wait_ready(run, log)
        (folder,) = leftovers(tmp_path)
        output = log.read_text()
        assert output.count(stack.THROWAWAY_NOTICE + "\n") == 1
        key = folder / "proof.key"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert key.read_text() not in output
        stripped = {**CHAT, "kv_transfer_params": {"prompt_token_ids": [1, 2, 3], "x": 1}}
        with httpx.Client(timeout=20) as client:
            reply = client.post(gateway + "/v1/chat/completions", json=stripped)
            assert reply.status_code == 200
            received = json.loads(reply.json()["stub_received"]["body"])
            assert received == CHAT
            metrics = client.get(f"http://127.0.0.1:{ports['METRICS_PORT']}/metrics")
            assert metrics.status_code == 200
        shown, decoded = pasted_handoff(output)
        params = json.loads(shown)
        # The route wrote the connector request: the stand-in answered as NIXL does.
        assert set(params) == {*tokens.CONNECTOR_REPLY, "prompt_token_ids", "token_policy_proof"}
        assert params["token_policy_proof"].startswith(f"tp4.{stack.THROWAWAY_KEY_ID}.")
        # The decode leg reached the stand-in as sent: the signed parameters (the
        # connector's and the ids) with their proof.
        decode = json.loads(json.loads(decoded)["stub_received"]["body"])
        assert decode == {**stack.DECODE_CHAT, "kv_transfer_params": params}
        os.kill(run.pid, signal.SIGINT)
        assert run.wait(timeout=30) == 0
    finally:
        processes.stop(run)
    assert "Traceback" not in log.read_text()
    assert leftovers(tmp_path) == []
    for name, port in ports.items():
        assert processes.port_is_free(int(port)), f"{name} {port} still bound"


def test_a_configured_key_is_used_and_none_generated(tmp_path):
    secret = tmp_path / "k"
    secret.write_text("s" * 32)
    proof = json.dumps({"keys": [{"id": "mine", "file": str(secret)}]})
    ports = free_ports()
    run = start(tmp_path, {**ports, stack.PROOF_VARIABLE: proof})
    log = tmp_path / "make-run.log"
    try:
        wait_ready(run, log)
        (folder,) = leftovers(tmp_path)
        assert not (folder / "proof.key").exists()
        assert stack.THROWAWAY_NOTICE not in log.read_text()
        body = {**CHAT, "max_tokens": 1, "return_token_ids": True}
        gateway = f"http://127.0.0.1:{ports['GATEWAY_PORT']}"
        reply = httpx.post(gateway + "/pd/prefill/v1/chat/completions", json=body, timeout=20)
        assert reply.status_code == 200
        assert reply.json()["kv_transfer_params"]["token_policy_proof"].startswith("tp4.mine.")
        os.kill(run.pid, signal.SIGINT)
        assert run.wait(timeout=30) == 0
    finally:
        processes.stop(run)


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
    # Besides the notice of the throwaway key (standard output), one line.
    lines = output.splitlines()
    assert lines.count(stack.THROWAWAY_NOTICE) == 1
    (line,) = [x for x in lines if x.startswith("make run:") and x != stack.THROWAWAY_NOTICE]
    assert re.fullmatch(
        r"make run: python\S* -m ext_proc serve exited with status 2 while starting; "
        r"its output is above",
        line,
    ), line
    assert leftovers(tmp_path) == []
