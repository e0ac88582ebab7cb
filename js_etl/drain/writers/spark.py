"""Spark's writer: the round's fetch is one ``mapInArrow`` job, decoded by Spark's ``from_json``
in the same pass and evaluated exactly once into local checkpoint blocks; the round's rows and
dead letters are appended from there, one tagged Delta transaction per table.

Why a checkpoint: a Spark RDD is recomputed whenever its blocks are missing, and a fetch from a
durable consumer is a side effect — a recomputed partition fetches *different* messages. The
eager ``localCheckpoint`` cuts the lineage: a lost block fails the job instead of fetching again,
and a failed task attempt's messages are simply not in it (nobody acks them). Everything after
the fetch — the dedupe, the anti-join of what the tables hold, the appends — reads the
checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from js_etl import faults
from js_etl.decode.spark import with_partition_columns
from js_etl.delta.keys import keys_of, range_keys
from js_etl.drain.fetch import FetchPlan, fetch_partition
from js_etl.drain.rounds import RoundStats
from js_etl.drain.writers.base import Commit, Writer
from js_etl.schema import PAYLOAD_BYTES, RAW_DDL
from js_etl.spark.session import is_connect

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("js_etl.drain")


@dataclass(frozen=True, slots=True)
class SparkRound:
    """A round's deliveries, flagged by :meth:`~js_etl.decode.spark.Decoder.flag`, held in local
    checkpoint blocks."""

    rows: DataFrame
    blocks: frozenset[int]  # the ids of the checkpoint's RDDs, to free after the round


class SparkWriter(Writer):
    name = "spark"

    def fetch(self, plan: FetchPlan, partitions: int, round_no: int) -> SparkRound:
        c = self.context
        tasks = c.spark.range(partitions, numPartitions=partitions)
        # Decoding in the fetch's pass saves checkpointing a second copy of the round.
        fetched = checkpoint(c.spark, c.decoder.flag(
            tasks.mapInArrow(partial(fetch_partition, plan), RAW_DDL),
            park_after=c.config.source.max_deliver))
        if c.fault == "lose_checkpoint":
            release_blocks(c.spark, fetched.blocks)  # as if the executor holding them had died
        return fetched

    def discard(self, fetched: SparkRound) -> None:
        release_blocks(self.context.spark, fetched.blocks)

    def commit(self, fetched: SparkRound, round_no: int, check: Callable[[], None]
               ) -> Commit | None:
        return self.commit_rows(fetched.rows, round_no, check)

    def commit_rows(self, fetched: DataFrame, round_no: int, check: Callable[[], None],
                    file_rows: DataFrame | None = None) -> Commit | None:
        """Commit flagged deliveries; the good ones' rows decoded from ``fetched``, or taken from
        ``file_rows`` (a columnar round's files, joined to the deliveries ``fetched`` keeps)."""
        import pyarrow as pa

        c = self.context
        deduped: SparkRound | None = None
        try:
            stats, seqs = self._stats(fetched)
            if not stats.n:
                return None
            duplicates = stats.n - stats.distinct
            if duplicates:
                deduped = self._dedupe(fetched)
                fetched = deduped.rows
                stats, seqs = self._stats(fetched)
            # Sequences a table already holds (committed by an earlier round or run whose acks
            # were lost) are acked, never written twice.
            held = [set(keys_of(range_keys(c.spark, table, c.stream, stats.first, stats.last),
                                seqs).column("seq").to_pylist())
                    for table in (c.target, c.dead_letters)]
            known = sorted(set().union(*held))
            written = stats
            if known:
                log.warning("round %d: %d messages are already in the tables (their acks were "
                            "lost); acking them instead of writing them again", round_no,
                            len(known))
                fetched = fetched.join(c.spark.createDataFrame(
                    pa.table({"seq": pa.array(known, pa.int64())})), "seq", "left_anti")
                written, _ = self._stats(fetched)
            tag = c.tag(round_no, stats)
            dead_version = row_version = None
            if written.dead:
                check()
                dead_version = c.dead_letters.append(
                    c.spark, c.decoder.dead_letters(fetched), tag, partition_by=[],
                    merge_schema=False)
            if written.n > written.dead:
                rows, partition_names = with_partition_columns(
                    self._good_rows(fetched, file_rows), list(c.config.target.partition_by))
                if c.fault == "fail_write_task":
                    rows = rows.mapInArrow(faults.failing_write_stage, rows.schema)
                check()
                row_version = c.target.append(c.spark, rows, tag, partition_by=partition_names,
                                              merge_schema=c.config.decode.merge_schema)
            return Commit(stats, seqs, row_version, dead_version,
                          already_held=(len(held[0]), len(held[1])), duplicates=duplicates)
        finally:
            if deduped is not None:
                release_blocks(c.spark, deduped.blocks)

    def acks(self, commit: Commit) -> tuple[pa.Table, pa.Table]:
        c, first, last = self.context, commit.stats.first, commit.stats.last
        rows = range_keys(c.spark, c.target, c.stream, first, last)
        dead = range_keys(c.spark, c.dead_letters, c.stream, first, last, with_error=True)
        return (keys_of(rows, commit.seqs),
                keys_of(dead, commit.seqs, with_error=True))

    def _stats(self, fetched: DataFrame) -> tuple[RoundStats, pa.ChunkedArray]:
        """What the round holds, and its seqs."""
        from pyspark.sql import functions as F

        keys = fetched.select("seq", F.col("error").isNotNull().alias("dead"),
                              F.col(PAYLOAD_BYTES).alias("bytes")).toArrow()
        return RoundStats.of(keys), keys.column("seq")

    def _dedupe(self, fetched: DataFrame) -> SparkRound:
        """One row per seq, the latest delivery (highest consumer_seq), checkpointed so every
        later job sees the same copy."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        latest = Window.partitionBy("seq").orderBy(F.col("consumer_seq").desc())
        log.warning("a round fetched some messages twice; keeping the latest delivery of each")
        return checkpoint(self.context.spark,
                          fetched.withColumn("_js_etl_n", F.row_number().over(latest))
                          .where(F.col("_js_etl_n") == 1).drop("_js_etl_n"))

    def _good_rows(self, fetched: DataFrame, file_rows: DataFrame | None) -> DataFrame:
        """The round's table rows: decoded from ``fetched``, or the ``file_rows`` of the
        deliveries ``fetched`` still holds (after the dedupe and the anti-join)."""
        if file_rows is None:
            return self.context.decoder.rows(fetched)
        from pyspark.sql import functions as F

        keep = fetched.where(F.col("error").isNull()).select("seq", "consumer_seq")
        return file_rows.join(keep, ["seq", "consumer_seq"], "left_semi")


def checkpoint(spark: SparkSession, df: DataFrame) -> SparkRound:
    """Evaluate ``df`` once, eagerly, into local checkpoint blocks."""
    if is_connect(spark):  # the server keeps the checkpoint until the client drops it
        return SparkRound(df.localCheckpoint(eager=True), frozenset())
    before = _persistent_rdds(spark)
    checkpointed = df.localCheckpoint(eager=True)
    return SparkRound(checkpointed, frozenset(_persistent_rdds(spark) - before))


def release_blocks(spark: SparkSession, rdd_ids: frozenset[int]) -> None:
    """Free checkpoint blocks now: ``DataFrame.unpersist`` does not reach a local checkpoint,
    and waiting for the JVM's GC lets memory grow with the backlog. (Over Spark Connect there
    are none to free here: the server frees a checkpoint when its client-side DataFrame is
    garbage-collected.)"""
    if not rdd_ids:
        return
    rdds = spark.sparkContext._jsc.getPersistentRDDs()
    for rdd_id in rdd_ids:
        if rdd_id in rdds:
            rdds[rdd_id].unpersist(False)


def _persistent_rdds(spark: SparkSession) -> set[int]:
    return set(spark.sparkContext._jsc.getPersistentRDDs().keys())
