"""What a table allows each writer: the schema Delta appends to, and the protocol, rules and
location the columnar writer honours."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from js_etl.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from js_etl.config import JobConfig, TargetConfig


@dataclass(frozen=True, slots=True)
class TableShape:
    reader_version: int
    writer_version: int
    partition_columns: tuple[str, ...]
    schema: StructType
    configuration: dict[str, str]  # the table's properties
    features: frozenset[str] = frozenset()  # reader and writer table features (protocol 3 / 7)


def schema_problem(table: str, shape: TableShape, rows: StructType, partition_by: list[str], *,
                   merge_schema: bool) -> str | None:
    """Why Delta would refuse to append ``rows`` (partitioned by ``partition_by``) to an
    existing table of ``shape`` — found before anything is fetched, where Delta's own refusal
    (``DELTA_FAILED_TO_MERGE_FIELDS``) comes after the fetch and names no type. Delta without
    type widening appends only a column of the very same type (nullability aside); a column the
    table lacks only with ``decode.merge_schema``."""
    have = {f.name.lower(): f.dataType for f in shape.schema.fields}
    widening = shape.configuration.get("delta.enableTypeWidening", "").lower() == "true"
    for field in rows.fields:
        kind = have.get(field.name.lower())
        if kind is None or kind.simpleString() == field.dataType.simpleString():
            continue
        if merge_schema and (widening or (_complex(kind) and _complex(field.dataType))):
            continue  # Delta merges these itself (nested fields, widening): its call
        return (f"table {table} has column {field.name} {kind.simpleString().upper()}, but this "
                f"job writes it as {field.dataType.simpleString().upper()}: make decode.schema "
                f"declare {field.name} {kind.simpleString().upper()}, or write into a new table")
    new = [f.name for f in rows.fields if f.name.lower() not in have]
    if new and not merge_schema:
        return (f"table {table} has no column {', '.join(new)}: set decode.merge_schema to true "
                "to add it, remove it from decode.schema, or write into a new table")
    if partition_by and [c.lower() for c in partition_by] != [
            c.lower() for c in shape.partition_columns]:
        return (f"table {table} is partitioned by {list(shape.partition_columns) or 'nothing'}, "
                f"this job by {partition_by}: make target.partition_by match the table, or "
                "write into a new table")
    return None


def _complex(kind: Any) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StructType

    return isinstance(kind, ArrayType | MapType | StructType)


def location_problem(location: str) -> str | None:
    """Why a table at ``location`` needs the Spark writer whatever it holds, or None."""
    directory = local_directory(location)
    if directory is None:
        if object_store_url(location):
            return None
        return f"the table is neither on the local file system nor on S3 ({location})"
    if "%" in directory:
        return f"the table's path holds '%', which deltalake reads as an escape ({directory})"
    return None


def table_problem(table: TableShape, rows: StructType, partition_columns: list[str]
                  ) -> str | None:
    """Why the existing table needs the Spark writer, or None; ``rows`` is the schema the
    drain's rows have, partition columns included."""
    problem = unwritable(table.reader_version, table.writer_version, table.configuration,
                         [f.metadata for f in table.schema.fields], table.features)
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


# Table features of tables the columnar writer appends to as it does to any other: deltalake
# commits to them, and a commit that only adds files is all they ask of a writer. Deletion vectors
# mark rows other writers deleted (an append adds none); a change data feed derives an append's
# changes from its add actions; timestampNtz only says a column is TIMESTAMP_NTZ, which the tasks
# write as Parquet's timestamp not adjusted to UTC; invariants are refused where a column has one
# (below).
APPEND_SAFE_FEATURES = frozenset({"appendOnly", "invariants", "changeDataFeed",
                                  "deletionVectors", "timestampNtz"})
# Reader features that leave a file's columns the table's rows (TableView.reads_files_as_rows).
PLAIN_FILE_READER_FEATURES = frozenset({"timestampNtz"})


def unwritable(reader_version: int, writer_version: int, configuration: Mapping[str, str],
               column_metadata: Iterable[Mapping[str, Any]],
               features: Iterable[str] = ()) -> str | None:
    """What of a table's protocol and rules the columnar writer would not honour, or None.
    Checked when the writer is chosen (Spark's snapshot) and again before every commit
    (deltalake's snapshot: another writer may add a rule during the run). The writer commits
    files without checking their rows, so any rule on rows refuses it: a CHECK constraint, or
    column metadata other than a comment (an invariant, a generation expression, a default, an
    identity); and a protocol beyond what its appends keep: the legacy protocols up to writer 4
    (reader 1), or table features (reader 3 / writer 7) within :data:`APPEND_SAFE_FEATURES`.
    Column mapping (reader 2, writer 5, or the feature) is refused: the tasks write columns by
    their logical names."""
    named = set(features) - APPEND_SAFE_FEATURES
    legacy = reader_version == 1 and writer_version <= 4
    with_features = reader_version in (1, 3) and writer_version == 7 and not named
    if not (legacy or with_features):
        what = f" ({', '.join(sorted(named))})" if named else ""
        return (f"the table's protocol (reader {reader_version}, writer {writer_version}){what} "
                "has features the columnar writer does not write")
    if any(key.startswith("delta.constraints.") for key in configuration):
        return "the table has CHECK constraints"
    if any(set(metadata) - {"comment"} for metadata in column_metadata):
        return ("the table has column rules (an invariant, a generated, default or identity "
                "column)")
    return None


# Object stores js-etl writes to: both spellings of S3 (Spark's Hadoop connector is s3a://).
OBJECT_STORE_SCHEMES = frozenset({"s3", "s3a"})


def object_store_url(location: str) -> str | None:
    """``location`` as an object-store URL without a trailing slash, or None."""
    scheme = urlparse(location).scheme.lower()
    return location.rstrip("/") if scheme in OBJECT_STORE_SCHEMES else None


def on_object_store(target: TargetConfig) -> bool:
    """Whether a job's tables lie on an object store (Spark's session then needs S3A)."""
    return any(path and object_store_url(path)
               for path in (target.path, target.dead_letter_path))


def local_directory(location: str) -> str | None:
    if location.startswith("file:"):
        return "/" + location.removeprefix("file:").lstrip("/")
    if "://" in location or ":" in location.split("/")[0]:
        return None
    return os.path.abspath(location)


def check_target_paths(config: JobConfig) -> None:
    """Refuse (exit 2, path named) a local table or dead-letter path that cannot be written
    (under a regular file, in /proc, no permission) before Spark starts, instead of an
    unexplained failure (exit 1) after the first round was fetched."""
    from js_etl.config import local_path_problem

    target = config.target
    for key, path in (("target.path", target.path),
                      ("target.dead_letter_path", target.resolved_dead_letter_path)):
        problem = local_path_problem(path) if path else None
        if problem:
            raise ConfigError(f"{key} {path}: {problem}; point it at a writable directory")
