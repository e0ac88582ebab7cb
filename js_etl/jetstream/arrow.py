"""Pulled messages as Arrow: the raw row every reader emits (:data:`js_etl.schema.RAW`), built
from a pull's columns with no per-row conversion, and the job setting that fixes a failed pull.
Used by the drain's fetch tasks and by the range reader of the backfill and the data source."""

from __future__ import annotations

import gc
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import accumulate

import pyarrow as pa
import pyarrow.compute as pc

from js_etl.errors import TerminalError
from js_etl.jetstream.errors import NatsUnavailableError, PullLimitError
from js_etl.jetstream.message import Deliveries, parse_headers
from js_etl.jetstream.pull import PullEnd, PullResult
from js_etl.jetstream.subjects import ForeignAckSubjectError, parse_ack_columns, prefix_stream
from js_etl.schema import raw_arrow

# Transport headers the server adds for its own protocol, not part of the message.
_TRANSPORT_HEADERS = ("Nats-Pin-Id",)


_FREEZES = 2  # task_gc: how many more tasks of this worker process freeze what lives


@contextmanager
def task_gc() -> Iterator[None]:
    """How a fetch task (or a backfill's range read) uses the worker's cycle collector: what
    lives when the task starts is frozen out of it, and it is off while the task pulls (and,
    since this is a generator, while its consumer decodes and writes each batch); on again
    after, in this reused worker.

    Why off: every frame allocates a few container objects, so the collector would run again
    and again during a task, looking for cycles the fetch never makes. What it relies on: the
    fetch makes no cycles per message (bytes, lists, frozen dataclasses, Arrow arrays are freed
    by reference counting); asyncio's per-pull futures may, a few objects a pull, and are
    collected once the collector is back.

    Why frozen (``gc.freeze``): PySpark's daemon runs a full ``gc.collect()`` in a reused
    worker after every task (``pyspark/daemon.py``), and that walked every object the worker
    had imported (pyarrow, pandas, nats-py, js-etl) after every task of every round. What it
    relies on: the daemon's collect after the last task leaves no cyclic garbage, so what lives
    at a task's start is live. The cost: an object frozen here is never examined by the cycle
    collector again (reference counting still frees it), so a cycle it joins later is not
    reclaimed. To keep that bounded, only a worker's first two tasks freeze (:data:`_FREEZES`):
    the first what the worker imported to start it, the second what the first imported as it
    ran (pandas through pyarrow, pyarrow's JSON reader and Parquet writer). The measurements:
    docs/design/columnar-writer.md.
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
    from one join and the lengths, which is faster than pyarrow's own conversion of a fetch
    task's batch (docs/design/nats-client.md). For a pull's subjects and ack replies (its
    payloads are one buffer already: Deliveries)."""
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
