"""Checks that make a leg "verified": its table holds exactly the published messages once (read
back with Spark; with ``deltalake`` for a table on S3, or when Spark is unusable), and its
consumer ends with nothing pending or ack-pending. Also the bench's Spark session, which does
the reading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from js_etl.delta.store import STORE_VARIABLES
from tools.bench.settings import RICH_FILLED, expected_ids

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyspark.sql import SparkSession

    from js_etl.config import JobConfig
    from js_etl.jetstream import JetStreamSession


def start_spark(config: JobConfig, *, object_store: bool = False) -> SparkSession:
    """The bench's local Spark (the js-etl leg runs on it, and tables are read back with it),
    its JVM started as ``js-etl drain`` starts it for ``config``; with S3A also when
    ``object_store`` (the run has S3 tables, which Spark's own writer needs it for)."""
    from js_etl.delta.rules import on_object_store
    from js_etl.drain.writers.columnar_plan import expects_columnar
    from js_etl.spark.session import local_session

    return local_session(config.spark.master, "js-etl-bench", config.spark.conf,
                         log_level="ERROR", columnar=expects_columnar(config),
                         object_store=object_store or on_object_store(config.target))


def table_counts(spark: SparkSession, path: str) -> dict[str, int]:
    """Rows, distinct stream sequences and their range, read back with Spark; and what the
    table's columns allow (:func:`table_problems` says which are required): distinct ids and
    their range where it has an ``id`` column, else the rows with a payload (``data`` of a raw
    table, ``text`` of a text one); the rows whose rich columns are all filled where it has
    them."""
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(path)
    columns = set(df.columns)
    aggs = [F.count(F.lit(1)).alias("rows"), F.countDistinct("seq").alias("distinct_seq"),
            F.min("seq").alias("min_seq"), F.max("seq").alias("max_seq")]
    if "id" in columns:
        aggs += [F.countDistinct("id").alias("distinct_id"), F.min("id").alias("min_id"),
                 F.max("id").alias("max_id")]
    else:
        payload = next((c for c in ("data", "text") if c in columns), None)
        if payload is not None:
            aggs.append(F.count(payload).alias("payload_rows"))
    if {c.split(".")[0] for c in RICH_FILLED} <= columns:
        filled = F.lit(True)
        for column in RICH_FILLED:
            filled = filled & F.col(column).isNotNull()
        aggs.append(F.count(F.when(filled, 1)).alias("filled"))
    row = df.agg(*aggs).first()
    assert row is not None  # an aggregate without grouping has exactly one row
    return {k: int(v) if v is not None else -1 for k, v in row.asDict().items()}


# Reads a table's counts (as table_counts) with the deltalake package in a child process, prints
# one JSON line and leaves with os._exit: deltalake's process can abort at exit after a read
# (rc 134, docs/reference/jetstream-wire-facts.md §12), so the caller trusts the printed line and
# ignores the exit code. An object-store table is read with the AWS_* variables of the child's
# environment as storage options.
_DELTALAKE_READER = r"""
import json, os, sys
import pyarrow.compute as pc
from deltalake import DeltaTable
path, store_variables, rich = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
options = {k: os.environ[k] for k in store_variables if os.environ.get(k)}
table = DeltaTable(path, storage_options=options if "://" in path else None)
names = {field.name for field in table.schema().fields}
payload = "id" if "id" in names else next((c for c in ("data", "text") if c in names), None)
tops = sorted({c.split(".")[0] for c in rich}) if {c.split(".")[0] for c in rich} <= names else []
t = table.to_pyarrow_table(columns=["seq", *([payload] if payload else []), *tops])
def value(x):
    x = x.as_py()
    return -1 if x is None else int(x)
seq = t.column("seq")
counts = {"rows": t.num_rows, "distinct_seq": value(pc.count_distinct(seq)),
          "min_seq": value(pc.min(seq)), "max_seq": value(pc.max(seq))}
if payload == "id":
    ids = t.column("id")
    counts.update(distinct_id=value(pc.count_distinct(ids)), min_id=value(pc.min(ids)),
                  max_id=value(pc.max(ids)))
elif payload is not None:
    counts["payload_rows"] = value(pc.count(t.column(payload)))
if tops:
    filled = None
    for column in rich:
        top, *inner = column.split(".")
        valid = pc.is_valid(pc.struct_field(t.column(top), inner) if inner else t.column(top))
        filled = valid if filled is None else pc.and_(filled, valid)
    counts["filled"] = value(pc.sum(filled)) if t.num_rows else 0
print(json.dumps(counts), flush=True)
os._exit(0)
"""


def table_counts_deltalake(path: str, timeout: float = 600,
                           storage: Mapping[str, str] | None = None) -> dict[str, int]:
    """Like :func:`table_counts`, read with ``deltalake`` in a child process (rc ignored); an
    ``s3://`` table with ``storage`` (the AWS_* variables; default: this process's)."""
    env = {**os.environ, **(storage or {})}
    proc = subprocess.run([sys.executable, "-c", _DELTALAKE_READER, path,
                           json.dumps(STORE_VARIABLES), json.dumps(RICH_FILLED)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"deltalake reader printed no result (rc {proc.returncode}): "
                           f"{tail[0][:300]}")
    return {k: int(v) for k, v in json.loads(lines[-1]).items()}


def table_problems(counts: dict[str, int], n: int, first_seq: int, last_seq: int, *,
                   ids: bool = True, filled: bool = False) -> list[str]:
    """What makes a table not the published set: every stream sequence of the range once; with
    ``ids`` (a decoded JSON table) ids 0..n-1 once each, else (a raw or text table, the payload
    in ``data`` or ``text``) a payload on every row; with ``filled`` (the rich schema) every row's
    rich columns filled."""
    lo, hi = expected_ids(n)
    expected = {"rows": n, "distinct_seq": n, "min_seq": first_seq, "max_seq": last_seq}
    if ids:
        expected.update(distinct_id=n, min_id=lo, max_id=hi)
    elif "payload_rows" in counts:
        expected["payload_rows"] = n
    if filled:
        expected["filled"] = n
    return [f"table {k} {counts[k]} != {v}" if k in counts else
            f"table has no column for {k}" for k, v in expected.items() if counts.get(k) != v]


def consumer_problems(js: JetStreamSession, stream: str, durable: str
                      ) -> tuple[list[str], dict[str, int]]:
    """A drained leg's consumer must end with nothing pending and nothing ack-pending
    (``num_redelivered`` is reported, not judged)."""
    deadline = time.monotonic() + 10  # acks are applied asynchronously after the flush
    while True:
        info = js.consumer_info(stream, durable)
        if (info.num_ack_pending == 0 and info.num_pending == 0) or \
                time.monotonic() > deadline:
            break
        time.sleep(0.05)
    state = {"num_pending": info.num_pending, "num_ack_pending": info.num_ack_pending,
             "num_redelivered": info.num_redelivered}
    problems = [f"consumer {k} {v}" for k, v in state.items()
                if k != "num_redelivered" and v != 0]
    return problems, state
