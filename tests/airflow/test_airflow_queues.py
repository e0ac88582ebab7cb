"""Event-driven scheduling: the ``nats`` scheme of common.messaging's MessageQueueTrigger, against
a real nats-server (with a token) in a real asyncio loop."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from airflow_support import TOKEN

from js_etl.dev.publish import publish, wait_for_messages
from js_etl.jetstream import (
    AckPolicy,
    ConnectionOptions,
    ConsumerConfig,
    JetStreamConnection,
    Secret,
)

CLASSPATH = "js_etl.airflow.triggers.JetStreamBacklogEventTrigger"


def _stream_with_consumer(tjs, names) -> None:
    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    tjs.run(tjs.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_policy=AckPolicy.EXPLICIT)))


def test_the_nats_scheme_is_registered_and_serialises_ids_and_numbers_only(token_server):
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
    from airflow.providers_manager import ProvidersManager

    assert "js_etl.airflow.queues.NatsMessageQueueProvider" in \
        ProvidersManager().queue_class_names
    trigger = MessageQueueTrigger(scheme="nats", nats_conn_id="nats_test", stream="ORDERS",
                                  consumer="orders_to_delta", min_pending=100,
                                  poll_interval=0.5)
    classpath, kwargs = trigger.serialize()
    assert classpath == CLASSPATH  # what the triggerer runs: the trigger itself
    assert kwargs == {"nats_conn_id": "nats_test", "stream": "ORDERS",
                      "consumer": "orders_to_delta", "min_pending": 100, "poll_interval": 0.5}
    assert TOKEN not in json.dumps(kwargs)
    # Watchers of one consumer share a poll whatever their threshold; another consumer doesn't.
    from js_etl.airflow import JetStreamBacklogEventTrigger

    same = JetStreamBacklogEventTrigger(**{**kwargs, "min_pending": 5})
    other = JetStreamBacklogEventTrigger(**{**kwargs, "consumer": "other"})
    assert same.shared_stream_key() == trigger.trigger.shared_stream_key()
    assert other.shared_stream_key() != trigger.trigger.shared_stream_key()


def test_the_deprecated_queue_uri_form_names_stream_and_consumer():
    from js_etl.airflow.queues import NatsMessageQueueProvider

    provider = NatsMessageQueueProvider()
    assert provider.scheme_matches("nats")
    assert provider.queue_matches("nats://ORDERS/orders_to_delta")
    assert provider.trigger_kwargs("nats://ORDERS/orders_to_delta") == {
        "stream": "ORDERS", "consumer": "orders_to_delta"}
    for queue in ("nats://ORDERS", "kafka://ORDERS/c", "nats://ORDERS/c/extra", "nats:///c"):
        assert not provider.queue_matches(queue), queue


def test_event_trigger_refuses_bad_thresholds():
    from js_etl.airflow import JetStreamBacklogEventTrigger

    for bad in (0, -1, True, "x", 1.5):
        with pytest.raises(ValueError, match="min_pending must be an integer >= 1"):
            JetStreamBacklogEventTrigger(stream="S", consumer="c", min_pending=bad)
    with pytest.raises(ValueError, match="poll_interval must be a positive"):
        JetStreamBacklogEventTrigger(stream="S", consumer="c", poll_interval=0)


async def _wait_until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_watcher_fires_exactly_when_the_backlog_crosses_n(tjs, names):
    """Through the triggerer's shared-stream path (one poll, a filter per watcher): N-1 pending
    is seen and gives no event, the N-th message fires once, and a second watcher with another
    threshold on the same poll fires on its own crossing."""
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    from js_etl.airflow import JetStreamBacklogEventTrigger

    _stream_with_consumer(tjs, names)
    n = 3
    watcher = MessageQueueTrigger(scheme="nats", nats_conn_id="nats_test", stream=names.stream,
                                  consumer=names.consumer, min_pending=n, poll_interval=0.05)
    trigger = watcher.trigger
    assert isinstance(trigger, JetStreamBacklogEventTrigger)
    bigger = JetStreamBacklogEventTrigger(**{**trigger.serialize()[1], "min_pending": n + 2})
    assert bigger.shared_stream_key() == trigger.shared_stream_key()

    async def scenario() -> dict[str, Any]:
        snapshots: list[int] = []
        subscribers: list[asyncio.Queue[dict[str, Any]]] = [asyncio.Queue(), asyncio.Queue()]

        async def fan_out() -> None:  # what the triggerer's SharedStreamManager does
            kwargs = trigger.serialize()[1]
            async for snapshot in JetStreamBacklogEventTrigger.open_shared_stream(kwargs):
                snapshots.append(snapshot["num_pending"])
                for queue in subscribers:
                    await queue.put(snapshot)

        async def subscribe(queue: asyncio.Queue[dict[str, Any]]) -> AsyncIterator[Any]:
            while True:
                yield await queue.get()

        events: dict[str, list[dict[str, Any]]] = {"n": [], "bigger": []}

        async def collect(name: str, t: JetStreamBacklogEventTrigger, q: asyncio.Queue) -> None:
            async for event in t.filter_shared_stream(subscribe(q)):
                events[name].append(event.payload)

        def seen_after(count: int, pending: int) -> bool:
            # a snapshot with `pending` exists and both filters have taken everything so far
            return pending in snapshots[count:] and all(q.empty() for q in subscribers)

        tasks = [asyncio.create_task(fan_out()),
                 asyncio.create_task(collect("n", trigger, subscribers[0])),
                 asyncio.create_task(collect("bigger", bigger, subscribers[1]))]
        conn = await JetStreamConnection.open(ConnectionOptions(
            servers=tjs.conn.options.servers, token=Secret(TOKEN), connect_timeout=2))
        try:
            await _wait_until(lambda: seen_after(0, 0), "a poll of the empty consumer")
            await publish(conn, [(f"{names.prefix}.e", b"m")] * (n - 1))
            await wait_for_messages(conn, names.stream, n - 1)
            mark = len(snapshots)
            await _wait_until(lambda: seen_after(mark, n - 1), f"{n - 1} pending seen")
            mark = len(snapshots)
            await _wait_until(lambda: len(snapshots) >= mark + 2 and seen_after(mark, n - 1),
                              "two more polls at N-1")
            at_n_minus_1 = {k: list(v) for k, v in events.items()}
            await publish(conn, [(f"{names.prefix}.e", b"m")])
            await _wait_until(lambda: events["n"], "the event at N")
            mark = len(snapshots)
            # more polls at N: still one event (edge-triggered), the bigger one still quiet
            await _wait_until(lambda: len(snapshots) >= mark + 3 and seen_after(mark, n),
                              "three more polls at N")
            at_n = {k: list(v) for k, v in events.items()}
            await publish(conn, [(f"{names.prefix}.e", b"m")] * 2)
            await _wait_until(lambda: events["bigger"], "the event at N+2")
            return {"at_n_minus_1": at_n_minus_1, "at_n": at_n, "final": events}
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await conn.close()

    result = asyncio.run(asyncio.wait_for(scenario(), 90))
    assert result["at_n_minus_1"] == {"n": [], "bigger": []}
    fired = {"stream": names.stream, "consumer": names.consumer, "num_pending": n,
             "min_pending": n}
    assert result["at_n"] == {"n": [fired], "bigger": []}
    assert result["final"] == {"n": [fired], "bigger": [
        {**fired, "num_pending": n + 2, "min_pending": n + 2}]}


def test_watcher_rearms_after_a_drain_and_fails_on_a_missing_consumer(tjs, names):
    """Fires at N, stays quiet while the backlog stays, fires again once it has seen the backlog
    fall below N (a drain) and cross N again; a consumer that does not exist is an error of the
    standalone run(), never an event (an event would start a DAG run)."""
    from js_etl.airflow import JetStreamBacklogEventTrigger
    from js_etl.jetstream import JetStreamAdmin
    from js_etl.jetstream.errors import ConsumerNotFoundError

    _stream_with_consumer(tjs, names)
    trigger = JetStreamBacklogEventTrigger(nats_conn_id="nats_test", stream=names.stream,
                                           consumer=names.consumer, min_pending=2,
                                           poll_interval=0.05)

    async def scenario() -> list[int]:
        snapshots: list[int] = []

        async def observed() -> AsyncIterator[Any]:
            async for snapshot in type(trigger).open_shared_stream(trigger.serialize()[1]):
                snapshots.append(snapshot["num_pending"])
                yield snapshot

        conn = await JetStreamConnection.open(ConnectionOptions(
            servers=tjs.conn.options.servers, token=Secret(TOKEN), connect_timeout=2))
        admin = JetStreamAdmin(conn)
        events = trigger.filter_shared_stream(observed())
        pending: asyncio.Future[Any] | None = None
        try:
            await publish(conn, [(f"{names.prefix}.e", b"m")] * 2)
            first = await asyncio.wait_for(anext(events), 30)
            pending = asyncio.ensure_future(anext(events))  # keeps the filter polling
            # what a drain's acks amount to: the consumer moves past everything
            last = (await admin.stream_info(names.stream)).state.last_seq
            await admin.reset_consumer(names.stream, names.consumer, last + 1)
            mark = len(snapshots)
            await _wait_until(lambda: 0 in snapshots[mark:], "a poll of the drained consumer")
            assert not pending.done()
            await publish(conn, [(f"{names.prefix}.e", b"m")] * 2)
            second = await asyncio.wait_for(pending, 30)
            return [first.payload["num_pending"], second.payload["num_pending"]]
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            await events.aclose()
            await conn.close()

    assert asyncio.run(asyncio.wait_for(scenario(), 90)) == [2, 2]

    missing = JetStreamBacklogEventTrigger(nats_conn_id="nats_test", stream=names.stream,
                                           consumer="no_such_consumer", poll_interval=0.05)

    async def first_of_missing() -> Any:
        return await anext(missing.run())

    with pytest.raises(ConsumerNotFoundError, match="no_such_consumer"):
        asyncio.run(asyncio.wait_for(first_of_missing(), 30))
