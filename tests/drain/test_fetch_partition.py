"""A fetch task's pulls against a real nats-server, without Spark (one partition, no
TaskContext): what the task does to its reused Python worker."""

from __future__ import annotations

import dataclasses
import gc
import time

import pyarrow.parquet as pq
import pytest
from streams import consumer, pub, publish_and_wait

from js_etl.config import load_config
from js_etl.drain.fetch import FetchPlan, fetch_partition
from js_etl.drain.writers.columnar_plan import ColumnarPlan
from js_etl.drain.writers.columnar_task import fetch_decode_write
from js_etl.jetstream import ack_prefix


def plan(nats_options, stream: str, durable: str) -> FetchPlan:
    return FetchPlan(options=nats_options, stream=stream, consumer=durable,
                     ack_prefix=ack_prefix(stream, durable), batch=10, max_bytes=1 << 20,
                     partition_messages=1000, extra_messages=0, partition_bytes=1 << 30,
                     held_bytes=1 << 30,
                     stop_after_seq=2**62, pull_timeout=5, deadline=time.time() + 60)


def test_the_cycle_collector_is_off_while_a_task_pulls_and_on_after(js, names, stream,
                                                                      nats_options):
    """Off for the pulls and whatever consumes their batches (the columnar writer's decode and
    write run between the yields); on again after the task, also after a failed one, because
    the worker process runs the next task."""
    pub(js, f"{names.prefix}.a", 25)
    consumer(js, stream, names.consumer)
    assert gc.isenabled()
    seen = []
    for batch in fetch_partition(plan(nats_options, stream, names.consumer), iter([None])):
        seen.append((batch.num_rows, gc.isenabled()))
    assert seen == [(10, False), (10, False), (5, False)]
    assert gc.isenabled()

    pub(js, f"{names.prefix}.a", 25)
    batches = fetch_partition(plan(nats_options, stream, names.consumer), iter([None]))
    with pytest.raises(RuntimeError, match="the consumer failed"):
        for _ in batches:
            assert not gc.isenabled()
            raise RuntimeError("the consumer failed")
    batches.close()  # what the worker does with a task's abandoned iterator
    assert gc.isenabled()


def test_what_lives_when_a_workers_first_tasks_start_is_frozen_out_of_the_cycle_collector(
        js, names, stream, nats_options, monkeypatch):
    """PySpark's daemon runs a full gc.collect() after every task in a reused worker: with the
    worker's imports frozen at its first two tasks' start, that collect walks only what later
    tasks made; the third task freezes nothing (jetstream.arrow.task_gc says why)."""
    from js_etl.jetstream import arrow

    pub(js, f"{names.prefix}.a", 15)
    consumer(js, stream, names.consumer)
    monkeypatch.setattr(arrow, "_FREEZES", 2)  # a fresh worker process
    gc.unfreeze()
    try:
        seen = []
        for _ in range(3):
            alive = [object()]  # a tracked object that lives when the task starts
            task = plan(nats_options, stream, names.consumer)
            got = sum(b.num_rows for b in fetch_partition(dataclasses.replace(
                task, partition_messages=5), iter([None])))
            seen.append((got, any(o is alive for o in gc.get_objects())))
        assert seen == [(5, False), (5, False), (5, True)]
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()  # the test process's own objects back to the collector


def test_a_worker_with_the_collector_off_keeps_it_off(js, names, stream, nats_options):
    pub(js, f"{names.prefix}.a", 5)
    consumer(js, stream, names.consumer)
    gc.disable()
    try:
        assert sum(b.num_rows for b in fetch_partition(plan(nats_options, stream, names.consumer),
                                                       iter([None]))) == 5
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_columnar_task_counts_the_headers_of_the_dead_letters_it_holds(js, names, stream,
                                                                          nats_options, tmp_path):
    """fetch.partition_max_bytes bounds the dead letters a columnar task holds for its round,
    headers and all: dead letters of empty payloads and 8 KiB of headers each must not get
    through as 0 bytes (a break-it review: 2,000 of them passed a 1 MiB budget)."""
    headers = [("Pad", "x" * 8000)]
    publish_and_wait(js, names, [(f"{names.prefix}.a", b"", headers)] * 200)
    consumer(js, stream, names.consumer, max_ack_pending=-1)
    decode = load_config(None, ["source.stream=S", "source.consumer=c", "target.path=/t",
                                "decode.format=json", "decode.schema=id BIGINT"],
                         environ={}).decode
    from pyspark.sql.types import LongType, StructField, StructType

    columnar = ColumnarPlan(str(tmp_path), decode,
                            StructType([StructField("id", LongType())]).json(), (), None, "part-x",
                            None)
    fetch = dataclasses.replace(plan(nats_options, stream, names.consumer), batch=200,
                                max_bytes=16 << 10, held_bytes=64 << 10)
    output = list(fetch_decode_write(fetch, columnar, 1, iter([0])))
    (described,) = [o.dead_letters for o in output if o.dead_letters is not None]
    dead = pq.read_table(tmp_path / described.path)
    # The task stops asking once it holds the budget, less its two pulls in flight.
    assert 0 < dead.nbytes < (64 << 10) + 2 * (16 << 10) * 2
    assert 0 < dead.num_rows == described.rows < 200
