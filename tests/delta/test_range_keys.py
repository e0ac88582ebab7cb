"""What a table holds for a range of sequences (delta.range_keys), the read every ack is built
from: by ``deltalake`` from the files the log names where those are the table's rows, else by
Spark through Delta. On every table shape below the answer must be Spark's own read of the
snapshot, and the files are read directly only where that is safe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from js_etl.delta.keys import range_keys
from js_etl.delta.table import DeltaTarget
from js_etl.schema import ACK_KEY_COLUMNS

STREAM = "S"


def create(spark: Any, path: Path, *, seq_name: str = "seq", partition_by: tuple[str, ...] = (),
           properties: str = "") -> None:
    """Three files holding seqs 1..10, 11..20, 21..30 of the stream (num_delivered 1,
    consumer_seq 1000 + seq, an error for the odd ones), another stream's 12..14 in them."""
    rows = [(STREAM, s, 1, 1000 + s, f"e{s}" if s % 2 else None) for s in range(1, 31)]
    rows += [("other", s, 1, s, None) for s in range(12, 15)]
    columns = (f"stream STRING, {seq_name} BIGINT, num_delivered BIGINT, consumer_seq BIGINT, "
               "error STRING")
    if partition_by:
        # deltalake's writer, which leaves partition columns out of the files (Delta 4.4 on
        # Spark writes them in as well).
        import pyarrow as pa
        from deltalake import write_deltalake

        names = [c.split()[0] for c in columns.split(", ")]
        for part in (rows[:10], rows[10:20], rows[20:]):
            write_deltalake(str(path), pa.Table.from_pylist([dict(zip(names, r, strict=True))
                                                            for r in part]),
                            partition_by=list(partition_by), mode="append")
        return
    spark.sql(f"CREATE TABLE delta.`{path}` ({columns}) USING delta "
              + (f"PARTITIONED BY ({', '.join(partition_by)}) " if partition_by else "")
              + (f"TBLPROPERTIES ({properties})" if properties else ""))
    (spark.createDataFrame(rows, columns).repartitionByRange(3, seq_name).write.format("delta")
     .mode("append").save(str(path)))


@pytest.mark.parametrize(("shape", "direct"), [
    ({}, True),
    ({"partition_by": ("stream",)}, False),  # not in deltalake's files
    ({"properties": "'delta.columnMapping.mode'='name', 'delta.minReaderVersion'='2', "
                    "'delta.minWriterVersion'='5'"}, False),  # physical names in the files
    ({"properties": "'delta.enableDeletionVectors'='true'"}, False),  # rows deleted in place
    ({"properties": "'delta.feature.timestampNtz'='supported'"}, True),  # reader 3, plain files
    ({"seq_name": "SEQ"}, False),  # Spark's names match without case, Parquet's do not
])
def test_range_keys_are_what_spark_reads_through_delta(spark, tmp_path, shape, direct):
    path = tmp_path / "t"
    create(spark, path, **shape)
    # On a table with deletion vectors the file stays, its rows 15 and 16 do not.
    spark.sql(f"DELETE FROM delta.`{path}` WHERE seq IN (15, 16)")
    target = DeltaTarget(str(path))
    view = target.exists_with_view(spark)[1]
    assert view is not None
    columns = (*ACK_KEY_COLUMNS, "error")
    through_delta = [tuple(r) for r in spark.read.format("delta").load(str(path)).where(
        f"stream = '{STREAM}'").select(*columns).collect()]

    for first, last, with_error in ((12, 18, True), (1, 30, False)):
        wanted = columns if with_error else ACK_KEY_COLUMNS
        keys = range_keys(spark, target, STREAM, first, last, with_error=with_error)
        assert keys is not None and keys.column_names == list(wanted)
        assert sorted(zip(*(keys.column(c).to_pylist() for c in wanted), strict=True)) == sorted(
            r[:len(wanted)] for r in through_delta if first <= r[0] <= last)
    assert range_keys(spark, target, STREAM, 31, 99) is None  # no file holds a seq there
    assert range_keys(spark, DeltaTarget(str(tmp_path / "none")), STREAM, 1, 9) is None
    assert view.reads_files_as_rows(("stream", *columns)) is direct
