"""The fetch that runs on executors: one partition = one NATS connection pulling no_wait batches
from the durable consumer until its budget is spent or the consumer has nothing more, emitting
Arrow record batches (``mapInArrow``), one per pull, with no per-row Spark conversion.

Nothing here acks: acks come from what a Delta commit holds (see :mod:`js_etl.drain.run`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from js_etl.faults import fail_first_attempt, hold_task, start_late
from js_etl.jetstream import ConnectionOptions, JetStreamSession, PullEnd
from js_etl.jetstream.arrow import raise_for_pull, task_gc, to_record_batch
from js_etl.jetstream.pull import PriorityGroupRequest, PullResult
from js_etl.jetstream.subjects import (
    AckMetadata,
)


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """What every partition of one round does. Picklable: it travels to the executors."""

    options: ConnectionOptions
    stream: str
    consumer: str
    ack_prefix: str  # replies must start with it: acks are rebuilt from rows with this prefix
    batch: int  # messages per pull
    max_bytes: int  # bytes per pull (server-side max_bytes)
    partition_messages: int  # message budget of one partition in this round ...
    extra_messages: int  # ... plus one for partitions 0 .. extra_messages - 1
    partition_bytes: int  # bytes one partition may fetch this round (run.max_bytes share, cap)
    held_bytes: int  # ... and may hold until the commit (fetch.partition_max_bytes: memory)
    stop_after_seq: int  # the run's target: a partition stops once it sees a later message
    pull_timeout: float  # client deadline of one pull
    # The round's one deadline, as wall-clock epoch seconds set by the driver when the round
    # starts: no pull is sent after it, whenever a task starts (waves beyond the executor
    # cores, retries, scheduling delays). See js_etl.drain.run for why it keeps every
    # delivery of a round inside ack_wait; it assumes executor clocks agree with the
    # driver's to well under ack_wait / 3 (NTP).
    deadline: float
    priority_group: PriorityGroupRequest | None = None  # a priority-group consumer's fields
    fault: str | None = None  # test-only fault point, see js_etl.faults
    fault_seconds: float = 0.0  # ... and how long a delaying fault point waits
    fault_gate: str | None = None  # ... and where a holding one waits (js_etl.faults.hold_task)


def fetch_partition(plan: FetchPlan, elements: Iterator[object],
                    held: Callable[[], int] | None = None) -> Iterator[pa.RecordBatch]:
    """The pulls of one task of a round, one task per partition. Its input ``elements`` (one,
    its index: a row of ``spark.range(partitions)`` for a ``mapInArrow``, an int for the
    columnar writer's ``mapPartitions``) carry nothing it needs.

    ``held``: how many bytes of the batches yielded so far the caller still holds, checked
    against ``plan.held_bytes`` before every pull; by default all the pulls' bytes (Spark's
    writer holds every fetched row until the round's commit).

    Two pulls are in flight, on two inboxes of one connection, so the server fills the next
    batch while this worker converts the last one (with one pull at a time the worker waits on
    its socket for a good part of the fetch). Every pull that was sent is
    collected and its messages emitted, and a pull is only sent while the partition's message
    and byte budgets cover it in full, so the budgets hold exactly as with one pull at a time.
    Priority groups keep one pull in flight: the pin is granted by a delivery, to one pull.
    """
    for _ in elements:  # read them all, as a task does
        pass
    start_late(plan.fault, plan.fault_seconds)
    if time.time() >= plan.deadline:
        return  # started too late: this round's window for pulls has closed
    from pyspark import TaskContext

    context = TaskContext.get()
    index = context.partitionId() if context is not None else 0
    budget = plan.partition_messages + (1 if index < plan.extra_messages else 0)
    with task_gc(), JetStreamSession(plan.options) as js:
        depth = 1 if plan.priority_group else 2
        pullers = [js.puller(plan.stream, plan.consumer, priority_group=plan.priority_group)
                   for _ in range(depth)]
        in_flight: deque[tuple[asyncio.Task[PullResult], int]] = deque()
        sent = 0  # pulls sent; pull k goes through pullers[k % depth]
        got = size = 0
        stop = False
        try:
            while True:
                while not stop and len(in_flight) < depth:
                    # In-flight pulls count as full: as many messages as asked, max_bytes.
                    room = budget - got - sum(n for _, n in in_flight)
                    coming = len(in_flight) * plan.max_bytes
                    if (room <= 0 or size + coming >= plan.partition_bytes
                            or (size if held is None else held()) + coming >= plan.held_bytes):
                        break
                    if time.time() >= plan.deadline:
                        stop = True  # keep the round well inside ack_wait: no redelivery
                        break
                    n = min(plan.batch, room)
                    in_flight.append((js.start_pull(pullers[sent % depth], n,
                                                    max_bytes=plan.max_bytes,
                                                    timeout=plan.pull_timeout), n))
                    sent += 1
                if not in_flight:
                    return
                result = js.run(in_flight.popleft()[0])
                if result.messages:
                    yield to_record_batch(result.messages, plan.ack_prefix)
                    got += len(result.messages)
                    size += result.bytes
                    # Every task's first attempt, once it holds deliveries (whichever partition
                    # gets them: another one may have drained the stream first).
                    fail_first_attempt("fail_fetch_task", plan.fault)
                    hold_task(plan.fault_gate, repr(plan.deadline))
                if result.end in (PullEnd.NO_MESSAGES, PullEnd.REQUESTS_PENDING,
                                  PullEnd.DEADLINE, PullEnd.PIN_MISMATCH):
                    # Drained for now, at max_ack_pending, or not (or no longer) the pinned
                    # client: commit what we have; the driver reads the pin state between rounds.
                    stop = True
                    continue
                raise_for_pull(result)  # disconnects, errors: fail this task attempt
                if result.messages and _nothing_left(result.messages[-1].metadata,
                                                     plan.stop_after_seq):
                    stop = True
        finally:
            js.cancel(task for task, _ in in_flight)  # only after a failure: the attempt fails


def _nothing_left(last: AckMetadata, stop_after_seq: int) -> bool:
    """Whether the last delivery of a pull says this partition can stop without another pull:
    it is past the run's target, or it is a first delivery whose pending token is 0 (nothing
    undelivered left). The server does not count redeliveries in that token, so after a
    redelivery only a 404 tells."""
    return last.stream_seq >= stop_after_seq or (last.num_delivered == 1
                                                 and last.num_pending == 0)


