"""Delta writes tagged with the job's identity, and reading back what the table holds.

Two writes: a drain round's blind **append** (:meth:`DeltaTarget.append`), and a backfill's
**MERGE** that inserts only the ``(stream, seq)`` a table lacks (:func:`merge_new_rows`).

Every round is one Delta transaction per table, tagged twice:

* ``txnAppId``/``txnVersion`` = job id / round number: Delta's *application transaction*. The
  snapshot keeps the highest version recorded for each app id (a ``txn`` action, carried through
  checkpoints), so :meth:`DeltaTarget.job_round` reads the job's last round from the snapshot
  itself, however many other commits (other writers, OPTIMIZE, VACUUM, backfills) came after it.
  Delta silently skips an append whose ``txnVersion`` is at or below the recorded one (the
  write returns normally and no new version appears), so round numbers must come
  from there, never from a window of the history, and every append is checked afterwards
  (:meth:`DeltaTarget.append` raises if it was skipped);
* ``userMetadata`` = a JSON :class:`CommitTag`, for people and audits reading the history.

Acks are built from :func:`range_keys`: the ``(seq, num_delivered, consumer_seq)`` of the rows
the table holds for a round's sequences, read from the current snapshot (through Delta, or the
files its log names where those are its rows: logical column names, deletion vectors, files
rewritten by OPTIMIZE, whatever the table's features, a read of the snapshot is what was
committed), never from the fetch.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote

from js_etl.delta.rules import (
    PLAIN_FILE_READER_FEATURES,
    TableShape,
    local_directory,
    object_store_url,
    unwritable,
)
from js_etl.delta.store import TableFiles, table_root
from js_etl.errors import ConfigError, TerminalError, TransientError, one_line
from js_etl.schema import REQUIRED_COLUMNS
from js_etl.spark.session import (
    hadoop_path,
    hadoop_read_text,
    is_connect,
    java_class,
    lossy_s3_log_store,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from js_etl.config import JobConfig
    from js_etl.delta.files import WrittenFile

log = logging.getLogger("js_etl.delta")

EVERY_SEQ = 2**63 - 1  # the highest stream sequence: "up to the end"
APPEND_ATTEMPTS = 3  # a round's append that loses to other writers this often fails transiently


@dataclass(frozen=True, slots=True)
class CommitTag:
    job: str  # "js-etl:<stream>:<consumer>"
    run: str  # this run's id
    round: int  # round number of the job: also the Delta txnVersion
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
        """Whether the table exists: yes where ``deltalake`` opens it (:func:`_deltalake_table`),
        else Delta's answer. Delta's ``isDeltaTable`` finds the table's root and loads its log
        in the JVM (``DeltaLog.forTable(root).tableExists``, delta-spark 4.4), which a columnar
        run never needs otherwise (docs/design/driver-reads.md). Only a table deltalake opens
        answers here: its ``is_deltatable`` says yes to logs Delta refuses (one holding only a
        ``.crc``, or a corrupt first commit), opening refuses them; and a partition directory,
        whose table Delta finds above it, is Delta's to judge."""
        if self.table:
            return bool(spark.catalog.tableExists(self.table))
        return _deltalake_table(self.location(spark)) is not None or self._delta_finds_path(spark)

    def exists_with_view(self, spark: SparkSession) -> tuple[bool, TableView | None]:
        """``(exists(), deltalake's view of the table or None)``, deltalake opening it once:
        for callers that read the table through deltalake where it can."""
        if self.table and not self.exists(spark):
            return False, None
        view = _deltalake_table(self.location(spark))
        return view is not None or bool(self.table) or self._delta_finds_path(spark), view

    def _delta_finds_path(self, spark: SparkSession) -> bool:
        from delta.tables import DeltaTable

        assert self.path is not None  # a target is a table or a path (TargetConfig checks)
        if object_store_url(self.path):  # no Hadoop connector needed to look at its log
            return _holds_a_commit(spark, self.path)
        if is_connect(spark):  # Delta's Python API needs Delta Connect on the server
            return _holds_a_commit(spark, self.location(spark))
        return bool(DeltaTable.isDeltaTable(spark, self.path))

    def sql_name(self) -> str:
        """The table in Spark SQL: its catalog name, or ``delta.`<path>```."""
        if self.table:
            return self.table
        assert self.path is not None  # a target is a table or a path (TargetConfig checks)
        return "delta.`" + self.path.replace("`", "``") + "`"

    def location(self, spark: SparkSession) -> str:
        """The table's directory as Spark reads it: a path as Hadoop qualifies it
        (``file:/data/t``, or ``hdfs://nn/data/t`` where ``fs.defaultFS`` says so), so that
        what the driver opens itself — the lock's files, the columnar writer's directory,
        deltalake's view — is the directory Delta reads, whatever the default file system and
        the JVM's working directory (unqualified, a scheme-less path on an HDFS cluster would be
        the driver's local disk to deltalake and the lock). An object-store URL is taken as it
        is: what reads it there is deltalake, obstore, or Spark's connector for its scheme."""
        if self.path and object_store_url(self.path):
            return object_store_url(self.path) or ""
        if self.path and is_connect(spark):
            # No Hadoop on a Spark Connect client: the path as this machine sees it, which must
            # be the server's view of it too (a shared file system).
            return _norm_path(self.path)
        if self.path:
            path, fs = hadoop_path(spark, self.path)
            return str(fs.makeQualified(path).toString()).rstrip("/")
        detail = spark.sql(f"DESCRIBE DETAIL {self.sql_name()}").first()
        assert detail is not None  # DESCRIBE DETAIL answers one row or raises
        return str(detail["location"]).rstrip("/")

    def read(self, spark: SparkSession) -> DataFrame:
        """The current snapshot, through Delta."""
        reader = spark.read.format("delta")
        return reader.table(self.table) if self.table else reader.load(self.path)

    def check_usable(self, spark: SparkSession) -> None:
        """Refuse, before anything is fetched, a table js-etl cannot fence and ack from
        (module docstring), and a path that holds other files but no Delta table: writing
        there would silently make those files part of a new table's directory."""
        exists, view = self.exists_with_view(spark)
        if not exists:
            if self.path:
                names = [name for name in _list_dir(spark, self.path) if name != "_js_etl"]
                if "_delta_log" in names and not _holds_a_commit(spark, self.path):
                    # A creation that never committed (a failed or killed first write leaves
                    # the log directory and data files no commit names): Delta creates the
                    # table there, and those files stay out of it until a VACUUM.
                    log.warning("%s: a first write that never committed left files there; "
                                "they are not part of the table", self)
                    return
                stray = names
                if stray:
                    raise TerminalError(
                        f"target {self.path} is not a Delta table but holds other files "
                        f"({', '.join(sorted(stray)[:3])}{', …' if len(stray) > 3 else ''}): "
                        "point target.path at an empty or new directory, or at a Delta table")
            return
        # deltalake's schema where it reads the table: Spark's read resolves the table and
        # loads its snapshot, which nothing else of a columnar run needs.
        schema = view.spark_schema() if view is not None else self.read(spark).schema
        types = {f.name.lower(): f.dataType.simpleString() for f in schema.fields}
        wrong = [f"{name} {kind}" for name, kind in REQUIRED_COLUMNS.items()
                 if types.get(name) != kind]
        if wrong:
            raise TerminalError(
                f"table {self} is not a js-etl table: it needs the columns {', '.join(wrong)} "
                "(the fence and the acks read them); write into a new table or path")

    def _snapshot(self, spark: SparkSession) -> Any:
        """Delta's own, freshly updated snapshot of the table (the one its writer uses). Over
        Spark Connect there is none to reach (no py4j, and Delta publishes no Delta Connect
        for Spark 4.2): there the table must be one ``deltalake`` reads."""
        if is_connect(spark):
            raise ConfigError(f"over Spark Connect js-etl reads {self}'s log with deltalake, "
                              "which cannot read it (a feature or location it does not "
                              "support): run this job on a classic Spark session")
        log = java_class(spark, "org.apache.spark.sql.delta.DeltaLog").forTable(
            spark._jsparkSession, self.location(spark))
        none = java_class(spark, "scala.Option").empty()
        return log.update(False, none, none)

    def shape(self, spark: SparkSession) -> TableShape:
        """The existing table's protocol, partitioning and schema: ``deltalake``'s view of its
        log where it reads the table (as :meth:`job_round`; the same log, without the Spark job
        Delta's snapshot runs), else Delta's snapshot, which costs less than DESCRIBE DETAIL and
        a read's schema (docs/design/driver-reads.md). tests/delta/test_delta_shape.py compares
        the two on tables with every rule the columnar writer must see."""

        view = _deltalake_table(self.location(spark))
        if view is not None:
            protocol, metadata = view.table.protocol(), view.table.metadata()
            return TableShape(protocol.min_reader_version, protocol.min_writer_version,
                              tuple(metadata.partition_columns), view.spark_schema(),
                              dict(metadata.configuration), _features(protocol))
        return self._snapshot_shape(spark)

    def _snapshot_shape(self, spark: SparkSession) -> TableShape:
        """:meth:`shape` from Delta's own snapshot."""
        from pyspark.sql.types import StructType

        snapshot = self._snapshot(spark)
        protocol = json.loads(snapshot.protocol().json())["protocol"]
        metadata = json.loads(snapshot.metadata().json())["metaData"]
        return TableShape(protocol["minReaderVersion"], protocol["minWriterVersion"],
                          tuple(metadata["partitionColumns"]),
                          StructType.fromJson(json.loads(metadata["schemaString"])),
                          dict(metadata.get("configuration") or {}),
                          frozenset(protocol.get("readerFeatures", ()))
                          | frozenset(protocol.get("writerFeatures", ())))

    def job_round(self, spark: SparkSession, job: str) -> tuple[int, int]:
        """``(last round of job, table version)`` from the snapshot's application transactions;
        ``(0, -1)`` for a table that does not exist yet."""
        exists, view = self.exists_with_view(spark)
        if not exists:
            return 0, -1
        if view is not None:
            return view.table.transaction_version(job) or 0, view.table.version()
        snapshot = self._snapshot(spark)
        recorded = snapshot.transactions().get(job)
        return (int(recorded.get()) if recorded.isDefined() else 0), int(snapshot.version())

    def append(self, spark: SparkSession, df: DataFrame, tag: CommitTag, *,
               partition_by: list[str], merge_schema: bool) -> int:
        """Append ``df`` as round ``tag.round`` of the job; returns the commit's version.

        Raises TerminalError if Delta did not record the round: it skips an append whose
        ``txnVersion`` is not above the recorded one without a word, and that would lose the
        round's rows while the run went on to ack them.
        """
        _, before = self.job_round(spark, tag.job)
        writer = (plain_types(spark, df).write.format("delta").mode("append")
                  .option("txnAppId", tag.job).option("txnVersion", str(tag.round))
                  .option("userMetadata", tag.to_json()))
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        if merge_schema:
            writer = writer.option("mergeSchema", "true")
        for attempt in range(1, APPEND_ATTEMPTS + 1):
            try:
                if self.table:
                    writer.saveAsTable(self.table)
                else:
                    writer.save(self.path)
                break
            except Exception as e:
                if not lost_to_another_commit(e, same_job=False):
                    raise
                # Delta refused this commit because another writer committed first (e.g. made
                # version 0 of a new table too): nothing of it is in the table, so it is made
                # again on the table as it now is. The round's rows are a checkpoint: the same.
                if attempt == APPEND_ATTEMPTS:
                    raise TransientError(
                        f"{self} kept changing under round {tag.round}'s append ({attempt} "
                        f"attempts, last: {type(e).__name__}): nothing of this round is acked; "
                        "retry the run") from None
                log.warning("%s: round %d's append lost to another writer's commit (%s); "
                            "appending again", self, tag.round, type(e).__name__)
        recorded, after = self.job_round(spark, tag.job)
        if recorded != tag.round:
            raise TerminalError(
                f"Delta did not record round {tag.round} of {tag.job} in {self} (it holds round "
                f"{recorded}): the append was skipped; nothing of this round is acked")
        return self._version_of(spark, tag, before + 1, after)

    def commit_files(self, spark: SparkSession, directory: str, files: list[WrittenFile],
                     tag: CommitTag) -> int:
        """Commit Parquet files the round's tasks wrote (:mod:`js_etl.drain.writers.columnar`)
        as round ``tag.round`` of the job, in one transaction carrying the same ``txn`` action
        and ``userMetadata`` as :meth:`append`; returns the commit's version.

        The ``deltalake`` writer does not skip a stale ``txnVersion`` the way Spark's does, so
        the round is checked before the commit (the lock keeps any other run of the job out
        between the check and the commit); after it, the snapshot must hold the round — whatever
        the commit raised (a conflict it gave up on, a failed post-commit checkpoint)."""
        from deltalake import CommitProperties, DeltaTable, Transaction
        from deltalake.transaction import AddAction, RemoveAction

        # deltalake's snapshot, not Spark's: the same txn actions of the same log (the tests
        # read the round back through Spark), without the Spark job that Spark's snapshot runs
        # to gather them (docs/design/driver-reads.md).

        table = DeltaTable(directory)
        recorded, before = table.transaction_version(tag.job) or 0, table.version()
        protocol = table.protocol()
        # Rules another writer added during the run. The commit below is made on this version,
        # and deltalake's fails if a later one changed the protocol or the metadata (a CHECK
        # constraint, a table property), not if another writer only appended
        # (docs/design/columnar-writer.md).
        problem = unwritable(protocol.min_reader_version, protocol.min_writer_version,
                             table.metadata().configuration,
                             [f.metadata for f in table.schema().fields], _features(protocol))
        if problem:
            raise TransientError(f"{self} changed during the run ({problem}): nothing of round "
                                 f"{tag.round} is committed or acked; the next run writes it "
                                 "with Spark")
        if recorded >= tag.round:
            raise TerminalError(
                f"{self} already holds round {recorded} of {tag.job}: round {tag.round} would "
                "be skipped; nothing of this round is acked")
        actions: list[AddAction | RemoveAction] = [
            AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats)
            for f in files]
        failure: Exception | None = None
        try:
            table.create_write_transaction(
                actions, "append", table.schema(),
                partition_by=table.metadata().partition_columns or None,
                commit_properties=CommitProperties(
                    custom_metadata={"userMetadata": tag.to_json()},
                    app_transactions=[Transaction(tag.job, tag.round,
                                                  int(time.time() * 1000))]))
        except Exception as e:  # deltalake's errors have no common base: judged by the snapshot
            failure = e
        table = DeltaTable(directory)
        recorded, after = table.transaction_version(tag.job) or 0, table.version()
        if recorded != tag.round:
            why = one_line(failure) if failure else "deltalake raised nothing"
            raise TransientError(f"the commit of round {tag.round} of {tag.job} into {self} "
                                 f"failed ({why}); nothing of this round is acked")
        version = self._version_of(spark, tag, before + 1, after)
        if version == after:  # else a later writer's commit is the table's last: theirs to judge
            _checkpoint_as_spark_would(table, self)
        return version

    def _version_of(self, spark: SparkSession, tag: CommitTag, first: int, last: int) -> int:
        """The version in ``first..last`` whose commit carries ``tag`` (other writers may have
        committed around ours)."""
        if first >= last:
            return last
        found = self._tagged(spark, range(last, first - 1, -1), tag.__eq__)
        return found[0] if found else last

    def last_round_seqs(self, spark: SparkSession, job: str) -> tuple[int, int] | None:
        """``(first, last)`` stream seqs of ``job``'s last round in this table, as its commit tag
        names them; None when the job never committed here; ``(1, EVERY_SEQ)`` when that
        commit's log file is gone (cleaned up after a checkpoint), so a caller clamping to its
        window takes all of it. Walks back from the version that recorded the round, past other
        writers' commits: one small log file each, read on the driver."""
        from py4j.protocol import Py4JJavaError

        round_no, version = self.job_round(spark, job)
        if round_no == 0:
            return None
        try:
            found = self._tagged(spark, range(version, -1, -1),
                                 lambda tag: tag.job == job and tag.round == round_no)
        except (Py4JJavaError, FileNotFoundError):  # the log file was cleaned up
            found = None
        return (found[1].first_seq, found[1].last_seq) if found else (1, EVERY_SEQ)

    def _tagged(self, spark: SparkSession, versions: Iterable[int],
                match: Callable[[CommitTag], bool]) -> tuple[int, CommitTag] | None:
        """The first of ``versions`` whose commit carries a tag ``match`` accepts."""
        location = self.location(spark)
        for version in versions:
            for action in log_actions(spark, location, version):
                info = action.get("commitInfo")
                tag = CommitTag.from_json(info.get("userMetadata")) if info else None
                if tag is not None and match(tag):
                    return version, tag
        return None


# Spark's writer checkpoints a table at every version that is a multiple of the table's
# delta.checkpointInterval, 10 where the table sets none. deltalake honours the property but
# defaults to 100. Whoever reads a table replays every commit since its last checkpoint, and the
# driver opens a columnar round's table several times (docs/design/columnar-writer.md).
SPARK_CHECKPOINT_INTERVAL = 10


def _features(protocol: Any) -> frozenset[str]:
    """The reader and writer table features of deltalake's ``ProtocolVersions``."""
    return frozenset(protocol.reader_features or ()) | frozenset(protocol.writer_features or ())


# Delta's SQLSTATE for every commit that lost to another's (DELTA_CONCURRENT_APPEND, _WRITE,
# _TRANSACTION, _DELETE_READ, DELTA_METADATA_CHANGED, DELTA_PROTOCOL_CHANGED …), as Spark
# Connect's errors carry it; a classic session raises Delta's Python classes, without it.
CONCURRENT_MODIFICATION = "2D521"


def lost_to_another_commit(error: BaseException, *, same_job: bool) -> bool:
    """Whether Delta refused a commit because another writer's came first, so that nothing of
    it is in the table and it may be made again on the table as it now is. ``same_job``: also
    when that commit was of the same application transaction (``txnAppId``:
    ConcurrentTransactionException), which for a drain's append is another run of its job — the
    lease and the lock keep those out, so one is not retried."""
    from delta.exceptions import (  # Python classes of their own, no common base
        ConcurrentAppendException,
        ConcurrentDeleteReadException,
        ConcurrentTransactionException,
        ConcurrentWriteException,
        DeltaConcurrentModificationException,
        MetadataChangedException,
        ProtocolChangedException,
    )

    condition = getattr(error, "getCondition", None)
    if (isinstance(error, ConcurrentTransactionException)
            or (callable(condition) and condition() == "DELTA_CONCURRENT_TRANSACTION")):
        return same_job
    if isinstance(error, ConcurrentAppendException | ConcurrentDeleteReadException
                  | ConcurrentWriteException | DeltaConcurrentModificationException
                  | MetadataChangedException | ProtocolChangedException):
        return True
    state = getattr(error, "getSqlState", None)
    return callable(state) and state() == CONCURRENT_MODIFICATION


def plain_types(spark: SparkSession, df: DataFrame) -> DataFrame:
    """Over Spark Connect, ``df`` with each column cast to its type as written: there a
    ``mapInArrow`` result's strings are explicitly collated, which Delta writes into the table's
    schema as ``string collate UTF8_BINARY``, a type deltalake (and so js-etl's own reads)
    refuses (pyspark 4.2.0; docs/design/spark-connect.md). Unchanged on a classic session."""
    if not is_connect(spark):
        return df
    return df.select(*(df[f.name].cast(f.dataType.simpleString()).alias(f.name)
                       for f in df.schema.fields))


def _checkpoint_as_spark_would(table: Any, target: DeltaTarget) -> None:
    """Checkpoint ``table`` (deltalake's, at the version this run's commit made) where Spark's
    writer would have checkpointed its own commit. A failed checkpoint leaves the table whole
    (the log is the table; a checkpoint only shortens reading it): it is logged, as Spark logs
    it, and the round goes on to its acks."""
    version = table.version()
    if (not version or version % SPARK_CHECKPOINT_INTERVAL
            or "delta.checkpointInterval" in table.metadata().configuration):
        return
    try:
        table.create_checkpoint()
    except Exception as e:  # deltalake's errors have no common base
        log.warning("could not checkpoint %s at version %d (%s: %s); its readers replay more "
                    "commits until the next one", target, version, type(e).__name__, e)


class JobTables(NamedTuple):
    """The two tables of a job: its rows, and its dead letters."""

    target: DeltaTarget
    dead_letters: DeltaTarget


def job_tables(config: JobConfig) -> JobTables:
    """The job's table and dead-letter table, from ``target.*``."""
    target = config.target
    return JobTables(DeltaTarget(target.path, target.table),
                     DeltaTarget(target.resolved_dead_letter_path,
                                 target.resolved_dead_letter_table))


def refuse_lossy_commits(spark: SparkSession, tables: Iterable[DeltaTarget]) -> None:
    """Raise ConfigError, before anything is fetched, where Spark's commits to one of the
    ``tables`` on S3 could replace another writer's (:func:`~js_etl.spark.session.
    lossy_s3_log_store`): any run on S3 may commit through Spark (its writer, or the
    columnar writer's rounds Spark appends). Checked for paths; a catalog table's location is
    Spark's to know."""
    for table in tables:
        problem = bool(table.path and object_store_url(table.path)) and \
            lossy_s3_log_store(spark, table.path or "")
        if problem:
            raise ConfigError(problem)


def same_table(a: DeltaTarget | None, b: DeltaTarget | None) -> bool:
    if a is None or b is None:
        return False
    if a.table or b.table:
        return bool(a.table and b.table and a.table.lower() == b.table.lower())
    return _norm_path(a.path) == _norm_path(b.path)


def _norm_path(path: str | None) -> str:
    text = (path or "").rstrip("/")
    if text.startswith("file:"):
        text = "/" + text.removeprefix("file:").lstrip("/")
    return text if "://" in text else os.path.abspath(text)


@dataclass(frozen=True, slots=True)
class TableView:
    """``deltalake``'s view of the latest version of a table in a local directory or an object
    store (:func:`~js_etl.delta.store.table_root`)."""

    root: str
    table: Any  # deltalake.DeltaTable

    def spark_schema(self) -> StructType:
        """The table's schema as Spark's type (the log's schema string, the same JSON)."""
        from pyspark.sql.types import StructType

        return StructType.fromJson(json.loads(self.table.schema().to_json()))

    def reads_files_as_rows(self, columns: Iterable[str]) -> bool:
        """Whether ``columns`` of the table's rows are the same columns of the files its log
        names, read as they are. What that relies on: on reader protocol 1 (or 3 with only
        :data:`PLAIN_FILE_READER_FEATURES`) a file's columns are named by their logical names
        (column mapping, which names the physical ones, needs reader 2 or its feature) and every
        row of a listed file is in the table (deletion vectors need their reader feature); a
        partition column is not in the files; and Spark matches names without case, a file's
        reader with it, so only names spelled as given count."""
        names = {field.name for field in self.table.schema().fields}
        partitions = set(self.table.metadata().partition_columns)
        protocol = self.table.protocol()
        plain = protocol.min_reader_version == 1 or (
            protocol.min_reader_version == 3
            and set(protocol.reader_features or ()) <= PLAIN_FILE_READER_FEATURES)
        return plain and all(c in names and c not in partitions for c in columns)

    def keys(self, stream: str, first: int, last: int, columns: Iterable[str]) -> pa.Table | None:
        """``columns`` of the rows the table holds for ``stream`` in ``first..last``, read from
        the files of its current snapshot whose ``seq`` statistics overlap the range (a file
        without them is read); None when no file can hold one. Only where
        :meth:`reads_files_as_rows` says yes for ``stream``, ``seq`` and ``columns``."""
        import pyarrow as pa
        import pyarrow.dataset as ds


        files = files_holding_seqs(pa.table(self.table.get_add_actions(flatten=True)), first,
                                   last)
        # A Delta path is an escaped URI reference (Spark's directory for the partition value
        # "a/b c" is "kind=a%2Fb c" on disk, "kind=a%252Fb%20c" in the log); absolute when the
        # file lies elsewhere.
        paths = [_relative(self.root, p) if ":" in p.split("/")[0] else unquote(p)
                 for p in files.column("path").to_pylist()]
        if not paths:
            return None
        in_range = ((ds.field("stream") == stream) & (ds.field("seq") >= first)
                    & (ds.field("seq") <= last))
        return TableFiles(self.root).parquet_dataset(paths).to_table(columns=list(columns),
                                                                     filter=in_range)


def _relative(root: str, path: str) -> str:
    """An absolute path of the log as a path under the table's root (local: the file's own)."""
    directory = local_directory(path)
    if directory is not None:
        return os.path.relpath(directory, root) if local_directory(root) else directory
    return path.removeprefix(root + "/")


def _deltalake_table(location: str) -> TableView | None:
    """``deltalake``'s view of the latest version of a table in a local directory or an object
    store, or None (elsewhere, or a table it cannot read): where it reads the table, it reads
    the same log as Spark's snapshot without the Spark job that snapshot runs to gather the
    application transactions (docs/design/driver-reads.md)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    root = table_root(location)
    # deltalake lists the directory it is given but reads a %XX in it as an escape (next to
    # "a b", a table in "a%20b" was read partly from "a b"): Spark reads those.
    if root is None or "%" in root:
        return None
    try:
        return TableView(root, DeltaTable(root))
    # DeltaError: e.g. a reader feature deltalake does not support (Spark's snapshot reads it);
    # OSError: the path is a regular file.
    except (DeltaError, OSError):
        return None


def _list_dir(spark: SparkSession, path: str) -> list[str]:
    """Names in directory ``path`` ([] if it does not exist): through the object store's client
    for its URL, else Hadoop's FileSystem."""
    if object_store_url(path):
        return TableFiles(path.rstrip("/")).names("")
    if is_connect(spark):  # no Hadoop on the client: its own view of the shared file system
        folder = Path(_norm_path(path))
        return [child.name for child in folder.iterdir()] if folder.is_dir() else []
    hpath, fs = hadoop_path(spark, path)
    if not fs.exists(hpath) or not fs.getFileStatus(hpath).isDirectory():
        return []
    return [str(status.getPath().getName()) for status in fs.listStatus(hpath)]


# What a Delta log holds once a table has a version: a commit, a checkpoint, or its pointer.
_COMMITTED = re.compile(r"\d{20}\.(json|checkpoint.*parquet)|_last_checkpoint")


def _holds_a_commit(spark: SparkSession, path: str) -> bool:
    return any(_COMMITTED.fullmatch(name) for name in _list_dir(spark, f"{path}/_delta_log"))


def log_actions(spark: SparkSession, location: str, version: int) -> list[dict[str, Any]]:
    """The actions of commit ``version``, read from its log file on the driver (no Spark job):
    through the object store's client for its URL, else Hadoop's FileSystem (any store Spark can
    write). Raises FileNotFoundError (or Py4JJavaError, through Hadoop) when it is gone."""
    if object_store_url(location) or is_connect(spark):  # (no Hadoop on a Connect client)
        name = f"_delta_log/{version:020d}.json"
        data = TableFiles(location).read(name)
        if data is None:
            raise FileNotFoundError(f"{location}/{name}")
        return [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    text = hadoop_read_text(spark, f"{location}/_delta_log/{version:020d}.json")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def create_empty(table: DeltaTarget, source: DataFrame, partition_by: list[str]) -> None:
    """Create a missing table with the source's schema (``limit(0)``: nothing is computed), so
    that even the first backfill writes through MERGE."""
    writer = plain_types(source.sparkSession, source.limit(0)).write.format("delta").mode("append")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    if table.table:
        writer.saveAsTable(table.table)
    else:
        writer.save(table.path)


# Characters Delta's Spark writer refuses in a column name without column mapping
# (DELTA_INVALID_CHARACTERS_IN_COLUMN_NAMES); deltalake's create takes them.
_REFUSED_IN_NAMES = frozenset(" ,;{}()\n\t=")


# Session settings Delta applies to the tables Spark creates: column mapping, deletion vectors...
_TABLE_DEFAULTS = "spark.databricks.delta.properties.defaults."


def needs_spark_to_create(rows: StructType, setting_names: Iterable[str]) -> bool:
    """Whether the missing table must be created by Spark, not :func:`create_table`: the session
    sets defaults for new Delta tables, which only Spark's creation applies (the table may
    then need the Spark writer), or a column name holds a character Spark's create refuses
    (so that the run fails with Delta's own error, as with the Spark writer)."""
    return (any(name.startswith(_TABLE_DEFAULTS) for name in setting_names)
            or any(_REFUSED_IN_NAMES.intersection(name) for name in rows.fieldNames()))


def create_table(directory: str, rows: StructType, partition_columns: list[str]) -> None:
    """Create the missing table at ``directory`` for this writer, with ``deltalake``, the
    library that commits its rounds: far cheaper than Spark's empty append, which runs in the
    JVM. Its first commit holds what Spark's would (protocol reader 1 / writer 2, the schema,
    the partition columns: tests/drain/test_columnar.py compares the two; a TIMESTAMP_NTZ
    column adds the timestampNtz feature, at reader 3 / writer 7, as Spark's does), unless
    :func:`needs_spark_to_create`.

    Raises if a table is there already, or another process created it meanwhile; the caller
    then reads the table. Never retried: deltalake retries a commit that lost its version by
    committing at the next one, and when two processes created one table at once the lost
    CREATE became a second commit that replaced the table's id, schema and partitioning.
    Without retries the loser's commit fails, because the local file system writes a version's
    log file only where none is (tests/unit/delta/test_create_table.py races two creates; the
    measurements: docs/design/columnar-writer.md)."""
    from deltalake import CommitProperties, DeltaTable, Schema

    DeltaTable.create(directory, Schema.from_json(rows.json()), mode="error",
                      partition_by=partition_columns or None,
                      commit_properties=CommitProperties(max_commit_retries=0))


def files_holding_seqs(files: pa.Table, first: int, last: int) -> pa.Table:
    """The add actions (``deltalake``'s ``get_add_actions(flatten=True)``) of the files that may
    hold a ``seq`` in ``first..last``: those whose ``seq`` statistics overlap the range, and
    every file without them. Callers check that the files' statistics and columns are the
    table's (:meth:`TableView.reads_files_as_rows`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    # No statistics to judge by, or not an integer's (a string seq's sort as text).
    if not all(name in files.column_names and pa.types.is_integer(files.schema.field(name).type)
               for name in ("min.seq", "max.seq")):
        return files
    overlap = pc.and_(pc.less_equal(files.column("min.seq"), last),
                      pc.greater_equal(files.column("max.seq"), first))
    return files.filter(pc.fill_null(overlap, True))
