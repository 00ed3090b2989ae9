"""Run a bootstrap assembled from the platform manifests (``gateway_assembly``) with the
real Envoy, this project's processor and the recording stand-in upstream: the listener
and the admin on local ports, the processor's cluster to the processor, every other
cluster to the stand-in. What the manifests' own routes answer is then what Envoy
answers, not what a reading of them says.

``bodiless_refusals`` sends requests without a body (GET, HEAD, DELETE, an empty POST)
to internal and token-in endpoints, the ones the servers act on without a body among
them, behind the given prefixes: each is answered 404 by the manifests' routes and the
stand-in receives none."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from devstack import processes
from ext_proc.core.address import HostPort
from tests.e2e.stack import LOCAL, start_stand_in, wait_for_fresh_record, write_proof_keys

# Internal and token-in endpoints the servers act on without a body (SGLang's cache and
# profiling, vLLM's development mode, Dynamo's frontend), one with a template segment,
# and a token-in one.
REFUSED: Final = (
    "/flush_cache",
    "/pause",
    "/sleep",
    "/reset_prefix_cache",
    "/clear_kv_blocks",
    "/start_profile",
    "/workers/1/drain",
    "/generative_scoring",
)
# Requests without a body: the method, and the empty body a POST announces.
BODILESS: Final = (("GET", None), ("HEAD", None), ("DELETE", None), ("POST", b""))


@dataclass(frozen=True)
class Running:
    gateway: HostPort
    stand_in: HostPort
    # The processor's metrics listener.
    metrics: HostPort | None = None

    def send(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> int:
        """One request, the path sent as written; its status."""
        connection = http.client.HTTPConnection(self.gateway.host, self.gateway.port, timeout=20)
        try:
            connection.request(method, path, body, {"connection": "close", **(headers or {})})
            reply = connection.getresponse()
            reply.read()
            return reply.status
        finally:
            connection.close()

    def _stub(self, method: str) -> Any:
        url = f"http://{self.stand_in}/__stub__/requests"
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=5) as reply:
            return json.loads(reply.read())

    def received(self) -> list[tuple[str, str]]:
        """Each request the stand-in received: method and target."""
        return [(r["method"], r["target"]) for r in self._stub("GET")]

    def bodies(self) -> list[tuple[str, bytes]]:
        """Each request the stand-in received: target and body."""
        return [(r["target"], base64.b64decode(r["body_b64"])) for r in self._stub("GET")]

    def records(self) -> list[dict[str, Any]]:
        """Each request the stand-in received, as it records it (method, target,
        headers, body_b64)."""
        return list(self._stub("GET"))

    def clear(self) -> None:
        self._stub("DELETE")


def _to(cluster: dict[str, Any], address: HostPort) -> None:
    (endpoints,) = cluster["load_assignment"]["endpoints"]
    (lb_endpoint,) = endpoints["lb_endpoints"]
    lb_endpoint["endpoint"]["address"] = {
        "socket_address": {"address": address.host, "port_value": address.port}
    }


def runnable(
    config: dict[str, Any], ports: dict[str, HostPort], processor_cluster: str
) -> dict[str, Any]:
    """``config`` on the local ``ports`` (gateway, admin, processor, stand_in)."""
    config = copy.deepcopy(config)
    local = {"socket_address": {"address": LOCAL, "port_value": 0}}
    config["admin"]["address"] = copy.deepcopy(local)
    config["admin"]["address"]["socket_address"]["port_value"] = ports["admin"].port
    (listener,) = config["static_resources"]["listeners"]
    listener["address"] = copy.deepcopy(local)
    listener["address"]["socket_address"]["port_value"] = ports["gateway"].port
    clusters = config["static_resources"]["clusters"]
    assert processor_cluster in [c["name"] for c in clusters], processor_cluster
    for cluster in clusters:
        _to(cluster, ports["processor" if cluster["name"] == processor_cluster else "stand_in"])
    return config


@contextmanager
def running(
    config: dict[str, Any],
    workdir: Path,
    processor_cluster: str,
    proof_keys: dict[str, bytes] | None = None,
    tenant_key: bytes | None = None,
) -> Iterator[Running]:
    """``proof_keys``: the processor's signing keys (id -> secret; the first signs);
    ``tenant_key``: its tenants' key (tenants.key_file)."""
    ports = {
        name: HostPort(LOCAL, processes.free_port())
        for name in ("gateway", "admin", "processor", "metrics", "stand_in")
    }
    children = []
    try:
        children.append(start_stand_in(ports["stand_in"], workdir / "stand-in.log"))
        settings: dict[str, Any] = {"drain_seconds": 0.1}
        if proof_keys:
            # One machine, one clock.
            keys = write_proof_keys(workdir, proof_keys)
            settings["proof"] = {"clock_skew_seconds": 1, "keys": keys}
        if tenant_key:
            (workdir / "tenant.key").write_bytes(tenant_key)
            settings["tenants"] = {"key_file": str(workdir / "tenant.key")}
        (workdir / "processor.yaml").write_text(yaml.safe_dump(settings))
        processor = processes.start(
            [
                sys.executable,
                "-m",
                "ext_proc",
                "serve",
                "--listen",
                str(ports["processor"]),
                "--metrics-listen",
                str(ports["metrics"]),
                "--config",
                str(workdir / "processor.yaml"),
            ],
            workdir / "processor.log",
        )
        children.append(processor)
        processes.wait_for_port(ports["processor"].port, processor)
        if proof_keys:
            wait_for_fresh_record(settings["proof"]["clock_skew_seconds"])
        path = workdir / "envoy.yaml"
        path.write_text(yaml.safe_dump(runnable(config, ports, processor_cluster), sort_keys=False))
        envoy = processes.start(
            processes.envoy_args(path, ports["admin"].port), workdir / "envoy.log"
        )
        children.append(envoy)
        processes.wait_for_envoy(ports["admin"].port, envoy)
        yield Running(ports["gateway"], ports["stand_in"], ports["metrics"])
    finally:
        for child in reversed(children):
            processes.stop(child)


def bodiless_refusals(
    gateway: Running, prefixes: Sequence[str], headers: dict[str, str] | None = None
) -> list[tuple[str, str, int]]:
    """Each bodiless request to a refused endpoint behind each prefix (as written, in
    upper case, with a trailing slash) that is not answered 404: method, path, status."""
    missed = []
    for prefix in prefixes:
        for endpoint in REFUSED:
            base = prefix.rstrip("/") + endpoint
            for path in (base, base.upper(), f"{base}/"):
                for method, body in BODILESS:
                    status = gateway.send(method, path, body, headers)
                    if status != 404:
                        missed.append((method, path, status))
    return missed
