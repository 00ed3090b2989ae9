"""``make run``: processor, Envoy and (unless both routes point elsewhere) the stand-in
upstream, in the foreground. Ctrl-C stops everything.

Environment: GATEWAY_PORT (8080), AGGREGATED_UPSTREAM / DISAGGREGATED_UPSTREAM
(host:port of real vLLM servers; default the stand-in), PROCESSOR_PORT (50051),
ENVOY_ADMIN_PORT (9901), STUB_PORT (8081), ENVOY_CONFIG (envoy/envoy.yaml; any
shipped variant, e.g. envoy/envoy-decompress.yaml).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ext_proc.devstack import envoy_config, processes
from ext_proc.devstack.envoy_config import Address

_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
_STRIPPED = json.dumps({**_CHAT, "kv_transfer_params": {"prompt_token_ids": [1, 2, 3], "x": 1}})
_DENIED = json.dumps({**_CHAT, "kv_transfer_params": {"prompt_token_ids": [1, True, -3]}})


def _examples(gateway: Address) -> str:
    return f"""\
gateway ready on http://{gateway}
  aggregated route (ids stripped):
    curl -s http://{gateway}/v1/chat/completions -H 'content-type: application/json' \\
      -d '{_STRIPPED}'
  disaggregated route (malformed ids denied):
    curl -s http://{gateway}/pd/v1/chat/completions -H 'content-type: application/json' \\
      -d '{_DENIED}'
Ctrl-C stops everything.
"""


def _env_port(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    if not value.isdigit():
        raise SystemExit(f"{name} must be a port number, got {value!r}")
    return int(value)


def run(processor_config: Path | None) -> int:
    gateway = Address("127.0.0.1", _env_port("GATEWAY_PORT", 8080))
    admin = Address("127.0.0.1", _env_port("ENVOY_ADMIN_PORT", 9901))
    processor = Address("127.0.0.1", _env_port("PROCESSOR_PORT", 50051))
    stub = Address("127.0.0.1", _env_port("STUB_PORT", 8081))
    aggregated = os.environ.get("AGGREGATED_UPSTREAM")
    disaggregated = os.environ.get("DISAGGREGATED_UPSTREAM")
    children: list[subprocess.Popen[bytes]] = []
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    # Nothing routes around a local stack: Ctrl-C need not wait out the drain window.
    os.environ.setdefault("EXT_PROC_DRAIN_SECONDS", "0")
    workdir = Path(tempfile.mkdtemp(prefix="ext_proc-stack-"))
    try:
        if aggregated is None or disaggregated is None:
            upstream = processes.start(
                [sys.executable, "-m", "ext_proc", "upstream", "--listen", str(stub)]
            )
            children.append(upstream)
            processes.wait_for_port(stub.port, upstream)
        serve = [sys.executable, "-m", "ext_proc", "serve", "--listen", str(processor)]
        if processor_config is not None:
            serve += ["--config", str(processor_config)]
        proc = processes.start(serve)
        children.append(proc)
        processes.wait_for_port(processor.port, proc)
        config = envoy_config.render(
            gateway=gateway,
            admin=admin,
            processor=processor,
            aggregated=Address.parse(aggregated) if aggregated else stub,
            disaggregated=Address.parse(disaggregated) if disaggregated else stub,
            source=Path(os.environ.get("ENVOY_CONFIG", envoy_config.SHIPPED)),
        )
        envoy_path = envoy_config.write(config, workdir / "envoy.yaml")
        envoy = processes.start(processes.envoy_args(envoy_path, base_id=admin.port))
        children.append(envoy)
        processes.wait_for_envoy(admin.port, envoy)
        print(_examples(gateway), flush=True)
        while not stopping:
            if any(child.poll() is not None for child in children):
                print("a stack process exited; stopping", file=sys.stderr)
                return 1
            time.sleep(0.2)
        return 0
    finally:
        for child in reversed(children):
            processes.stop(child)
