"""The fetch that runs on executors: one partition = one NATS connection pulling no_wait batches
from the durable consumer until its budget is spent or the consumer has nothing more, emitting
Arrow record batches (``mapInArrow``), one per pull, with no per-row Spark conversion.

Nothing here acks: acks come from what a Delta commit holds (see :mod:`js_etl.spark.drain`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from js_etl.errors import TerminalError
from js_etl.faults import fail_first_attempt
from js_etl.jetstream import ConnectionOptions, JetStreamSession, PullEnd, parse_headers
from js_etl.jetstream.message import JsMessage

# The raw row as fetched; decoding happens on the JVM afterwards (see decode.py).
RAW_DDL = ("subject STRING, stream STRING, seq BIGINT, consumer_seq BIGINT, num_delivered BIGINT, "
           "published_at TIMESTAMP, headers MAP<STRING, ARRAY<STRING>>, data BINARY")
ARROW_SCHEMA = pa.schema([
    ("subject", pa.string()),
    ("stream", pa.string()),
    ("seq", pa.int64()),
    ("consumer_seq", pa.int64()),
    ("num_delivered", pa.int64()),
    ("published_at", pa.timestamp("us", tz="UTC")),
    ("headers", pa.map_(pa.string(), pa.list_(pa.string()))),
    ("data", pa.binary()),
])
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
    partition_messages: int  # message budget of one partition in this round
    partition_bytes: int  # byte budget of one partition in this round (bounds executor memory)
    stop_after_seq: int  # the run's target: a partition stops once it sees a later message
    pull_timeout: float  # client deadline of one pull
    fetch_seconds: float  # wall-time budget of the fetch phase (kept well under ack_wait)
    group: str | None = None
    min_pending: int | None = None
    min_ack_pending: int | None = None
    pin_id: str | None = None
    fault: str | None = None  # test-only fault point, see js_etl.faults


def fetch_partition(plan: FetchPlan, batches: Iterator[pa.RecordBatch]
                    ) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body. The input is one row per partition: its index."""
    index = [i for batch in batches for i in batch.column(0).to_pylist()]
    started = time.monotonic()
    with JetStreamSession(plan.options) as js:
        puller = js.puller(plan.stream, plan.consumer, group=plan.group,
                           min_pending=plan.min_pending, min_ack_pending=plan.min_ack_pending,
                           pin_id=plan.pin_id)
        got = size = 0
        while got < plan.partition_messages and size < plan.partition_bytes:
            if time.monotonic() - started > plan.fetch_seconds:
                break  # keep the round well inside ack_wait: no redelivery into this round
            result = js.pull(puller, min(plan.batch, plan.partition_messages - got),
                             max_bytes=plan.max_bytes, timeout=plan.pull_timeout)
            if result.messages:
                yield to_record_batch(result.messages, plan.ack_prefix)
                got += len(result.messages)
                size += result.bytes
            if result.end in (PullEnd.NO_MESSAGES, PullEnd.REQUESTS_PENDING, PullEnd.DEADLINE,
                              PullEnd.PIN_MISMATCH):
                # Drained for now, at max_ack_pending, or not (or no longer) the pinned client:
                # commit what we have; the driver reads the pin state between rounds.
                break
            result.raise_for_status()  # disconnects, errors: fail this task attempt
            if index == [0]:
                fail_first_attempt("fail_fetch_task", plan.fault)
            if result.messages and _nothing_left(result.messages[-1].reply,
                                                 plan.stop_after_seq):
                break


def _nothing_left(reply: str, stop_after_seq: int) -> bool:
    """Whether the last delivery of a pull says this partition can stop without another pull:
    it is past the run's target, or it is a first delivery whose pending token is 0 (nothing
    undelivered left). Redeliveries are not counted in that token (measured), so after a
    redelivery only a 404 tells."""
    delivered, seq, _, _, pending = reply.rsplit(".", 5)[1:]
    return int(seq) >= stop_after_seq or (delivered == "1" and pending == "0")


def to_record_batch(messages: list[JsMessage], ack_prefix: str) -> pa.RecordBatch:
    """Build the Arrow batch straight from the pull: one pass over the messages."""
    n = len(messages)
    subjects: list[str] = [""] * n
    seqs = [0] * n
    cseqs = [0] * n
    delivered = [0] * n
    stamps = [0] * n
    headers: list[list[tuple[str, list[str]]] | None] = [None] * n
    data: list[bytes] = [b""] * n
    prefix_dot = ack_prefix + "."
    for i, m in enumerate(messages):
        if not m.reply.startswith(prefix_dot):
            raise TerminalError(
                f"ack subject {m.reply!r} does not start with {ack_prefix!r}: this server uses an "
                "ack subject form js-etl cannot rebuild from table rows; acks would be lost")
        # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
        tokens = m.reply[len(prefix_dot):].split(".")
        delivered[i] = int(tokens[0])
        seqs[i] = int(tokens[1])
        cseqs[i] = int(tokens[2])
        stamps[i] = int(tokens[3]) // 1000
        subjects[i] = m.subject
        data[i] = m.data
        if m.raw_headers:
            parsed = parse_headers(m.raw_headers)
            for key in _TRANSPORT_HEADERS:
                parsed.pop(key, None)
            headers[i] = list(parsed.items()) if parsed else None
    stream = ack_prefix.split(".")[-2]
    return pa.RecordBatch.from_arrays([
        pa.array(subjects, pa.string()),
        pa.array([stream] * n, pa.string()),
        pa.array(seqs, pa.int64()),
        pa.array(cseqs, pa.int64()),
        pa.array(delivered, pa.int64()),
        pa.array(stamps, pa.timestamp("us", tz="UTC")),
        pa.array(headers, ARROW_SCHEMA.field("headers").type),
        pa.array(data, pa.binary()),
    ], schema=ARROW_SCHEMA)
