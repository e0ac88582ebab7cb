"""A blocking facade over the async layer, for Spark Python workers and the driver.

Spark reuses Python workers between tasks, and after ``asyncio.run`` a worker has no current
event loop, so nothing here is global: each session owns a fresh event loop for its
lifetime. A session is created inside the partition function; only picklable
:class:`ConnectionOptions` cross to the executors.

>>> with JetStreamSession(options) as js:
...     puller = js.puller("ORDERS", "orders_to_delta")
...     result = js.pull(puller, 1000, max_bytes=8 << 20)
...     js.run(js.acker.ack([m.reply for m in result.messages]))
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, Self, TypeVar

from js_etl.jetstream.ack import Acker
from js_etl.jetstream.admin import JetStreamAdmin
from js_etl.jetstream.api import ConsumerInfo, StreamInfo
from js_etl.jetstream.client import JetStreamConnection
from js_etl.jetstream.options import ConnectionOptions
from js_etl.jetstream.pull import Puller, PullResult

T = TypeVar("T")


class JetStreamSession:
    def __init__(self, options: ConnectionOptions) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self.conn = self._loop.run_until_complete(JetStreamConnection.open(options))
        except BaseException:
            self._loop.close()
            raise
        self.admin = JetStreamAdmin(self.conn)
        self.acker = Acker(self.conn)

    def run(self, coro: Awaitable[T]) -> T:
        """Run one coroutine (or a task of :meth:`start_pull`) on this session's loop."""
        return self._loop.run_until_complete(coro)

    # The calls executors and the driver make all the time; anything else goes through run().
    def stream_info(self, stream: str) -> StreamInfo:
        return self.run(self.admin.stream_info(stream))

    def consumer_info(self, stream: str, consumer: str) -> ConsumerInfo:
        return self.run(self.admin.consumer_info(stream, consumer))

    def puller(self, stream: str, consumer: str, **kw: Any) -> Puller:
        return Puller(self.conn, stream, consumer, **kw)

    def pull(self, puller: Puller, batch: int, **kw: Any) -> PullResult:
        return self.run(puller.pull(batch, **kw))

    def start_pull(self, puller: Puller, batch: int, **kw: Any) -> asyncio.Task[PullResult]:
        """A pull to collect later with ``run(task)``. It is sent the next time this session's
        loop runs (e.g. while an earlier pull is collected), so the server fills it while the
        caller works on the previous batch. One pull at a time per ``Puller``."""
        return self._loop.create_task(puller.pull(batch, **kw))

    def cancel(self, tasks: Iterable[asyncio.Task[Any]]) -> None:
        """Cancel pulls that will not be collected (their deliveries redeliver after ack_wait)."""
        pending = [t for t in tasks if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            self.run(asyncio.wait(pending))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._loop.run_until_complete(self.conn.close())
        finally:
            self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
