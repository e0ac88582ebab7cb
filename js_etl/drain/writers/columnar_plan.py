"""What a job's settings let the columnar writer do, and the plan its fetch tasks carry."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from js_etl.config.ddl import field_types
from js_etl.delta.files import PartitionColumn
from js_etl.delta.store import TableFiles, store_options, table_root
from js_etl.schema import DEAD_LETTER, ORIGIN_COLUMNS, RAW_DDL, ddl
from js_etl.spark.session import driver_property

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType, StructType

    from js_etl.config import DecodeConfig, JobConfig


# Spark's own name for the date of a timestamp column as a partition expression.
_TO_DATE = re.compile(r"(?is)\s*to_date\s*\(\s*`?published_at`?\s*\)\s*")


# Time zones in which to_date(published_at) is the UTC date the task computes.
_UTC_ZONES = {"utc", "etc/utc", "gmt", "etc/gmt", "z", "+00:00"}


# Origin columns a partition may copy: not the key columns range_keys reads from the files.
_COPYABLE_ORIGIN = ("subject",)


# What the columnar writer decodes as Spark does. Not SMALLINT or TINYINT: Spark's parser takes
# 200 into a TINYINT as -56, the decoders refuse it.
_WRITABLE_TYPES = ("bigint", "int", "double", "string", "boolean", "date", "timestamp",
                   "timestamp_ntz")


_NESTING = ("decimal", "array", "struct", "map")


_TYPES_PROBLEM = ("decode.schema has a type the columnar writer does not decode as Spark does "
                  f"(it takes {', '.join(t.upper() for t in _WRITABLE_TYPES)}, DECIMAL, and "
                  "ARRAY, STRUCT and MAP<STRING, …> of them)")


# A TIMESTAMP anywhere in a type's simple string (not a TIMESTAMP_NTZ).
_TIMESTAMP = re.compile(r"\btimestamp\b(?!_ntz)")


# What a partition column may copy: not DOUBLE (0.0 and -0.0 are one value to a filter and
# two to a grouping, so a row would go into two files).
_PARTITION_TYPES = ("bigint", "int", "string", "boolean")


@dataclass(frozen=True, slots=True)
class ColumnarPlan:
    """What a fetch task needs to decode and write. Picklable: it travels to the executors."""

    directory: str  # the table's root: its local directory or object-store URL
    decode: DecodeConfig
    payload_json: str  # decode.schema as Spark's StructType JSON
    partitions: tuple[PartitionColumn, ...]
    park_after: int | None  # source.max_deliver (see Decoder.flag)
    file_prefix: str  # "part-<run>-r<round>": which run and round wrote a file
    # The dead-letter table's directory, where the tasks' dead-letter files are committed as
    # they are; None: they go to ``directory``'s top level, for Spark's append to read.
    dead_letter_directory: str | None
    # How the tasks reach an object-store table (store_options: its credentials): never shown.
    storage: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def dead_letter_files(self) -> str:
        """The directory the tasks' dead-letter file paths are relative to."""
        return self.dead_letter_directory or self.directory


def config_problem(spark: SparkSession, config: JobConfig) -> str | None:
    """Why this job's settings need the Spark writer, or None."""
    problem = _decode_problem(config)
    if problem:
        return problem
    payload = _payload_type(config.decode)
    if not all(_writable(f.dataType) for f in payload.fields):
        return _TYPES_PROBLEM
    problem = _times_problem(spark, [f.dataType.simpleString() for f in payload.fields])
    if problem:
        return problem
    return _fields_problem(config, {f.name: f.dataType.simpleString() for f in payload.fields},
                           spark.conf.get("spark.sql.session.timeZone") or "")


def _writable(kind: DataType) -> bool:
    """Whether the decoders give ``kind`` as Spark's parser does: the plain types (dates and
    timestamps too), DECIMAL, and arrays, structs and string-keyed maps of them."""
    from pyspark.sql.types import ArrayType, DecimalType, MapType, StringType, StructType

    if isinstance(kind, ArrayType):
        return _writable(kind.elementType)
    if isinstance(kind, StructType):
        return bool(kind.fields) and all(_writable(f.dataType) for f in kind.fields)
    if isinstance(kind, MapType):
        return isinstance(kind.keyType, StringType) and _writable(kind.valueType)
    return isinstance(kind, DecimalType) or kind.simpleString() in _WRITABLE_TYPES


def _times_problem(spark: SparkSession, kinds: list[str]) -> str | None:
    """Why DATE, TIMESTAMP or TIMESTAMP_NTZ fields (``kinds``: the fields' simple types) would
    not be read as Spark's parser reads them (js_etl.decode.times follows its default
    formatters and their legacy fallback, in a UTC session, with the JVM's zone rules)."""
    if not any(re.search(r"\b(date|timestamp|timestamp_ntz)\b", k) for k in kinds):
        return None
    from js_etl.decode.times import java_tzdb

    policy = spark.conf.get("spark.sql.legacy.timeParserPolicy") or "CORRECTED"
    if policy.upper() != "CORRECTED":
        return f"spark.sql.legacy.timeParserPolicy is {policy}, not CORRECTED (dates, timestamps)"
    fallback = spark.conf.get("spark.sql.json.enableDateTimeParsingFallback", None)
    if fallback is not None and fallback.lower() != "true":
        return f"spark.sql.json.enableDateTimeParsingFallback is {fallback} (dates, timestamps)"
    if any(_TIMESTAMP.search(k) for k in kinds):
        ours = java_tzdb()
        theirs = f"{driver_property(spark, 'java.home')}/lib/tzdb.dat"
        if ours is None or os.path.realpath(ours) != os.path.realpath(theirs):
            return (f"the JVM's time zone rules ({theirs}) are not the ones the columnar "
                    f"decoder finds ({ours}: $JAVA_HOME, else java on the PATH)")
    return None


def expects_columnar(config: JobConfig) -> bool:
    """Whether a drain of ``config`` will write with the columnar writer, as far as its settings
    tell before Spark starts (the table's rules are read later, by :func:`table_problem`): local
    Spark starts its JVM for the writer it will serve (:func:`js_etl.spark.session.
    local_jvm_options`). decode.schema is read without Spark
    (:func:`js_etl.config.ddl.field_types`); a schema that reader is not sure of counts as no,
    which only starts the JVM as for Spark's writer."""
    fields = (field_types(config.decode.schema or "") if config.decode.format == "json"
              else _payload_type_fields(config.decode))
    return (config.target.writer != "spark" and _decode_problem(config) is None
            and fields is not None and all(map(_writable_text, fields.values()))
            and _fields_problem(config, fields, config.spark.conf.get(
                "spark.sql.session.timeZone", "UTC")) is None)


def _writable_text(kind: str) -> bool:
    """:func:`_writable` of a type as :func:`js_etl.config.ddl.field_types` gives it."""
    words = re.findall(r"[a-z_]+", kind)
    return (all(word in _WRITABLE_TYPES or word in _NESTING for word in words)
            and "struct<>" not in kind and not re.search(r"map<(?!string,)", kind))


def _decode_problem(config: JobConfig) -> str | None:
    decode = config.decode
    if decode.format == "json" and decode.unknown_fields != "ignore":
        return "decode.unknown_fields is dead_letter"
    return None


def _payload_type_fields(decode: DecodeConfig) -> dict[str, str]:
    """The payload columns of a raw or text drain, as {name: simple type}."""
    return {"text": "string"} if decode.format == "text" else {}


def _fields_problem(config: JobConfig, fields: Mapping[str, str], zone: str) -> str | None:
    """The rest of :func:`config_problem`, on the payload's fields as {name: simple type}."""
    from js_etl.config import partition_column_name

    if any(_TIMESTAMP.search(kind) for kind in fields.values()) \
            and zone.lower() not in _UTC_ZONES:
        # Spark reads a timestamp without an offset in the session's zone; the decoder in UTC.
        return f"TIMESTAMP fields in session time zone {zone!r}, not UTC"
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


def columnar_plan(location: str, config: JobConfig, run_id: str,
                  dead_letter_directory: str | None) -> ColumnarPlan:
    """The plan of a job :func:`config_problem`, :func:`location_problem` and
    :func:`table_problem` accepted."""
    directory = table_root(location)
    assert directory is not None  # location_problem accepted it
    payload = _payload_type(config.decode)
    return ColumnarPlan(directory, config.decode, payload.json(),
                        _partition_columns(config, payload), config.source.max_deliver,
                        f"part-{run_id}", dead_letter_directory,
                        store_options() if TableFiles(directory).remote else {})


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
    the table's partition columns: the origin columns, the payload's fields (``text`` of a text
    drain), ``data`` where a row keeps the payload (``DecodeConfig.keeps_payload``), then each
    computed partition column (a DATE).

    It is the schema the Spark writer's rows have (:meth:`~js_etl.drain.run.Drain.
    _empty_rows`; tests/drain/test_columnar.py compares the two for every kind of field and
    partition this writer takes), worked out without analysing the Spark decoding that this
    writer never runs: that analysis runs in the JVM, every run (docs/design/driver-reads.md)."""
    from pyspark.sql.types import DateType, StructField, StructType, _parse_datatype_string

    raw = _parse_datatype_string(RAW_DDL)
    assert isinstance(raw, StructType)
    payload = _payload_type(config.decode)
    fields = [raw[name] for name in ORIGIN_COLUMNS] + payload.fields
    if config.decode.keeps_payload:
        fields.append(raw["data"])
    partitions = _partition_columns(config, payload)
    fields += [StructField(c.name, DateType()) for c in partitions if c.source is None]
    return (StructType([StructField(f.name, f.dataType, True, f.metadata) for f in fields]),
            [c.name for c in partitions])


def dead_letter_schema() -> StructType:
    """The dead-letter table's schema (:data:`js_etl.schema.DEAD_LETTER`) in Spark's types."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    schema = _parse_datatype_string(ddl(DEAD_LETTER))
    assert isinstance(schema, StructType)
    return schema


def _payload_type(decode: DecodeConfig) -> StructType:
    """The payload's columns: decode.schema's fields for json, ``text STRING`` for text, none
    for raw (its payload is ``data``)."""
    from pyspark.sql.types import StringType, StructField, StructType, _parse_datatype_string

    if decode.format == "text":
        return StructType([StructField("text", StringType())])
    if decode.format == "raw":
        return StructType([])
    schema = _parse_datatype_string(decode.schema or "")
    assert isinstance(schema, StructType)  # the Decoder checked decode.schema
    return schema


def _computed(expression: str) -> str:
    """The expression of ``<expression> AS <name>``."""
    return re.split(r"(?is)\s+AS\s+", expression)[0]
