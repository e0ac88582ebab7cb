"""One ``js-etl stream`` run: a ``Trigger.AvailableNow`` query from the job's stream
(``spark.readStream.format("nats_jetstream")``, :mod:`js_etl.source.stream`) into the job's
table and dead-letter table, which stops once it has read what the stream held when it started.

Each micro-batch is written by ``foreachBatch``: its good rows appended to the table, its dead
letters to the dead-letter table, each append carrying Delta's application transaction
``(txnAppId, txnVersion) = ("js-etl-stream:<stream>:<query id>", batch id + 1)``. What
exactly-once relies on:

* Spark logs a batch's offsets in the checkpoint before it runs the batch, and its commit only
  after ``foreachBatch`` returned; a run killed anywhere in between runs that batch again, with
  the same offsets;
* the same offsets read the same messages (:mod:`js_etl.source.stream`);
* a table that already records the batch's transaction is not appended to again — checked
  before the append, and Delta itself skips an append whose ``txnVersion`` is not above the
  recorded one — so a batch run twice is in each table once;
* the query id is the checkpoint's own (Spark keeps it in the checkpoint's metadata), so a
  restarted query continues its transactions, and a new checkpoint starts its own.

A drain and a stream job must not write one table: each is exactly-once on its own, not with the
other (their positions are a durable consumer and a checkpoint).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from js_etl import faults
from js_etl.decode.spark import with_partition_columns
from js_etl.delta.table import (
    EVERY_SEQ,
    CommitTag,
    DeltaTarget,
    job_tables,
    refuse_lossy_commits,
)
from js_etl.errors import ConfigError, JsEtlError, RunRefusedError, TerminalError
from js_etl.report import RunReport, StopReason
from js_etl.schema import DEAD_LETTER_COLUMNS
from js_etl.source import register
from js_etl.source.datasource import NAME, load_error
from js_etl.source.options import job_options
from js_etl.source.stream import move_consumer
from js_etl.spark.session import configure_s3a, hadoop_read_text, is_connect
from js_etl.streaming.preflight import NOT_OVER_CONNECT, checkpoint_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from js_etl.config import JobConfig


@dataclass
class StreamReport(RunReport):
    """A run report plus the query: its checkpoint and id, and each batch it ran."""

    checkpoint: str = ""
    query_id: str = ""
    # per batch: its id, offsets [from, to) in sequences (from is null for a new query's first
    # batch: Spark reports none), first and last seq, and the rows and dead letters this run
    # appended
    batches: list[dict[str, Any]] = field(default_factory=list)
    batches_already_written: int = 0  # batches a killed run had written: not written again
    skipped: int = 0  # sequences gone before the query read them, over the query's life


def run_stream(spark: SparkSession, config: JobConfig, *, run_id: str | None = None
               ) -> StreamReport:
    """Run the job's ``Trigger.AvailableNow`` query to its end — what the stream held when it
    started, from where the checkpoint ``streaming.checkpoint`` left off — and report what it
    wrote (the module docstring says how each batch is written once).

    >>> report = run_stream(spark, load_config("orders_stream.yaml"))
    >>> [batch["offsets"] for batch in report.batches], report.messages_written
    """
    if is_connect(spark):
        raise ConfigError(NOT_OVER_CONNECT)
    checkpoint = checkpoint_of(config)
    register(spark)
    configure_s3a(spark)
    target, dead_letters = job_tables(config)
    refuse_lossy_commits(spark, [target, dead_letters])
    run_id = run_id or uuid.uuid4().hex[:12]
    report = StreamReport(
        job=f"js-etl-stream:{config.source.stream}", run_id=run_id,
        stream=config.source.stream,
        consumer=config.source.consumer if config.streaming.commit_consumer else "",
        target=str(target), dead_letter_target=str(dead_letters),
        started_at=datetime.now(UTC).isoformat(timespec="seconds"), checkpoint=checkpoint,
        writer="stream")
    options = job_options(config)
    batches = BatchWriter(config, target, dead_letters, report)
    with report.phase("query"), _one_line(checkpoint):
        df = spark.readStream.format(NAME).options(**options).load()
        query = (df.writeStream.foreachBatch(batches)
                 .option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        batches.started(str(query.id))
        query.awaitTermination()
    report.query_id = str(query.id)
    _add_offsets(report.batches, query.recentProgress)
    progress = query.lastProgress
    if progress is not None and progress["sources"]:
        end = _offset(progress["sources"][0]["endOffset"])
        report.skipped = int(end.get("skipped", 0)) if end else 0
        if end and config.streaming.commit_consumer:
            # Spark commits a batch to the source when it starts the next one: the last one's
            # end is moved here, after the query ended with it committed.
            move_consumer(config.nats.connection_options(), config.source.stream,
                          config.source.consumer, int(end["seq"]), config.source.lease_bucket,
                          end.get("query"))
    report.stopped_because = StopReason.TARGET_REACHED
    report.rounds = len(report.batches)
    report.seconds = report.phase_seconds.get("query", 0.0)
    return report


@contextmanager
def _one_line(checkpoint: str) -> Iterator[None]:
    """The query's failure as js-etl's error: the source's own, or another run at work on the
    checkpoint (exit 73, as for a drain whose consumer another run holds)."""
    try:
        yield
    except JsEtlError:
        raise
    except Exception as e:
        error = load_error(e)
        if error is not None:
            raise error from None
        text = str(e)
        if _another_run_has_the_checkpoint(text, checkpoint):
            leftovers = (" (if no other run is at work, a first batch that never logged its "
                         "offsets left files there: delete the checkpoint, nothing was "
                         "committed through it)"
                         if "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY" in text else "")
            raise RunRefusedError(
                f"another run of this stream job is writing its checkpoint {checkpoint}: this "
                "run stopped (no batch is written twice); the next run continues from the "
                f"checkpoint{leftovers}") from None
        raise


def _another_run_has_the_checkpoint(text: str, checkpoint: str) -> bool:
    """Spark's words when two queries write one checkpoint (spark 4.2's error conditions): the
    second to log a batch's offsets or commit, or to create the checkpoint, finds the file there
    — CONCURRENT_STREAM_LOG_UPDATE; _LEGACY_ERROR_TEMP_2207 ("Multiple streaming queries are
    concurrently using <path>") when the rename of the log file lost the race;
    STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY when it started as a new query and found the
    other's first offsets by the time it checked the checkpoint was empty."""
    if "CONCURRENT_STREAM_LOG_UPDATE" in text:
        return True
    return checkpoint.rstrip("/") in text and (
        "Multiple streaming queries are concurrently using" in text
        or "FileAlreadyExistsException" in text
        or "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY" in text)


class BatchWriter:
    """``foreachBatch``: one micro-batch into the two tables, once (module docstring)."""

    def __init__(self, config: JobConfig, target: DeltaTarget, dead_letters: DeltaTarget,
                 report: StreamReport) -> None:
        self.config = config
        self.target = target
        self.dead_letters = dead_letters
        self.report = report
        self._query_id = ""
        self._started = threading.Event()

    def started(self, query_id: str) -> None:
        self._query_id = query_id
        self._started.set()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        self._started.wait()  # start() returned with the query's id before the first batch
        job = f"js-etl-stream:{self.config.source.stream}:{self._query_id}"
        spark = batch.sparkSession
        batch = batch.persist()  # two tables and a count read it: the same rows, read once
        try:
            stats = batch.agg(F.count("*").alias("n"), F.count("error").alias("dead"),
                              F.min("seq").alias("first"), F.max("seq").alias("last"),
                              F.coalesce(F.sum(F.length("data")), F.lit(0)).alias("bytes")
                              ).first()
            assert stats is not None  # an aggregate without grouping has one row
            tag = CommitTag(job, self.report.run_id, batch_id + 1, "",
                            stats["first"] or 0, stats["last"] or 0)
            faults.kill_at_batch("kill_before_batch_write", batch_id)
            written: dict[str, Any] = {"batch": batch_id, "first_seq": stats["first"],
                                       "last_seq": stats["last"]}
            def logged_end() -> int:
                return _logged_end(spark, self.report.checkpoint, batch_id)

            dead_version = None
            if stats["dead"]:
                dead = batch.where(F.col("error").isNotNull()).select(*DEAD_LETTER_COLUMNS)
                dead_version = self._append(spark, self.dead_letters, dead, tag, [], False,
                                            logged_end)
                faults.kill_at_batch("kill_between_tables", batch_id)
            decode = self.config.decode
            rows = batch.where(F.col("error").isNull()).drop(
                *(["error"] if decode.keeps_payload else ["error", "data"]))
            rows, partition_by = with_partition_columns(
                rows, list(self.config.target.partition_by))
            version = self._append(spark, self.target, rows, tag, partition_by,
                                   decode.merge_schema, logged_end)
            faults.kill_at_batch("kill_after_batch_write", batch_id)
        finally:
            batch.unpersist()
        report = self.report
        # What this run appended: a killed run's appends of this batch are not made again.
        if version is None:
            report.batches_already_written += 1
        else:
            written["rows"] = stats["n"] - stats["dead"]
            report.messages_written += written["rows"]
            report.delta_versions.append(version)
            report.bytes += stats["bytes"]
        if dead_version is not None:
            written["dead_letters"] = stats["dead"]
            report.dead_letters += stats["dead"]
            report.dead_letter_versions.append(dead_version)
        if stats["first"] is not None:
            report.first_seq = min(report.first_seq or stats["first"], stats["first"])
            report.last_seq = max(report.last_seq or 0, stats["last"])
        report.batches.append(written)

    @staticmethod
    def _append(spark: SparkSession, table: DeltaTarget, df: DataFrame, tag: CommitTag,
                partition_by: list[str], merge_schema: bool, logged_end: Callable[[], int]
                ) -> int | None:
        """Append ``df`` as batch ``tag.round``; None where the table already holds it (a run
        killed after this append and before Spark's commit of the batch). A batch run again
        from its logged offsets reads the same range, less what has left the stream since (a
        purge, a deleted message): within what the table holds, which ends before the logged
        end (``logged_end``). A table ahead of that — holding the batch with a range the batch
        now goes beyond, or ends before, or a later batch — has a checkpoint older than itself
        (put back from a copy): Spark re-planned the batch, and skipping it would lose or
        duplicate messages."""
        recorded, _ = table.job_round(spark, tag.job)
        if recorded < tag.round:
            return table.append(spark, df, tag, partition_by=partition_by,
                                merge_schema=merge_schema)
        held = table.last_round_seqs(spark, tag.job) if recorded == tag.round else None
        if held == (1, EVERY_SEQ):  # its commit's log file was cleaned up: cannot tell
            return None
        within = held is not None and held[1] < logged_end() and (
            tag.first_seq == tag.last_seq == 0
            or (held[0] <= tag.first_seq and tag.last_seq <= held[1]))
        if not within:
            holds = f"batch {recorded - 1} of this query" + (
                f" as seqs {held[0]}..{held[1]}" if held else "")
            raise TerminalError(
                f"{table} already holds {holds}, but its checkpoint now plans batch "
                f"{tag.round - 1} as seqs {tag.first_seq}..{tag.last_seq}: the checkpoint is older "
                "than the table (put back from a copy?); give the query the checkpoint that wrote "
                "the table, or a new checkpoint and a new table")
        return None


def _logged_end(spark: SparkSession, checkpoint: str, batch_id: int) -> int:
    """Batch ``batch_id``'s end offset (a sequence) as Spark logged it in the checkpoint before
    it ran the batch: the last line of ``offsets/<batch id>`` is the source's offset."""
    text = hadoop_read_text(spark, f"{checkpoint.rstrip('/')}/offsets/{batch_id}")
    return int(json.loads(text.strip().splitlines()[-1])["seq"])


def _add_offsets(batches: list[dict[str, Any]], progress: list[Any]) -> None:
    """Each batch's offsets as the query's progress gives them: ``[from, to)`` in sequences."""
    sources = {p["batchId"]: p["sources"][0] for p in progress if p["sources"]}
    for batch in batches:
        source = sources.get(batch["batch"])
        if source is not None:
            start, end = _offset(source["startOffset"]), _offset(source["endOffset"])
            batch["offsets"] = [start["seq"] if start else None, end["seq"] if end else None]


def _offset(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    return json.loads(value) if isinstance(value, str) else dict(value)
