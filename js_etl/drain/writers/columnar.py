"""The columnar writer: each fetch task decodes its payloads with Arrow and writes the table's
Parquet files itself (:mod:`~js_etl.drain.writers.columnar_task`); the driver commits them in one
Delta transaction per table and round. The JVM sees only what a round needs to decide and ack:
one blob of keys per pull and one row per file.

The round is one Spark job, an RDD's ``mapPartitions`` (over Spark Connect, which has no RDDs, a
``mapInArrow``) whose small output (keys and file descriptions) is collected on the driver, the
only read of it: so the fetch runs exactly once without a checkpoint. What the rest of the round
relies on:

* **A failed task attempt's files are never committed.** Only files named in the collected
  output are committed; a failed attempt's stay in the directory unreferenced, as a failed Spark
  write task's do, until a VACUUM.
* **Dead letters travel as files**, never through the collected output (a round may hold
  ``partitions x fetch.partition_max_bytes`` of them). Where the dead-letter table takes files as
  they are (the rules :func:`~js_etl.delta.rules.table_problem` checks) they are written there
  and committed like the rows; else Spark's append reads them, and they are removed.
* **The files are immutable.** A round the file commit cannot take as it is — a sequence fetched
  twice, or one a table already holds — is read back and committed by Spark's writer, with its
  dedupe and anti-join: every rule of a round applies to both writers.
* **The same commit**: the same application transaction (job, round) and ``userMetadata`` tag as
  a Spark append, with ``seq`` statistics so that range reads skip other rounds' files.
* **Acks come from reading the tables back**, never from the task output.

It is chosen (:func:`open_columnar`) only where it writes what Spark's writer would: the
settings (:func:`~js_etl.drain.writers.columnar_plan.config_problem`), the table's location and
rules (:mod:`js_etl.delta.rules`). Anything else uses Spark's writer, and the report says why.
The measurements behind these choices: ``docs/design/columnar-writer.md``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from js_etl.delta.keys import no_keys, range_keys
from js_etl.delta.rules import location_problem, table_problem
from js_etl.delta.store import TableFiles, table_root
from js_etl.delta.table import DeltaTarget, create_empty, create_table, needs_spark_to_create
from js_etl.drain.fetch import FetchPlan
from js_etl.drain.rounds import RoundStats
from js_etl.drain.writers.base import Commit, WriteContext, Writer
from js_etl.drain.writers.columnar_plan import (
    ColumnarPlan,
    columnar_plan,
    config_problem,
    dead_letter_schema,
    row_schema,
)
from js_etl.drain.writers.columnar_task import (
    TASK_OUTPUT_DDL,
    RoundOutput,
    fetch_decode_write,
    fetch_task,
    task_outputs,
)
from js_etl.drain.writers.spark import SparkWriter
from js_etl.errors import TerminalError
from js_etl.schema import PAYLOAD_BYTES, ROUND_DDL, round_arrow
from js_etl.spark.session import is_connect

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from js_etl.delta.files import WrittenFile
    from js_etl.delta.table import CommitTag


@dataclass(slots=True)
class ColumnarRound:
    """A columnar round's collected task output, and whether its dead-letter files were
    committed as they are (the round's to remove otherwise)."""

    output: RoundOutput
    dead_letters_committed: bool = False


@dataclass(frozen=True, slots=True)
class FilesCommit(Commit):
    """A round committed as its files: no table held any of its seqs before it."""

    rows_in_range_before: bool = False  # the target held others' rows in the round's range


class ColumnarWriter(Writer):
    name = "columnar"

    def __init__(self, context: WriteContext, plan: ColumnarPlan, spark_writer: SparkWriter
                 ) -> None:
        super().__init__(context)
        self.plan = plan
        self.spark_writer = spark_writer  # for the rounds the file commit cannot take

    def fetch(self, plan: FetchPlan, partitions: int, round_no: int) -> ColumnarRound:
        spark = self.context.spark
        if is_connect(spark):
            tasks = spark.range(partitions, numPartitions=partitions)
            return ColumnarRound(RoundOutput.of(task_outputs(tasks.mapInArrow(
                partial(fetch_task, plan, self.plan, round_no), TASK_OUTPUT_DDL).toArrow())))
        # A plain RDD job: no Spark SQL to plan, nor output to convert (docs/design/
        # columnar-writer.md).
        indexes = spark.sparkContext.parallelize(range(partitions), partitions)
        return ColumnarRound(RoundOutput.of(indexes.mapPartitions(
            partial(fetch_decode_write, plan, self.plan, round_no)).collect()))

    def discard(self, fetched: ColumnarRound) -> None:
        # Copied into the dead-letter table by Spark's append by now; or the round failed,
        # and their messages, never acked, come back.
        if not fetched.dead_letters_committed:
            self._remove(fetched.output.dead_letters, self.plan.dead_letter_files)

    def commit(self, fetched: ColumnarRound, round_no: int, check: Callable[[], None]
               ) -> Commit | None:
        output = fetched.output
        if not output.keys.num_rows:
            return None
        as_files = self._commit_files(fetched, round_no, check)
        if as_files is not None:
            return as_files
        # A seq twice, or one a table holds: Spark's writer, which has the rules for both.
        file_rows = self._read_files(output.files) if output.files else None
        through_spark = self.spark_writer.commit_rows(self._as_spark_round(output), round_no,
                                                      check, file_rows)
        # Read into the append, or rows the table held already: no commit names them.
        self._remove(output.files, self.plan.directory)
        return through_spark

    def acks(self, commit: Commit) -> tuple[pa.Table, pa.Table]:
        import pyarrow.compute as pc

        if not isinstance(commit, FilesCommit):
            return self.spark_writer.acks(commit)
        c, first, last = self.context, commit.stats.first, commit.stats.last
        rows = range_keys(c.spark, c.target, c.stream, first, last)
        if rows is not None and commit.rows_in_range_before:  # others' rows: not ours
            rows = rows.filter(pc.is_in(rows.column("seq"), commit.seqs))
        # No dead letter held the range before this round: all it holds now is ours, and none
        # when the round wrote none (the lease keeps other runs of the job out), so that read is
        # skipped.
        dead = range_keys(c.spark, c.dead_letters, c.stream, first, last,
                          with_error=True) if commit.stats.dead else None
        return (rows if rows is not None else no_keys(),
                dead if dead is not None else no_keys(with_error=True))

    def _commit_files(self, fetched: ColumnarRound, round_no: int, check: Callable[[], None]
                      ) -> FilesCommit | None:
        """Commit the files as they are, when the round holds each seq once and neither table
        holds any of them; else None, with nothing written."""
        import pyarrow.compute as pc

        c, output = self.context, fetched.output
        stats = RoundStats.of(output.keys)
        seqs = output.keys.column("seq")
        if stats.distinct < stats.n:
            return None
        held = range_keys(c.spark, c.target, c.stream, stats.first, stats.last)
        if held is not None and pc.any(pc.is_in(held.column("seq"), seqs)).as_py():
            return None
        if range_keys(c.spark, c.dead_letters, c.stream, stats.first, stats.last) is not None:
            return None  # rare: Spark's writer compares the dead letters it holds
        tag = c.tag(round_no, stats)
        self._check_files(output, stats)  # before anything is committed
        dead_version = row_version = None
        if stats.dead:
            check()
            dead_version = self._append_dead_letters(fetched, tag)
        if stats.n > stats.dead:
            check()
            row_version = c.target.commit_files(c.spark, self.plan.directory,
                                                list(output.files), tag)
        return FilesCommit(stats, seqs, row_version, dead_version,
                           rows_in_range_before=held is not None)

    def _append_dead_letters(self, fetched: ColumnarRound, tag: CommitTag) -> int:
        """The round's dead letters into their table: their files committed as they are where
        the plan wrote them into the table's directory (no Spark job), else read and appended by
        Spark."""
        c, directory = self.context, self.plan.dead_letter_directory
        if directory is None:
            return c.dead_letters.append(
                c.spark, c.decoder.dead_letters(self._read_dead_letters(fetched.output)), tag,
                partition_by=[], merge_schema=False)
        version = c.dead_letters.commit_files(c.spark, directory,
                                              list(fetched.output.dead_letters), tag)
        fetched.dead_letters_committed = True  # commit_files returned: the snapshot names them
        return version

    def _as_spark_round(self, output: RoundOutput) -> DataFrame:
        """A columnar round as Spark's writer's flagged deliveries: the good deliveries' keys
        (the rows themselves are in the files) and the dead letters."""
        import pyarrow as pa
        import pyarrow.compute as pc

        keys = output.keys
        good = keys.filter(pc.invert(keys.column("dead")))
        n = good.num_rows
        schema = round_arrow()
        given = {"seq": good.column("seq"), "consumer_seq": good.column("consumer_seq"),
                 "num_delivered": good.column("num_delivered"),
                 PAYLOAD_BYTES: good.column("bytes")}
        rows = pa.table([given.get(f.name, pa.nulls(n, f.type)) for f in schema], schema=schema)
        return self.context.spark.createDataFrame(rows, ROUND_DDL).unionByName(
            self._read_dead_letters(output))

    def _check_files(self, output: RoundOutput, stats: RoundStats) -> None:
        """Stop before anything is committed if the files and the keys disagree (it cannot
        happen: a task's files and its keys come together)."""
        for kind, files, expected in (("rows", output.files, stats.n - stats.dead),
                                      ("dead letters", output.dead_letters, stats.dead)):
            written = sum(f.rows for f in files)
            if written != expected:
                raise TerminalError(
                    f"the round's files hold {written} {kind}, its keys say {expected}: "
                    "nothing of this round is committed or acked")

    def _read_files(self, files: Iterable[WrittenFile], schema: StructType | None = None,
                    directory: str | None = None) -> DataFrame:
        """Files the round's tasks wrote, read by Spark (their paths relative to ``directory``,
        else the table's)."""
        spark = self.context.spark
        # Spark reads a path as a glob pattern: a table directory named t[1] matched nothing.
        root = directory or self.plan.directory
        escaped = re.sub(r"([\\\[\]{}*?])", r"\\\1", root)
        prefix = escaped if TableFiles(root).remote else f"file://{escaped}"
        reader = spark.read if schema is None else spark.read.schema(schema)
        return reader.parquet(*[f"{prefix}/{f.path}" for f in files])

    def _read_dead_letters(self, output: RoundOutput) -> DataFrame:
        """The round's dead letters as ROUND_DDL rows (the payload's bytes as decode.flag
        counts them)."""
        from pyspark.sql import functions as F

        if not output.dead_letters:
            return self.context.spark.createDataFrame([], ROUND_DDL)
        return self._read_files(output.dead_letters, dead_letter_schema(),
                                self.plan.dead_letter_files
                                ).withColumn(PAYLOAD_BYTES, F.length("data"))

    @staticmethod
    def _remove(files: Iterable[WrittenFile], directory: str) -> None:
        """Delete task files (their paths relative to ``directory``)."""
        where = TableFiles(directory)
        for f in files:
            where.remove(f.path)


def open_columnar(context: WriteContext, spark_writer: SparkWriter) -> ColumnarWriter | str:
    """The columnar writer for this run, or why it cannot write the job's tables. A missing
    table it is to write is created first, by ``deltalake``, or by Spark where only Spark creates
    it as Spark would."""
    c = context
    problem = config_problem(c.spark, c.config)
    if problem:
        return problem
    conf_keys = functools.cache(partial(_session_conf_keys, c.spark))
    # A catalog table exists by now (the drain locks in its directory): a path is its location.
    location = c.target.location(c.spark)
    rows, names = row_schema(c.config)
    problem = _table_problem(c.spark, c.target, location, rows, names,
                             c.target.exists(c.spark), conf_keys)
    if problem:
        return problem
    dead_letters = _dead_letters_as_files(c.spark, c.dead_letters, conf_keys)
    return ColumnarWriter(context, columnar_plan(location, c.config, c.run_id, dead_letters),
                          spark_writer)


def _table_problem(spark: SparkSession, table: DeltaTarget, location: str, rows: StructType,
                   names: list[str], exists: bool, conf_keys: Callable[[], list[str]]
                   ) -> str | None:
    """Why the columnar writer cannot commit ``rows`` (partitioned by ``names``) into ``table``
    at ``location`` as files, or None; a missing table is created first."""
    problem = location_problem(location)
    if problem is None:
        if not exists:
            _create(spark, table, location, rows, names, conf_keys)
        problem = table_problem(table.shape(spark), rows, names)
    return problem


def _create(spark: SparkSession, table: DeltaTarget, location: str, rows: StructType,
            names: list[str], conf_keys: Callable[[], list[str]]) -> None:
    try:
        if needs_spark_to_create(rows, conf_keys()):
            create_empty(table, spark.createDataFrame([], rows), names)
        else:
            root = table_root(location)
            assert root is not None  # location_problem accepted it
            create_table(root, rows, names)
    except Exception:
        if not table.exists(spark):  # else another first run created it
            raise


def _dead_letters_as_files(spark: SparkSession, table: DeltaTarget,
                           conf_keys: Callable[[], list[str]]) -> str | None:
    """The dead-letter table's directory where the task's dead-letter files can be committed
    as they are: a table the columnar writer's rules accept (no rule on rows, exactly the
    dead-letter columns, no partitions); a missing one is created now. Else None, and Spark
    appends them: a catalog table still to create, session defaults for new tables (Spark
    creates it at the first dead letter), or a table with other rules."""
    rows = dead_letter_schema()
    exists = table.exists(spark)
    if not exists and (table.table or needs_spark_to_create(rows, conf_keys())):
        return None
    location = table.location(spark)
    if _table_problem(spark, table, location, rows, [], exists, conf_keys):
        return None
    return table_root(location)


def _session_conf_keys(spark: SparkSession) -> list[str]:
    """The names of the session's settings, in one answer from the JVM (PySpark's
    ``conf.getAll`` asks for each setting twice). A name holding a line break reads as two
    here; what uses them looks for a prefix, and a false match only makes Spark create the
    table. Over Spark Connect, the server's answer to ``conf.getAll``."""
    if is_connect(spark):
        return list(spark.conf.getAll)
    return str(spark.conf._jconf.getAll().keySet().mkString("\n")).split("\n")
