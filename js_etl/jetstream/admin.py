"""JetStream admin requests: stream/consumer info, creating, updating (metadata) and deleting
streams and consumers, UNPIN, consumer reset, and a message lookup by time. Raw ``$JS.API``
requests, because nats-py cannot express priority groups (and we want one typed error per
server ``err_code``).

What a drain needs of its consumer is checked in :mod:`js_etl.durable.policy`, not here."""

from __future__ import annotations

from typing import Any

from js_etl.jetstream.api import ConsumerConfig, ConsumerInfo, StreamInfo
from js_etl.jetstream.client import JetStreamConnection
from js_etl.jetstream.errors import (
    ConsumerNotFoundError,
    JetStreamError,
    NatsUnavailableError,
    StreamNotFoundError,
)


class JetStreamAdmin:
    """Admin calls over one connection.

    >>> admin = JetStreamAdmin(conn)
    >>> info = await admin.consumer_info("ORDERS", "orders_to_delta")
    >>> info.num_pending
    1200
    """

    def __init__(self, conn: JetStreamConnection, timeout: float = 5.0) -> None:
        self.conn = conn
        self.timeout = timeout

    async def _call(self, api: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.conn.request(api, body, self.timeout)

    async def stream_info(self, stream: str) -> StreamInfo:
        try:
            return StreamInfo.from_response(await self._call(f"STREAM.INFO.{stream}"))
        except StreamNotFoundError as e:
            raise _named(e, stream) from None

    async def add_stream(self, name: str, subjects: list[str], **config: Any) -> StreamInfo:
        body = {"name": name, "subjects": subjects, "storage": "file", "num_replicas": 1, **config}
        return StreamInfo.from_response(await self._call(f"STREAM.CREATE.{name}", body))

    async def delete_stream(self, name: str) -> None:
        await self._call(f"STREAM.DELETE.{name}")

    async def consumer_info(self, stream: str, consumer: str) -> ConsumerInfo:
        try:
            return ConsumerInfo.from_response(
                await self._call(f"CONSUMER.INFO.{stream}.{consumer}"))
        except (StreamNotFoundError, ConsumerNotFoundError) as e:
            raise _named(e, stream, consumer) from None

    async def create_consumer(self, stream: str, config: ConsumerConfig, *,
                              action: str = "create") -> ConsumerInfo:
        """Create (``action="create"``: fail if it exists with another config) or update."""
        name = config.durable_name or config.name
        api = f"CONSUMER.CREATE.{stream}.{name}" if name else f"CONSUMER.CREATE.{stream}"
        body = {"stream_name": stream, "config": config.as_dict(), "action": action}
        return ConsumerInfo.from_response(await self._call(api, body))

    async def update_consumer_metadata(self, stream: str, consumer: str,
                                       changes: dict[str, str | None]) -> ConsumerInfo:
        """Set (or, for None, remove) metadata keys of a consumer. Its config goes back as the
        server gave it, so fields :class:`ConsumerConfig` does not model (``backoff`` …) stay."""
        try:
            config = dict((await self._call(f"CONSUMER.INFO.{stream}.{consumer}"))["config"])
        except (StreamNotFoundError, ConsumerNotFoundError) as e:
            raise _named(e, stream, consumer) from None
        metadata = dict(config.get("metadata") or {})
        for key, value in changes.items():
            if value is None:
                metadata.pop(key, None)
            else:
                metadata[key] = value
        config["metadata"] = metadata
        body = {"stream_name": stream, "config": config, "action": "update"}
        return ConsumerInfo.from_response(
            await self._call(f"CONSUMER.CREATE.{stream}.{consumer}", body))

    async def delete_consumer(self, stream: str, consumer: str) -> None:
        await self._call(f"CONSUMER.DELETE.{stream}.{consumer}")

    async def unpin(self, stream: str, consumer: str, group: str) -> None:
        """Release the pin of a ``pinned_client`` group (no-op on an overflow consumer)."""
        await self._call(f"CONSUMER.UNPIN.{stream}.{consumer}", {"group": group})

    async def reset_consumer(self, stream: str, consumer: str, seq: int) -> int:
        """Move the consumer so its next delivery is stream sequence ``seq`` (server 2.14+).

        Returns the sequence the server reset to.
        """
        try:
            answer = await self._call(f"CONSUMER.RESET.{stream}.{consumer}", {"seq": seq})
        except NatsUnavailableError:
            # The server does not answer a reset of a missing consumer or stream: say which is
            # missing instead of a transient "no answer".
            await self.consumer_info(stream, consumer)
            raise
        return int(answer.get("reset_seq", seq))


def _named(error: JetStreamError, stream: str, consumer: str | None = None) -> JetStreamError:
    """The same error, saying which stream or consumer is missing (the server's text names
    neither). The server's words stay first: callers and alerts match on them."""
    if isinstance(error, StreamNotFoundError):
        what = f"{error.description}: {stream!r}"
    elif consumer is not None:
        what = f"{error.description}: {consumer!r} on stream {stream!r}"
    else:
        return error
    return type(error)(what, code=error.code, err_code=error.err_code)


async def first_message_at_or_after(admin: JetStreamAdmin, stream: str,
                                    start_time: str) -> tuple[int, str] | None:
    """``(stream sequence, RFC 3339 time)`` of the first message stored at or after
    ``start_time`` (RFC 3339, up to nanoseconds), or None when no message is that recent.

    ``$JS.API.STREAM.MSG.GET.<stream>`` with ``{"start_time": …}`` (the bound is inclusive at
    nanosecond precision; an earlier time than every message answers the first message still
    stored; a later one answers 404 err_code 10037 "no message found"). The answer
    carries the message's payload too, so this is for resolving a few bounds, not for reading.
    """
    try:
        answer = await admin.conn.request(f"STREAM.MSG.GET.{stream}", {"start_time": start_time},
                                          admin.timeout)
    except JetStreamError as e:
        if e.err_code == 10037:
            return None
        raise
    message = answer.get("message") or {}
    return int(message["seq"]), str(message.get("time") or "")
