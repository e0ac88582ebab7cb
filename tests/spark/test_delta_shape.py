"""DeltaTarget.shape reads a table's protocol, partitioning, schema and properties with
``deltalake`` where it can (js_etl/spark/delta.py); the columnar writer is chosen on it
(columnar.table_problem), so it must see every rule Delta's own snapshot shows."""

from __future__ import annotations

from typing import Any

import pytest

from js_etl.spark import columnar
from js_etl.spark.delta import DeltaTarget, _deltalake_table

pytestmark = pytest.mark.slow

COLUMNS = "id BIGINT, kind STRING, headers MAP<STRING, ARRAY<STRING>>, ts TIMESTAMP, d DATE"
# (name, CREATE TABLE body after the path, what the columnar writer must make of it)
TABLES = [
    ("plain", f"({COLUMNS}) USING delta PARTITIONED BY (d)", None),
    ("not_null", "(id BIGINT NOT NULL, kind STRING COMMENT 'a kind') USING delta",
     "NOT NULL"),
    ("comment", "(id BIGINT COMMENT 'the id', kind STRING) USING delta", None),
    ("generated", "(ts TIMESTAMP, d DATE GENERATED ALWAYS AS (CAST(ts AS DATE))) USING delta",
     "protocol"),
    ("identity", "(id BIGINT GENERATED ALWAYS AS IDENTITY, kind STRING) USING delta",
     "protocol"),
    ("default", "(id BIGINT, kind STRING DEFAULT 'x') USING delta "
     "TBLPROPERTIES ('delta.feature.allowColumnDefaults' = 'supported')", "protocol"),
    ("varchar", "(id BIGINT, code VARCHAR(5)) USING delta", "column rules"),
    ("column_mapping", f"({COLUMNS}) USING delta TBLPROPERTIES ("
     "'delta.columnMapping.mode' = 'name', 'delta.minReaderVersion' = '2', "
     "'delta.minWriterVersion' = '5')", "protocol"),
    ("deletion_vectors", f"({COLUMNS}) USING delta TBLPROPERTIES "
     "('delta.enableDeletionVectors' = 'true')", "protocol"),
    ("append_only", "(id BIGINT) USING delta TBLPROPERTIES ('delta.appendOnly' = 'true')",
     None),
]


def problem(shape: Any) -> str | None:
    """The columnar writer's verdict on the table, for rows of its own columns."""
    return columnar.table_problem(shape, shape.schema, list(shape.partition_columns))


@pytest.mark.parametrize(("name", "body", "expected"), TABLES, ids=[t[0] for t in TABLES])
def test_deltalakes_view_of_a_table_is_deltas(name, body, expected, spark, tmp_path):
    path = tmp_path / name
    spark.sql(f"CREATE TABLE delta.`{path}` {body}")
    if name == "generated":  # a CHECK constraint too, on the same table
        spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT recent CHECK (d > '2020-01-01')")
    target = DeltaTarget(path=str(path))

    shape, delta = target.shape(spark), target._snapshot_shape(spark)

    assert shape == delta
    found = problem(shape)
    assert (found is None) if expected is None else (expected in (found or ""))
    # deltalake 1.6.6 reads every one of these (protocols up to reader 3 / writer 7): the
    # comparison above was of its view, not of Delta's with itself.
    assert _deltalake_table(str(path)) is not None
