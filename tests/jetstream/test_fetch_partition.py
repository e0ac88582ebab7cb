"""A fetch task's pulls against a real nats-server, without Spark (one partition, no
TaskContext): what the task does to its reused Python worker."""

from __future__ import annotations

import gc
import time

import pytest
from streams import consumer, pub

from js_etl.jetstream import ack_prefix
from js_etl.spark.fetch import FetchPlan, fetch_partition


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
