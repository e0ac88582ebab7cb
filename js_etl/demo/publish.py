"""Fast, confirmed publishing for the demo, tests and the bench.

Messages go out as raw PUB/HPUB frames in chunks of one write each, every one with its own reply
subject; the server's PubAcks come back through the raw frame sink (no per-message future).
A chunk is sent only once the previous one is fully acknowledged: under load JetStream drops
core publishes it cannot ingest (docs/design/nats-client.md), so nothing here trusts a publish
it did not see acknowledged.

Headers are given as raw pairs, so a key may repeat (nats-py's publish takes a dict).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from js_etl.errors import TransientError
from js_etl.jetstream.admin import JetStreamAdmin
from js_etl.jetstream.client import JetStreamConnection
from js_etl.jetstream.errors import api_error

Header = tuple[str, str]
Message = tuple[str, bytes] | tuple[str, bytes, Sequence[Header]]


def header_block(headers: Sequence[Header]) -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers)
    return f"NATS/1.0\r\n{lines}\r\n".encode()


def frame(subject: str, reply: str, data: bytes, headers: Sequence[Header] = ()) -> bytes:
    if not headers:
        return b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(), len(data), data)
    hdr = header_block(headers)
    return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject.encode(), reply.encode(), len(hdr),
                                             len(hdr) + len(data), hdr, data)


async def publish(conn: JetStreamConnection, messages: Iterable[Message], *, chunk: int = 5000,
                  timeout: float = 30.0) -> int:
    """Publish (subject, data[, headers]) messages and wait for every PubAck; returns count.

    Raises the server's error if a publish is refused (e.g. no stream for the subject), and
    TransientError if PubAcks do not arrive within ``timeout`` per chunk.
    """
    confirm = _PubAcks()
    nc = conn.nc
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox + ".*")
    nc.raw_sinks[sub._id] = confirm.on_frame
    count = 0
    buffer: list[bytes] = []
    try:
        for subject, data, *headers in messages:
            buffer.append(frame(subject, f"{inbox}.{count}", data, *headers))
            count += 1
            if len(buffer) >= chunk:
                await confirm.send(conn, buffer, count, timeout)
                buffer.clear()
        if buffer:
            await confirm.send(conn, buffer, count, timeout)
    finally:
        nc.raw_sinks.pop(sub._id, None)
        await sub.unsubscribe()
    if confirm.errors:
        raise api_error(confirm.errors[0])
    return count


class _PubAcks:
    """Counts PubAcks arriving on the publish inbox and wakes the sender when a chunk is in."""

    def __init__(self) -> None:
        self.acked = 0
        self.errors: list[dict[str, Any]] = []
        self._target = 0
        self._done: asyncio.Future[None] | None = None

    def on_frame(self, subject: bytes, reply: bytes, data: bytes | memoryview,
                 headers: bytes | None) -> None:
        data = bytes(data)  # a PubAck: a few dozen bytes (a view of the read buffer, see FrameSink)
        if headers and b" 503" in headers.split(b"\r\n", 1)[0]:
            self.errors.append({"code": 503, "description": "no stream listens on the subject"})
        elif b'"error"' in data:
            self.errors.append(json.loads(data)["error"])
        self.acked += 1
        if self._done is not None and self.acked >= self._target and not self._done.done():
            self._done.set_result(None)

    async def send(self, conn: JetStreamConnection, buffer: list[bytes], total: int,
                   timeout: float) -> None:
        self._target = total
        self._done = asyncio.get_running_loop().create_future()
        await conn.nc._send_command(b"".join(buffer))
        await conn.nc.flush()
        if self.acked >= total:
            return
        try:
            await asyncio.wait_for(self._done, timeout)
        except TimeoutError:
            raise TransientError(f"only {self.acked} of {total} publishes acknowledged after "
                                 f"{timeout}s") from None


async def wait_for_messages(conn: JetStreamConnection, stream: str, count: int,
                            timeout: float = 30.0) -> None:
    """Wait until ``stream``'s last sequence reached ``count``."""
    admin = JetStreamAdmin(conn)
    deadline = time.monotonic() + timeout
    while True:
        state = (await admin.stream_info(stream)).state
        if state.last_seq >= count:
            return
        if time.monotonic() > deadline:
            raise TransientError(f"stream {stream} has {state.last_seq} of {count} messages "
                                 f"after {timeout}s")
        await asyncio.sleep(0.02)
