"""The columnar write path: each fetch task decodes its payloads with Arrow and writes the target
table's Parquet files itself; the driver commits them in one Delta transaction per round.

Why (issue 14): on the Spark writer every message crosses the JVM row by row — Arrow to rows,
``from_json`` with a parser per payload, the round's checkpoint of full rows, Parquet encoding —
and that, not the pull, was most of a round's CPU. Here the JVM sees only what the round needs
to decide and ack: one blob of keys per pull and one row per file (and the dead letters, where
Spark appends them: below).

The round is one Spark job, an RDD's ``mapPartitions``: its tasks write the good rows *and* the dead
letters to files, and their output (:class:`TaskOutput`: one blob of keys per pull, one description
per file) is collected on the driver, which is the only read of it. Not a DataFrame's
``mapInArrow``: nothing of the output needs Spark SQL, and planning and converting it cost the JVM
about twice a plain RDD job's CPU (a two-task job collecting 3 MB of blobs, warm ``local[2]``:
118-210 ms against 61-69 ms). So the fetch runs exactly
once without the Spark writer's eager local checkpoint (:mod:`js_etl.spark.drain`), which cost a
second Spark job a round (js-etl bench --legs js_etl, three alternating runs each, 1M x 256 B in 5
rounds: the write phase took 0.64-0.69 s with the checkpoint and its collect, 0.19-0.24 s without).
What the rest of the round relies on, and why it still holds:

* **A failed task attempt's files are never committed.** Only files named in the collected
  output are committed, and a failed attempt's output is not in it. Its files stay in the table
  directory unreferenced, as a failed Spark write task's do, until a VACUUM removes them.
* **Dead letters travel as files, not through the task output.** A task writes its dead letters
  (payload, headers and reason) to one Parquet file of the dead-letter columns
  (:data:`js_etl.schema.DEAD_LETTER`), named with the task's file prefix. A round may hold up to
  ``partitions x fetch.partition_max_bytes`` of them: a collect would put all of it on the
  driver's JVM heap and against ``spark.driver.maxResultSize``, and ``deltalake``'s own writer
  held about 4x the bytes it wrote (measured: a peak of 1,240 MiB for 256 MiB). Where the
  dead-letter table takes the files as they are
  (:attr:`ColumnarPlan.dead_letter_directory`: the rules :func:`table_problem` checks for the
  rows' table) the file is written there, with statistics, and committed like the rows; else it
  is written at the rows' table's top level and Spark's append reads it (the dead-letter table
  has a rule on rows, or is a catalog table still to create). A file not committed as it is is
  removed at the end of the round (a process that dies first leaves it unreferenced, as a failed
  attempt's files, until a VACUUM). * **The files are immutable.** A round the fast commit
  cannot take as it is — a sequence fetched twice, or one a table already holds — reads its
  files back with Spark and goes through the Spark writer with the usual dedupe and anti-join,
  so every rule of the round applies to both paths. * **The same commit.** The files are
  committed with the same application transaction (``txnAppId`` = job, ``txnVersion`` = round)
  and the same ``userMetadata`` tag as a Spark append, by the ``deltalake`` package (Delta's
  Rust implementation) on the driver, with statistics on ``seq`` so that
  :func:`js_etl.spark.delta.range_keys` skips the files of other rounds. Measured with
  delta-spark 4.4.0 and deltalake 1.6.6 (tests/spark/ test_columnar.py pins each): Spark's
  snapshot reports the round from that ``txn`` action, the history shows the tag, and a range
  outside a file's ``seq`` statistics plans no file. * **Acks still come from reading the tables
  back** (their snapshots), never from the task output.

It is chosen when the round is planned (:func:`columnar_plan`) only where it writes what the
Spark writer would: JSON payloads whose schema the batch decoder covers
(:func:`js_etl.spark.json_batch.supported`), decoded by the same rules and dead-letter reasons
(:mod:`js_etl.spark.source_decode`), into a local table with a plain protocol whose schema is
exactly the drain's rows. Anything else uses the Spark writer, and the run report says why.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from js_etl.faults import fail_first_attempt
from js_etl.schema import (
    ACK_KEY_COLUMNS,
    DEAD_LETTER,
    ORIGIN_COLUMNS,
    RAW_DDL,
    ddl,
    dead_letter_arrow,
)
from js_etl.spark.fetch import FetchPlan, fetch_partition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from js_etl.config import DecodeConfig, JobConfig
    from js_etl.spark.delta import TableShape

KEY_SCHEMA = pa.schema([("seq", pa.int64()), ("consumer_seq", pa.int64()),
                        ("num_delivered", pa.int64()), ("dead", pa.bool_()),
                        ("bytes", pa.int64())])
# Spark's own name for the date of a timestamp column as a partition expression.
_TO_DATE = re.compile(r"(?is)\s*to_date\s*\(\s*`?published_at`?\s*\)\s*")
# Time zones in which to_date(published_at) is the UTC date the task computes.
_UTC_ZONES = {"utc", "etc/utc", "gmt", "etc/gmt", "z", "+00:00"}
# Origin columns a partition may copy: not the ones table_keys reads from the files.
_COPYABLE_ORIGIN = ("subject",)
# What the columnar writer decodes as Spark does. Not SMALLINT or TINYINT: Spark's parser takes
# 200 into a TINYINT as -56 (a break-it review), the decoders refuse it.
_WRITABLE_TYPES = ("bigint", "int", "double", "string", "boolean")
_TYPES_PROBLEM = ("decode.schema has a type the columnar writer does not decode as Spark does "
                  f"(it takes {', '.join(t.upper() for t in _WRITABLE_TYPES)})")
# decode.schema as expects_columnar reads it without Spark: plain `name TYPE` pairs.
_PLAIN_FIELD = re.compile(r"\s*(`?)([A-Za-z_][A-Za-z0-9_]*)\1\s+([A-Za-z]+)\s*")
_PLAIN_TYPES = {"bigint": "bigint", "long": "bigint", "int": "int", "integer": "int",
                "double": "double", "string": "string", "boolean": "boolean"}
# What a partition column may copy: not DOUBLE (0.0 and -0.0 are one value to a filter and
# two to a grouping, so a row went into two files: a break-it review).
_PARTITION_TYPES = ("bigint", "int", "string", "boolean")
_STATS_COLUMNS = ("seq", "consumer_seq", "num_delivered")
_MAX_STRING_STAT = 32  # Delta's own writer truncates longer string statistics
_PLAIN = re.compile(r"[0-9A-Za-z_.-]+")  # needs no escaping in a path or a URI


@dataclass(frozen=True, slots=True)
class PartitionColumn:
    name: str  # the table's partition column
    source: str | None  # the row column it copies; None: to_date(published_at) (UTC)


@dataclass(frozen=True, slots=True)
class ColumnarPlan:
    """What a fetch task needs to decode and write. Picklable: it travels to the executors."""

    directory: str  # the table's local directory
    decode: DecodeConfig
    payload_json: str  # decode.schema as Spark's StructType JSON
    partitions: tuple[PartitionColumn, ...]
    park_after: int | None  # source.max_deliver (see Decoder.flag)
    file_prefix: str  # "part-<run>-r<round>": which run and round wrote a file
    # The dead-letter table's directory, where the tasks' dead-letter files are committed as
    # they are; None: they go to ``directory``'s top level, for Spark's append to read.
    dead_letter_directory: str | None

    @property
    def dead_letter_files(self) -> str:
        """The directory the tasks' dead-letter file paths are relative to."""
        return self.dead_letter_directory or self.directory


@dataclass(frozen=True, slots=True)
class WrittenFile:
    """One Parquet file a task wrote: the Delta ``add`` action's fields."""

    path: str  # relative to the table directory
    size: int
    partition_values: dict[str, str | None]
    modification_time: int  # epoch ms
    stats: str  # Delta statistics JSON
    rows: int


@dataclass(frozen=True, slots=True)
class TaskOutput:
    """One item of a fetch task's output, for one of:

    * a pulled batch: ``keys``, the Arrow IPC stream of the batch's :data:`KEY_SCHEMA` columns
      (one value per pull, not one per message: 1M key rows through the JVM cost it seconds);
    * a file of rows the task wrote: ``file``;
    * the file of dead letters it wrote (one at most): ``dead_letters`` (its path relative to
      :attr:`ColumnarPlan.dead_letter_files`)."""

    keys: bytes | None = None
    file: WrittenFile | None = None
    dead_letters: WrittenFile | None = None


@dataclass(frozen=True, slots=True)
class RoundOutput:
    """A columnar round's task output, collected on the driver: the keys of every delivery
    (:data:`KEY_SCHEMA`), the files of rows, the files of dead letters."""

    keys: pa.Table
    files: tuple[WrittenFile, ...]
    dead_letters: tuple[WrittenFile, ...]

    @classmethod
    def of(cls, output: list[TaskOutput]) -> RoundOutput:
        """From the tasks' collected output."""
        keys = [batch for o in output if o.keys is not None
                for batch in pa.ipc.open_stream(o.keys)]
        return cls(pa.Table.from_batches(keys, schema=KEY_SCHEMA),
                   tuple(o.file for o in output if o.file is not None),
                   tuple(o.dead_letters for o in output if o.dead_letters is not None))


def config_problem(spark: SparkSession, config: JobConfig) -> str | None:
    """Why this job's settings need the Spark writer, or None."""
    from pyspark.sql.pandas.types import to_arrow_type

    from js_etl.spark.json_batch import supported

    problem = _decode_problem(config)
    if problem:
        return problem
    payload = _payload_type(config.decode)
    if not supported(to_arrow_type(payload, timezone="UTC")):
        return _TYPES_PROBLEM
    return _fields_problem(config, {f.name: f.dataType.simpleString() for f in payload.fields},
                           spark.conf.get("spark.sql.session.timeZone") or "")


def expects_columnar(config: JobConfig) -> bool:
    """Whether a drain of ``config`` will write with the columnar writer, as far as its settings
    tell before Spark starts (the table's rules are read later, by :func:`table_problem`): local
    Spark starts its JVM for the writer it will serve (:func:`js_etl.spark.session.
    local_jvm_options`). decode.schema is read without Spark, as plain ``name TYPE`` pairs
    only; any other schema counts as no, which only starts the JVM as for Spark's writer."""
    fields = _plain_fields(config.decode.schema or "")
    return (config.target.writer != "spark" and _decode_problem(config) is None
            and fields is not None
            and _fields_problem(config, fields, config.spark.conf.get(
                "spark.sql.session.timeZone", "UTC")) is None)


def _plain_fields(ddl: str) -> dict[str, str] | None:
    """``name TYPE, ...`` as {name: Spark's simple type name}, or None for any other schema (the
    config has refused names that differ only in case)."""
    fields: dict[str, str] = {}
    for part in ddl.split(","):
        match = _PLAIN_FIELD.fullmatch(part)
        if match is None or match[3].lower() not in _PLAIN_TYPES:
            return None
        fields[match[2]] = _PLAIN_TYPES[match[3].lower()]
    return fields  # never empty: "" splits into one part, which does not match


def _decode_problem(config: JobConfig) -> str | None:
    decode = config.decode
    if decode.format != "json":
        return f"decode.format is {decode.format} (the columnar writer decodes JSON)"
    if decode.unknown_fields != "ignore":
        return "decode.unknown_fields is dead_letter"
    return None


def _fields_problem(config: JobConfig, fields: Mapping[str, str], zone: str) -> str | None:
    """The rest of :func:`config_problem`, on the payload's fields as {name: simple type}."""
    from js_etl.config import partition_column_name

    if not all(kind in _WRITABLE_TYPES for kind in fields.values()):
        return _TYPES_PROBLEM
    copyable = {name.lower() for name, kind in fields.items()
                if kind in _PARTITION_TYPES} | set(_COPYABLE_ORIGIN)
    for expression in config.target.partition_by:
        name, plain = partition_column_name(expression)
        if name and plain and name.lower() in copyable:
            continue
        if not (name and not plain and _TO_DATE.fullmatch(_computed(expression))):
            return (f"target.partition_by {expression!r}: the columnar writer computes only "
                    "to_date(published_at) AS <name> and copies columns")
        if zone.lower() not in _UTC_ZONES:
            return f"to_date(published_at) in session time zone {zone!r}, not UTC"
    return None


def location_problem(location: str) -> str | None:
    """Why a table at ``location`` needs the Spark writer whatever it holds, or None."""
    directory = local_directory(location)
    if directory is None:
        return f"the table is not on the local file system ({location})"
    if "%" in directory:
        return f"the table's path holds '%', which deltalake reads as an escape ({directory})"
    return None


def table_problem(table: TableShape, rows: StructType, partition_columns: list[str]
                  ) -> str | None:
    """Why the existing table needs the Spark writer, or None; ``rows`` is the schema the
    drain's rows have, partition columns included."""
    problem = unwritable(table.reader_version, table.writer_version, table.configuration,
                         [f.metadata for f in table.schema.fields])
    if problem:
        return problem
    if [f.name for f in table.schema.fields if not f.nullable]:
        return "the table has NOT NULL columns"
    if list(table.partition_columns) != partition_columns:
        return (f"the table is partitioned by {list(table.partition_columns)}, the rows by "
                f"{partition_columns}")
    ours = {f.name: f.dataType.simpleString() for f in rows.fields}
    theirs = {f.name: f.dataType.simpleString() for f in table.schema.fields}
    if ours != theirs:
        return "the table's columns differ from the rows' (schema evolution is the Spark writer's)"
    return None


def unwritable(reader_version: int, writer_version: int, configuration: Mapping[str, str],
               column_metadata: Iterable[Mapping[str, Any]]) -> str | None:
    """What of a table's protocol and rules the columnar writer would not honour, or None.
    Checked when the writer is chosen (Spark's snapshot) and again before every commit
    (deltalake's snapshot: another writer may add a rule during the run). The writer commits
    files without checking their rows, so any rule on rows refuses it: a protocol above reader 1
    / writer 2, a CHECK constraint, or column metadata other than a comment (an invariant, a
    generation expression, a default, an identity)."""
    if reader_version > 1 or writer_version > 2:
        return (f"the table's protocol (reader {reader_version}, writer {writer_version}) has "
                "features the columnar writer does not write")
    if any(key.startswith("delta.constraints.") for key in configuration):
        return "the table has CHECK constraints"
    if any(set(metadata) - {"comment"} for metadata in column_metadata):
        return ("the table has column rules (an invariant, a generated, default or identity "
                "column)")
    return None


def columnar_plan(location: str, config: JobConfig, run_id: str,
                  dead_letter_directory: str | None) -> ColumnarPlan:
    """The plan of a job :func:`config_problem`, :func:`location_problem` and
    :func:`table_problem` accepted."""
    directory = local_directory(location)
    assert directory is not None  # location_problem accepted it
    payload = _payload_type(config.decode)
    return ColumnarPlan(directory, config.decode, payload.json(),
                        _partition_columns(config, payload), config.source.max_deliver,
                        f"part-{run_id}", dead_letter_directory)


def _partition_columns(config: JobConfig, payload: StructType) -> tuple[PartitionColumn, ...]:
    from js_etl.config import partition_column_name

    copyable = {n.lower(): n for n in (*payload.fieldNames(), *_COPYABLE_ORIGIN)}
    partitions = []
    for expression in config.target.partition_by:
        name, plain = partition_column_name(expression)
        assert name is not None  # config_problem accepted it
        source = copyable[name.lower()] if plain else None
        # A copy takes the column's own name, as Delta records it: partition_by KIND of a field
        # Kind is the partition column Kind.
        partitions.append(PartitionColumn(source or name, source))
    return tuple(partitions)


def row_schema(config: JobConfig) -> tuple[StructType, list[str]]:
    """The schema of the rows this writer writes for a job :func:`config_problem` accepted, and
    the table's partition columns: the origin columns, the payload's fields (and ``data`` with
    keep_raw), then each computed partition column (a DATE).

    It is the schema the Spark writer's rows have (:meth:`~js_etl.spark.drain.Drain.
    _empty_rows`; tests/spark/test_columnar.py compares the two for every kind of field and
    partition this writer takes), worked out without analysing the Spark decoding that this
    writer never runs: that analysis cost a run 0.35 JVM CPU-seconds (measured, issue 14)."""
    from pyspark.sql.types import DateType, StructField, StructType, _parse_datatype_string

    raw = _parse_datatype_string(RAW_DDL)
    assert isinstance(raw, StructType)
    payload = _payload_type(config.decode)
    fields = [raw[name] for name in ORIGIN_COLUMNS] + payload.fields
    if config.decode.keep_raw:
        fields.append(raw["data"])
    partitions = _partition_columns(config, payload)
    fields += [StructField(c.name, DateType()) for c in partitions if c.source is None]
    return (StructType([StructField(f.name, f.dataType, True, f.metadata) for f in fields]),
            [c.name for c in partitions])


# Characters Delta's Spark writer refuses in a column name without column mapping (measured,
# delta-spark 4.4.0: DELTA_INVALID_CHARACTERS_IN_COLUMN_NAMES); deltalake's create takes them.
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
    library that commits its rounds: 10 ms of the driver, where Spark's empty append cost a
    first run 0.66 JVM CPU-seconds (measured, issue 14). Its first commit holds what Spark's
    would (protocol reader 1 / writer 2, the schema, the partition columns:
    tests/spark/test_columnar.py compares the two), unless :func:`needs_spark_to_create`.

    Raises if a table is there already, or another process created it meanwhile; the caller
    then reads the table. Never retried: deltalake retries a commit that lost its version by
    committing at the next one, and a lost CREATE became a second commit that replaced the
    table's id, schema and partitioning (a break-it review: two processes creating one table,
    24 of 40 races). Without retries the loser's commit fails, because the local file system
    writes a version's log file only where none is (measured, deltalake 1.6.6: 0 of 540 races
    with two commits, against 38 of 40 with
    mode="error" and the default retries; tests/unit/test_create_table.py races two creates)."""
    from deltalake import CommitProperties, DeltaTable, Schema

    DeltaTable.create(directory, Schema.from_json(rows.json()), mode="error",
                      partition_by=partition_columns or None,
                      commit_properties=CommitProperties(max_commit_retries=0))


def dead_letter_schema() -> StructType:
    """The dead-letter table's schema (:data:`js_etl.schema.DEAD_LETTER`) in Spark's types."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    schema = _parse_datatype_string(ddl(DEAD_LETTER))
    assert isinstance(schema, StructType)
    return schema


def table_keys(directory: str, stream: str, first: int, last: int) -> pa.Table | None:
    """``(seq, num_delivered, consumer_seq)`` of the rows the table holds for ``stream`` in
    ``first..last``, read by ``deltalake`` on the driver (:meth:`LocalView.keys`); None when no
    file can hold one.

    Reading the named files as they are is a read of the snapshot only while the table has no
    deletion vectors and no column mapping: so only on the protocol the writer was chosen for
    (reader 1, writer <= 2); another writer upgrading it during the run makes this a transient
    error, and the next run picks the Spark writer. The columnar writer's tables never take a
    key column as a partition column (``_COPYABLE_ORIGIN``)."""
    from deltalake import DeltaTable

    from js_etl.errors import TransientError
    from js_etl.spark.delta import LocalView

    table = DeltaTable(directory)
    protocol = table.protocol()
    if protocol.min_reader_version > 1 or protocol.min_writer_version > 2:
        raise TransientError(
            f"the table at {directory} changed its protocol during the run (reader "
            f"{protocol.min_reader_version}, writer {protocol.min_writer_version}): nothing of "
            "this round is acked; the next run writes it with Spark")
    return LocalView(directory, table).keys(stream, first, last, ACK_KEY_COLUMNS)


def _payload_type(decode: DecodeConfig) -> StructType:
    from pyspark.sql.types import StructType, _parse_datatype_string

    schema = _parse_datatype_string(decode.schema or "")
    assert isinstance(schema, StructType)  # the Decoder checked decode.schema
    return schema


def _computed(expression: str) -> str:
    """The expression of ``<expression> AS <name>``."""
    return re.split(r"(?is)\s+AS\s+", expression)[0]


def local_directory(location: str) -> str | None:
    if location.startswith("file:"):
        return "/" + location.removeprefix("file:").lstrip("/")
    if "://" in location or ":" in location.split("/")[0]:
        return None
    return os.path.abspath(location)


def fetch_decode_write(fetch: FetchPlan, plan: ColumnarPlan, round_no: int,
                       elements: Iterator[int]) -> Iterator[TaskOutput]:
    """``mapPartitions`` body over one element a partition: the fetch
    (:func:`~js_etl.spark.fetch.fetch_partition`), each pulled batch decoded, its good rows written
    on into one Parquet file per partition value and its dead letters into the task's dead-letter
    file (:class:`_TaskFiles`); yields the keys of each pull, then each file once all are closed.

    What fetch.partition_max_bytes bounds here is the round's dead letters (payload, headers and
    subject counted), which Spark's append reads back where the dead-letter table does not take
    them as they are: the good rows are committed as they are, the keys a few dozen bytes a
    message."""
    from pyspark import TaskContext

    from js_etl.spark.source_decode import BatchDecoder

    decoder = BatchDecoder.of(plan.decode, plan.payload_json)
    context = TaskContext.get()
    task = context.partitionId() if context is not None else 0
    dead_bytes = 0
    with _TaskFiles(plan, f"{plan.file_prefix}-r{round_no}-t{task}") as files:
        # Late binding wanted: the fetch asks before each pull what is held by then.
        for raw in fetch_partition(fetch, elements, held=lambda: dead_bytes):  # noqa: B023
            decoded = decoder(raw)
            # The decoder keeps a good row's payload only with keep_raw: the bytes, and a row
            # that is parked below, take it from the pull.
            payloads = raw.column("data")
            error = decoded.column("error")
            if plan.park_after is not None:
                delivered = decoded.column("num_delivered")
                poison = pc.binary_join_element_wise(
                    "poison: delivered ", pc.cast(delivered, pa.string()),
                    f" times (more than source.max_deliver {plan.park_after})", "")
                error = pc.if_else(pc.greater(delivered, plan.park_after), poison, error)
            dead = pc.is_valid(error)
            rows = decoded.drop_columns(["error"] if plan.decode.keep_raw else ["error", "data"])
            yield TaskOutput(keys=_key_blob(decoded, dead, payloads))
            if pc.any(dead).as_py():
                files.add(rows.filter(pc.invert(dead)))
                dead_letters = _dead_letters(decoded.filter(dead), error.filter(dead),
                                             payloads.filter(dead))
                dead_bytes += dead_letters.nbytes
                files.add_dead_letters(dead_letters)
            else:
                files.add(rows)  # a filter would copy every payload byte (~1 s per 400 MB)
        written, dead_file = files.close()
    if written:  # the attempt dies with its files on disk: they must never be committed
        fail_first_attempt("fail_write_task", fetch.fault)
    for description in written:
        yield TaskOutput(file=description)
    if dead_file is not None:
        yield TaskOutput(dead_letters=dead_file)


def _key_blob(decoded: pa.RecordBatch, dead: pa.Array, payloads: pa.Array) -> bytes:
    """The batch's KEY_SCHEMA columns as one Arrow IPC stream."""
    keys = pa.RecordBatch.from_arrays([
        decoded.column("seq"), decoded.column("consumer_seq"), decoded.column("num_delivered"),
        dead, pc.binary_length(payloads).cast(pa.int64())], schema=KEY_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, KEY_SCHEMA) as writer:
        writer.write_batch(keys)
    return bytes(sink.getvalue())


def _dead_letters(decoded: pa.RecordBatch, error: pa.Array, payloads: pa.Array
                  ) -> pa.RecordBatch:
    columns = {name: decoded.column(name) for name in dead_letter_arrow().names
               if name in decoded.schema.names}
    columns.update({"data": payloads, "error": error})
    n = decoded.num_rows
    return pa.RecordBatch.from_arrays(
        [columns.get(f.name, pa.nulls(n, f.type)) for f in dead_letter_arrow()],
        schema=dead_letter_arrow())


class _TaskFiles:
    """A task's Parquet files, one per distinct partition value of its rows, written a row
    group at a time as the batches come: a task holds less than :data:`ROW_GROUP_BYTES` of
    decoded rows (over all its files; then every file writes what it holds), not its whole
    share of the round. And one file of its dead letters, if it has any, written a batch's
    dead letters at a time.

    Why on (measured, issue 14): holding every decoded batch until the task's end made each
    batch's buffers fresh pages from the OS. pyarrow's JSON parse of 8 MB of 4 KiB payloads
    took 12 ms with its results dropped, 30 ms with them kept; a fetch task of 100k x 4 KiB
    took 3.3-4.0 CPU-seconds holding its rows, 2.4-2.8 writing them on. A row group's buffers
    are freed once it is written, and the next batches reuse their pages.

    A partition column copied from a row column stays in the file (Delta reads partition
    columns from the log's ``partitionValues``, which hold the same value), so a round read
    back from its files (:meth:`~js_etl.spark.drain.Drain._good_rows`) has every row column."""

    def __init__(self, plan: ColumnarPlan, name: str) -> None:
        self._plan, self._name = plan, name
        self._files: dict[tuple[Any, ...], _OpenFile] = {}
        self._written: list[WrittenFile] = []
        self._opened = 0
        self._dead: _OpenFile | None = None

    def __enter__(self) -> _TaskFiles:
        return self

    def __exit__(self, *failure: object) -> None:
        for file in self._files.values():  # after a failure: the attempt's files stay unnamed
            file.writer.close()
        if self._dead is not None:
            self._dead.writer.close()

    def add_dead_letters(self, rows: pa.RecordBatch) -> None:
        if self._dead is None:
            self._dead = _OpenFile(self._plan.dead_letter_files,
                                   f"{self._name}-dead-letters-{uuid.uuid4().hex}.snappy.parquet",
                                   {}, dead_letter_arrow())
        self._dead.hold(rows)
        self._dead.flush()

    def add(self, rows: pa.RecordBatch) -> None:
        if not rows.num_rows:
            return
        values = {column.name: (pc.cast(rows.column("published_at"), pa.date32())
                                if column.source is None else rows.column(column.source))
                  for column in self._plan.partitions}
        keys = (pa.table(values).group_by(list(values)).aggregate([]).to_pylist()
                if values else [{}])
        for key in keys:
            # One value (a round within one day): no filter, which would copy every byte.
            part = rows if len(keys) == 1 else rows.filter(_matching(values, key))
            file = self._files.get(tuple(key.values()))
            if file is None:
                if len(self._files) >= MAX_OPEN_FILES:  # a file handle each: close them all
                    self._close_open()
                file = self._files[tuple(key.values())] = self._open(key, rows.schema)
            file.hold(part)
        if sum(file.pending_bytes for file in self._files.values()) >= ROW_GROUP_BYTES:
            for file in self._files.values():
                file.flush()

    def close(self) -> tuple[list[WrittenFile], WrittenFile | None]:
        """Every file closed: the files of rows the task wrote, and of dead letters."""
        self._close_open()
        dead, self._dead = self._dead, None
        return self._written, dead.close() if dead else None

    def _close_open(self) -> None:
        self._written += [file.close() for file in self._files.values()]
        self._files.clear()

    def _open(self, key: dict[str, Any], schema: pa.Schema) -> _OpenFile:
        partition_values = {c: _partition_text(v) for c, v in key.items()}
        safe = all(v is not None and _PLAIN.fullmatch(c) and _PLAIN.fullmatch(v)
                   and len(c) + len(v) < 200 for c, v in partition_values.items())
        # Where a file lies does not matter to Delta (its partitionValues do): a readable
        # directory when the values make one (a file name has at most 255 bytes: Spark's own
        # writer fails on a longer value), else the table's top level.
        directory = "/".join(f"{c}={v}" for c, v in partition_values.items()) if safe else ""
        self._opened += 1
        path = (f"{directory}/{self._name}-{self._opened}-{uuid.uuid4().hex}"
                ".snappy.parquet").lstrip("/")
        return _OpenFile(self._plan.directory, path, partition_values, schema)


def _matching(values: dict[str, pa.Array], key: dict[str, Any]) -> pa.Array:
    mask = pa.repeat(True, len(next(iter(values.values()))))
    for column, value in key.items():
        mask = pc.and_(mask, pc.is_null(values[column]) if value is None
                       else pc.equal(values[column], pa.scalar(value, values[column].type)))
    return mask


# Decoded rows a task holds before its files write them as row groups. Large enough for row
# groups a reader skips and decodes well; small enough that the buffers are reused (_TaskFiles).
ROW_GROUP_BYTES = 32 << 20
# Files a task keeps open (a file handle each, against the process's limit, often 1,024): a task
# whose rows have more partition values closes them all and opens new ones, so a value may get
# several files, as it would from several tasks.
MAX_OPEN_FILES = 100


class _OpenFile:
    """One Parquet file being written, and the Delta statistics of what it holds so far."""

    def __init__(self, directory: str, path: str, partition_values: dict[str, str | None],
                 schema: pa.Schema) -> None:
        import pyarrow.parquet as pq

        self.path, self.partition_values = path, partition_values
        self.full = os.path.join(directory, path)
        os.makedirs(os.path.dirname(self.full), exist_ok=True)
        self.writer = pq.ParquetWriter(self.full, schema, compression="snappy")
        self.pending: list[pa.RecordBatch] = []  # rows not yet written
        self.pending_bytes = 0
        self.stats = _Stats()

    def hold(self, rows: pa.RecordBatch) -> None:
        self.pending.append(rows)
        self.pending_bytes += rows.nbytes

    def close(self) -> WrittenFile:
        import time

        self.flush()
        self.writer.close()
        return WrittenFile(self.path, os.stat(self.full).st_size, self.partition_values,
                           int(time.time() * 1000), self.stats.to_json(), self.stats.rows)

    def flush(self) -> None:
        if not self.pending:
            return
        group = pa.Table.from_batches(self.pending)
        self.writer.write_table(group, row_group_size=group.num_rows)
        self.stats.add(group)
        self.pending, self.pending_bytes = [], 0


def _partition_text(value: Any) -> str | None:
    """A partition value as Delta writes it in ``partitionValues``: Spark writes an empty string
    and Hive's null marker as null (measured: both read back as null from its table)."""
    if value is None or value in ("", "__HIVE_DEFAULT_PARTITION__"):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


class _Stats:
    """Delta statistics of a file, gathered a row group at a time: its rows, and min, max and
    nulls of the key columns (what data skipping on a round's ``seq`` range needs); ``stream``
    too when short."""

    def __init__(self) -> None:
        self.rows = 0
        self.minimum: dict[str, Any] = {}
        self.maximum: dict[str, Any] = {}
        self.nulls = dict.fromkeys((*_STATS_COLUMNS, "stream"), 0)

    def add(self, group: pa.Table) -> None:
        self.rows += group.num_rows
        for name in self.nulls:
            column = group.column(name)
            self.nulls[name] += column.null_count
            low, high = (v.as_py() for v in pc.min_max(column).values())
            if low is None:
                continue
            self.minimum[name] = min(low, self.minimum.get(name, low))
            self.maximum[name] = max(high, self.maximum.get(name, high))

    def to_json(self) -> str:
        minimum, maximum = dict(self.minimum), dict(self.maximum)
        if len(maximum.get("stream", "")) > _MAX_STRING_STAT:
            minimum.pop("stream"), maximum.pop("stream")
        return json.dumps({"numRecords": self.rows, "minValues": minimum, "maxValues": maximum,
                           "nullCount": self.nulls}, separators=(",", ":"))
