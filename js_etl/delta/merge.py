"""The backfill's MERGE: insert only the ``(stream, seq)`` a table lacks, in one tagged commit."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from js_etl.delta.table import CommitTag, DeltaTarget, create_empty
from js_etl.errors import TransientError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger("js_etl.delta")


MERGE_ATTEMPTS = 5  # a MERGE that loses to concurrent commits this often fails transiently


# --- MERGE: insert what the table lacks --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MergeResult:
    inserted: int  # rows inserted
    source_rows: int | None  # rows in the MERGE's source; None when its commit was not found
    version: int | None  # the MERGE's commit; None when it was not found in the recent history


def merge_new_rows(spark: SparkSession, table: DeltaTarget, source: DataFrame, tag: CommitTag, *,
                   stream: str, lo: int, hi: int, partition_by: list[str], merge_schema: bool,
                   on_attempt: Callable[[], None] = lambda: None) -> MergeResult:
    """Insert the source rows (``stream``, seqs ``lo..hi``) whose ``(stream, seq)`` the table
    lacks, in one commit tagged with ``tag``. ``on_attempt`` is called before every attempt.

    Retries on a commit conflict: the retry re-reads the table, so rows a concurrent writer
    added meanwhile are skipped.
    """
    from delta.exceptions import (
        ConcurrentAppendException,
        ConcurrentDeleteReadException,
        ConcurrentTransactionException,
        ConcurrentWriteException,
        DeltaConcurrentModificationException,
        MetadataChangedException,
        ProtocolChangedException,
    )

    conflicts = (ConcurrentAppendException, ConcurrentDeleteReadException,
                 ConcurrentTransactionException, ConcurrentWriteException,
                 DeltaConcurrentModificationException, MetadataChangedException,
                 ProtocolChangedException)
    for attempt in range(1, MERGE_ATTEMPTS + 1):
        on_attempt()
        try:
            with _user_metadata(spark, tag.to_json()):
                if not table.exists(spark):
                    create_empty(table, source, partition_by)
                merge = (table.delta_table(spark).alias("t")
                         .merge(source.alias("s"), _merge_condition(stream, lo, hi))
                         .whenNotMatchedInsertAll())
                if merge_schema:
                    merge = merge.withSchemaEvolution()
                metrics = merge.execute().first()
            break
        except conflicts as e:
            if attempt == MERGE_ATTEMPTS:
                raise TransientError(
                    f"{table} kept changing under the backfill's MERGE ({attempt} attempts, "
                    f"last: {type(e).__name__}); nothing was duplicated — retry when the "
                    "drain is idle") from None
            log.warning("backfill %s: MERGE into %s lost to a concurrent commit (%s); "
                        "retrying", tag.run, table, type(e).__name__)
            time.sleep(min(0.5 * 2 ** attempt, 8.0))
    inserted = int(metrics["num_inserted_rows"]) if metrics is not None else 0
    version, source_rows = _merge_commit(spark, table, tag)
    return MergeResult(inserted, source_rows, version)


def _merge_commit(spark: SparkSession, table: DeltaTarget, tag: CommitTag
                  ) -> tuple[int | None, int | None]:
    """(version, MERGE source row count) of the run's MERGE into ``table``."""
    rows = (table.delta_table(spark).history(50)
            .select("version", "operation", "userMetadata", "operationMetrics").collect())
    for row in rows:
        found = CommitTag.from_json(row["userMetadata"])
        ours = found is not None and (found.job, found.run) == (tag.job, tag.run)
        if ours and row["operation"] == "MERGE":
            metrics = row["operationMetrics"] or {}
            source = metrics.get("numSourceRows")
            return int(row["version"]), None if source is None else int(source)
    return None, None


def _merge_condition(stream: str, lo: int, hi: int) -> Column:
    from pyspark.sql import functions as F

    # The target-only terms let Delta skip files outside the range (seq min/max statistics).
    return ((F.col("t.stream") == F.col("s.stream")) & (F.col("t.seq") == F.col("s.seq"))
            & (F.col("t.stream") == F.lit(stream)) & F.col("t.seq").between(lo, hi))


@contextmanager
def _user_metadata(spark: SparkSession, text: str) -> Iterator[None]:
    """Tag commits made through SQL/MERGE (no writer options there) via the session conf."""
    key = "spark.databricks.delta.commitInfo.userMetadata"
    previous = spark.conf.get(key, None)
    spark.conf.set(key, text)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)
