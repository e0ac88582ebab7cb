"""Wait for a consumer's backlog in the triggerer, without holding a worker slot.

* :class:`JetStreamBacklogTrigger` — the deferrable sensor's trigger: fires once, then ends.
* :class:`JetStreamBacklogEventTrigger` — the ``nats`` scheme of Airflow's ``MessageQueueTrigger``
  (event-driven scheduling, :mod:`js_etl.airflow.queues`): runs for as long as the asset watcher
  exists and fires each time the backlog *crosses* ``min_pending`` from below.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Hashable
from typing import Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from js_etl.airflow.hooks import JetStreamHook
from js_etl.errors import TerminalError
from js_etl.jetstream import JetStreamAdmin, JetStreamConnection

SUCCESS = "success"
ERROR = "error"
# What both triggers serialise: the connection *id*, names and numbers, never a secret.
_SERIALISED = ("nats_conn_id", "stream", "consumer", "min_pending", "poll_interval")


def _serialized(trigger: BaseTrigger) -> tuple[str, dict[str, Any]]:
    return (f"{type(trigger).__module__}.{type(trigger).__qualname__}",
            {name: getattr(trigger, name) for name in _SERIALISED})


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
        return _serialized(self)

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


_log = logging.getLogger(__name__)
# The longest wait between two checks of a watcher whose stream, consumer or credentials need a
# fix (the wait doubles from poll_interval).
MAX_TERMINAL_WAIT = 300.0


def _check_event_args(min_pending: Any, poll_interval: Any) -> tuple[int, float]:
    if isinstance(min_pending, bool) or not isinstance(min_pending, int | str):
        raise ValueError(f"min_pending must be an integer >= 1, got {min_pending!r}")
    try:
        threshold = int(min_pending)
    except ValueError:
        threshold = 0
    if threshold < 1:
        raise ValueError(f"min_pending must be an integer >= 1, got {min_pending!r}")
    if isinstance(poll_interval, bool) or not isinstance(poll_interval, int | float) \
            or not poll_interval > 0:
        raise ValueError(f"poll_interval must be a positive number of seconds, "
                         f"got {poll_interval!r}")
    return threshold, float(poll_interval)


class JetStreamBacklogEventTrigger(BaseEventTrigger):
    """Fires each time a durable consumer's backlog crosses ``min_pending`` (event-driven
    scheduling: an ``AssetWatcher``'s trigger, usually built by
    ``MessageQueueTrigger(scheme="nats", ...)``).

    Edge-triggered, so one backlog starts one DAG run: after an event the trigger waits until
    the backlog has fallen below ``min_pending`` again (a drain ran) before it can fire again.
    A backlog that is already at ``min_pending`` when the trigger starts (e.g. after a
    triggerer restart) fires at once.

    Serialised: the connection *id*, the names and two numbers; the connection is read where the
    trigger runs. Watchers of the same consumer on the same connection and cadence share one
    NATS connection and one poll in the triggerer (``shared_stream_key``), whatever their
    thresholds.

    A missing stream, consumer or connection, and refused credentials, need a fix: each is
    logged as an error, and checked again after a wait that doubles up to
    :data:`MAX_TERMINAL_WAIT` (never an event, which would start a DAG run for nothing, and
    never a failed trigger, which the triggerer would restart at once, again and again); an
    unreachable server is logged and retried every ``poll_interval``. The connection is kept
    through either.

    Event payload: ``{"stream", "consumer", "num_pending", "min_pending"}``.
    """

    def __init__(self, *, stream: str, consumer: str, min_pending: int = 1,
                 poll_interval: float = 5.0, nats_conn_id: str = "nats_default") -> None:
        super().__init__()
        self.nats_conn_id = nats_conn_id
        self.stream = stream
        self.consumer = consumer
        self.min_pending, self.poll_interval = _check_event_args(min_pending, poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return _serialized(self)

    def shared_stream_key(self) -> Hashable | None:
        # Only what open_shared_stream reads: min_pending is applied per watcher in the filter.
        return ("js-etl-backlog", self.nats_conn_id, self.stream, self.consumer,
                self.poll_interval)

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """One connection, one ``consumer_info`` per ``poll_interval``; yields
        ``{"num_pending": n}`` forever, or raises a terminal error."""
        stream, consumer = kwargs["stream"], kwargs["consumer"]
        interval = float(kwargs["poll_interval"])
        hook = JetStreamHook(kwargs["nats_conn_id"])
        conn: JetStreamConnection | None = None
        wait = interval
        try:
            while True:
                try:
                    if conn is None:
                        conn = await JetStreamConnection.open(await hook.aconnection_options())
                    info = await JetStreamAdmin(conn).consumer_info(stream, consumer)
                except TerminalError as e:  # a missing stream or consumer, refused credentials
                    wait = min(wait * 2, max(interval, MAX_TERMINAL_WAIT))
                    _log.error("%s/%s: %s: %s; this needs a fix, no event until then; checking "
                               "again in %.3gs", stream, consumer, type(e).__name__, e, wait)
                except Exception as e:  # unreachable, leadership change: the next poll may pass
                    wait = interval
                    _log.warning("%s/%s: %s: %s; retrying in %.3gs", stream, consumer,
                                 type(e).__name__, e, interval)
                    old, conn = conn, None
                    if old is not None:
                        await _close_quietly(old)
                else:
                    wait = interval
                    yield {"num_pending": info.num_pending}
                await asyncio.sleep(wait)
        finally:
            if conn is not None:
                await _close_quietly(conn)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]
                                   ) -> AsyncIterator[TriggerEvent]:
        armed = True
        async for snapshot in shared_stream:
            pending = int(snapshot["num_pending"])
            if armed and pending >= self.min_pending:
                armed = False
                self.log.info("%s/%s: %d pending >= %d: firing", self.stream, self.consumer,
                              pending, self.min_pending)
                yield TriggerEvent({"stream": self.stream, "consumer": self.consumer,
                                    "num_pending": pending, "min_pending": self.min_pending})
            elif not armed and pending < self.min_pending:
                armed = True
                self.log.info("%s/%s: %d pending, below %d again: armed", self.stream,
                              self.consumer, pending, self.min_pending)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Without the triggerer's shared-stream manager (tests, older Airflow): the same
        filter over a poll of its own."""
        async for event in self.filter_shared_stream(
                type(self).open_shared_stream(self.serialize()[1])):
            yield event


async def _close_quietly(conn: JetStreamConnection) -> None:
    try:
        await conn.close()
    except Exception as e:  # closing must never hide the result or the real error
        _log.warning("closing a NATS connection failed: %s", e)
