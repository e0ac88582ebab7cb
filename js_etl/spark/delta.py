"""Delta writes tagged with the job's identity, and reading back what a commit holds.

Every round is one Delta transaction per table, tagged twice:
* ``txnAppId``/``txnVersion`` = job id / round number (Delta's application transaction: a
  repeated (app, version) is skipped, so replaying a round can never add its rows twice);
* ``userMetadata`` = a JSON :class:`CommitTag`, so recovery finds the round in the history.

Acks are built from :func:`committed_keys`: the ``(seq, num_delivered, consumer_seq)`` of the
files that the round's commit added, read back from the table itself.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ACK_KEY_COLUMNS = ("seq", "num_delivered", "consumer_seq")


@dataclass(frozen=True, slots=True)
class CommitTag:
    job: str  # "js-etl:<stream>:<consumer>"
    run: str  # this run's id
    round: int  # global round number of the job: also the Delta txnVersion
    ack_prefix: str  # "$JS.ACK.<stream>.<consumer>": acks are rebuilt with it
    first_seq: int  # lowest and highest stream sequence fetched in the round
    last_seq: int

    def to_json(self) -> str:
        return json.dumps({"js_etl": asdict(self)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> CommitTag | None:
        try:
            data = json.loads(text or "")["js_etl"]
            return cls(**data)
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True, slots=True)
class DeltaTarget:
    """A Delta table by path or by catalog name."""

    path: str | None = None
    table: str | None = None

    def __str__(self) -> str:
        return self.table or self.path or "?"

    def exists(self, spark: SparkSession) -> bool:
        from delta.tables import DeltaTable

        if self.table:
            return bool(spark.catalog.tableExists(self.table))
        return bool(DeltaTable.isDeltaTable(spark, self.path))

    def delta_table(self, spark: SparkSession) -> Any:
        from delta.tables import DeltaTable

        return (DeltaTable.forName(spark, self.table) if self.table
                else DeltaTable.forPath(spark, self.path))

    def location(self, spark: SparkSession) -> str:
        if self.path:
            return self.path.rstrip("/")
        return str(self.delta_table(spark).detail().first()["location"]).rstrip("/")

    def append(self, df: DataFrame, tag: CommitTag, *, partition_by: list[str],
               merge_schema: bool) -> None:
        writer = (df.write.format("delta").mode("append")
                  .option("txnAppId", tag.job).option("txnVersion", str(tag.round))
                  .option("userMetadata", tag.to_json()))
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        if merge_schema:
            writer = writer.option("mergeSchema", "true")
        if self.table:
            writer.saveAsTable(self.table)
        else:
            writer.save(self.path)

    def job_commits(self, spark: SparkSession, job: str, limit: int = 50
                    ) -> list[tuple[int, CommitTag]]:
        """Commits of ``job`` among the table's newest ``limit`` commits, newest first."""
        if not self.exists(spark):
            return []
        rows = self.delta_table(spark).history(limit).select("version", "userMetadata").collect()
        tagged = ((int(r["version"]), CommitTag.from_json(r["userMetadata"])) for r in rows)
        return [(v, t) for v, t in tagged if t is not None and t.job == job]

    def commit_of(self, spark: SparkSession, tag: CommitTag) -> int | None:
        """The version that holds this round, or None (nothing was committed for it)."""
        # Concurrent writers (a backfill's MERGE) may have committed after this round.
        for version, found in self.job_commits(spark, tag.job, limit=50):
            if found.round == tag.round:
                return version
        return None


def committed_keys(spark: SparkSession, target: DeltaTarget, version: int, *,
                   with_error: bool = False) -> Any:
    """``(seq, num_delivered, consumer_seq[, error])`` of the rows that commit ``version`` added,
    as a pyarrow Table. Read from the table's own files, never from the fetch that produced
    them."""
    import pyarrow as pa

    columns = (*ACK_KEY_COLUMNS, "error") if with_error else ACK_KEY_COLUMNS
    empty = pa.table({c: pa.array([], pa.string() if c == "error" else pa.int64())
                      for c in columns})
    location = target.location(spark)
    paths = added_files(spark, location, version)
    if not paths:
        return empty
    files = [p if "://" in p or p.startswith("/") else f"{location}/{unquote(p)}" for p in paths]
    return spark.read.parquet(*files).select(*columns).toArrow()


def added_files(spark: SparkSession, location: str, version: int) -> list[str]:
    """The data files commit ``version`` added: its ``add`` actions, read from the commit file on
    the driver through Hadoop's FileSystem (any store Spark can write; no Spark job)."""
    jvm = spark._jvm  # type: ignore[attr-defined]
    path = jvm.org.apache.hadoop.fs.Path(f"{location}/_delta_log/{version:020d}.json")
    stream = path.getFileSystem(spark._jsc.hadoopConfiguration()).open(path)  # type: ignore
    try:
        text = str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()
    actions = (json.loads(line) for line in text.splitlines() if line.strip())
    return [a["add"]["path"] for a in actions if "add" in a]
