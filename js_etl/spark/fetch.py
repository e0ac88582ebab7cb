"""The fetch that runs on executors: one partition = one NATS connection pulling no_wait batches
from the durable consumer until its budget is spent or the consumer has nothing more, emitting
Arrow record batches (``mapInArrow``), one per pull, with no per-row Spark conversion.

Also the raw row both readers emit (:data:`js_etl.schema.RAW`, :func:`to_record_batch`; the
backfill's range reader is :mod:`js_etl.spark.read_range`), and the job settings that fix a
failed pull (:func:`raise_for_pull`).

Nothing here acks: acks come from what a Delta commit holds (see :mod:`js_etl.spark.drain`).
"""

from __future__ import annotations

import asyncio
import gc
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate

import pyarrow as pa
import pyarrow.compute as pc

from js_etl.errors import TerminalError
from js_etl.faults import fail_first_attempt, start_late
from js_etl.jetstream import ConnectionOptions, JetStreamSession, PullEnd
from js_etl.jetstream.errors import NatsUnavailableError, PullLimitError
from js_etl.jetstream.message import Deliveries, parse_headers
from js_etl.jetstream.pull import PriorityGroupRequest, PullResult
from js_etl.jetstream.subjects import (
    AckMetadata,
    ForeignAckSubjectError,
    parse_ack_columns,
    prefix_stream,
)
from js_etl.schema import raw_arrow

# Transport headers the server adds for its own protocol, not part of the message.
_TRANSPORT_HEADERS = ("Nats-Pin-Id",)


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
    # cores, retries, scheduling delays). See js_etl.spark.drain for why it keeps every
    # delivery of a round inside ack_wait; it assumes executor clocks agree with the
    # driver's to well under ack_wait / 3 (NTP).
    deadline: float
    priority_group: PriorityGroupRequest | None = None  # a priority-group consumer's fields
    fault: str | None = None  # test-only fault point, see js_etl.faults
    fault_seconds: float = 0.0  # ... and how long a delaying fault point waits


def fetch_partition(plan: FetchPlan, elements: Iterator[object],
                    held: Callable[[], int] | None = None) -> Iterator[pa.RecordBatch]:
    """The pulls of one task of a round, one task per partition. Its input ``elements`` (one,
    its index: a row of ``spark.range(partitions)`` for the Spark writer's ``mapInArrow``, an
    int for the columnar writer's ``mapPartitions``) carry nothing it needs.

    ``held``: how many bytes of the batches yielded so far the caller still holds, checked
    against ``plan.held_bytes`` before every pull; by default all the pulls' bytes (Spark's
    writer holds every fetched row until the round's commit).

    Two pulls are in flight, on two inboxes of one connection, so the server fills the next
    batch while this worker converts the last one (profiled: with one pull at a time the worker
    waited on its socket for about a quarter of the fetch). Every pull that was sent is
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


_FREEZES = 2  # task_gc: how many more tasks of this worker process freeze what lives


@contextmanager
def task_gc() -> Iterator[None]:
    """How a fetch task (or a backfill's range read) uses the worker's cycle collector: what
    lives when the task starts is frozen out of it, and it is off while the task pulls (and,
    since this is a generator, while its consumer decodes and writes each batch); on again
    after, in this reused worker.

    Why off: every frame allocates a few container objects, so the collector ran ~600 times in
    a 400k-message task and took 0.42 of its 4.0 CPU-seconds at 256 B (0.13 of 3.7 at 4 KiB),
    measured with ``gc.callbacks``. What it relies on: the fetch makes no cycles per message
    (bytes, lists, frozen dataclasses, Arrow arrays are freed by reference counting); asyncio's
    per-pull futures may, a few objects a pull, and are collected once the collector is back.

    Why frozen (``gc.freeze``): PySpark's daemon runs a full ``gc.collect()`` in a reused
    worker after every task (``pyspark/daemon.py``), and that walked every object the worker
    had imported — pyarrow, pandas, nats-py, js-etl: ~90,000 of them. Measured (2026-11-26,
    local[2]): a trivial two-task ``mapInArrow`` job cost its workers 93 ms of CPU, 3.5 ms
    with this: about 45 ms saved a task, that is a round's every task. What it relies on: the
    daemon's collect after the last task leaves no cyclic garbage, so what lives at a task's
    start is live; measured at the start of eight tasks in a row, ``gc.collect()`` found 0
    objects each time and the frozen count stayed at 90,868 from the third task on. The cost:
    an object frozen here is never examined by the cycle collector again (reference counting
    still frees it), so a cycle it joins later is not reclaimed. To keep that bounded, only a
    worker's first two tasks freeze (:data:`_FREEZES`): the first what the worker imported to
    start it, the second what the first imported as it ran (pandas through pyarrow, pyarrow's
    JSON reader and Parquet writer): 62,049 and then 90,866 objects in the measurement above,
    90,868 at the third task's start.
    """
    global _FREEZES
    if _FREEZES:
        _FREEZES -= 1
        gc.freeze()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _nothing_left(last: AckMetadata, stop_after_seq: int) -> bool:
    """Whether the last delivery of a pull says this partition can stop without another pull:
    it is past the run's target, or it is a first delivery whose pending token is 0 (nothing
    undelivered left). Redeliveries are not counted in that token (measured), so after a
    redelivery only a 404 tells."""
    return last.stream_seq >= stop_after_seq or (last.num_delivered == 1
                                                 and last.num_pending == 0)


def raise_for_pull(result: PullResult) -> None:
    """``result.raise_for_status()``, its message followed by the job setting that fixes it."""
    try:
        result.raise_for_status()
    except PullLimitError as e:
        raise e.with_hint("lower fetch.batch / fetch.max_bytes or raise the consumer's "
                          "limit") from None
    except NatsUnavailableError as e:
        if result.end is not PullEnd.DISCONNECTED:
            raise
        raise e.with_hint("a server drops a slow consumer: lower fetch.max_bytes") from None


def to_record_batch(messages: Deliveries, ack_prefix: str) -> pa.RecordBatch:
    """Build the Arrow batch straight from the pull's columns. The only per-message Python is
    looking at the header blocks; the ack subjects are split and converted by Arrow compute
    kernels (:func:`~js_etl.jetstream.subjects.parse_ack_columns`)."""
    n = len(messages)
    replies = _text_array(messages.replies)
    try:
        acks = parse_ack_columns(replies, ack_prefix)
    except ForeignAckSubjectError as e:
        raise TerminalError(
            f"{e}: this server uses an ack subject form js-etl cannot rebuild from table rows; "
            "acks would be lost") from None
    headers: list[list[tuple[str, list[str]]] | None] = [None] * n
    for i, raw in enumerate(messages.headers):
        if raw:
            parsed = parse_headers(raw)
            for key in _TRANSPORT_HEADERS:
                parsed.pop(key, None)
            headers[i] = list(parsed.items()) if parsed else None
    stream = prefix_stream(ack_prefix)
    try:
        data = messages.payload_array()
    except ValueError as e:  # one pull holds at most fetch.max_bytes (48 MiB) and one message
        raise TerminalError(f"{e}; lower fetch.max_bytes") from None
    return pa.RecordBatch.from_arrays([
        _text_array(messages.subjects),
        pa.array([stream] * n, pa.string()),
        acks.stream_seq,
        acks.consumer_seq,
        acks.num_delivered,
        pc.divide(acks.timestamp_ns, 1000).cast(pa.timestamp("us", tz="UTC")),
        pa.array(headers, raw_arrow().field("headers").type),
        data,
        _utf8_flags(data),
    ], schema=raw_arrow())


def binary_array(values: list[bytes]) -> pa.Array:
    """``pa.array(values, pa.binary())`` for ``bytes`` values (``len`` is their size), built
    from one join and the lengths: pyarrow's own conversion took 9.1-9.7 ms for 4,000 values of
    256 B or of 4 KiB alike, this 0.4 and 3.4-4.3 ms (a fetch task's batch; 2-core box). For a
    pull's subjects and ack replies (its payloads are one buffer already: Deliveries)."""
    offsets = array("i", [0])
    try:
        offsets.extend(accumulate(map(len, values)))
    except OverflowError:  # a pull's subjects: at most a few hundred bytes a message
        raise TerminalError(f"{len(values)} values hold over 2 GiB") from None
    return pa.Array.from_buffers(pa.binary(), len(values),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])


def _text_array(values: list[bytes]) -> pa.Array:
    """Subjects (and ack replies) as a STRING array, validated by Arrow at once; a subject that
    is not UTF-8 (the server takes any bytes but whitespace) keeps its row, its bad bytes
    replaced by U+FFFD."""
    array = binary_array(values)
    try:
        return array.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([value.decode("utf-8", "replace") for value in values], pa.string())


def _utf8_flags(data: pa.Array) -> pa.Array:
    """Which payloads are valid UTF-8: one Arrow validation of the whole batch, and only when
    that fails, a strict decode per payload."""
    try:
        data.cast(pa.string())
        return pa.repeat(True, len(data))
    except pa.ArrowInvalid:
        return pa.array([_is_utf8(value) for value in data.to_pylist()], pa.bool_())


def _is_utf8(payload: bytes) -> bool:
    try:
        payload.decode("utf-8")  # strict, like Arrow: no surrogates, no overlong forms
        return True
    except UnicodeDecodeError:
        return False
