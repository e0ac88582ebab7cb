"""Parquet files written by fetch tasks for a Delta commit: one file per partition value,
written a row group at a time, with the Delta statistics data skipping needs."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from js_etl.delta.store import TableFiles
from js_etl.schema import dead_letter_arrow

_STATS_COLUMNS = ("seq", "consumer_seq", "num_delivered")


_MAX_STRING_STAT = 32  # Delta's own writer truncates longer string statistics


_PLAIN = re.compile(r"[0-9A-Za-z_.-]+")  # needs no escaping in a path or a URI


@dataclass(frozen=True, slots=True)
class PartitionColumn:
    name: str  # the table's partition column
    source: str | None  # the row column it copies; None: to_date(published_at) (UTC)


@dataclass(frozen=True, slots=True)
class WrittenFile:
    """One Parquet file a task wrote: the Delta ``add`` action's fields."""

    path: str  # relative to the table directory
    size: int
    partition_values: dict[str, str | None]
    modification_time: int  # epoch ms
    stats: str  # Delta statistics JSON
    rows: int


class TaskFiles:
    """A task's Parquet files, one per distinct partition value of its rows, written a row
    group at a time as the batches come: a task holds less than :data:`ROW_GROUP_BYTES` of
    decoded rows (over all its files; then every file writes what it holds), not its whole
    share of the round, so a row group's buffers are freed and their pages reused by the next
    batches. And one file of its dead letters, if it has any, written a batch's dead letters at
    a time.

    A partition column copied from a row column stays in the file (Delta reads partition
    columns from the log's ``partitionValues``, which hold the same value), so a round read
    back from its files has every row column."""

    def __init__(self, directory: str, dead_letter_directory: str,
                 partitions: tuple[PartitionColumn, ...], name: str,
                 storage: Mapping[str, str] | None = None) -> None:
        # Rows go to ``directory``, dead letters to ``dead_letter_directory`` (roots: local or
        # object-store, reached with ``storage``, see TableFiles); every file's name starts
        # with ``name``.
        self._directory = TableFiles(directory, storage)
        self._dead_directory = TableFiles(dead_letter_directory, storage)
        self._partitions, self._name = partitions, name
        self._files: dict[tuple[Any, ...], _OpenFile] = {}
        self._written: list[WrittenFile] = []
        self._opened = 0
        self._dead: _OpenFile | None = None

    def __enter__(self) -> TaskFiles:
        return self

    def __exit__(self, *failure: object) -> None:
        for file in self._files.values():  # after a failure: the attempt's files stay unnamed
            file.abandon()
        if self._dead is not None:
            self._dead.abandon()

    def add_dead_letters(self, rows: pa.RecordBatch) -> None:
        if self._dead is None:
            self._dead = _OpenFile(self._dead_directory,
                                   f"{self._name}-dead-letters-{uuid.uuid4().hex}.snappy.parquet",
                                   {}, dead_letter_arrow())
        self._dead.hold(rows)
        self._dead.flush()

    def add(self, rows: pa.RecordBatch) -> None:
        if not rows.num_rows:
            return
        values = {column.name: (pc.cast(rows.column("published_at"), pa.date32())
                                if column.source is None else rows.column(column.source))
                  for column in self._partitions}
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
        return _OpenFile(self._directory, path, partition_values, schema)


def _matching(values: dict[str, pa.Array], key: dict[str, Any]) -> pa.Array:
    mask = pa.repeat(True, len(next(iter(values.values()))))
    for column, value in key.items():
        mask = pc.and_(mask, pc.is_null(values[column]) if value is None
                       else pc.equal(values[column], pa.scalar(value, values[column].type)))
    return mask


# Decoded rows a task holds before its files write them as row groups. Large enough for row
# groups a reader skips and decodes well; small enough that the buffers are reused (TaskFiles).
ROW_GROUP_BYTES = 32 << 20


# Files a task keeps open (a file handle each, against the process's limit, often 1,024): a task
# whose rows have more partition values closes them all and opens new ones, so a value may get
# several files, as it would from several tasks.
MAX_OPEN_FILES = 100


class _OpenFile:
    """One Parquet file being written, and the Delta statistics of what it holds so far."""

    def __init__(self, files: TableFiles, path: str, partition_values: dict[str, str | None],
                 schema: pa.Schema) -> None:
        import pyarrow.parquet as pq

        self.path, self.partition_values = path, partition_values
        self._files = files
        self._sink = self._files.open_output(path)
        self.writer = pq.ParquetWriter(self._sink, schema, compression="snappy")
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
        self._sink.close()
        return WrittenFile(self.path, self._files.size(self.path), self.partition_values,
                           int(time.time() * 1000), self.stats.to_json(), self.stats.rows)

    def abandon(self) -> None:
        """Close after a failure: what was written stays, named by no commit."""
        self.writer.close()
        self._sink.close()

    def flush(self) -> None:
        if not self.pending:
            return
        group = pa.Table.from_batches(self.pending)
        self.writer.write_table(group, row_group_size=group.num_rows)
        self.stats.add(group)
        self.pending, self.pending_bytes = [], 0


def _partition_text(value: Any) -> str | None:
    """A partition value as Delta writes it in ``partitionValues``: Spark writes an empty string
    and Hive's null marker as null (both read back as null from its table)."""
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
