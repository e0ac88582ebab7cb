"""What a failure says in one line (js_etl.spark.failures) and which table a job cannot append
to (js_etl.delta.table.schema_problem): pure logic on texts and Spark types, no JVM."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    DataType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from js_etl.delta.rules import TableShape, schema_problem
from js_etl.spark.failures import failure_reason, java_root_cause

PY4J_TEXT = """An error occurred while calling o53.getFileSystem.
: org.apache.hadoop.fs.UnsupportedFileSystemException: No FileSystem for scheme "s3a"
\tat org.apache.hadoop.fs.FileSystem.getFileSystemClass(FileSystem.java:3443)
\tat py4j.GatewayConnection.run(GatewayConnection.java:238)
"""
CAUSED_TEXT = PY4J_TEXT + """Caused by: java.lang.ClassNotFoundException: org.apache.hadoop.S3A
\tat java.base/java.net.URLClassLoader.findClass(URLClassLoader.java:445)
"""


class Py4JJavaError(Exception):  # the name py4j gives it; only str() and the name are read
    pass


def test_a_java_failure_is_its_root_cause_in_one_line():
    no_s3a = 'UnsupportedFileSystemException: No FileSystem for scheme "s3a"'
    assert java_root_cause(PY4J_TEXT) == no_s3a
    assert java_root_cause(CAUSED_TEXT) == "ClassNotFoundException: org.apache.hadoop.S3A"
    assert java_root_cause("no java here") is None
    reason, code = failure_reason(Py4JJavaError(PY4J_TEXT))
    assert (reason, code) == (no_s3a, 1)


BIGINT, INT, STRING, DATE = LongType(), IntegerType(), StringType(), DateType()


def struct(*fields: tuple[str, DataType]) -> StructType:
    return StructType([StructField(name, kind) for name, kind in fields])


def shape(*fields: tuple[str, DataType], partitions: tuple[str, ...] = (),
          **conf: str) -> TableShape:
    return TableShape(1, 2, partitions, struct(*fields), conf)


@pytest.mark.parametrize("table, written, merge, problem", [
    ([("seq", BIGINT), ("id", STRING)], [("seq", BIGINT), ("id", BIGINT)], False,
     "table t has column id STRING, but this job writes it as BIGINT: make decode.schema declare "
     "id STRING, or write into a new table"),
    ([("seq", BIGINT), ("id", BIGINT)], [("seq", BIGINT), ("id", INT)], True,
     "table t has column id BIGINT, but this job writes it as INT: make decode.schema declare id "
     "BIGINT, or write into a new table"),
    ([("seq", BIGINT), ("ID", BIGINT)], [("seq", BIGINT), ("id", BIGINT)], False,
     None),  # Delta ignores case
    ([("seq", BIGINT), ("id", BIGINT), ("extra", STRING)], [("seq", BIGINT), ("id", BIGINT)],
     False, None),
    ([("seq", BIGINT)], [("seq", BIGINT), ("id", BIGINT)], False,
     "table t has no column id: set decode.merge_schema to true to add it, remove it from "
     "decode.schema, or write into a new table"),
    ([("seq", BIGINT)], [("seq", BIGINT), ("id", BIGINT)], True, None),
    ([("s", struct(("a", INT)))], [("s", struct(("a", INT), ("b", STRING)))], True,
     None),  # nested fields: Delta merges them itself
])
def test_what_delta_would_refuse_is_named_before_the_fetch(table, written, merge, problem):
    assert schema_problem("t", shape(*table), struct(*written), [],
                          merge_schema=merge) == problem


def test_type_widening_tables_and_partitioning():
    widening = shape(("seq", BIGINT), ("id", INT), **{"delta.enableTypeWidening": "true"})
    assert schema_problem("t", widening, struct(("seq", BIGINT), ("id", BIGINT)), [],
                          merge_schema=True) is None
    parted = shape(("seq", BIGINT), ("day", DATE), partitions=("day",))
    written = struct(("seq", BIGINT), ("day", DATE))
    assert schema_problem("t", parted, written, ["day"], merge_schema=False) is None
    assert schema_problem("t", parted, written, ["seq"], merge_schema=False) == (
        "table t is partitioned by ['day'], this job by ['seq']: make target.partition_by match "
        "the table, or write into a new table")
