"""JetStream admin requests: stream/consumer info, creating and checking the drain consumer,
UNPIN, and consumer reset. Raw ``$JS.API`` requests, because nats-py cannot express priority
groups (and we want one typed error per server ``err_code``)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from js_etl.jetstream.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    StreamInfo,
)
from js_etl.jetstream.client import JetStreamConnection
from js_etl.jetstream.errors import (
    ConsumerConfigError,
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

    async def purge_stream(self, name: str, *, keep: int | None = None) -> None:
        await self._call(f"STREAM.PURGE.{name}", {"keep": keep} if keep is not None else None)

    async def consumer_info(self, stream: str, consumer: str) -> ConsumerInfo:
        return ConsumerInfo.from_response(await self._consumer_info_raw(stream, consumer))

    async def _consumer_info_raw(self, stream: str, consumer: str) -> dict[str, Any]:
        try:
            return await self._call(f"CONSUMER.INFO.{stream}.{consumer}")
        except (StreamNotFoundError, ConsumerNotFoundError) as e:
            raise _named(e, stream, consumer) from None

    async def create_consumer(self, stream: str, config: ConsumerConfig, *,
                              action: str = "create") -> ConsumerInfo:
        """Create (``action="create"``: fail if it exists with another config) or update."""
        name = config.durable_name or config.name
        api = f"CONSUMER.CREATE.{stream}.{name}" if name else f"CONSUMER.CREATE.{stream}"
        body = {"stream_name": stream, "config": config.as_dict(), "action": action}
        return ConsumerInfo.from_response(await self._call(api, body))

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
            # The server does not answer a reset of a missing consumer or stream (measured on
            # 2.15.1): say which is missing instead of a transient "no answer".
            await self.consumer_info(stream, consumer)
            raise
        return int(answer.get("reset_seq", seq))

    async def ensure_drain_consumer(self, stream: str, desired: ConsumerConfig, *,
                                    create: bool, min_ack_wait: float) -> ConsumerInfo:
        """The durable pull consumer a drain uses: checked if it exists, else created.

        Raises ConsumerNotFoundError (with the fix) when it is missing and ``create`` is off, and
        ConsumerConfigError when an existing one cannot serve a drain.
        """
        name = desired.durable_name or ""
        ack_wait = max(desired.ack_wait or 0.0, min_ack_wait)
        try:
            raw = await self._consumer_info_raw(stream, name)
        except ConsumerNotFoundError as e:
            if not create:
                command = consumer_add_command(stream, name, replace(desired, ack_wait=ack_wait))
                raise ConsumerNotFoundError(
                    f"consumer {name!r} not found on stream {stream!r}: create it (set "
                    f"source.create_consumer: true, or run `{command}`)",
                    code=e.code or 404, err_code=e.err_code or 10014) from None
            info = await self.create_consumer(stream, replace(desired, ack_wait=ack_wait))
            raw = {"config": {}}
        else:
            info = ConsumerInfo.from_response(raw)
        problems = drain_consumer_problems(
            info.config, min_ack_wait=min_ack_wait, stream=stream, consumer=name,
            headers_only=bool((raw.get("config") or {}).get("headers_only")))
        if problems:
            raise ConsumerConfigError(f"consumer {stream}/{name} cannot be drained: "
                                      + "; ".join(problems))
        return info


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


def consumer_add_command(stream: str, name: str, config: ConsumerConfig) -> str:
    """The ``nats`` CLI command (v0.5) that creates the durable pull consumer a drain wants.
    ``--defaults`` lets it run without a terminal (without it the CLI prompts, and fails)."""
    parts = ["nats consumer add", stream, name, "--pull", "--ack explicit"]
    if config.ack_wait:
        parts.append(f"--wait {config.ack_wait:g}s")
    if config.max_ack_pending:
        parts.append(f"--max-pending {config.max_ack_pending}")
    parts += [f"--filter {subject}" for subject in config.filter_subjects]
    parts.append("--defaults")
    return " ".join(parts)


def drain_consumer_problems(config: ConsumerConfig, *, min_ack_wait: float,
                            stream: str = "STREAM", consumer: str = "CONSUMER",
                            headers_only: bool = False) -> list[str]:
    """What keeps an existing consumer from serving an ack-after-commit drain, each with the
    ``nats`` CLI command that fixes it (v0.5; each runs as printed, without a terminal)."""
    problems = []
    replacement = (f"`nats consumer add {stream} {consumer}_pull --pull --ack explicit "
                   "--defaults`, then set source.consumer to it")
    if config.deliver_subject:
        problems.append("it is a push consumer (deliver_subject set); a drain needs a pull "
                        f"consumer: create one under a new name, e.g. {replacement}")
    if config.ack_policy is not AckPolicy.EXPLICIT:
        problems.append(f"ack policy is {config.ack_policy.value!r}; a drain acks each message "
                        "after its Delta commit and needs 'explicit'; an ack policy cannot be "
                        f"changed, so create a new consumer, e.g. {replacement}")
    if headers_only:
        problems.append("it delivers headers only (headers_only), so every payload would be "
                        "lost: turn it off with "
                        f"`nats consumer edit {stream} {consumer} --no-headers-only -f`")
    if config.ack_wait is not None and config.ack_wait < min_ack_wait:
        seconds = math.ceil(min_ack_wait) + 1
        problems.append(f"ack_wait {config.ack_wait:g}s is shorter than one round needs "
                        f"({min_ack_wait:g}s): messages would be redelivered before their "
                        "commit; raise it with "
                        f"`nats consumer edit {stream} {consumer} --wait {seconds}s -f`, or lower "
                        "fetch.pull_timeout (a round needs 3 x fetch.pull_timeout)")
    if config.max_deliver is not None and config.max_deliver > 0:
        # The server drops a message after max_deliver deliveries and moves its ack floor past
        # it (reference §13); a run that dies after fetching, or a fence NAK, spends a delivery
        # without committing. No timing makes that safe, so the drain refuses the limit.
        problems.append(f"max_deliver {config.max_deliver}: the server drops a message after "
                        "that many deliveries, and a run that dies after fetching spends one, so "
                        "a crash could lose messages for good (js-etl parks poison itself: "
                        "source.max_deliver); remove the limit with "
                        f"`nats consumer edit {stream} {consumer} --max-deliver=-1 -f`")
    if config.max_ack_pending == 0:
        problems.append("max_ack_pending is 0")
    return problems


async def first_message_at_or_after(admin: JetStreamAdmin, stream: str,
                                    start_time: str) -> tuple[int, str] | None:
    """``(stream sequence, RFC 3339 time)`` of the first message stored at or after
    ``start_time`` (RFC 3339, up to nanoseconds), or None when no message is that recent.

    ``$JS.API.STREAM.MSG.GET.<stream>`` with ``{"start_time": …}`` (measured on 2.15.1: the bound
    is inclusive at nanosecond precision; an earlier time than every message answers the first
    message still stored; a later one answers 404 err_code 10037 "no message found"). The answer
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
