"""Fast publishing for the demo, tests and benchmarks: core PUB/HPUB frames written in bulk,
then confirmed by watching the stream's message count (cheaper than a PubAck per message).

Headers are given as raw pairs, so a key may repeat (nats-py's publish takes a dict).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence

from js_etl.errors import TransientError
from js_etl.jetstream.admin import JetStreamAdmin
from js_etl.jetstream.client import JetStreamConnection

Header = tuple[str, str]


def header_block(headers: Sequence[Header]) -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers)
    return f"NATS/1.0\r\n{lines}\r\n".encode()


def frame(subject: str, data: bytes, headers: Sequence[Header] = ()) -> bytes:
    if not headers:
        return b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(data), data)
    hdr = header_block(headers)
    return b"HPUB %s %d %d\r\n%s%s\r\n" % (subject.encode(), len(hdr), len(hdr) + len(data),
                                          hdr, data)


async def publish(conn: JetStreamConnection,
                  messages: Iterable[tuple[str, bytes] | tuple[str, bytes, Sequence[Header]]],
                  *, chunk: int = 5000) -> int:
    """Publish (subject, data[, headers]) messages in chunks of one write each; returns count."""
    nc = conn.nc
    buffer: list[bytes] = []
    count = 0
    for message in messages:
        buffer.append(frame(*message))
        count += 1
        if len(buffer) >= chunk:
            await nc._send_command(b"".join(buffer))
            await nc.flush()  # bound what sits in our outbound buffer
            buffer.clear()
    if buffer:
        await nc._send_command(b"".join(buffer))
    await nc.flush()
    return count


async def wait_for_messages(conn: JetStreamConnection, stream: str, count: int,
                            timeout: float = 30.0) -> None:
    """Wait until ``stream`` holds at least ``count`` messages (its last_seq reached them)."""
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
