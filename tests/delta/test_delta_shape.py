"""DeltaTarget.shape reads a table's protocol, partitioning, schema and properties with
``deltalake`` where it can (js_etl/delta/table.py); the columnar writer is chosen on it
(rules.table_problem), so it must see every rule Delta's own snapshot shows. DeltaTarget.exists
takes deltalake's yes the same way, and must answer as Delta does."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from js_etl.delta import rules
from js_etl.delta.table import DeltaTarget, _deltalake_table

pytestmark = pytest.mark.slow

COLUMNS = "id BIGINT, kind STRING, headers MAP<STRING, ARRAY<STRING>>, ts TIMESTAMP, d DATE"
# (name, CREATE TABLE body after the path, what the columnar writer must make of it)
TABLES = [
    ("plain", f"({COLUMNS}) USING delta PARTITIONED BY (d)", None),
    ("not_null", "(id BIGINT NOT NULL, kind STRING COMMENT 'a kind') USING delta",
     "NOT NULL"),
    ("comment", "(id BIGINT COMMENT 'the id', kind STRING) USING delta", None),
    ("generated", "(ts TIMESTAMP, d DATE GENERATED ALWAYS AS (CAST(ts AS DATE))) USING delta",
     "checkConstraints, generatedColumns"),
    ("identity", "(id BIGINT GENERATED ALWAYS AS IDENTITY, kind STRING) USING delta",
     "protocol"),
    ("default", "(id BIGINT, kind STRING DEFAULT 'x') USING delta "
     "TBLPROPERTIES ('delta.feature.allowColumnDefaults' = 'supported')", "protocol"),
    ("varchar", "(id BIGINT, code VARCHAR(5)) USING delta", "column rules"),
    ("column_mapping", f"({COLUMNS}) USING delta TBLPROPERTIES ("
     "'delta.columnMapping.mode' = 'name', 'delta.minReaderVersion' = '2', "
     "'delta.minWriterVersion' = '5')", "protocol"),
    ("deletion_vectors", f"({COLUMNS}) USING delta TBLPROPERTIES "
     "('delta.enableDeletionVectors' = 'true')", None),
    ("change_data_feed", f"({COLUMNS}) USING delta TBLPROPERTIES "
     "('delta.enableChangeDataFeed' = 'true')", None),
    ("row_tracking", "(id BIGINT) USING delta TBLPROPERTIES ('delta.enableRowTracking' = 'true')",
     "domainMetadata, rowTracking"),
    ("type_widening", "(id INT) USING delta TBLPROPERTIES ('delta.enableTypeWidening' = 'true')",
     "typeWidening"),
    ("append_only", "(id BIGINT) USING delta TBLPROPERTIES ('delta.appendOnly' = 'true')",
     None),
    ("timestamp_ntz", "(id BIGINT, at TIMESTAMP_NTZ) USING delta", None),
]


def problem(shape: Any) -> str | None:
    """The columnar writer's verdict on the table, for rows of its own columns."""
    return rules.table_problem(shape, shape.schema, list(shape.partition_columns))


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


def test_exists_answers_as_delta_does_and_takes_a_yes_from_deltalake(spark, tmp_path,
                                                                     monkeypatch):
    from delta.tables import DeltaTable

    spark.sql(f"CREATE TABLE delta.`{tmp_path / 'table'}` (id BIGINT, d DATE) USING delta "
              "PARTITIONED BY (d)")
    spark.sql(f"INSERT INTO delta.`{tmp_path / 'table'}` VALUES (1, DATE'2026-11-25')")
    spark.sql(f"CREATE TABLE delta.`{tmp_path / 'a%20b'}` (id BIGINT) USING delta")
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "x.parquet").write_bytes(b"PAR1")
    (tmp_path / "empty_log" / "_delta_log").mkdir(parents=True)
    # deltalake's is_deltatable says yes to this one (a break-it review); Delta says no.
    (tmp_path / "crc_only" / "_delta_log").mkdir(parents=True)
    (tmp_path / "crc_only" / "_delta_log" / "00000000000000000000.crc").write_text("{}")
    (tmp_path / "a_file").write_text("not a table")
    cases = {  # path: Delta's answer, and whether deltalake may give it without Delta
        "table": (True, True), "missing": (False, False),
        "table/d=2026-11-25": (True, False),  # Delta finds the table above a partition
        "stray": (False, False), "empty_log": (False, False), "crc_only": (False, False),
        "a_file": (False, False), "a%20b": (True, False), "a b": (False, False)}
    asked = []
    spark_answer = DeltaTable.isDeltaTable

    def is_delta_table(session: Any, path: str) -> bool:
        asked.append(path)
        return bool(spark_answer(session, path))

    monkeypatch.setattr(DeltaTable, "isDeltaTable", is_delta_table)
    for name, (expected, from_deltalake) in cases.items():
        path = str(tmp_path / name)
        asked.clear()
        assert spark_answer(spark, path) is expected, name  # the cases say what Delta says
        assert DeltaTarget(path=path).exists(spark) is expected, name
        assert (asked == []) is from_deltalake, name


def test_a_path_is_the_directory_spark_reads_whatever_the_default_file_system(spark,
                                                                              tmp_path):
    """A scheme-less path is Hadoop's to qualify: on a cluster whose default file system is
    HDFS it is not the driver's disk, and neither the lock, the columnar writer nor deltalake
    may treat it as such (viewfs with a local fallback stands in for hdfs:// here)."""
    from deltalake import write_deltalake

    local = tmp_path / "table"
    write_deltalake(str(local), pa.table({"id": pa.array([1], pa.int64())}))
    target = DeltaTarget(path=str(local))
    assert target.location(spark) == f"file:{local}"
    assert rules.location_problem(target.location(spark)) is None
    assert target.exists(spark)

    conf = spark.sparkContext._jsc.hadoopConfiguration()
    default = conf.get("fs.defaultFS")
    elsewhere = tmp_path / "default_fs"
    elsewhere.mkdir()
    conf.set("fs.viewfs.mounttable.jsetltest.linkFallback", f"file://{elsewhere}")
    conf.set("fs.defaultFS", "viewfs://jsetltest/")
    try:
        location = target.location(spark)
        assert location == f"viewfs://jsetltest{local}"
        assert "nor on S3" in (rules.location_problem(location) or "")
        assert _deltalake_table(location) is None
        assert not target.exists(spark)  # Spark reads the default file system: no table there
    finally:
        conf.set("fs.defaultFS", default)
        conf.unset("fs.viewfs.mounttable.jsetltest.linkFallback")
    assert target.location(spark) == f"file:{local}"


@pytest.mark.parametrize("directory", ["t", "t%41"])  # "%": deltalake does not open it: Spark's
def test_a_table_without_the_key_columns_is_refused_before_anything_is_fetched(spark, tmp_path,
                                                                             directory):
    """check_usable reads the schema with deltalake where it opens the table, else with Spark;
    both must refuse a table the fence and the acks cannot read (README: Troubleshooting)."""
    from js_etl.errors import TerminalError

    bad, good = tmp_path / "bad" / directory, tmp_path / "good" / directory
    spark.sql(f"CREATE TABLE delta.`{bad}` (stream STRING, SEQ STRING, num_delivered BIGINT) "
              "USING delta")
    spark.sql(f"CREATE TABLE delta.`{good}` (STREAM STRING, seq BIGINT, consumer_seq BIGINT, "
              "num_delivered BIGINT, id BIGINT) USING delta")
    assert (_deltalake_table(str(bad)) is None) is ("%" in directory)
    with pytest.raises(TerminalError, match=r"is not a js-etl table: it needs the columns "
                                            r"seq bigint, consumer_seq bigint \(the fence"):
        DeltaTarget(str(bad)).check_usable(spark)
    DeltaTarget(str(good)).check_usable(spark)  # names match without case, as Spark reads them
