"""Wait for a consumer's backlog in the triggerer, without holding a worker slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from js_etl.airflow.hooks import JetStreamHook
from js_etl.errors import TerminalError
from js_etl.jetstream import JetStreamAdmin, JetStreamConnection

SUCCESS = "success"
ERROR = "error"


def error_payload(error: BaseException, *, stream: str, consumer: str) -> dict[str, Any]:
    """The event (and XCom-safe dict) for a failure: the reason, and whether a retry may help."""
    return {
        "status": ERROR,
        "stream": stream,
        "consumer": consumer,
        "error": type(error).__name__,
        "message": f"{type(error).__name__}: {error}",
        # Terminal js-etl errors (missing stream/consumer, refused credentials, a bad or
        # missing connection) need a fix; anything else (unreachable, leadership change) may pass.
        "retryable": not isinstance(error, TerminalError),
    }


class JetStreamBacklogTrigger(BaseTrigger):
    """Fires once ``num_pending >= min_pending`` on a durable consumer, or once with an error.

    It serialises the connection *id* and plain values only; the hook is rebuilt where the
    trigger runs (the triggerer), so no secret is ever written to the metadata database. One
    NATS connection is kept for the whole wait and closed when the trigger ends.

    Events: ``{"status": "success", "num_pending": N, "stream": ..., "consumer": ...}`` or
    ``{"status": "error", "error": "StreamNotFoundError", "message": ..., "retryable": False}``.
    """

    def __init__(self, *, nats_conn_id: str, stream: str, consumer: str, min_pending: int = 1,
                 poll_interval: float = 5.0) -> None:
        super().__init__()
        self.nats_conn_id = nats_conn_id
        self.stream = stream
        self.consumer = consumer
        self.min_pending = int(min_pending)
        self.poll_interval = float(poll_interval)
        self._conn: JetStreamConnection | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "nats_conn_id": self.nats_conn_id,
            "stream": self.stream,
            "consumer": self.consumer,
            "min_pending": self.min_pending,
            "poll_interval": self.poll_interval,
        })

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            options = await JetStreamHook(self.nats_conn_id).aconnection_options()
            self._conn = await JetStreamConnection.open(options)
            admin = JetStreamAdmin(self._conn)
            while True:
                info = await admin.consumer_info(self.stream, self.consumer)
                if info.num_pending >= self.min_pending:
                    event = {"status": SUCCESS, "stream": self.stream, "consumer": self.consumer,
                             "num_pending": info.num_pending}
                    break
                self.log.info("%s/%s: %d pending, waiting for %d", self.stream, self.consumer,
                              info.num_pending, self.min_pending)
                await asyncio.sleep(self.poll_interval)
        except Exception as e:  # every failure must reach the task as an event
            event = error_payload(e, stream=self.stream, consumer=self.consumer)
        finally:
            await self._close()
        yield TriggerEvent(event)

    async def cleanup(self) -> None:
        await self._close()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            await conn.close()
        except Exception as e:  # closing must never turn a result into a failure
            self.log.warning("closing the NATS connection of %s/%s failed: %s", self.stream,
                             self.consumer, e)
