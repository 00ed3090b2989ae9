"""A raw HTTP/2 client for what ordinary clients do not send: streams that announce a
body and never send it, trailers without a body."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events

from ext_proc.core.address import HostPort


@dataclass
class Reply:
    status: int = 0
    body: bytes = b""
    ended: bool = False


@dataclass
class H2:
    """One HTTP/2 connection (prior knowledge, cleartext) to ``address``."""

    address: HostPort
    replies: dict[int, Reply] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sock = socket.create_connection((self.address.host, self.address.port), timeout=30)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self._flush()

    def _flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def open(self, path: str, headers: list[tuple[str, str]], *, end: bool = False) -> int:
        """Send a POST's headers; the stream stays open unless ``end``."""
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":authority", "x"),
                (":path", path),
                ("content-type", "application/json"),
                *headers,
            ],
            end_stream=end,
        )
        self.replies[stream] = Reply()
        self._flush()
        return stream

    def send(self, stream: int, data: bytes, *, end: bool = False) -> None:
        self.conn.send_data(stream, data, end_stream=end)
        self._flush()

    def trailers(self, stream: int, trailers: list[tuple[str, str]]) -> None:
        self.conn.send_headers(stream, trailers, end_stream=True)
        self._flush()

    def wait(self, stream: int) -> Reply:
        """Read until ``stream`` has its whole reply."""
        reply = self.replies[stream]
        while not reply.ended:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("connection closed")
            for event in self.conn.receive_data(data):
                got = self.replies.get(getattr(event, "stream_id", 0))
                if isinstance(event, h2.events.ResponseReceived) and got is not None:
                    got.status = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.DataReceived) and got is not None:
                    got.body += event.data
                    self.conn.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)) and got:
                    got.ended = True
            self._flush()
        return reply

    def close(self) -> None:
        self.sock.close()
