"""A shipped Envoy configuration run by the real Envoy with no processor, for what Envoy
decides by itself: TLS handshakes, direct responses, path normalisation.

Every upstream cluster points at the recording stub, the processor's cluster at a port
nothing listens on: a request the processor would have to see fails closed (500), and
the stub shows whether anything was forwarded.
"""

from __future__ import annotations

import json
import socket
import ssl
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devstack import processes
from ext_proc.core.address import HostPort
from ext_proc.tools.envoygen import PROCESSOR_CLUSTER
from tests.e2e import certs
from tests.e2e.stack import start_stand_in

REPO = Path(__file__).resolve().parents[2]
CERT_DIR = "/etc/ext-proc/tls/"
LOCAL = "127.0.0.1"


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Gateway:
    address: HostPort
    upstream: HostPort

    def forwarded(self) -> list[dict[str, Any]]:
        """Every request the stub upstream received."""
        url = f"http://{self.upstream}/__stub__/requests"
        with urllib.request.urlopen(url, timeout=5) as reply:
            received: list[dict[str, Any]] = json.loads(reply.read())
        return received

    def exchange(self, request: bytes, tls: ssl.SSLContext | None = None) -> Reply:
        """Send one raw HTTP/1.1 request (the path exactly as written) and read the reply
        to the end of the connection (the request says ``connection: close``)."""
        raw = socket.create_connection((self.address.host, self.address.port), timeout=10)
        # The TLS socket takes over the connection (and closes it).
        with raw if tls is None else tls.wrap_socket(raw, server_hostname=certs.GATEWAY) as sock:
            sock.sendall(request)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        return parse(data)


def request(method: str, path: str, body: bytes = b"") -> bytes:
    head = (
        f"{method} {path} HTTP/1.1\r\nhost: gateway\r\nconnection: close\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def parse(data: bytes) -> Reply:
    head, separator, body = data.partition(b"\r\n\r\n")
    if not separator:
        raise ConnectionError(f"no HTTP response: {data[:80]!r}")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Reply(int(status_line.split()[1]), headers, body)


def _socket(address: HostPort) -> dict[str, Any]:
    return {"socket_address": {"address": address.host, "port_value": address.port}}


def _point(config: dict[str, Any], gateway: HostPort, admin: HostPort, upstream: HostPort) -> None:
    config["admin"]["address"] = _socket(admin)
    (listener,) = config["static_resources"]["listeners"]
    listener["address"] = _socket(gateway)
    nowhere = HostPort(LOCAL, processes.free_port())
    for cluster in config["static_resources"]["clusters"]:
        (locality,) = cluster["load_assignment"]["endpoints"]
        (lb_endpoint,) = locality["lb_endpoints"]
        target = nowhere if cluster["name"] == PROCESSOR_CLUSTER else upstream
        lb_endpoint["endpoint"]["address"] = _socket(target)


@contextmanager
def running(source: Path, workdir: Path, cert_dir: Path | None = None) -> Iterator[Gateway]:
    """Envoy on ``source`` (certificate paths moved to ``cert_dir``) and the stub."""
    text = source.read_text()
    if cert_dir is not None:
        text = text.replace(CERT_DIR, f"{cert_dir}/")
    config = yaml.safe_load(text)
    gateway, admin, upstream = (HostPort(LOCAL, processes.free_port()) for _ in range(3))
    _point(config, gateway, admin, upstream)
    path = workdir / "envoy.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    with ExitStack() as children:
        stub = start_stand_in(upstream, workdir / "upstream.log")
        children.callback(processes.stop, stub)
        envoy = processes.start(processes.envoy_args(path, admin.port), workdir / "envoy.log")
        children.callback(processes.stop, envoy)
        processes.wait_for_envoy(admin.port, envoy)
        yield Gateway(gateway, upstream)
