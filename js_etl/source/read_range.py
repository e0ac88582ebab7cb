"""The one range reader: a contiguous range of a stream's sequences, read by position without
touching any durable consumer. Used by ``js-etl backfill`` (:mod:`js_etl.backfill.run`) and by
the ``nats_jetstream`` Spark data source (:mod:`js_etl.source.datasource`).

* :class:`RangeRequest` and :func:`resolve_sequences` (driver, NATS only): a start and end, as
  sequences or RFC 3339 times, inclusive, become stream sequences ``[lo, hi]``; the end defaults
  to the stream's last sequence at that moment. :func:`split_range` cuts it into contiguous
  sub-ranges, one per Spark partition.
* :func:`read_range` (executors): one partition = one ephemeral consumer reading one contiguous
  sub-range by position, without acks, then deleted. It emits the same raw Arrow rows as the
  drain's fetch (:func:`js_etl.jetstream.arrow.to_record_batch`).

Re-executing a partition reads exactly the same messages again (its own consumer, by position,
no acks), as long as the range and the stream's content are the same: see
:mod:`js_etl.backfill.run`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from js_etl.errors import ConfigError, PurgedRangeError, RangeError
from js_etl.instant import format_instant, parse_instant
from js_etl.jetstream import (
    AckPolicy,
    ConnectionOptions,
    ConsumerConfig,
    DeliverPolicy,
    JetStreamSession,
    PullEnd,
    StreamInfo,
    ack_prefix,
)
from js_etl.jetstream.admin import first_message_at_or_after
from js_etl.jetstream.arrow import raise_for_pull, task_gc, to_record_batch
from js_etl.jetstream.errors import JetStreamError, NatsUnavailableError


@dataclass(frozen=True, slots=True)
class RangeRequest:
    """What the user asked for: a start (sequence or time) and an optional end, inclusive."""

    from_seq: int | None = None
    to_seq: int | None = None
    from_time: int | None = None  # ns since the epoch
    to_time: int | None = None

    @classmethod
    def parse(cls, *, from_seq: int | None = None, to_seq: int | None = None,
              from_time: str | None = None, to_time: str | None = None) -> RangeRequest:
        """Check the flags' shape (no NATS needed); times are parsed here."""
        if (from_seq is None) == (from_time is None):
            raise RangeError("give exactly one start: --from-seq N or --from-time T")
        if to_seq is not None and to_time is not None:
            raise RangeError("give at most one end: --to-seq M or --to-time U")
        for flag, value in (("--from-seq", from_seq), ("--to-seq", to_seq)):
            if value is not None and value < 1:
                raise RangeError(f"{flag} must be a stream sequence (1 or more), got {value}")
        start = parse_instant(from_time, "--from-time") if from_time is not None else None
        end = parse_instant(to_time, "--to-time") if to_time is not None else None
        if from_seq is not None and to_seq is not None and to_seq < from_seq:
            raise RangeError(f"empty range: --to-seq {to_seq} is before --from-seq {from_seq}")
        if start is not None and end is not None and end < start:
            raise RangeError(f"empty range: --to-time {format_instant(end)} is before "
                             f"--from-time {format_instant(start)}")
        return cls(from_seq, to_seq, start, end)

    def as_dict(self) -> dict[str, Any]:
        return {"from_seq": self.from_seq, "to_seq": self.to_seq,
                "from_time": None if self.from_time is None else format_instant(self.from_time),
                "to_time": None if self.to_time is None else format_instant(self.to_time)}

    def describe(self) -> str:
        d = self.as_dict()
        start = f"seq {d['from_seq']}" if d["from_seq"] is not None else d["from_time"]
        end = (f"seq {d['to_seq']}" if d["to_seq"] is not None
               else d["to_time"] or "the stream's end")
        return f"{start} .. {end}"

@dataclass(frozen=True, slots=True)
class Spelling:
    """How errors name the range's settings: the CLI's flags (``--from-seq 7``) or the data
    source's options (``from_seq=7``), and what the read is called (``backfill``, ``read``)."""

    what: str = "backfill"
    cli: bool = True

    def setting(self, key: str, value: Any) -> str:
        return f"--{key.replace('_', '-')} {value}" if self.cli else f"{key}={value}"


CLI = Spelling()


@dataclass(frozen=True, slots=True)
class SequenceRange:
    """A request resolved to stream sequences at one moment."""

    lo: int  # inclusive
    hi: int
    resolved: tuple[int, int]  # the request in sequences, before the end was clamped
    notes: tuple[str, ...]  # why the end was clamped
    stream: StreamInfo


def resolve_sequences(js: JetStreamSession, stream: StreamInfo, request: RangeRequest,
                      spelling: Spelling = CLI) -> SequenceRange:
    """Turn ``request`` into ``[lo, hi]`` of ``stream`` (its info, just read), with one clear
    error per impossible range. Times become sequences through ``STREAM.MSG.GET`` with
    ``start_time`` (stream timestamps grow with the sequence, so a time window is a sequence
    window). No start means the stream's first sequence; no end its last one, now."""
    name = stream.name
    first, last = stream.state.first_seq, stream.state.last_seq
    if last == 0:
        raise RangeError(f"stream {name} is empty: nothing to {spelling.what}")
    notes: list[str] = []

    if request.from_time is not None:
        found = js.run(first_message_at_or_after(js.admin, name,
                                                 format_instant(request.from_time)))
        if found is None:
            raise RangeError(f"no message in stream {name} at or after "
                             f"{format_instant(request.from_time)}: its last message is seq "
                             f"{last}, stored at {_ts(stream.state.last_ts)}")
        lo, stored = found
        gone = gone_since(stream, request.from_time, found)
        if gone is not None:
            raise PurgedRangeError(
                f"{gone}: start at {spelling.setting('from_seq', first)} (or "
                f"{spelling.setting('from_time', stored)}) to {spelling.what} what is left")
    else:
        lo = first if request.from_seq is None else int(request.from_seq)
    if lo > last:
        raise RangeError(f"stream {name} ends at seq {last}: nothing at or after seq {lo}")

    if request.to_time is not None:
        after = js.run(first_message_at_or_after(js.admin, name,
                                                 format_instant(request.to_time + 1)))
        hi = after[0] - 1 if after is not None else last
    else:
        hi = request.to_seq if request.to_seq is not None else last
    resolved = (lo, hi)

    if hi < lo:
        if request.from_time is not None and request.to_time is not None:
            raise RangeError(f"no message in stream {name} between "
                             f"{format_instant(request.from_time)} and "
                             f"{format_instant(request.to_time)}")
        raise RangeError(f"empty range: {request.describe()} resolves to seq {lo} .. seq {hi} "
                         f"in stream {name}")
    if lo < first:
        gone = f"seqs {lo}..{min(hi, first - 1)}"
        raise PurgedRangeError(
            f"{gone} are no longer in stream {name} (purged or expired): the first available is "
            f"seq {first}" + (f", stored at {_ts(stream.state.first_ts)}"
                              if stream.state.first_ts else "")
            + (f"; start at {spelling.setting('from_seq', first)}" if hi >= first else
               "; the whole range is gone"))
    if hi > last:
        notes.append(f"end clamped from seq {hi} to seq {last}: the stream's last sequence when "
                     f"the {spelling.what} started")
        hi = last
    return SequenceRange(lo, hi, resolved, tuple(notes), stream)


def gone_since(stream: StreamInfo, from_time: int, found: tuple[int, str]) -> str | None:
    """Why messages stored from ``from_time`` may be gone, or None: ``found``, the first
    message stored at or after it, is the stream's first, stored after ``from_time``, and
    messages before it were removed (purged or expired)."""
    seq, stored = found
    first = stream.state.first_seq
    if seq == first > 1 and from_time < parse_instant(stored):
        return (f"stream {stream.name} no longer holds messages before seq {first} (purged or "
                f"expired; seq {first} was stored at {stored}), so messages from "
                f"{format_instant(from_time)} may be gone")
    return None


def refuse_work_queue(stream: StreamInfo, what: str) -> None:
    """A WorkQueue stream's messages are its consumer's to take, and the server refuses the
    ack-none consumers a read by position needs: say so before anything starts."""
    if stream.retention == "workqueue":
        raise ConfigError(f"stream {stream.name} is a WorkQueue stream: it cannot be read by "
                          f"position (the server refuses the ack-none consumers a {what} "
                          "uses); drain it with its durable consumer (js-etl drain)")


def refuse_unmatched_filters(stream: StreamInfo, filters: tuple[str, ...], setting: str
                             ) -> None:
    """A filter no subject of the stream can match (a typo) would read nothing, run after run:
    say so before anything starts. Not checked where the stream stores subjects its config
    does not list (a mirror's or sourced stream's origins', a subject transform's)."""
    if stream.unlisted_subjects or not stream.subjects:
        return
    unmatched = [f for f in filters if not any(subjects_overlap(f, s) for s in stream.subjects)]
    if unmatched:
        raise ConfigError(f"{setting} {', '.join(unmatched)}: no subject of stream "
                          f"{stream.name} ({', '.join(stream.subjects)}) can match it")


def subjects_overlap(a: str, b: str) -> bool:
    """Whether some subject matches both NATS filters (``*`` one token, ``>`` one or more at
    the end)."""
    left, right = a.split("."), b.split(".")
    for x, y in zip(left, right, strict=False):
        if ">" in (x, y):
            return True  # the other has a token here, and ">" takes it and any after it
        if x != y and "*" not in (x, y):
            return False
    return len(left) == len(right)


def split_range(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """``[lo, hi]`` as at most ``parts`` contiguous, disjoint, non-empty sub-ranges covering it."""
    count = hi - lo + 1
    parts = max(1, min(parts, count))
    cuts = [lo + count * i // parts for i in range(parts + 1)]
    return [(cuts[i], cuts[i + 1] - 1) for i in range(parts)]


def _ts(value: datetime | None) -> str:
    return value.isoformat().replace("+00:00", "Z") if value else "?"


@dataclass(frozen=True, slots=True)
class RangeFetchPlan:
    """What every partition of a backfill does. Picklable: it travels to the executors."""

    options: ConnectionOptions
    stream: str
    name_prefix: str  # ephemeral consumer names: <prefix>_<partition>_<attempt nonce>
    bounds: tuple[tuple[int, int], ...]  # partition i reads bounds[i], inclusive
    filter_subjects: tuple[str, ...]
    batch: int
    max_bytes: int
    pull_timeout: float
    inactive_threshold: float


def fetch_range_partition(plan: RangeFetchPlan, batches: Iterator[pa.RecordBatch]
                          ) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body. The input is one row per partition: its index."""
    for index in [i for batch in batches for i in batch.column(0).to_pylist()]:
        yield from read_range(plan, index)


def read_range(plan: RangeFetchPlan, index: int) -> Iterator[pa.RecordBatch]:
    """Every message of sub-range ``index`` (that matches the filter), in order, exactly once,
    ``consumer_seq`` null.

    The consumer's name is unique to this attempt: creating a consumer under an existing name
    with the same config answers the *existing* consumer, already advanced, so a retried task
    reusing the name would skip what its failed attempt read.
    """
    lo, hi = plan.bounds[index]
    name = f"{plan.name_prefix}_{index}_{uuid.uuid4().hex[:8]}"
    prefix = ack_prefix(plan.stream, name)
    with task_gc(), JetStreamSession(plan.options) as js:
        js.run(js.admin.create_consumer(plan.stream, ConsumerConfig(
            name=name, description="js-etl backfill (ephemeral)",
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=lo,
            ack_policy=AckPolicy.NONE, inactive_threshold=plan.inactive_threshold,
            filter_subjects=plan.filter_subjects, mem_storage=True, num_replicas=1)))
        puller = js.puller(plan.stream, name)
        try:
            next_seq = lo
            while next_seq <= hi:
                # Never ask for more than the sequences left in the range: without a filter
                # nothing beyond `hi` is ever delivered.
                result = js.pull(puller, min(plan.batch, hi - next_seq + 1),
                                 max_bytes=plan.max_bytes, timeout=plan.pull_timeout)
                if result.messages:
                    batch = to_record_batch(result.messages, prefix)
                    last = batch.column("seq")[-1].as_py()
                    if last > hi:  # filtered consumers skip ahead: drop what lies beyond hi
                        batch = batch.filter(pc.less_equal(batch.column("seq"), hi))
                    if batch.num_rows:
                        # An ephemeral consumer's sequence depends on where a partition starts:
                        # null, so a range's rows do not depend on how it was split (a drain's
                        # rows keep their durable consumer's).
                        yield batch.set_column(
                            batch.schema.get_field_index("consumer_seq"), "consumer_seq",
                            pa.nulls(batch.num_rows, pa.int64()))
                    next_seq = last + 1
                    if result.messages[-1].metadata.num_pending == 0:
                        break  # pending token 0: the consumer has nothing more at all
                if result.end is PullEnd.NO_MESSAGES:
                    break
                if result.end not in (PullEnd.BATCH_FULL, PullEnd.BYTES_FULL, PullEnd.OVERSIZE) \
                        or not result.messages:
                    # Never end a partition short without saying so: fail the task, and the
                    # retry (a new consumer) reads the same sub-range again.
                    raise_for_pull(result)
                    raise NatsUnavailableError(
                        f"backfill pull on {plan.stream}/{name} ended with {result.end.value} "
                        f"({result.status or 'no status'}) before seq {hi}; the task is retried")
        finally:
            js.run(puller.close())
            try:
                js.run(js.admin.delete_consumer(plan.stream, name))
            except JetStreamError:
                pass  # inactive_threshold removes it anyway
