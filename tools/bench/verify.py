"""Checks that make a leg "verified": its table holds exactly the published messages once (read
back with Spark, or with ``deltalake`` when Spark is unusable), and its consumer ends with
nothing pending or ack-pending. Also the bench's Spark session, which does the reading."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from tools.bench.settings import expected_ids

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from js_etl.config import JobConfig
    from js_etl.jetstream import JetStreamSession


def start_spark(config: JobConfig) -> SparkSession:
    """The bench's local Spark (the js-etl leg runs on it, and tables are read back with it),
    its JVM started as ``js-etl drain`` starts it for ``config``."""
    from js_etl.drain.writers.columnar_plan import expects_columnar
    from js_etl.spark.session import local_session

    return local_session(config.spark.master, "js-etl-bench", config.spark.conf,
                         log_level="ERROR", columnar=expects_columnar(config))


def table_counts(spark: SparkSession, path: str) -> dict[str, int]:
    """Rows, distinct stream sequences and ids, and their ranges, read back with Spark."""
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(path)
    row = df.agg(F.count(F.lit(1)).alias("rows"), F.countDistinct("seq").alias("distinct_seq"),
                 F.min("seq").alias("min_seq"), F.max("seq").alias("max_seq"),
                 F.countDistinct("id").alias("distinct_id"), F.min("id").alias("min_id"),
                 F.max("id").alias("max_id")).first()
    assert row is not None  # an aggregate without grouping has exactly one row
    return {k: int(v) if v is not None else -1 for k, v in row.asDict().items()}


# Reads a table's (seq, id) with the deltalake package in a child process, prints one JSON line
# and leaves with os._exit: deltalake's process can abort at exit after a read (rc 134,
# docs/reference/jetstream-wire-facts.md §12), so the caller trusts the printed line and ignores
# the exit code.
_DELTALAKE_READER = r"""
import json, os, sys
import pyarrow.compute as pc
from deltalake import DeltaTable
t = DeltaTable(sys.argv[1]).to_pyarrow_table(columns=["seq", "id"])
seq, ids = t.column("seq"), t.column("id")
def value(x):
    x = x.as_py()
    return -1 if x is None else int(x)
print(json.dumps({"rows": t.num_rows,
                  "distinct_seq": value(pc.count_distinct(seq)), "min_seq": value(pc.min(seq)),
                  "max_seq": value(pc.max(seq)), "distinct_id": value(pc.count_distinct(ids)),
                  "min_id": value(pc.min(ids)), "max_id": value(pc.max(ids))}), flush=True)
os._exit(0)
"""


def table_counts_deltalake(path: str, timeout: float = 600) -> dict[str, int]:
    """Like :func:`table_counts`, read with ``deltalake`` in a child process (rc ignored)."""
    proc = subprocess.run([sys.executable, "-c", _DELTALAKE_READER, path], capture_output=True,
                          text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"deltalake reader printed no result (rc {proc.returncode}): "
                           f"{tail[0][:300]}")
    return {k: int(v) for k, v in json.loads(lines[-1]).items()}


def table_problems(counts: dict[str, int], n: int, first_seq: int, last_seq: int) -> list[str]:
    lo, hi = expected_ids(n)
    expected = {"rows": n, "distinct_seq": n, "min_seq": first_seq, "max_seq": last_seq,
                "distinct_id": n, "min_id": lo, "max_id": hi}
    return [f"table {k} {counts.get(k)} != {v}" for k, v in expected.items()
            if counts.get(k) != v]


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
