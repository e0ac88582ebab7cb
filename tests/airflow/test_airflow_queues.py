"""Event-driven scheduling: the ``nats`` scheme of common.messaging's MessageQueueTrigger, against
a real nats-server (with a token) in a real asyncio loop."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from airflow_support import TOKEN

from js_etl.demo.publish import publish, wait_for_messages
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


def test_watcher_rearms_after_a_drain(tjs, names):
    """Fires at N, stays quiet while the backlog stays, fires again once it has seen the backlog
    fall below N (a drain) and cross N again."""
    from js_etl.airflow import JetStreamBacklogEventTrigger
    from js_etl.jetstream import JetStreamAdmin

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



def test_a_watcher_on_a_missing_consumer_logs_backs_off_and_fires_once_it_exists(tjs, names,
                                                                                caplog):
    """A missing consumer needs a fix: no event (it would start a DAG run), no failed trigger
    (the triggerer would restart it at once, a crash loop), but an error logged each check, the
    checks further and further apart, on the one connection; once the consumer exists with a
    backlog, the watcher fires."""
    import logging
    import re

    from js_etl.airflow import JetStreamBacklogEventTrigger
    from js_etl.jetstream import JetStreamAdmin

    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    trigger = JetStreamBacklogEventTrigger(nats_conn_id="nats_test", stream=names.stream,
                                           consumer=names.consumer, poll_interval=0.05)

    def waits() -> list[float]:
        return [float(m[1]) for r in caplog.records if r.name == "js_etl.airflow.triggers"
                and r.levelno == logging.ERROR
                and (m := re.search(r"ConsumerNotFoundError.*checking again in ([0-9.]+)s",
                                    r.getMessage()))]

    async def scenario() -> Any:
        events = trigger.run()
        first = asyncio.ensure_future(anext(events))
        try:
            await _wait_until(lambda: first.done() or len(waits()) >= 3, "three checks", 60)
            assert not first.done(), first  # neither an event nor an exception
            conn = await JetStreamConnection.open(ConnectionOptions(
                servers=tjs.conn.options.servers, token=Secret(TOKEN), connect_timeout=2))
            try:
                await JetStreamAdmin(conn).create_consumer(names.stream, ConsumerConfig(
                    durable_name=names.consumer, ack_policy=AckPolicy.EXPLICIT))
                await publish(conn, [(f"{names.prefix}.e", b"m")])
            finally:
                await conn.close()
            return await asyncio.wait_for(first, 60)
        finally:
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            await events.aclose()

    with caplog.at_level(logging.WARNING, logger="js_etl.airflow.triggers"):
        event = asyncio.run(asyncio.wait_for(scenario(), 90))
    assert event.payload["num_pending"] == 1
    seen = waits()
    assert seen[:3] == [0.1, 0.2, 0.4], seen  # doubling from poll_interval
    assert not any("retrying in" in r.getMessage() for r in caplog.records)  # one connection


def _sync_dags_folder_and_unpause(dag_id: str) -> None:
    """What the DAG processor does: serialise the bundle's DAGs into the metadata DB; then the
    user's unpause, and a second sync, which registers the asset watchers' triggers (Airflow
    only does so for assets of active, unpaused DAGs)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    manager = DagBundlesManager()
    with create_session() as session:
        manager.sync_bundles_to_db(session=session)
    (bundle,) = [b for b in manager.get_all_dag_bundles() if b.name == "dags-folder"]
    if not bundle.is_initialized:
        bundle.initialize()

    def sync() -> None:
        bag = BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path,
                           bundle_name=bundle.name)
        sync_bag_to_db(bag, bundle.name, bundle.version)

    sync()
    with create_session() as session:
        session.get(DagModel, dag_id).is_paused = False
    sync()


def test_a_real_triggerer_starts_the_watcher_dag_which_drains_the_backlog(
        tjs, names, tmp_path, spark, capfd, monkeypatch, request):
    """The example DAG (dags/drain_on_backlog_event.py, on a test stream): a real
    `airflow triggerer` process runs its nats watcher; N messages make one asset event that
    queues a run of the DAG (what the scheduler turns into a DAG run), and that run drains."""
    import subprocess
    import sys

    from airflow.models.asset import AssetDagRunQueue, AssetEvent, AssetModel
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session
    from airflow_support import DAGS_FOLDER, REPO, failures, load_dag, task_states, xcom

    n = 20
    _stream_with_consumer(tjs, names)
    table = tmp_path / "table"
    config = tmp_path / "job.yaml"
    config.write_text(
        f"source: {{stream: {names.stream}, consumer: {names.consumer}}}\n"
        "fetch: {partitions: 2, batch: 100, pull_timeout: 2}\n"
        f"target: {{path: '{table}'}}\n"
        "spark: {conf: {spark.sql.shuffle.partitions: 2,"
        " spark.databricks.delta.snapshotPartitions: 2}}\n")
    dag_id = f"watcher_drain_{names.stream}"
    source = (REPO / "dags" / "drain_on_backlog_event.py").read_text()
    monkeypatch.setenv("JS_ETL_DAG_CONFIG", str(config))  # read where the drain runs
    # The watcher's consumer, named where the DAG is parsed (the triggerer inherits these).
    monkeypatch.setenv("JS_ETL_DAG_STREAM", names.stream)
    monkeypatch.setenv("JS_ETL_DAG_CONSUMER", names.consumer)
    for old, new in (('"js_etl_drain_on_backlog_event"', repr(dag_id)),
                     ('nats_conn_id="nats_default"', 'nats_conn_id="nats_test"'),
                     ("min_pending=500", f"min_pending={n}"),
                     ("poll_interval=30", "poll_interval=0.2")):
        assert old in source, old
        source = source.replace(old, new)
    path = DAGS_FOLDER / f"{dag_id}.py"
    path.write_text(source)
    # Gone with this test's environment: parsed again without it, by another test's dag.test(),
    # it would watch the default consumer, a new trigger that test did not make.
    request.addfinalizer(lambda: path.unlink(missing_ok=True))
    asset_name = f"nats_backlog_{names.stream}_{names.consumer}"
    _sync_dags_folder_and_unpause(dag_id)
    with create_session() as session:
        (trigger,) = [t for t in session.query(Trigger).all()
                      if t.kwargs.get("stream") == names.stream]
        assert trigger.classpath == "js_etl.airflow.triggers.JetStreamBacklogEventTrigger"
        trigger_id = trigger.id

    triggerer = subprocess.Popen(
        # No log server: it would bind a fixed port, which a second copy of the suite shares.
        [str(Path(sys.executable).with_name("airflow")), "triggerer", "--skip-serve-logs"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def triggerer_runs_it() -> bool:
            with create_session() as session:
                return session.get(Trigger, trigger_id).triggerer_id is not None

        _poll(triggerer_runs_it, "the triggerer to take the watcher's trigger", 120, triggerer)
        publish_sync(tjs, names, n - 1)
        publish_sync(tjs, names, 1)
        started = time.monotonic()

        def event() -> list[dict]:
            with create_session() as session:
                return [dict(e.extra) for e in session.query(AssetEvent).join(
                    AssetEvent.asset).filter(AssetModel.name == asset_name).all()]

        _poll(event, "the watcher's asset event", 120, triggerer)
        seconds = time.monotonic() - started
        with create_session() as session:
            queued = [q.target_dag_id for q in session.query(AssetDagRunQueue).all()]
    finally:
        triggerer.terminate()
        try:
            out, _ = triggerer.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            triggerer.kill()
            out, _ = triggerer.communicate()
    with capfd.disabled():
        print(f"\npublish of the N-th message -> asset event by a real triggerer: {seconds:.2f}s")
    (fired,) = event()
    assert fired["from_trigger"] is True
    assert fired["payload"] == {"stream": names.stream, "consumer": names.consumer,
                                "num_pending": n, "min_pending": n}, out[-3000:]
    assert dag_id in queued  # the scheduler's input: this DAG's next run is due

    dag_run = load_dag(path).test()
    assert task_states(dag_run) == {"drain": "success"}, failures(dag_id)
    assert xcom(dag_run, "drain")["messages_written"] == n
    assert spark.read.format("delta").load(str(table)).count() == n


def publish_sync(tjs, names, count: int) -> None:
    before = tjs.stream_info(names.stream).state.last_seq
    tjs.run(publish(tjs.conn, [(f"{names.prefix}.e", b"m")] * count))
    tjs.run(wait_for_messages(tjs.conn, names.stream, before + count))


def _poll(condition, what: str, timeout: float, process) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the triggerer exited ({process.returncode}) waiting for {what}:"
                                 f" {process.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_an_unreachable_server_is_retried_not_an_error_nor_an_event(token_server, caplog):
    """The watcher outlives a NATS outage: each failed poll is logged and retried."""
    import logging

    from js_etl.airflow import JetStreamBacklogEventTrigger

    trigger = JetStreamBacklogEventTrigger(nats_conn_id="nats_closed", stream="S", consumer="c",
                                           poll_interval=0.05)

    def retries() -> int:
        return sum("retrying in" in r.getMessage() for r in caplog.records
                   if r.name == "js_etl.airflow.triggers")

    async def scenario() -> bool:
        events = trigger.run()
        first = asyncio.ensure_future(anext(events))
        try:
            await _wait_until(lambda: first.done() or retries() >= 3, "three failed polls", 60)
            return first.done()
        finally:
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            await events.aclose()

    with caplog.at_level(logging.WARNING, logger="js_etl.airflow.triggers"):
        ended = asyncio.run(scenario())
    assert not ended  # neither an event nor an exception
    assert retries() >= 3
