"""The one parser for ``host:port`` addresses (listeners, upstreams, the processor).

IPv6 hosts may be written in brackets (``[::1]:9000``); a host is an IP address or a
DNS name. A processor listen address may instead be ``unix:/path`` (see ``Listen``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final

_HOST: Final = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
UNIX_PREFIX: Final = "unix:"


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str, *, allow_zero: bool = False) -> HostPort:
        """``host:port``; port 0 (any free port) only with ``allow_zero``.

        Raises ``ValueError`` naming what is wrong.
        """
        host, sep, port = text.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        lowest = 0 if allow_zero else 1
        if not sep or not host or not port.isdigit() or not lowest <= int(port) < 65536:
            raise ValueError(f"expected host:port with a port in {lowest}..65535, got {text!r}")
        if not is_ip(host) and not _HOST.fullmatch(host):
            raise ValueError(f"{host!r} is neither an IP address nor a DNS name")
        return cls(host, int(port))

    @property
    def is_ip(self) -> bool:
        return is_ip(self.host)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def check_listen(text: str) -> str:
    """A gRPC listen address: ``host:port`` (port 0: any) or ``unix:/path``."""
    if text.startswith(UNIX_PREFIX):
        if not text.removeprefix(UNIX_PREFIX):
            raise ValueError("unix: needs a socket path")
        return text
    HostPort.parse(text, allow_zero=True)
    return text
