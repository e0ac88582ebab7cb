"""A TCP relay in front of a nats-server that can hold every byte (a network partition between
one client and NATS), for tests of what a lost connection does (no tests here)."""

from __future__ import annotations

import asyncio
import socket
import threading


class Partition:
    """A TCP relay to a nats-server that can hold every byte in both directions (a network
    partition between one client host and NATS), then let them through again."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.blocked = threading.Event()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                             return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                while self.blocked.is_set():
                    await asyncio.sleep(0.02)
                writer.write(data)
                await writer.drain()
        finally:
            try:
                writer.close()
            except RuntimeError:  # the relay's loop is gone (drop/close): nothing to close on
                pass

    def drop(self) -> None:
        """End the partition by losing every byte it held (the relay stops, nothing sent)."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def close(self) -> None:
        self.blocked.clear()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
