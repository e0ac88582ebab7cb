"""Backfills: re-read a range of the stream into Delta through ephemeral consumers. The
explicit ``rewind`` of the durable consumer, the one way to move a drain's position, is
:mod:`js_etl.durable.rewind`.

This module plans and orchestrates; the executors' range reader is
:mod:`js_etl.source.read_range`, the MERGE is :func:`js_etl.delta.merge.merge_new_rows`.

A backfill never touches the durable consumer. It plans on the driver (NATS only, so a bad range
fails in a second, before Spark starts), then reads on executors and writes once:

1. **Resolve** the request to stream sequences ``[lo, hi]``. Times become sequences first (the
   first message stored at or after the time, ``STREAM.MSG.GET`` with ``start_time``; stream
   timestamps grow with the sequence, so a time window is a sequence window), so the range can be
   split by sequence. The end defaults to the stream's ``last_seq`` at start and is clamped to it.
2. **Split** ``[lo, hi]`` into one contiguous sub-range per partition (``fetch.partitions``).
   Partition *i* creates its own ephemeral consumer (``by_start_sequence`` at its ``lo``, the job's
   filter subjects, ``ack_policy none``, memory storage, a short ``inactive_threshold`` and a name
   unique to this task attempt), pulls no_wait batches of ``fetch.batch`` / ``fetch.max_bytes``
   until it passes its ``hi``, drops what lies beyond ``hi``, and deletes the consumer.
3. **Write** rows and dead letters with a Delta ``MERGE`` on ``(stream, seq)`` — ``WHEN NOT
   MATCHED INSERT`` — so a sequence already in the table is never written twice.

Why recomputation is harmless here (unlike the drain): a partition reads *by position* through a
consumer of its own, without acks, so re-executing it reads exactly the same messages again — as
long as the range and the stream's content are the same. The fetch is persisted only to save
work: the statistics, the dead-letter MERGE and the rows MERGE are separate actions, and if a
cached block is evicted Spark recomputes it deterministically. The one exception is the stream
changing under us: a purge, ``max_age``/``max_msgs`` expiry or a deleted message between two
actions makes a recomputed partition read *fewer* messages. That can only lose rows (the MERGE
never duplicates), so the run checks ``first_seq`` again after the fetch (and fails before writing
if the start was purged meanwhile) and compares the MERGE source counts with what it read, and
says so in the report's ``notes``.

Duplicates — what we rely on:

* **MERGE vs. a concurrent append.** Delta runs a MERGE at the table's isolation level, and OSS
  Delta's default is ``Serializable`` (it refuses to set ``WriteSerializable``). On delta-spark
  4.4 (pinned by tests/backfill/test_backfill.py, the concurrent append test): a blind append —
  exactly what a drain round does — committed while our MERGE runs makes the MERGE fail with
  ``ConcurrentAppendException``, even when the appended sequences lie outside our range (the
  conflict check cannot prune on ``seq``). We then retry the MERGE, which re-reads the table, so
  a row a drain appended meanwhile is seen and skipped. A plain append of an anti-join would *not*
  be protected: two appends never conflict. On a table whose ``delta.isolationLevel`` is
  ``WriteSerializable`` (possible on tables written by Databricks) blind appends are exempt, so
  that protection is gone; the next point still holds.
* **The drain appends without looking at the table.** Whatever lies above the durable
  consumer's ack floor will be delivered to the drain and appended by it. So when the backfill
  writes into the table this job's drain writes, the range is clamped to the consumer's ack floor
  (and refused if it lies wholly above it): the drain and the backfill then write disjoint
  sequences, now and later. To load history *before* a drain takes over, create or ``rewind`` the
  durable consumer to start after the range first.
* **Rows and dead letters** come from the same fetch: the
  :class:`~js_etl.decode.spark.Decoder` splits it, and each half is merged into its own table on
  ``(stream, seq)``.

Backfill commits are tagged (``userMetadata``) with job ``js-etl-backfill:<stream>:<consumer>``,
never with the drain's job id, so a drain's fence never mistakes backfilled rows (whose
``consumer_seq``/``num_delivered`` belong to an ephemeral consumer) for its own rounds.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from js_etl import faults
from js_etl.config import JobConfig
from js_etl.decode.spark import Decoder, with_partition_columns
from js_etl.delta.merge import merge_new_rows
from js_etl.delta.table import CommitTag, DeltaTarget, job_tables, refuse_lossy_commits, same_table
from js_etl.durable.policy import consumer_add_command_at, source_stream_info
from js_etl.errors import PurgedRangeError, RangeError
from js_etl.jetstream import (
    ConnectionOptions,
    ConsumerInfo,
    JetStreamSession,
    StreamInfo,
    ack_prefix,
)

# Re-exported (the explicit "as" form): tests and callers look times up through this module.
from js_etl.jetstream.admin import first_message_at_or_after as first_message_at_or_after
from js_etl.jetstream.errors import ConsumerNotFoundError
from js_etl.report import RunReport, StopReason
from js_etl.schema import RAW_DDL
from js_etl.source.read_range import (
    RangeFetchPlan,
    RangeRequest,
    fetch_range_partition,
    refuse_unmatched_filters,
    refuse_work_queue,
    resolve_sequences,
    split_range,
)
from js_etl.spark.session import configure_s3a

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("js_etl.backfill")

MIN_INACTIVE_THRESHOLD = 30.0  # seconds an abandoned ephemeral consumer outlives its task


# --- the request and its resolution -------------------------------------------------------------
# RangeRequest, resolve_sequences and split_range live with the range reader (read_range), which
# the nats_jetstream data source shares; re-exported here for the CLI and existing callers.
__all__ = ["Backfill", "BackfillPlan", "BackfillReport", "RangeRequest", "run_backfill",
           "split_range"]


@dataclass(frozen=True, slots=True)
class BackfillPlan:
    """The request resolved against the stream (and the drain) at the start of the run."""

    lo: int  # the range to read, inclusive (after clamping)
    hi: int
    resolved: tuple[int, int]  # the request in sequences, before clamping
    clamped: bool
    notes: tuple[str, ...]
    stream: StreamInfo
    filter_subjects: tuple[str, ...]
    durable: ConsumerInfo | None  # the drain's consumer, if it exists (read only)


def resolve_range(js: JetStreamSession, config: JobConfig, request: RangeRequest, *,
                  drain_writes_target: bool, target: str = "") -> BackfillPlan:
    """Turn the request into ``[lo, hi]``, with one clear error per impossible range."""
    source = config.source
    name = source.stream
    stream_info = source_stream_info(js, name)
    refuse_work_queue(stream_info, "backfill")
    refuse_unmatched_filters(stream_info, tuple(source.filter_subjects), "source.filter_subjects")
    found = resolve_sequences(js, stream_info, request)
    lo, hi, resolved, stream = found.lo, found.hi, found.resolved, found.stream
    notes = list(found.notes)

    durable = _consumer_or_none(js, name, source.consumer)
    filters = tuple(source.filter_subjects) or (durable.config.filter_subjects if durable else ())
    if drain_writes_target:
        floor = durable.ack_floor.stream_seq if durable else 0
        if hi > floor:
            if lo > floor:
                raise RangeError(_ahead_of_drain(config, lo, hi, durable, target))
            notes.append(f"end clamped from seq {hi} to seq {floor}: consumer {source.consumer} "
                         f"drains into {target or 'this table'} and has not acked beyond seq "
                         f"{floor}; the drain writes seqs {floor + 1}..{hi} itself (backfilling "
                         "them too would duplicate them)")
            hi = floor
    return BackfillPlan(lo, hi, resolved, (lo, hi) != resolved, tuple(notes), stream, filters,
                        durable)


def _ahead_of_drain(config: JobConfig, lo: int, hi: int, durable: ConsumerInfo | None,
                    target: str) -> str:
    s = config.source
    where = target or "the target table"
    if durable is None:
        return (f"consumer {s.consumer} does not exist yet, and its first drain into {where} "
                f"would start at the stream's beginning and write seqs {lo}..{hi} a second time: "
                f"create it to start after the range first (`"
                f"{consumer_add_command_at(s.stream, s.consumer, hi + 1, None, config)}`), then "
                "backfill; or backfill into another table (--set target.path=...)")
    floor = durable.ack_floor.stream_seq
    return (f"seqs {lo}..{hi} are above the ack floor ({floor}) of consumer {s.consumer}, which "
            f"drains into {where} and will write them itself; backfilling them too would "
            f"duplicate them. Backfill into another table (--set target.path=...), or move the "
            f"consumer past the range first (js-etl rewind --to-seq {hi + 1})")


def _consumer_or_none(js: JetStreamSession, stream: str, consumer: str) -> ConsumerInfo | None:
    try:
        return js.consumer_info(stream, consumer)
    except ConsumerNotFoundError:
        return None


# --- the report ---------------------------------------------------------------------------------
@dataclass
class BackfillReport(RunReport):
    """A drain's run report plus the range: asked for, resolved to sequences, and covered."""

    requested_range: dict[str, Any] = field(default_factory=dict)
    resolved_range: list[int] = field(default_factory=list)  # the request in sequences
    covered_range: list[int] = field(default_factory=list)  # what was read, inclusive
    clamped: bool = False
    notes: list[str] = field(default_factory=list)  # why it was clamped; anything surprising
    messages_read: int = 0  # messages in the covered range that matched the filter
    already_present: int = 0  # read but already in the table (or dead-letter table): skipped
    partitions: int = 0
    merge_attempts: int = 0  # > 1 when a concurrent commit made a MERGE retry


# --- the run ------------------------------------------------------------------------------------
SAME_AS_TARGET: Any = object()  # default `drain_target`: assume the target is the drain's table


class Backfill:
    """One backfill. ``plan()`` needs NATS only; ``run(spark)`` plans (if not done) and runs.

    ``drain_target`` is the table this config's drain writes (default: the target itself, the
    safe assumption). When the backfill's target is that table, the range is clamped to the
    durable consumer's ack floor (see the module docstring); pass ``None`` when no drain writes
    the target.
    """

    def __init__(self, config: JobConfig, request: RangeRequest, *,
                 options: ConnectionOptions | None = None, drain_target: Any = SAME_AS_TARGET,
                 run_id: str | None = None) -> None:
        self.config = config
        self.request = request
        self.options = options or config.nats.connection_options()
        self.source = config.source
        self.target, self.dead_letters = job_tables(config)
        self.drain_target = self.target if drain_target is SAME_AS_TARGET else drain_target
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.job = f"js-etl-backfill:{self.source.stream}:{self.source.consumer}"
        self.name_prefix = f"jsetl_bf_{self.run_id}"
        self._plan: BackfillPlan | None = None
        self.report = BackfillReport(
            job=self.job, run_id=self.run_id, stream=self.source.stream,
            consumer=f"{self.name_prefix}_* (ephemeral)", target=str(self.target),
            dead_letter_target=str(self.dead_letters),
            started_at=datetime.now(UTC).isoformat(timespec="seconds"),
            requested_range=request.as_dict())

    def plan(self) -> BackfillPlan:
        if self._plan is None:
            with self.report.phase("plan"), JetStreamSession(self.options) as js:
                self._plan = resolve_range(
                    js, self.config, self.request, target=str(self.target),
                    drain_writes_target=same_table(self.target, self.drain_target))
            plan, report = self._plan, self.report
            report.resolved_range = list(plan.resolved)
            report.covered_range = [plan.lo, plan.hi]
            report.clamped = plan.clamped
            report.notes.extend(plan.notes)
            report.target_seq = plan.stream.state.last_seq
            report.pending_before = plan.durable.num_pending if plan.durable else 0
            for note in plan.notes:
                log.warning("backfill %s: %s", self.run_id, note)
        return self._plan

    def run(self, spark: SparkSession) -> BackfillReport:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        started = time.monotonic()
        configure_s3a(spark)
        refuse_lossy_commits(spark, [self.target, self.dead_letters])
        planned_before = self._plan is not None  # the CLI plans before it starts Spark
        decode = self.config.decode
        decoder = Decoder(decode.format, decode.schema, keep_raw=decode.keep_raw,  # before any pull
                          unknown_fields=decode.unknown_fields)
        plan = self.plan()
        report = self.report
        fetch = self.config.fetch
        bounds = split_range(plan.lo, plan.hi, fetch.partitions)
        report.partitions = len(bounds)
        fetch_plan = RangeFetchPlan(
            options=self.options, stream=self.source.stream, name_prefix=self.name_prefix,
            bounds=tuple(bounds), filter_subjects=plan.filter_subjects, batch=fetch.batch,
            max_bytes=fetch.max_bytes, pull_timeout=fetch.pull_timeout,
            inactive_threshold=max(MIN_INACTIVE_THRESHOLD, 6 * fetch.pull_timeout))
        fetched = (spark.range(len(bounds), numPartitions=len(bounds))
                   .mapInArrow(partial(fetch_range_partition, fetch_plan), RAW_DDL)
                   # Saves re-reading NATS for each action below; an evicted block is simply
                   # recomputed, reading the same messages (module docstring).
                   .persist(StorageLevel.MEMORY_AND_DISK))
        try:
            with self.report.phase("fetch"):
                stats = fetched.agg(F.count("*").alias("n"),
                                    F.coalesce(F.sum(F.length("data")), F.lit(0)).alias("bytes"),
                                    F.min("seq").alias("first"), F.max("seq").alias("last")
                                    ).first()
            assert stats is not None  # an aggregate without grouping has exactly one row
            report.messages_read = int(stats["n"])
            report.bytes = int(stats["bytes"])
            report.first_seq = None if stats["first"] is None else int(stats["first"])
            report.last_seq = None if stats["last"] is None else int(stats["last"])
            self._check_start_still_stored(plan, before_write=True)
            if not report.messages_read:
                report.stopped_because = StopReason.NOTHING_IN_RANGE
                report.notes.append(f"no message in seqs {plan.lo}..{plan.hi} matches the filter "
                                    f"{list(plan.filter_subjects) or '(none)'}")
                log.warning("backfill %s: %s", self.run_id, report.notes[-1])
            else:
                with self.report.phase("write"):
                    self._write(spark, decoder, fetched, plan)
                report.rounds = 1
                report.stopped_because = StopReason.RANGE_DONE
        finally:
            fetched.unpersist()
        self._check_start_still_stored(plan, before_write=False)
        with JetStreamSession(self.options) as js:
            durable = _consumer_or_none(js, self.source.stream, self.source.consumer)
        report.pending_after = durable.num_pending if durable else None
        report.ack_pending_after = durable.num_ack_pending if durable else None
        earlier = report.phase_seconds.get("plan", 0.0) if planned_before else 0.0
        report.seconds = round(time.monotonic() - started + earlier, 3)
        return report

    def _write(self, spark: SparkSession, decoder: Decoder, fetched: DataFrame,
               plan: BackfillPlan) -> None:
        report = self.report
        flagged = decoder.flag(fetched)
        dead_letters = decoder.dead_letters(flagged)
        dead_source: int | None = 0
        if not dead_letters.isEmpty():
            inserted, dead_source = self._merge(spark, self.dead_letters, dead_letters,
                                                plan, partition_by=[], merge_schema=False)
            report.dead_letters = inserted
        rows, partition_names = with_partition_columns(decoder.rows(flagged),
                                                       list(self.config.target.partition_by))
        inserted, rows_source = self._merge(spark, self.target, rows, plan,
                                            partition_by=partition_names,
                                            merge_schema=self.config.decode.merge_schema)
        report.messages_written = inserted
        report.already_present = report.messages_read - inserted - report.dead_letters
        if rows_source is not None and dead_source is not None \
                and rows_source + dead_source != report.messages_read:
            # Only a changed stream (purge, expiry, deleted messages) makes a recomputed fetch
            # read something else; the MERGE cannot duplicate, but rows may be missing.
            report.notes.append(
                f"the writes saw {rows_source + dead_source} messages where the fetch read "
                f"{report.messages_read}: the stream changed during the backfill (purge, expiry "
                "or deleted messages?); check the table and re-run the backfill if needed")
            log.warning("backfill %s: %s", self.run_id, report.notes[-1])

    def _merge(self, spark: SparkSession, table: DeltaTarget, source: DataFrame,
               plan: BackfillPlan, *, partition_by: list[str], merge_schema: bool
               ) -> tuple[int, int | None]:
        """Insert the source rows whose ``(stream, seq)`` the table lacks, in one commit.

        Returns (rows inserted, rows in the MERGE's source — None when its commit could not be
        found in the recent history). Retries on a commit conflict: the
        retry re-reads the table, so rows a concurrent writer added meanwhile are skipped.
        """
        tag = CommitTag(self.job, self.run_id, 0, ack_prefix(self.source.stream,
                                                            self.name_prefix), plan.lo, plan.hi)

        def count_attempt() -> None:
            self.report.merge_attempts += 1

        source = faults.held_in_a_task("hold_mid_merge", source)
        merged = merge_new_rows(spark, table, source, tag, stream=self.source.stream,
                                lo=plan.lo, hi=plan.hi, partition_by=partition_by,
                                merge_schema=merge_schema, on_attempt=count_attempt)
        if merged.version is not None:
            versions = (self.report.dead_letter_versions if table is self.dead_letters
                        else self.report.delta_versions)
            versions.append(merged.version)
        return merged.inserted, merged.source_rows

    def _check_start_still_stored(self, plan: BackfillPlan, *, before_write: bool) -> None:
        with JetStreamSession(self.options) as js:
            first = source_stream_info(js, self.source.stream).state.first_seq
        if first <= plan.lo:
            return
        text = (f"stream {self.source.stream} was purged or expired past seq {plan.lo} during the "
                f"backfill (its first available is now seq {first})")
        if before_write:
            raise PurgedRangeError(f"{text}: nothing written; backfill from --from-seq {first}")
        self.report.notes.append(f"{text}: seqs {plan.lo}..{first - 1} may be missing")
        log.warning("backfill %s: %s", self.run_id, self.report.notes[-1])


def run_backfill(spark: SparkSession, config: JobConfig, request: RangeRequest, *,
                 options: ConnectionOptions | None = None, drain_target: Any = SAME_AS_TARGET,
                 run_id: str | None = None) -> BackfillReport:
    """Backfill ``request`` from ``config.source.stream`` into ``config.target``.

    >>> report = run_backfill(spark, config, RangeRequest.parse(from_seq=1000, to_seq=5000))
    >>> report.covered_range, report.messages_written, report.already_present
    ([1000, 5000], 3800, 201)
    """
    return Backfill(config, request, options=options, drain_target=drain_target,
                    run_id=run_id).run(spark)
