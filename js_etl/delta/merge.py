"""The backfill's MERGE: insert only the ``(stream, seq)`` a table lacks, in one tagged commit."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from js_etl.delta.table import (
    CommitTag,
    DeltaTarget,
    create_empty,
    lost_to_another_commit,
    plain_types,
)
from js_etl.errors import TransientError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

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
    added meanwhile are skipped. The MERGE is SQL over a temporary view of the source, so it
    runs alike on a classic session and over Spark Connect (whose Spark 4.2 servers have no
    Delta Connect plugin for Delta's Python API).
    """
    source = plain_types(spark, source)
    view = f"jsetl_merge_{uuid.uuid4().hex}"
    source.createOrReplaceTempView(view)
    evolution = "WITH SCHEMA EVOLUTION " if merge_schema else ""
    statement = (f"MERGE {evolution}INTO {table.sql_name()} AS t USING {view} AS s "
                 f"ON {_merge_condition(stream, lo, hi)} WHEN NOT MATCHED THEN INSERT *")
    try:
        for attempt in range(1, MERGE_ATTEMPTS + 1):
            on_attempt()
            try:
                with _user_metadata(spark, tag.to_json()):
                    if not table.exists(spark):
                        create_empty(table, source, partition_by)
                    metrics = spark.sql(statement).first()
                break
            except Exception as e:
                if not lost_to_another_commit(e, same_job=True):
                    raise
                if attempt == MERGE_ATTEMPTS:
                    raise TransientError(
                        f"{table} kept changing under the backfill's MERGE ({attempt} attempts, "
                        f"last: {_condition(e)}); nothing was duplicated — retry when the "
                        "drain is idle") from None
                log.warning("backfill %s: MERGE into %s lost to a concurrent commit (%s); "
                            "retrying", tag.run, table, _condition(e))
                time.sleep(min(0.5 * 2 ** attempt, 8.0))
    finally:
        with suppress(Exception):  # a session gone bad must not hide the MERGE's own error
            spark.catalog.dropTempView(view)
    inserted = int(metrics["num_inserted_rows"]) if metrics is not None else 0
    version, source_rows = _merge_commit(spark, table, tag)
    return MergeResult(inserted, source_rows, version)


def _condition(error: BaseException) -> str:
    condition = getattr(error, "getCondition", None)
    return (condition() if callable(condition) else None) or type(error).__name__


def _merge_commit(spark: SparkSession, table: DeltaTarget, tag: CommitTag
                  ) -> tuple[int | None, int | None]:
    """(version, MERGE source row count) of the run's MERGE into ``table``."""
    rows = (spark.sql(f"DESCRIBE HISTORY {table.sql_name()} LIMIT 50")
            .select("version", "operation", "userMetadata", "operationMetrics").collect())
    for row in rows:
        found = CommitTag.from_json(row["userMetadata"])
        ours = found is not None and (found.job, found.run) == (tag.job, tag.run)
        if ours and row["operation"] == "MERGE":
            metrics = row["operationMetrics"] or {}
            source = metrics.get("numSourceRows")
            return int(row["version"]), None if source is None else int(source)
    return None, None


def _merge_condition(stream: str, lo: int, hi: int) -> str:
    # The target-only terms let Delta skip files outside the range (seq min/max statistics).
    # The stream's name is a literal only when it needs no quoting: the join on s.stream is
    # what keeps other streams' rows apart, this term only narrows the files read.
    skip = f"t.stream = '{stream}' AND " if re.fullmatch(r"[\w-]+", stream) else ""
    return (f"t.stream = s.stream AND t.seq = s.seq AND {skip}"
            f"t.seq BETWEEN {int(lo)} AND {int(hi)}")


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
