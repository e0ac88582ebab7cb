"""What a Delta table holds of a round's sequences, as Arrow on the driver: the keys acks are
built from."""

from __future__ import annotations

from typing import TYPE_CHECKING

from js_etl.delta.table import DeltaTarget
from js_etl.schema import ACK_KEY_COLUMNS

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession


def range_keys(spark: SparkSession, table: DeltaTarget, stream: str, first: int, last: int, *,
               with_error: bool = False) -> pa.Table | None:
    """``(seq, num_delivered, consumer_seq[, error])`` of the rows ``table`` holds for
    ``stream`` in ``first..last``, as Arrow on the driver; None when no file can hold one.

    Read by ``deltalake`` on the driver from the files the log names where those are the rows
    (:meth:`TableView.reads_files_as_rows`: reader protocol 1, no key column a partition
    column), else through Delta by Spark, which plans the scan with Delta's data skipping
    (``inputFiles``) and reads. Either way the files are chosen by their ``seq`` statistics, so
    a round's range that no file holds yet, the common case, costs no Spark job: on small rounds
    those Spark reads were a large share of a round (docs/design/driver-reads.md). The answer is
    the log as read at the call's start (Spark's ``inputFiles()`` answered for the log at its
    end): either way a commit of another writer after that moment is not seen, and the check is
    not atomic with the round's write (a commit between the two is possible)."""
    from pyspark.sql import functions as F

    columns = _key_columns(with_error)
    exists, view = table.exists_with_view(spark)
    if not exists:
        return None
    if view is not None and view.reads_files_as_rows(("stream", *columns)):
        return view.keys(stream, first, last, columns)
    rows = table.read(spark).where((F.col("stream") == stream)
                                   & F.col("seq").between(first, last))
    return rows.select(*columns).toArrow() if rows.inputFiles() else None


def no_keys(*, with_error: bool = False) -> pa.Table:
    """An empty table of :func:`range_keys`' columns."""
    import pyarrow as pa

    return pa.table({c: pa.array([], pa.string() if c == "error" else pa.int64())
                     for c in _key_columns(with_error)})


def _key_columns(with_error: bool) -> tuple[str, ...]:
    """The keys an ack is built from, and a dead letter's reason for its ``+TERM``."""
    return (*ACK_KEY_COLUMNS, "error") if with_error else ACK_KEY_COLUMNS


def keys_of(keys: pa.Table | None, seqs: pa.Array | pa.ChunkedArray, *,
            with_error: bool = False) -> pa.Table:
    """The rows of ``keys`` whose seq is one of ``seqs`` (no rows for None)."""
    import pyarrow.compute as pc

    if keys is None:
        return no_keys(with_error=with_error)
    return keys.filter(pc.is_in(keys.column("seq"), value_set=seqs))
