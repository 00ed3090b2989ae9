"""The real stack for end-to-end tests: Envoy binary, processor process, stub upstream."""

from __future__ import annotations

import base64
import json
import math
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench import stack as bench_stack
from devstack import envoy_config, processes
from ext_proc.core.address import HostPort
from ext_proc.tools import envoygen

LOCAL = "127.0.0.1"
BODY_LIMIT = 16 * 1024 * 1024  # the shipped routes' request_body_buffer_limit


@dataclass
class Received:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    raw: bytes
    protocol: str

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name]


def route(name: str, prefix: str, policy: dict[str, Any], rewrite: str = "/v1/") -> dict[str, Any]:
    """A test route to the aggregated cluster, ``prefix`` rewritten to ``rewrite``; its
    policy metadata states that rewrite (``envoygen.state_rewrite``)."""
    entry = {
        "name": name,
        "match": {"prefix": prefix},
        "route": {"cluster": "aggregated", "prefix_rewrite": rewrite},
        "metadata": {"filter_metadata": {"ext_proc.token_policy": dict(policy)}},
        "request_body_buffer_limit": BODY_LIMIT,
    }
    envoygen.state_rewrite(entry)
    return entry


def extra_routes() -> list[dict[str, Any]]:
    """Test-only routes placed before the shipped routes, each stating its rewrite in
    its policy metadata as the generator's routes do (``envoygen.state_rewrite``)."""
    routes = _extra_routes()
    for entry in routes:
        envoygen.state_rewrite(entry)
    return routes


def _extra_routes() -> list[dict[str, Any]]:
    # route() states its own rewrite; the routes written out here are stated above.
    return [
        route("deny", "/deny/v1/", {"topology": "aggregated", "action": "deny"}),
        # Honor routes that trust any caller (docs/trust.md), so a client's ids are
        # validated and honored as they are for proven or peer-sent ones.
        route("trusted", "/trusted/v1/", {"topology": "disaggregated", "trust_any_caller": True}),
        route(
            "vocab",
            "/vocab/v1/",
            {"topology": "disaggregated", "vocab_size": 1000, "trust_any_caller": True},
        ),
        # Stripping only the policed keys, the client's other keys kept in place.
        route("keep", "/keep/v1/", {"action": "strip", "keep_other_keys": True}),
        # Forwarding only what the engine declares (strict_body), served at the root as
        # SGLang serves its native endpoints.
        route("strict-sglang", "/strict-sglang/", {"strict_body": "sglang 0.5.23"}, "/"),
        route(
            "strict-sglang-deny",
            "/strict-sglang-deny/",
            {"action": "deny", "strict_body": "sglang 0.5.23"},
            "/",
        ),
        route("strict-vllm", "/strict-vllm/v1/", {"strict_body": "vllm 0.32.0"}),
        route("bad-action", "/bad-action/v1/", {"action": "allow"}),
        route("bad-field", "/bad-field/v1/", {"topolgy": "aggregated"}),
        route("bad-type", "/bad-type/v1/", {"max_ids": {"n": 1}}),
        route(
            "audit",
            "/audit/v1/",
            {
                "topology": "disaggregated",
                "vocab_size": 10,
                "audit": True,
                "trust_any_caller": True,
            },
        ),
        {
            "name": "h2-upstream",
            "match": {"prefix": "/h2up/v1/"},
            "route": {"cluster": "upstream_h2", "prefix_rewrite": "/v1/"},
            "request_body_buffer_limit": BODY_LIMIT,
            "metadata": {"filter_metadata": {"ext_proc.token_policy": {"action": "strip"}}},
        },
        {
            # The body mode chosen per route, whatever the filter's default.
            "name": "duplex-route",
            "match": {"prefix": "/duplex/v1/"},
            "request_body_buffer_limit": BODY_LIMIT,
            "route": {"cluster": "aggregated", "prefix_rewrite": "/v1/"},
            "metadata": {"filter_metadata": {"ext_proc.token_policy": {"action": "strip"}}},
            "typed_per_filter_config": {
                "envoy.filters.http.ext_proc": {
                    "@type": "type.googleapis.com/"
                    "envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
                    "overrides": {
                        "processing_mode": {
                            "request_header_mode": "SEND",
                            "request_body_mode": "FULL_DUPLEX_STREAMED",
                            "request_trailer_mode": "SEND",
                            "response_header_mode": "SKIP",
                        }
                    },
                }
            },
        },
        {
            "name": "no-metadata",
            "match": {"prefix": "/plain/v1/"},
            "route": {"cluster": "aggregated", "prefix_rewrite": "/v1/"},
            "request_body_buffer_limit": BODY_LIMIT,
        },
    ]


def add_routes(routes: list[dict[str, Any]], added: list[dict[str, Any]]) -> None:
    """``added`` before the shipped forwarding routes, after the shipped token endpoint
    404s (direct responses), which stay first as in every shipped config."""
    first = next((i for i, r in enumerate(routes) if "direct_response" not in r), len(routes))
    routes[first:first] = added


def start_stand_in(address: HostPort, log: Path) -> subprocess.Popen[bytes]:
    """The recording stand-in upstream on ``address``, once it listens (stopped again
    when it does not)."""
    child = processes.start(processes.stand_in_args(address), log, cwd=envoy_config.REPO)
    try:
        processes.wait_for_port(address.port, child)
    except BaseException:
        processes.stop(child)
        raise
    return child


def new_key() -> bytes:
    """A signing key: 32 random bytes, hex-encoded (a key file's surrounding whitespace
    is ignored, so raw bytes could lose some)."""
    return secrets.token_hex(32).encode()


OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def static_cluster(name: str, address: HostPort, connect_timeout: str) -> dict[str, Any]:
    """A STATIC cluster of one endpoint at ``address``."""
    endpoint = {
        "address": {"socket_address": {"address": address.host, "port_value": address.port}}
    }
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": connect_timeout,
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": endpoint}]}],
        },
    }


def _h2_cluster(address: HostPort) -> dict[str, Any]:
    """The stub upstream again, reached over HTTP/2 (prior knowledge)."""
    return static_cluster("upstream_h2", address, "2s") | {
        "typed_extension_protocol_options": {
            OPTIONS: {
                "@type": f"type.googleapis.com/{OPTIONS}",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
    }


def write_proof_keys(workdir: Path, proof_keys: dict[str, bytes]) -> list[dict[str, str]]:
    """Signing keys (id -> secret) written to files; the processor's ``proof.keys``."""
    folder = workdir / "proof-keys"
    folder.mkdir(mode=0o700, exist_ok=True)
    keys = []
    for key_id, secret in proof_keys.items():
        path = folder / key_id
        path.write_bytes(secret)
        os.chmod(path, 0o600)
        keys.append({"id": key_id, "file": str(path)})
    return keys


def wait_for_fresh_record(clock_skew_seconds: float) -> None:
    """A processor's own record, made before it serves, honors only proofs minted after
    it began, a skew rounded up included (ext_proc/edge/record.py): tests mint after
    this returns."""
    fresh = math.ceil(time.time()) + clock_skew_seconds + 1
    time.sleep(max(0.0, fresh - time.time()))


@dataclass
class Stack:
    workdir: Path
    gateway: HostPort = field(default_factory=lambda: HostPort(LOCAL, processes.free_port()))
    admin: HostPort = field(default_factory=lambda: HostPort(LOCAL, processes.free_port()))
    processor: HostPort = field(default_factory=lambda: HostPort(LOCAL, processes.free_port()))
    upstream: HostPort = field(default_factory=lambda: HostPort(LOCAL, processes.free_port()))
    metrics: HostPort = field(default_factory=lambda: HostPort(LOCAL, processes.free_port()))
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    source: Path = envoy_config.SHIPPED
    routes: list[dict[str, Any]] = field(default_factory=extra_routes)
    # Routes placed before even the token endpoint 404s: an operator's config that
    # forwards what the shipped ones answer (the processor's own defences alone).
    unguarded: list[dict[str, Any]] = field(default_factory=list)
    # A real server for both routes instead of the recording stub (conformance tier).
    real_upstream: HostPort | None = None
    # Processor configuration (YAML keys) for this stack; defaults otherwise.
    processor_config: dict[str, Any] = field(default_factory=dict)
    # Signing keys (id -> secret; the first signs), written to files the processor's
    # ``proof.keys`` name; other ``proof`` settings come from processor_config.
    proof_keys: dict[str, bytes] = field(default_factory=dict)
    # A Unix socket for the processor instead of TCP (with an envoy-uds style config).
    processor_socket: Path | None = None
    # Where /etc/ext-proc/tls/ certificate paths point (TLS configs).
    cert_dir: Path | None = None
    # Processor workers; over TCP worker i serves the processor's port plus i, so with
    # more than one ``start`` picks a processor port with that many free ports from it,
    # and Envoy's processor cluster lists each worker as an endpoint.
    workers: int = 1
    # Addresses of the config's further upstream clusters, by name.
    others: dict[str, HostPort] = field(default_factory=dict)
    # Changes the rendered Envoy config before it is written (after the routes are in).
    edit: Callable[[dict[str, Any]], None] | None = None
    # The processor's environment on top of this one's (LD_PRELOAD, FAKETIME, ...).
    processor_env: dict[str, str] = field(default_factory=dict)
    # Envoy's hot restart epoch (processes.envoy_args); None: hot restart off.
    envoy_epoch: int | None = None
    # Envoy's worker threads (--concurrency); None: Envoy's own default (one per core).
    envoy_concurrency: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.gateway}"

    def _log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> Stack:
        """Start every process; one failing to start stops those already running."""
        if self.workers > 1 and self.processor_socket is None:
            # The ports after the processor's serve its other workers: free ones.
            self.processor = HostPort(LOCAL, bench_stack.consecutive_free_ports(self.workers))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        if self.real_upstream is None:
            self.children["upstream"] = start_stand_in(self.upstream, self._log("upstream"))
        else:
            self.upstream = self.real_upstream
        self.start_processor()
        config = envoy_config.render(
            gateway=self.gateway,
            admin=self.admin,
            processor=self.processor_socket or self.processor,
            aggregated=self.upstream,
            disaggregated=self.upstream,
            prefill=self.upstream,
            source=self.source,
            cert_dir=self.cert_dir,
            others=self.others,
        )
        hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        (vhost,) = hcm["typed_config"]["route_config"]["virtual_hosts"]
        add_routes(vhost["routes"], self.routes)
        vhost["routes"][:0] = self.unguarded
        config["static_resources"]["clusters"].append(_h2_cluster(self.upstream))
        if self.workers > 1 and self.processor_socket is None:
            # Worker i serves the processor's port plus i: Envoy lists each.
            bench_stack.list_workers(config, self.processor, self.workers)
        if self.edit is not None:
            self.edit(config)
        envoy_config.write(config, self.workdir / "envoy.yaml")
        self.start_envoy()

    def start_envoy(self) -> None:
        """Envoy on the config ``start`` wrote, at ``envoy_epoch``, once it is ready."""
        path = self.workdir / "envoy.yaml"
        args = processes.envoy_args(path, self.admin.port, self.envoy_epoch)
        if self.envoy_concurrency is not None:
            args += ["--concurrency", str(self.envoy_concurrency)]
        envoy = processes.start(args, self._log("envoy"))
        self.children["envoy"] = envoy
        processes.wait_for_envoy(self.admin.port, envoy)

    def start_processor(self) -> None:
        args = [
            sys.executable,
            "-m",
            "ext_proc",
            "serve",
            "--listen",
            f"unix:{self.processor_socket}" if self.processor_socket else str(self.processor),
            "--log-level",
            "debug",
            "--metrics-listen",
            str(self.metrics),
        ]
        # A short drain keeps test teardown quick; tests of the drain set their own.
        config = {"drain_seconds": 0.1, **self.processor_config}
        if self.proof_keys:
            # One machine, one clock: a skew of 1 s unless a test sets its own.
            proof = {"clock_skew_seconds": 1, **config.get("proof", {})}
            config["proof"] = {**proof, "keys": self._write_keys()}
        path = self.workdir / "processor.yaml"
        path.write_text(yaml.safe_dump(config))
        args += ["--config", str(path), "--workers", str(self.workers)]
        env = {**os.environ, **self.processor_env} if self.processor_env else None
        proc = processes.start(args, self._log("processor"), env=env)
        self.children["processor"] = proc
        if self.processor_socket is not None:
            processes.wait_for_port(self.metrics.port, proc)  # opened once serving
        else:
            for port in self.worker_ports():
                processes.wait_for_port(port, proc)
        if self.proof_keys and not config["proof"].get("record"):
            wait_for_fresh_record(config["proof"]["clock_skew_seconds"])

    def worker_ports(self) -> range:
        """The processor workers' ports over TCP: worker i serves the processor's plus i."""
        return range(self.processor.port, self.processor.port + self.workers)

    def processor_hosts(self) -> dict[int, dict[str, Any]]:
        """The processor cluster's hosts by port, as Envoy's admin reports them."""
        url = f"http://{self.admin}/clusters?format=json"
        with urllib.request.urlopen(url, timeout=5) as reply:
            statuses = json.loads(reply.read())["cluster_statuses"]
        (cluster,) = [c for c in statuses if c["name"] == envoygen.PROCESSOR_CLUSTER]
        hosts: list[dict[str, Any]] = cluster["host_statuses"]
        return {h["address"]["socket_address"]["port_value"]: h for h in hosts}

    def wait_for_workers(self, timeout: float = 30.0) -> None:
        """Until every worker accepts connections on its port and Envoy has every one in
        its rotation (no failed health check, not ejected): a worker restarted by its
        supervisor is then served streams again, and none meets a refused connection."""
        proc = self.children["processor"]
        for port in self.worker_ports():
            processes.wait_for_port(port, proc, timeout)
        deadline = time.monotonic() + timeout
        while True:
            hosts = self.processor_hosts()
            flags = [k for h in hosts.values() for k, v in h["health_status"].items() if v is True]
            if sorted(hosts) == list(self.worker_ports()) and not flags:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"processor workers not all in Envoy's rotation: {hosts}")
            time.sleep(0.1)

    def _write_keys(self) -> list[dict[str, str]]:
        return write_proof_keys(self.workdir, self.proof_keys)

    def processor_memory_kib(self) -> dict[str, int]:
        """The processor's current (VmRSS) and peak (VmHWM) resident memory."""
        status = Path(f"/proc/{self.children['processor'].pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return {key: int(fields[key].split()[0]) for key in ("VmRSS", "VmHWM")}

    def reset_processor_peak(self) -> None:
        """Start VmHWM afresh at the current RSS (Linux >= 4.0: clear_refs value 5)."""
        Path(f"/proc/{self.children['processor'].pid}/clear_refs").write_text("5")

    def inflight(self) -> float:
        """The processor's in-flight budget in use (its metrics endpoint)."""
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        (line,) = (x for x in text.splitlines() if x.startswith("ext_proc_inflight_body_bytes "))
        return float(line.split()[1])

    def open_upload(self, length: int, first: bytes) -> socket.socket:
        """Start an HTTP/1.1 POST announcing ``length`` body bytes; send only ``first``."""
        sock = socket.create_connection((self.gateway.host, self.gateway.port), timeout=30)
        sock.sendall(
            (
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                f"content-type: application/json\r\ncontent-length: {length}\r\n\r\n"
            ).encode()
            + first
        )
        return sock

    def stop_processor(self) -> None:
        processes.stop(self.children.pop("processor"))

    def stop(self) -> None:
        for child in self.children.values():
            processes.stop(child)

    def _stub(self, method: str, query: str = "") -> Any:
        url = f"http://{self.upstream}/__stub__/requests{query}"
        request = urllib.request.Request(url, method=method)
        with urllib.request.urlopen(request, timeout=5) as reply:
            return json.loads(reply.read())

    def received_count(self) -> int:
        """How many requests reached the stub, without fetching their bodies."""
        return int(self._stub("GET", "?count")["count"])

    def incomplete_count(self) -> int:
        """How many requests reached the stub whose connection ended before their body
        did (never recorded)."""
        return int(self._stub("GET", "?count")["incomplete"])

    def received(self) -> list[Received]:
        return [
            Received(
                r["method"],
                r["target"],
                [tuple(h) for h in r["headers"]],
                base64.b64decode(r["body_b64"]),
                base64.b64decode(r["raw_b64"]),
                r["protocol"],
            )
            for r in self._stub("GET")
        ]

    def clear(self) -> None:
        self._stub("DELETE")

    def logs(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")


def read_past_head(sock: socket.socket) -> bytes:
    """What ``sock`` received until a response's head was whole (its blank line, and any
    bytes after it in the same reads), or the connection closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data
