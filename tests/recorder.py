"""A TCP pass-through in front of a real server that keeps every byte sent to it:
what the gateway forwarded to a vLLM server, exactly, with nothing answered in its
place. It runs an asyncio loop in a thread of the test process."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from ext_proc.core.address import HostPort

_CHUNK = 1 << 16


class Recorder:
    """Listens on 127.0.0.1 (``address``) and relays each connection to ``upstream``."""

    def __init__(self, upstream: HostPort) -> None:
        self.upstream = upstream
        self._received = bytearray()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self.address: HostPort | None = None

    def received(self) -> bytes:
        """Every byte sent to the upstream so far, in arrival order per connection."""
        with self._lock:
            return bytes(self._received)

    def clear(self) -> None:
        with self._lock:
            self._received.clear()

    async def _relay(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, record: bool
    ) -> None:
        try:
            while chunk := await source.read(_CHUNK):
                if record:
                    with self._lock:
                        self._received += chunk
                sink.write(chunk)
                await sink.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                sink.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.upstream.host, self.upstream.port
            )
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            self._relay(reader, up_writer, record=True),
            self._relay(up_reader, writer, record=False),
        )

    @contextlib.contextmanager
    def running(self) -> Iterator[Recorder]:
        thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        thread.start()

        async def start() -> asyncio.Server:
            return await asyncio.start_server(self._accept, "127.0.0.1", 0)

        self._server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        port = self._server.sockets[0].getsockname()[1]
        self.address = HostPort("127.0.0.1", port)
        try:
            yield self
        finally:

            async def stop() -> None:
                assert self._server is not None
                self._server.close()
                for task in asyncio.all_tasks():
                    if task is not asyncio.current_task():
                        task.cancel()

            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            thread.join(10)
            self._loop.close()
