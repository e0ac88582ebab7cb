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


# The object store's clients giving up, as they word it (seen through tools/fault_proxy.py).
OBSTORE_503 = (
    "Generic S3 error: Error performing GET http://127.0.0.1:46459/b/events/_js_etl/c1.lock in "
    "5.04s, after 10 retries, max_retries: 10, retry_timeout: 180s  - Server returned non-2xx "
    'status code: 503 Service Unavailable: <?xml version="1.0" encoding="UTF-8"?>\n'
    "<Error><Code>SlowDown</Code></Error>\n\nDebug source:\nGeneric {\n    store: \"S3\",\n}")
DELTALAKE_RESET = (
    "Generic S3 error\n          \x1b[31m↳\x1b[0m Error performing PUT "
    "http://127.0.0.1:1/b/t/_delta_log/00000000000000000001.json in 708µs - HTTP error\n"
    "           \x1b[31m↳\x1b[0m error sending request\n")
S3A_503 = PY4J_TEXT + (
    "Caused by: software.amazon.awssdk.services.s3.model.S3Exception: SlowDown (Service: S3, "
    "Status Code: 503, Request ID: r1) (SDK Attempt Count: 6)\n\tat software.amazon.X(X.java:1)\n")
EXECUTOR_503 = (
    "An error occurred while calling o120.collect.\n: org.apache.spark.SparkException: Job "
    "aborted\nTraceback (most recent call last):\n  File \"files.py\", line 177, in close\n"
    "OSError: " + OBSTORE_503.replace("GET", "PUT").split("\n\n")[0]
    + "\n\tat org.apache.spark.api.python.BasePythonRunner(PythonRunner.scala:1)\n")


@pytest.mark.parametrize("text, said", [
    (OBSTORE_503, "Generic S3 error: Error performing GET http://127.0.0.1:46459/b/events/_js_etl/"
                  "c1.lock in 5.04s, after 10 retries, max_retries: 10, retry_timeout: 180s  - "
                  "Server returned non-2xx status code: 503 Service Unavailable"),
    (DELTALAKE_RESET, "Generic S3 error Error performing PUT http://127.0.0.1:1/b/t/_delta_log/"
                      "00000000000000000001.json in 708µs - HTTP error error sending request"),
    (S3A_503, "S3Exception: SlowDown (Service: S3, Status Code: 503, Request ID: r1) (SDK "
              "Attempt Count: 6)"),
    (EXECUTOR_503, "Generic S3 error: Error performing PUT http://127.0.0.1:46459/b/events/"
                   "_js_etl/c1.lock in 5.04s, after 10 retries, max_retries: 10, retry_timeout: "
                   "180s  - Server returned non-2xx status code: 503 Service Unavailable"),
])
def test_a_store_that_failed_or_was_not_reached_is_transient_in_one_line(text, said):
    reason, code = failure_reason(RuntimeError(text))
    assert code == 75
    assert reason == (f"the object store failed a request after its client's retries ({said}); "
                      "nothing the run did not commit was acked, the next run takes it up again")


def test_a_store_refusing_a_request_is_not_transient():
    forbidden = OBSTORE_503.replace("503 Service Unavailable", "403 Forbidden")
    assert failure_reason(RuntimeError(forbidden))[1] == 1
