"""``spark.readStream.format("nats_jetstream")``: micro-batches over a stream's sequences.

Offsets are stream sequences: ``{"stream": "ORDERS", "seq": N, "created": T}`` is "every
message before seq N of the stream ORDERS created at T was handed to the query", and a
micro-batch from offset ``a`` to ``b`` is the sequence range ``[a, b - 1]``, cut into
partitions and read like a batch read (:func:`~js_etl.source.datasource.read_partition`: an
ephemeral ack-none consumer per task, by position). What this relies on for exactly-once with a
sink such as Delta:

* a batch's range is fixed by its offsets, which Spark writes to the checkpoint before the batch
  runs; a retried task or a restarted query reads the same range, and the stream still holds
  the same messages in it (they never change; only retention, a purge or a delete removes one —
  see ``fail_on_data_loss``);
* the sink commits each batch once (Delta's streaming sink records the batch id in the commit);
* a stream's sequences never go back, and its creation time never changes: a stream deleted
  and created again under the name starts over at 1 with another creation time, which the
  driver checks before it plans or runs a batch (else it would skip or re-read in silence).

``commit(end)`` — called by Spark after the sink committed the batch ending at ``end`` — moves
the durable consumer named by ``commit_consumer`` (if any) to ``end`` with a consumer reset, so
its ``num_pending`` counts what the query has not committed yet; never ahead of the sink, never
backwards. The query itself never reads through that consumer, and claims it when it starts
and before every move (:mod:`js_etl.durable.cursor`): one nothing else reads from, or refused.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from js_etl.durable.cursor import check_query, claim_cursor
from js_etl.durable.policy import source_stream_info
from js_etl.errors import ConfigError, PurgedRangeError, RangeError, StreamReplacedError
from js_etl.instant import format_instant
from js_etl.jetstream import ConnectionOptions, JetStreamSession, StreamInfo
from js_etl.jetstream.admin import first_message_at_or_after
from js_etl.source.datasource import Pushed, ReadPlan, read_partition
from js_etl.source.options import SourceOptions
from js_etl.source.read_range import gone_since, split_range

log = logging.getLogger(__name__)


class NatsJetStreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The micro-batch reader; one instance lives on the driver for the whole query."""

    def __init__(self, parsed: SourceOptions, payload_json: str | None) -> None:
        if parsed.request.to_seq is not None or parsed.request.to_time is not None:
            raise ConfigError("a stream has no end: to_seq and to_time are for spark.read "
                              "(Trigger.AvailableNow stops at what the stream held when the "
                              "query started)")
        self.parsed = parsed
        self.options = parsed.nats.connection_options()
        fetch = parsed.fetch
        self.plan = ReadPlan(
            options=self.options, stream=parsed.stream, lo=0, hi=-1,
            filter_subjects=parsed.filter_subjects, batch=fetch.batch, max_bytes=fetch.max_bytes,
            pull_timeout=fetch.pull_timeout, partitions=fetch.partitions, decode=parsed.decode,
            pushed=Pushed(), payload_json=payload_json)
        self.target: int | None = None  # Trigger.AvailableNow: no offset beyond it
        # With commit_consumer: the query's token, made by its first offset and carried by
        # every later one (so a run from the checkpoint has it); it names the consumer's owner.
        self.query: str | None = None
        self._checked: str | None = None  # the token the consumer's mark was checked against
        self._js: JetStreamSession | None = None
        streaming = parsed.streaming
        if streaming.commit_consumer is not None:  # refused before the query starts, or ours
            try:
                claim_cursor(self._session(), parsed.stream, streaming.commit_consumer,
                             streaming.lease_bucket)
            except BaseException:
                self.stop()
                raise

    # --- the driver side: offsets --------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts (a restarted one starts from its checkpoint instead)."""
        info = self._stream()
        request, streaming = self.parsed.request, self.parsed.streaming
        first, last = _first(info), info.state.last_seq
        if request.from_seq is not None:
            seq = request.from_seq
            if seq > last + 1:  # waiting for it would skip what comes before it in silence
                raise RangeError(f"stream {info.name} ends at seq {last}: from_seq {seq} is past "
                                 "its next message (start=latest starts with that one)")
        elif request.from_time is not None:
            found = self._session().run(first_message_at_or_after(
                self._session().admin, info.name, format_instant(request.from_time)))
            seq = found[0] if found is not None else last + 1
            gone = gone_since(info, request.from_time, found) if found is not None else None
            if gone is not None:
                if streaming.fail_on_data_loss:
                    raise PurgedRangeError(f"{gone}: start at from_seq={seq}, or set "
                                           "fail_on_data_loss=false to start there")
                log.warning("%s: starting at seq %d (fail_on_data_loss=false)", gone, seq)
        else:
            seq = last + 1 if streaming.start == "latest" else first
        if streaming.commit_consumer is not None:  # a new query's token (Spark asks a
            self.query = uuid.uuid4().hex  # restarted one too, then starts from its checkpoint)
        return self._offset(info, seq)

    def getDefaultReadLimit(self) -> ReadLimit:
        streaming = self.parsed.streaming
        if streaming.max_messages_per_batch is not None:
            return ReadMaxRows(streaming.max_messages_per_batch)
        if streaming.max_bytes_per_batch is not None:
            return ReadMaxBytes(streaming.max_bytes_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._stream().state.last_seq + 1

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The next batch's end: what the stream holds now (or the AvailableNow target), within
        the options' per-batch limits unless the engine asks for everything available.
        Messages gone before ``start`` (retention, a purge) fail the query, or with
        ``fail_on_data_loss=false`` are skipped and counted in the offset's ``skipped``."""
        info = self._stream()
        seq = self._resumable(start, info)
        self.query = start.get("query")  # the checkpoint's, or the new query's initial one
        consumer = self.parsed.streaming.commit_consumer
        if consumer is not None and self.query is not None and self.query != self._checked:
            check_query(self._session(), info.name, consumer, self.query)
            self._checked = self.query
        first = _first(info)
        skipped = int(start.get("skipped", 0))
        if seq < first:
            if self.parsed.streaming.fail_on_data_loss:
                raise _data_loss(info.name, seq, first - 1, first)
            log.warning("stream %s no longer holds seqs %d..%d (purged or expired): skipped "
                        "(fail_on_data_loss=false)", info.name, seq, first - 1)
            skipped += first - seq
            seq = first
        end = info.state.last_seq + 1
        if self.target is not None:
            end = min(end, self.target)
        if not isinstance(limit, ReadAllAvailable):  # the engine may lift the options' limits
            streaming = self.parsed.streaming
            if streaming.max_messages_per_batch is not None:
                end = min(end, seq + streaming.max_messages_per_batch)
            if streaming.max_bytes_per_batch is not None and info.state.messages:
                # By the stream's average stored message size: sizes are not known per
                # sequence without reading them. At least one message a batch.
                average = max(1, info.state.bytes // info.state.messages)
                end = min(end, seq + max(1, streaming.max_bytes_per_batch // average))
        return self._offset(info, max(seq, end), skipped)

    def reportLatestOffset(self) -> dict[str, Any]:
        info = self._stream()
        return self._offset(info, info.state.last_seq + 1)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        # A restarted query runs its last logged batch again without asking latestOffset first.
        info = self._stream()
        lo, hi = self._resumable(start, info), self._resumable(end, info) - 1
        if hi < lo:
            return []
        return [InputPartition(bounds) for bounds in split_range(lo, hi, self.plan.partitions)]

    def commit(self, end: dict[str, Any]) -> None:
        """The sink committed everything before ``end``: move ``commit_consumer`` there."""
        consumer = self.parsed.streaming.commit_consumer
        if consumer is not None:
            move_consumer_on(self._session(), self.plan.stream, consumer, self._seq(end),
                             self.parsed.streaming.lease_bucket, end.get("query"))

    def stop(self) -> None:
        if self._js is not None:
            self._js.close()
            self._js = None

    # --- the executor side ---------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """One sub-range of a batch. Messages that leave the front of the stream before the
        task reads them — since the driver planned the batch, or while the task reads — fail
        it (and so the query), unless ``fail_on_data_loss=false``.

        The read delivers in sequence order, so a message the front took before its turn
        shows as sequences not read below where the front is: after each pull with such a
        gap, and at the end if the range was not read to its end, the task asks where the
        stream begins. Asked at once, this tells a gap the front made from a message deleted
        earlier (or, with ``filter_subjects``, filtered out), which the front has not
        reached yet; only a front racing right behind the read is taken for a loss."""
        lo, hi = partition.value
        check = self.parsed.streaming.fail_on_data_loss
        filtered = bool(self.plan.filter_subjects)
        front = _Front(self.options, self.plan.stream)
        unread_from = lo  # every sequence below it was read, or skipped and judged
        try:
            for batch in read_partition(self.plan, (lo, hi)):
                seqs = batch.column("seq")
                if check and len(seqs):
                    gap = seqs[0].as_py() > unread_from or (not filtered and len(seqs) < (
                        seqs[-1].as_py() - seqs[0].as_py() + 1))
                    if gap:
                        front.refuse_past(_first_unread(seqs, unread_from, filtered), hi)
                    unread_from = seqs[-1].as_py() + 1
                yield batch
            if check and unread_from <= hi:
                front.refuse_past(unread_from, hi)
        finally:
            front.close()

    # --- helpers -------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_js"] = None  # the driver's connection never travels
        return state

    def _session(self) -> JetStreamSession:
        if self._js is None:  # one connection for the query: Spark asks for offsets often
            self._js = JetStreamSession(self.options)
        return self._js

    def _stream(self) -> StreamInfo:
        return source_stream_info(self._session(), self.plan.stream, "the option stream")

    def _offset(self, info: StreamInfo, seq: int, skipped: int = 0) -> dict[str, Any]:
        offset: dict[str, Any] = {"stream": self.plan.stream, "seq": seq}
        if info.created is not None:
            offset["created"] = info.created.isoformat()
        if self.query is not None:
            offset["query"] = self.query
        if skipped:
            offset["skipped"] = skipped
        return offset

    def _resumable(self, offset: dict[str, Any], info: StreamInfo) -> int:
        """``offset``'s sequence, if it is one of this stream: not of a stream deleted and
        created again under its name (another creation time; or, for an offset written before
        offsets carried it, a sequence the stream has not reached)."""
        seq, created = self._seq(offset), offset.get("created")
        now = info.created.isoformat() if info.created is not None else None
        last = info.state.last_seq
        if created is not None and now is not None and created != now:
            raise StreamReplacedError(
                f"stream {info.name} was deleted and created again since the query's checkpoint "
                f"was written (the checkpoint is at seq {seq} of the stream created {created}; "
                f"this one was created {now} and ends at seq {last}): its sequences started "
                "over, so the checkpoint cannot resume it; give the query a new checkpoint "
                "location")
        if seq > last + 1:
            raise StreamReplacedError(
                f"stream {info.name} ends at seq {last}, below the query's checkpoint at seq "
                f"{seq}: it is not the stream the checkpoint read (deleted and created again, or "
                "restored from an older backup), so the checkpoint cannot resume it; give the "
                "query a new checkpoint location")
        return seq

    def _seq(self, offset: dict[str, Any]) -> int:
        if offset.get("stream") != self.plan.stream:
            raise ConfigError(f"the query's checkpoint is for stream {offset.get('stream')!r}, "
                              f"not {self.plan.stream!r}: give the query its own checkpoint "
                              "location")
        return int(offset["seq"])


def move_consumer(options: ConnectionOptions, stream: str, consumer: str, seq: int,
                  lease_bucket: str, query: str | None) -> None:
    """Move durable ``consumer`` so its next delivery is ``seq`` (what ``query`` committed)."""
    with JetStreamSession(options) as js:
        move_consumer_on(js, stream, consumer, seq, lease_bucket, query)


def move_consumer_on(js: JetStreamSession, stream: str, consumer: str, seq: int,
                     lease_bucket: str, query: str | None) -> None:
    """:func:`move_consumer` on an open session, the consumer claimed again first (a reader or
    a drain that appeared since is refused, :mod:`js_etl.durable.cursor`). Never backwards: a
    consumer already past ``seq`` stays (a consumer reset would deliver again what it
    delivered)."""
    if claim_cursor(js, stream, consumer, lease_bucket, query).delivered.stream_seq + 1 < seq:
        js.run(js.admin.reset_consumer(stream, consumer, seq))


class _Front:
    """Where a task's stream begins now, asked as often as the read needs over one connection
    (made at the first question, closed with the read)."""

    def __init__(self, options: ConnectionOptions, stream: str) -> None:
        self.options, self.stream = options, stream
        self._js: JetStreamSession | None = None

    def refuse_past(self, unread: int, hi: int) -> None:
        """Fail if the front is past ``unread``, a sequence of the range up to ``hi`` the task
        has not read."""
        if self._js is None:
            self._js = JetStreamSession(self.options)
        first = _first(source_stream_info(self._js, self.stream, "the option stream"))
        if first > unread:
            raise _data_loss(self.stream, unread, min(first - 1, hi), first)

    def close(self) -> None:
        if self._js is not None:
            self._js.close()
            self._js = None


def _first_unread(seqs: pa.Array, unread_from: int, filtered: bool) -> int:
    """The lowest sequence from ``unread_from`` on that a delivered batch skipped (with a
    filter, any sequence before its first message may be one it wanted)."""
    if filtered or seqs[0].as_py() > unread_from:
        return unread_from
    steps = pc.subtract(seqs[1:], seqs[:-1])
    gap = pc.index(pc.greater(steps, 1), True).as_py()
    return seqs[gap].as_py() + 1


def _first(info: StreamInfo) -> int:
    """The first sequence the stream holds or will hold (an empty new stream says 0)."""
    return max(info.state.first_seq, 1)


def _data_loss(stream: str, seq: int, last_gone: int, first: int) -> PurgedRangeError:
    return PurgedRangeError(
        f"stream {stream} no longer holds seqs {seq}..{last_gone}, which the query has not read "
        f"(purged or expired): the first available is seq {first}; set fail_on_data_loss=false "
        "to skip them")

