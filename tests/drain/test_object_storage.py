"""Tables on a real S3-compatible store (SeaweedFS, started by the tests: tools/object_store.py):
the drain's guarantees where its table lives in a bucket, reached only through the AWS_*
variables of the process (the ``s3`` fixture: a bucket per test)."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest
from drains import (
    assert_exactly_once,
    assert_no_process_left,
    config_for,
    drain_process,
    events,
    setup_stream,
    table_seqs,
)
from streams import publish_and_wait

from js_etl.delta.store import TableFiles
from js_etl.drain.lock import TableLock
from js_etl.drain.run import run_drain
from js_etl.errors import ConfigError, RunRefusedError
from js_etl.jetstream import ConsumerConfig
from js_etl.spark.failures import failure_reason
from js_etl.spark.session import configure_s3a

pytestmark = pytest.mark.slow


def test_a_drain_into_an_s3_table_takes_every_message_once_on_the_columnar_writer(
        spark, js, names, nats_server, s3):
    messages, good, bad = events(names, 700, poison_every=97)
    setup_stream(js, names, messages)
    table = f"{s3}/events"

    report = run_drain(spark, config_for(names, nats_server.url, table))

    assert report.writer == "columnar", report.writer_note
    assert_exactly_once(spark, js, names, table, good, bad)
    # Every file the log names is in the bucket, under the table (no local directory used).
    from deltalake import DeltaTable

    files = TableFiles(table)
    uris = DeltaTable(table).file_uris()
    assert uris and all(uri.startswith(table + "/") for uri in uris)
    assert all(files.size(uri.removeprefix(table + "/")) > 0 for uri in uris)
    assert files.names("_js_etl") == []  # the run's lock is gone with the run


# A kill after the fetch leaves nothing written, whichever writer: it runs on one. A kill in
# the middle of the acks finds the table as a kill after the commit does: what differs is on
# the NATS side, where tests/drain/test_faults.py kills mid-ack.
@pytest.mark.parametrize("fault, writer", [
    ("kill_after_fetch", "auto"),
    ("kill_after_commit", "auto"), ("kill_after_commit", "spark"),
])
def test_a_drain_killed_at_each_point_of_an_s3_round_recovers_exactly_once(
        fault, writer, spark, js, names, nats_server, s3):
    """SIGKILL of a real ``js-etl drain`` after the fetch and after the commit of an S3 table's
    round (the latter on either writer); the next run leaves every message in it once."""
    messages, good, bad = events(names, 600, poison_every=97)
    setup_stream(js, names, messages)
    table = f"{s3}/events"
    marker = uuid.uuid4().hex

    proc = drain_process(names, nats_server.url, table, fault, marker, f"target.writer={writer}")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == -9, f"not killed at {fault}: {proc.returncode}: {err[-800:]}"
    assert_no_process_left(marker)

    report = run_drain(spark, config_for(names, nats_server.url, table,
                                         f"target.writer={writer}"))

    if report.messages_written:  # a run with nothing left to write chooses no writer
        assert report.writer == ("spark" if writer == "spark" else "columnar")
    if fault == "kill_after_fetch":
        assert report.released_at_start > 0
    else:
        assert report.reacked_at_start > 0  # committed, not acked: the fence acks it
    assert_exactly_once(spark, js, names, table, good, bad)


@pytest.mark.parametrize("fmt", ["raw", "text"])
def test_raw_and_text_drains_into_s3_take_the_columnar_writer(fmt, spark, js, names,
                                                              nats_server, s3):
    messages, good, _ = events(names, 300)
    setup_stream(js, names, messages)
    table = f"{s3}/{fmt}"

    report = run_drain(spark, config_for(names, nats_server.url, table, f"decode.format={fmt}",
                                         "decode.schema=null"))

    assert (report.writer, report.writer_note) == ("columnar", None)
    assert_exactly_once(spark, js, names, table, good, [])


def test_two_consumers_draining_into_one_new_s3_table_at_once_lose_no_commit(
        spark, js, names, nats_server, s3):
    """Two runs (two durable consumers on disjoint subjects) create and append to one new S3
    table at the same moment: deltalake's conditional PUT makes one of each pair of concurrent
    commits lose and retry, so both runs' rows are there once."""
    js.run(js.admin.add_stream(names.stream, [names.subject]))
    for consumer, subject in (("left", "l"), ("right", "r")):
        js.run(js.admin.create_consumer(names.stream, ConsumerConfig(
            durable_name=consumer, filter_subjects=(f"{names.prefix}.{subject}",),
            ack_wait=300)))
    publish_and_wait(js, names, [(f"{names.prefix}.{'l' if i % 2 else 'r'}",
                                  json.dumps({"id": i}).encode()) for i in range(800)])
    table = f"{s3}/shared"
    start = threading.Barrier(2)
    reports: dict[str, Any] = {}

    def drain(consumer: str) -> None:
        config = config_for(names, nats_server.url, table, f"source.consumer={consumer}",
                            f"target.dead_letter_path={table}_{consumer}_dead", "fetch.batch=50")
        start.wait()
        reports[consumer] = run_drain(spark, config)

    threads = [threading.Thread(target=drain, args=(c,)) for c in ("left", "right")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert set(reports) == {"left", "right"}, "a run failed: see its log"
    assert table_seqs(spark, names, table) == list(range(1, 801))
    for consumer in ("left", "right"):
        info = js.consumer_info(names.stream, consumer)
        assert (info.num_pending, info.num_ack_pending) == (0, 0)


def test_the_lock_on_s3_lets_one_run_in_and_refuses_the_second(spark, s3):
    """The run's lock on an object store is a PUT with If-None-Match: a second run of the
    consumer finds it held and is refused; once released it can be taken."""
    location = f"{s3}/locked"
    first = TableLock(spark, location, "c1", "run-1").acquire()
    try:
        with pytest.raises(RunRefusedError, match="another run holds this consumer"):
            TableLock(spark, location, "c1", "run-2").acquire()
        assert TableFiles(location).names("_js_etl") == ["c1.lock"]
    finally:
        first.release()
    with TableLock(spark, location, "c1", "run-3"):
        assert b"run-3" in (TableFiles(location).read("_js_etl/c1.lock") or b"")


def test_two_commits_made_on_one_snapshot_of_an_s3_table_both_land(s3):
    """What makes several writers of one S3 table safe: two deltalake writers that read the same
    version both commit the next one; the store refuses the second PUT of that log file
    (If-None-Match), and the loser commits at the version after, instead of replacing it."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    table = f"{s3}/raced"
    write_deltalake(table, pa.table({"n": [0]}))
    first, second = DeltaTable(table), DeltaTable(table)  # both at version 0

    write_deltalake(first, pa.table({"n": [1]}), mode="append")
    write_deltalake(second, pa.table({"n": [2]}), mode="append")

    latest = DeltaTable(table)
    assert latest.version() == 2
    assert sorted(latest.to_pyarrow_table().column("n").to_pylist()) == [0, 1, 2]


def test_spark_writer_drains_into_an_s3_table_through_s3a(spark, js, names, nats_server, s3):
    """``target.writer=spark`` on an S3 table: Spark's Delta writer through Hadoop's S3A,
    configured from the same AWS_* variables; the tables read back by deltalake."""
    messages, good, bad = events(names, 300, poison_every=50)
    setup_stream(js, names, messages)
    table = f"{s3}/events"

    report = run_drain(spark, config_for(names, nats_server.url, table, "target.writer=spark"))

    assert report.writer == "spark"
    assert_exactly_once(spark, js, names, table, good, bad)


def test_a_columnar_round_holding_rows_an_s3_table_has_is_appended_by_spark(
        spark, js, names, nats_server, s3):
    """A second consumer of the stream into the same S3 table fetches sequences the table
    holds: they are acked, not written again; the rest of its rounds is read back from the
    task files in the bucket by Spark (S3A), appended, and those files removed."""
    messages = [(f"{names.prefix}.e", json.dumps({"id": i}).encode()) for i in range(400)]
    setup_stream(js, names, messages)
    table = f"{s3}/events"
    first = run_drain(spark, config_for(names, nats_server.url, table, "run.max_messages=150"))
    assert (first.writer, first.messages_written) == ("columnar", 150)
    js.run(js.admin.create_consumer(names.stream, ConsumerConfig(durable_name="second",
                                                                 ack_wait=300)))

    second = run_drain(spark, config_for(names, nats_server.url, table,
                                         "source.consumer=second"))

    assert (second.messages_written, second.already_committed) == (250, 150)
    assert table_seqs(spark, names, table) == list(range(1, 401))
    from deltalake import DeltaTable

    committed = {uri.rsplit("/", 1)[-1] for uri in DeltaTable(table).file_uris()}
    in_bucket = {name for name in TableFiles(table).names("") if name.endswith(".parquet")}
    leftovers = {name for name in in_bucket - committed if second.run_id in name}
    assert not leftovers, "the second run's task files were read into Spark's append"


class _RacingLines:
    """A ``java.util.Iterator`` of a commit's lines (py4j callback) that, when Delta's log
    store asks for the first line, has another writer create the same log file: exactly
    between the store's look for the file and its PUT."""

    class Java:
        implements = ("java.util.Iterator",)

    def __init__(self, race: Any, lines: list[str]) -> None:
        self._race, self._lines = race, list(lines)

    def hasNext(self) -> bool:
        return bool(self._lines)

    def next(self) -> str:
        if self._race is not None:
            self._race, race = None, self._race
            race()
        return self._lines.pop(0)


@pytest.mark.parametrize("store", ["io.jsetl.delta.ConditionalPutLogStore",
                                   "io.delta.storage.S3SingleDriverLogStore"])
def test_sparks_commit_to_s3_never_replaces_another_writers_commit(store, spark, s3):
    """Another process commits version 0 while Spark's log store is writing it. js-etl's log
    store PUTs with If-None-Match: the store refuses Spark's write (Delta then commits at the
    next version) and the other commit stays. Delta's default S3 log store, tried the same way,
    replaces the other commit: that is why a session with it is refused on S3."""
    from pyspark.java_gateway import ensure_callback_server_started

    ensure_callback_server_started(spark.sparkContext._gateway)
    jvm, conf = spark._jvm, spark._jsc.hadoopConfiguration()
    configure_s3a(spark)
    location = f"{s3.replace('s3://', 's3a://')}/raced_by_spark"
    version = f"_delta_log/{0:020d}.json"
    files = TableFiles(location.replace("s3a://", "s3://"))
    log_store = getattr(jvm, store)(conf)
    lines = _RacingLines(lambda: files.create(version, b'{"other":1}\n'), ['{"spark":1}'])

    path = jvm.org.apache.hadoop.fs.Path(f"{location}/{version}")
    if store.endswith("ConditionalPutLogStore"):
        with pytest.raises(Exception, match="FileAlreadyExistsException"):
            log_store.write(path, lines, False, conf)
        assert files.read(version) == b'{"other":1}\n'
    else:
        log_store.write(path, lines, False, conf)
        assert files.read(version) == b'{"spark":1}\n'  # the other writer's commit is gone


def test_a_session_whose_s3_log_store_can_lose_commits_is_refused_before_fetching(
        spark, js, names, nats_server, s3):
    messages, _, _ = events(names, 10)
    setup_stream(js, names, messages)
    key = "spark.delta.logStore.s3.impl"
    ours = spark.conf.get(key)
    spark.conf.set(key, "io.delta.storage.S3SingleDriverLogStore")
    try:
        with pytest.raises(ConfigError, match="can overwrite another writer's commit"):
            run_drain(spark, config_for(names, nats_server.url, f"{s3}/events"))
    finally:
        spark.conf.set(key, ours)
    info = js.consumer_info(names.stream, names.consumer)
    assert (info.num_pending, info.num_ack_pending) == (10, 0)  # nothing was fetched


def test_a_store_that_refuses_the_credentials_or_does_not_answer_fails_in_one_js_etl_line(
        s3, s3_server, monkeypatch):
    """Refused or missing credentials are a configuration error (exit 2); a store that does not
    answer may come back (exit 75): either is one js-etl line, never the client's exception."""
    from js_etl.demo.server import free_port

    wrong_secret = {**s3_server.environment(), "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    with pytest.raises(ConfigError, match="refused js-etl's credentials"):
        TableFiles(f"{s3}/t", wrong_secret).create("_js_etl/c.lock", b"x")
    nobody = {**s3_server.environment(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    with pytest.raises(Exception) as failed:
        TableFiles(f"{s3}/t", nobody).create("_js_etl/c.lock", b"x")
    line, exit_code = failure_reason(failed.value)
    assert exit_code == 75 and line.startswith("the object store failed a request")
    assert "\n" not in line
    no_credentials = {"AWS_ENDPOINT_URL": s3_server.environment()["AWS_ENDPOINT_URL"],
                      "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1"}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # the client reads them too
        monkeypatch.delenv(name)
    with pytest.raises(ConfigError, match="no credentials for the object store"):
        TableFiles(f"{s3}/t", no_credentials).create("_js_etl/c.lock", b"x")
