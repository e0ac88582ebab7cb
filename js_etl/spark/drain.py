"""The bounded drain: fence ▸ plan ▸ [fetch ▸ write+commit ▸ ack]* ▸ report (DESIGN §2).

The hazard that shapes this module: a Spark RDD is recomputed whenever its blocks are missing,
and fetching from a durable consumer is a side effect — a recomputed partition fetches
*different* messages. So:

1. A round's fetch runs exactly once, as an eager ``localCheckpoint``. That cuts the lineage:
   if a checkpointed block is ever lost, Spark fails the job instead of silently re-fetching.
   A failed task attempt's messages are simply not in the checkpoint; nobody acks them and the
   server redelivers them after ``ack_wait``.
2. Table rows and dead-letter rows are written from that checkpoint, one Delta transaction per
   table, tagged with the job and round (see :mod:`js_etl.spark.delta`).
3. Acks are built from the files each commit added, read back from the table — never from the
   checkpoint or a fetch. What was not committed is never acked.

A run that dies between commit and acks leaves a committed, unacked round. The next run's fence
acks it (acks are idempotent and keyed by stream sequence) before it pulls anything.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from js_etl.config import JobConfig
from js_etl.errors import TransientError
from js_etl.jetstream import (
    ConnectionOptions,
    ConsumerConfig,
    ConsumerInfo,
    JetStreamSession,
    ack_subject,
)
from js_etl.report import RunReport
from js_etl.spark.decode import decode, json_fields, with_partition_columns
from js_etl.spark.delta import CommitTag, DeltaTarget, committed_keys
from js_etl.spark.fetch import RAW_DDL, FetchPlan, fetch_partition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("js_etl.drain")

DEFAULT_ACK_WAIT = 300.0  # seconds, for consumers js-etl creates
DEFAULT_MAX_ACK_PENDING = 100_000  # for consumers js-etl creates: the round size ceiling


@dataclass(frozen=True, slots=True)
class RoundSize:
    partitions: int
    batch: int
    partition_messages: int
    partition_bytes: int


def min_ack_wait(config: JobConfig) -> float:
    """The shortest ack_wait a drain accepts: the fetch phase uses a third of ack_wait, and a
    round must still be able to finish a few pulls (each bounded by fetch.pull_timeout)."""
    return 3 * config.fetch.pull_timeout


def plan_round(config: JobConfig, info: ConsumerInfo, *, messages_left: float,
               bytes_left: float) -> RoundSize | None:
    """Size one round so partitions × batch never exceed the consumer's ack-pending headroom.

    Returns None when there is no headroom at all (every ack-pending slot taken).
    """
    fetch = config.fetch
    limit = info.config.max_ack_pending
    headroom = float("inf") if not limit or limit < 0 else limit - info.num_ack_pending
    budget = min(headroom, messages_left)
    if budget < 1:
        return None
    partitions = int(min(fetch.partitions, budget))
    per_partition = budget / partitions
    partition_messages = int(min(per_partition, 2**31 - 1))
    batch = max(1, min(fetch.batch, partition_messages))
    partition_bytes = int(min(fetch.partition_max_bytes, max(bytes_left / partitions, 1)))
    return RoundSize(partitions, batch, partition_messages, partition_bytes)


class Drain:
    """One run of a drain. Use :func:`run_drain`."""

    def __init__(self, spark: SparkSession, config: JobConfig, options: ConnectionOptions,
                 *, run_id: str | None = None,
                 on_round: Callable[[RunReport], None] | None = None) -> None:
        self.spark = spark
        self.config = config
        self.options = options
        self.source = config.source
        self.target = DeltaTarget(config.target.path, config.target.table)
        self.dead_letters = DeltaTarget(config.target.resolved_dead_letter_path,
                                        config.target.resolved_dead_letter_table)
        self.ack_prefix = f"$JS.ACK.{self.source.stream}.{self.source.consumer}"
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.on_round = on_round or (lambda report: None)
        self.report = RunReport(
            job=config.job_id, run_id=self.run_id, stream=self.source.stream,
            consumer=self.source.consumer, target=str(self.target),
            dead_letter_target=str(self.dead_letters),
            started_at=datetime.now(UTC).isoformat(timespec="seconds"))

    def run(self) -> RunReport:
        started = time.monotonic()
        if self.config.decode.format == "json":
            json_fields(self.config.decode.schema or "")  # bad DDL fails before any pull
        with self._phase("connect"):
            js = JetStreamSession(self.options)
        with js:
            self._run(js, started)
        self.report.seconds = round(time.monotonic() - started, 3)
        return self.report

    def _run(self, js: JetStreamSession, started: float) -> None:
        report, run = self.report, self.config.run
        with self._phase("plan"):
            stream = js.stream_info(self.source.stream)
            info = js.run(js.admin.ensure_drain_consumer(
                self.source.stream, self._desired_consumer(), create=self.source.create_consumer,
                min_ack_wait=min_ack_wait(self.config)))
            report.target_seq = stream.state.last_seq
            report.pending_before = info.num_pending
        with self._phase("fence"):
            last_round = self._fence(js, info)
        next_round = last_round + 1
        while True:
            stop = self._budget_spent(started)
            if stop:
                report.stopped_because = stop
                break
            with self._phase("plan"):
                info = js.consumer_info(self.source.stream, self.source.consumer)
            if info.num_pending == 0 and info.num_ack_pending == 0:
                report.stopped_because = "drained"
                break
            if report.rounds and info.delivered.stream_seq >= report.target_seq:
                report.stopped_because = "target_reached"
                break
            size = plan_round(self.config, info,
                              messages_left=_left(run.max_messages, report.messages_written
                                                  + report.dead_letters),
                              bytes_left=_left(run.max_bytes, report.bytes))
            if size is None:
                raise TransientError(
                    f"consumer {self.source.stream}/{self.source.consumer} has all "
                    f"{info.config.max_ack_pending} ack-pending slots taken by deliveries this "
                    f"run did not make; they return after ack_wait "
                    f"({info.config.ack_wait or 0:g}s): retry then")
            fetched, blocks = self._fetch(size, info)
            try:
                done = self._commit_and_ack(js, fetched, next_round)
            finally:
                self._release(blocks)
            if not done:
                report.stopped_because = "drained"
                break
            next_round += 1
            self.on_round(report)
        with self._phase("plan"):
            info = js.consumer_info(self.source.stream, self.source.consumer)
        report.pending_after = info.num_pending
        report.ack_pending_after = info.num_ack_pending

    def _desired_consumer(self) -> ConsumerConfig:
        s = self.source
        return ConsumerConfig(
            durable_name=s.consumer, ack_wait=s.ack_wait or DEFAULT_ACK_WAIT,
            max_ack_pending=s.max_ack_pending or DEFAULT_MAX_ACK_PENDING,
            max_deliver=s.max_deliver, filter_subjects=tuple(s.filter_subjects),
            description="js-etl drain into Delta")

    def _fence(self, js: JetStreamSession, info: ConsumerInfo) -> int:
        """Finish what an earlier run left: ack the newest committed round of this job in both
        tables, unless the consumer's ack floor shows it fully acked already (acks are
        idempotent, so a needless re-ack only costs time). Returns the job's last round."""
        last_round = 0
        for table in (self.target, self.dead_letters):
            commits = table.job_commits(self.spark, self.config.job_id)
            if not commits:
                continue
            version, tag = commits[0]
            last_round = max(last_round, tag.round)
            if info.ack_floor.stream_seq < tag.last_seq:
                keys = committed_keys(self.spark, table, version)
                self.report.reacked_at_start += self._ack(js, keys)
        return last_round

    def _fetch(self, size: RoundSize, info: ConsumerInfo) -> tuple[DataFrame, set[int]]:
        ack_wait = info.config.ack_wait or DEFAULT_ACK_WAIT
        plan = FetchPlan(
            options=self.options, stream=self.source.stream, consumer=self.source.consumer,
            ack_prefix=self.ack_prefix, batch=size.batch, max_bytes=self.config.fetch.max_bytes,
            partition_messages=size.partition_messages, partition_bytes=size.partition_bytes,
            stop_after_seq=self.report.target_seq or 2**63 - 1,
            pull_timeout=self.config.fetch.pull_timeout,
            fetch_seconds=max(self.config.fetch.pull_timeout, ack_wait / 3),
            group=self.source.priority_group, min_pending=self.source.min_pending,
            min_ack_pending=self.source.min_ack_pending)
        with self._phase("fetch"):
            df = (self.spark.range(size.partitions, numPartitions=size.partitions)
                  .mapInArrow(partial(fetch_partition, plan), RAW_DDL))
            before = self._persistent_rdds()
            # The one and only evaluation of this round's fetch (see module docstring).
            fetched = df.localCheckpoint(eager=True)
            return fetched, self._persistent_rdds() - before

    def _persistent_rdds(self) -> set[int]:
        return set(self.spark.sparkContext._jsc.getPersistentRDDs().keys())

    def _release(self, rdd_ids: set[int]) -> None:
        """Free the round's checkpoint blocks now: ``DataFrame.unpersist`` does not reach a
        local checkpoint, and waiting for the JVM's GC lets memory grow with the backlog."""
        rdds = self.spark.sparkContext._jsc.getPersistentRDDs()
        for rdd_id in rdd_ids:
            if rdd_id in rdds:
                rdds[rdd_id].unpersist(False)

    def _commit_and_ack(self, js: JetStreamSession, fetched: DataFrame, round_no: int) -> bool:
        from pyspark.sql import functions as F

        report = self.report
        with self._phase("write"):
            stats = fetched.agg(F.count("*").alias("n"),
                                F.coalesce(F.sum(F.length("data")), F.lit(0)).alias("bytes"),
                                F.min("seq").alias("first"), F.max("seq").alias("last")).first()
            if not stats["n"]:
                return False
            decoded = decode(fetched, self.config.decode.format, self.config.decode.schema)
            tag = CommitTag(self.config.job_id, self.run_id, round_no, self.ack_prefix,
                            int(stats["first"]), int(stats["last"]))
            committed = []
            if not decoded.dead_letters.isEmpty():
                self.dead_letters.append(decoded.dead_letters, tag, partition_by=[],
                                         merge_schema=False)
                committed.append((self.dead_letters, report.dead_letter_versions))
            rows, partition_names = with_partition_columns(decoded.rows,
                                                           list(self.config.target.partition_by))
            self.target.append(rows, tag, partition_by=partition_names,
                               merge_schema=self.config.decode.merge_schema)
            committed.append((self.target, report.delta_versions))
        with self._phase("ack"):
            for table, versions in committed:
                version = table.commit_of(self.spark, tag)
                if version is None:
                    continue  # nothing committed for this table: nothing to ack
                versions.append(version)
                acked = self._ack(js, committed_keys(self.spark, table, version))
                if table is self.target:
                    report.messages_written += acked
                else:
                    report.dead_letters += acked
        report.rounds += 1
        report.bytes += int(stats["bytes"])
        report.first_seq = min(x for x in (report.first_seq, stats["first"]) if x is not None)
        report.last_seq = max(x for x in (report.last_seq, stats["last"]) if x is not None)
        log.info("round %d: %d messages, versions %s", round_no, stats["n"],
                 report.delta_versions[-1:])
        return True

    def _ack(self, js: JetStreamSession, keys: Any) -> int:
        if keys.num_rows == 0:
            return 0
        prefix = self.ack_prefix
        columns = [keys.column(c).to_pylist() for c in ("num_delivered", "seq", "consumer_seq")]
        return js.ack(ack_subject(prefix, d, s, c) for d, s, c in zip(*columns, strict=True))

    def _budget_spent(self, started: float) -> str | None:
        run, report = self.config.run, self.report
        if run.max_rounds is not None and report.rounds >= run.max_rounds:
            return "max_rounds"
        if run.max_messages is not None and (report.messages_written + report.dead_letters
                                             >= run.max_messages):
            return "max_messages"
        if run.max_bytes is not None and report.bytes >= run.max_bytes:
            return "max_bytes"
        if run.max_seconds is not None and time.monotonic() - started >= run.max_seconds:
            return "max_seconds"
        return None

    def _phase(self, name: str) -> _Phase:
        return _Phase(self.report, name)


class _Phase:
    def __init__(self, report: RunReport, name: str) -> None:
        self.report, self.name = report, name

    def __enter__(self) -> None:
        self.started = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.report.add_phase(self.name, time.monotonic() - self.started)


def _left(budget: int | None, used: int) -> float:
    return float("inf") if budget is None else budget - used


def run_drain(spark: SparkSession, config: JobConfig, *, run_id: str | None = None,
              options: ConnectionOptions | None = None) -> RunReport:
    """Drain ``config.source`` into ``config.target`` on ``spark`` and return the report.

    >>> report = run_drain(spark, load_config("conf/example.yaml"))
    >>> report.messages_written, report.stopped_because
    (12000, 'drained')
    """
    return Drain(spark, config, options or config.nats.connection_options(),
                 run_id=run_id).run()
