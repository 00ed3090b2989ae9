"""An HTTP/1.1 upstream whose streamed answer stays open until the test lets it end, as
a model's streamed completion does: the response headers and a first event at once,
the other events once ``release`` is called. It keeps every request's bytes as they
arrived. It runs an asyncio loop in a thread of the test process."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from ext_proc.core.address import HostPort

# The events of every answer, in order; the first goes out with the headers.
EVENTS = (*(b"data: %d\n\n" % i for i in range(5)), b"data: [DONE]\n\n")
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


@dataclass(frozen=True)
class Arrived:
    head: bytes  # the request line and headers, as sent
    body: bytes  # the body, its framing (content-length or chunks) removed
    chunked: bool


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class HeldUpstream:
    """Listens on 127.0.0.1 (``address``) once ``running``."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._arrived: list[Arrived] = []
        self._gate: asyncio.Event | None = None
        self.address: HostPort | None = None

    def arrived(self) -> list[Arrived]:
        with self._lock:
            return list(self._arrived)

    def clear(self) -> None:
        with self._lock:
            self._arrived.clear()

    def release(self) -> None:
        """Let every answer held so far, and every later one, end."""
        self._set_gate(True)

    def hold(self) -> None:
        """Hold the next answers after their first event again."""
        self._set_gate(False)

    def _set_gate(self, open_: bool) -> None:
        gate = self._gate
        assert gate is not None

        async def set_gate() -> None:
            gate.set() if open_ else gate.clear()

        asyncio.run_coroutine_threadsafe(set_gate(), self._loop).result(10)

    async def _body(self, reader: asyncio.StreamReader, head: bytes) -> Arrived:
        fields = [line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line]
        headers = {name.strip().lower(): value.strip() for name, value in fields}
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = b""
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                body += (await reader.readexactly(size + 2))[:-2]
            await reader.readuntil(b"\r\n")  # the last chunk's empty trailer section
            return Arrived(head, body, chunked=True)
        length = int(headers.get(b"content-length", b"0"))
        return Arrived(head, await reader.readexactly(length), chunked=False)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._gate is not None
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrived = await self._body(reader, head)
                with self._lock:
                    self._arrived.append(arrived)
                writer.write(HEAD + _chunk(EVENTS[0]))
                await writer.drain()
                await self._gate.wait()
                writer.write(b"".join(_chunk(event) for event in EVENTS[1:]) + b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    @contextlib.contextmanager
    def running(self) -> Iterator[HeldUpstream]:
        thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        thread.start()

        async def start() -> asyncio.Server:
            self._gate = asyncio.Event()
            return await asyncio.start_server(self._serve, "127.0.0.1", 0)

        server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        self.address = HostPort("127.0.0.1", server.sockets[0].getsockname()[1])
        try:
            yield self
        finally:

            async def stop() -> None:
                server.close()
                for task in asyncio.all_tasks():
                    if task is not asyncio.current_task():
                        task.cancel()

            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            thread.join(10)
            self._loop.close()
