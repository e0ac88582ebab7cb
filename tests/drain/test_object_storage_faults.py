"""Faults between js-etl and the object store: the drain's guarantees where the network between
it and a real store (SeaweedFS) fails — 5xx answers, connections reset in the middle of an
upload, a request that reached the store whose answer is lost, slow answers.

The faults are injected by a proxy in front of the store (tools/fault_proxy.py), which this
process and every ``js-etl drain`` it starts reach the store through (AWS_ENDPOINT_URL). After
each fault the run either completes, or ends with the transient error (exit 75) and one js-etl
line; then a clean rerun leaves every message in the tables once and nothing pending.

Where the requests go on a columnar round into ``<bucket>/events`` (seen through the proxy):
the lock's create is a PUT with If-None-Match; each task's Parquet file is a multipart upload
(POST ``?uploads``, PUT ``?partNumber=1&uploadId=…``, POST ``?uploadId=…``); a commit is a PUT
of ``_delta_log/<version>.json`` with If-None-Match; the driver reads the log with GETs and
LISTs.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from drains import (
    assert_exactly_once,
    assert_no_process_left,
    config_for,
    drain_process,
    events,
    setup_stream,
)

from js_etl.delta.store import TableFiles
from js_etl.delta.table import CommitTag
from js_etl.drain.run import run_drain
from js_etl.errors import JsEtlError, TransientError
from js_etl.report import RunReport
from js_etl.spark.failures import failure_reason
from tools.fault_proxy import FaultProxy

pytestmark = pytest.mark.slow

# The request targets (path?query) of the table "events" that the faults aim at.
DATA_PARTS = r"/events/part-[^?]*\?partNumber="  # the upload of a row file's part
DATA_COMPLETE = r"/events/part-[^?]*\?uploadId="  # the completion of its multipart upload
COMMIT = r"/events/_delta_log/00000000000000000001\.json$"  # round 1 (version 0: the creation)
LOG_FILES = r"/events/_delta_log/\d{20}\.json$"
LOCK = r"/events/_js_etl/[^/]+\.lock$"


@pytest.fixture
def proxy(s3_server: Any, s3: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """The fault proxy in front of the test's store: this process, its Spark tasks (the driver
    passes them its AWS_* variables) and every ``js-etl drain`` it starts go through it."""
    with FaultProxy(s3_server.endpoint) as p:
        monkeypatch.setenv("AWS_ENDPOINT_URL", p.endpoint)
        yield p


def drain(spark: Any, names: Any, url: str, table: str, *extra: str) -> RunReport | Exception:
    """A run in this process: its report, or what it raised."""
    try:
        return run_drain(spark, config_for(names, url, table, *extra))
    except Exception as e:  # what the run raised is the test's to judge
        return e


def cli_outcome(error: Exception) -> tuple[str, int]:
    """What ``js-etl drain`` prints and exits with for ``error`` (js_etl.cli.main)."""
    if isinstance(error, JsEtlError):
        return f"js-etl: {type(error).__name__}: {error}", error.exit_code
    reason, code = failure_reason(error)
    return f"js-etl: {reason}", code


def assert_transient_in_one_line(outcome: RunReport | Exception) -> None:
    assert isinstance(outcome, Exception), f"the run completed: {outcome}"
    line, code = cli_outcome(outcome)
    assert code == TransientError.exit_code, line
    assert "\n" not in line, f"more than one line: {line!r}"


def wait_for_faults(proxy: FaultProxy, n: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    """The proxy's faulted requests, once it has acted on ``n`` (a delayed answer is logged when
    it is passed on)."""
    deadline = time.monotonic() + timeout
    while True:
        faults = proxy.faults()
        if len(faults) >= n or time.monotonic() > deadline:
            return faults
        time.sleep(0.1)


def rounds_committed(table: str, job: str) -> list[int]:
    """The round of every commit of ``job`` in the table's log (one entry per commit)."""
    files = TableFiles(table)
    found = []
    for name in sorted(files.names("_delta_log")):
        if not name.endswith(".json"):
            continue
        for line in (files.read(f"_delta_log/{name}") or b"").decode().splitlines():
            info = json.loads(line).get("commitInfo") if line.strip() else None
            tag = CommitTag.from_json(info.get("userMetadata")) if info else None
            if tag is not None and tag.job == job:
                found.append(tag.round)
    return found


def clean_rerun(spark: Any, js: Any, names: Any, url: str, table: str, proxy: FaultProxy,
                good: list[int], bad: list[int]) -> RunReport:
    """Without faults, the next run leaves every message once and nothing pending."""
    proxy.clear()
    report = run_drain(spark, config_for(names, url, table))
    assert_exactly_once(spark, js, names, table, good, bad)
    return report


def start(js: Any, names: Any, s3: str) -> tuple[str, list[int], list[int]]:
    messages, good, bad = events(names, 700, poison_every=97)
    setup_stream(js, names, messages)
    return f"{s3}/events", good, bad


# --- faults the clients ride out -------------------------------------------------------------

def test_503s_on_the_uploads_of_a_rounds_data_files_are_retried(
        spark, js, names, nats_server, s3, proxy):
    """SlowDown on the first three part uploads of the round's Parquet files: the object store
    client retries them, the round commits once."""
    table, good, bad = start(js, names, s3)
    proxy.add("PUT", DATA_PARTS, "error", status=503, times=3)

    report = drain(spark, names, nats_server.url, table)

    assert isinstance(report, RunReport), report
    assert len(proxy.faults()) == 3
    assert report.messages_written == len(good)
    assert rounds_committed(table, report.job) == [1]
    clean_rerun(spark, js, names, nats_server.url, table, proxy, good, bad)


def test_a_connection_reset_mid_upload_of_a_parquet_file_is_retried(
        spark, js, names, nats_server, s3, proxy):
    """The connection drops halfway through a part's body: the store never completes that
    part, the client sends it again, the file is whole and committed once."""
    table, good, bad = start(js, names, s3)
    proxy.add("PUT", DATA_PARTS, "reset_mid_body")

    report = drain(spark, names, nats_server.url, table)

    assert isinstance(report, RunReport), report
    [fault] = proxy.faults()
    assert 0 < fault["sent"] < fault["of"]
    assert report.messages_written == len(good)
    clean_rerun(spark, js, names, nats_server.url, table, proxy, good, bad)


def test_a_data_file_upload_completed_with_its_answer_lost_is_completed_again(
        spark, js, names, nats_server, s3, proxy):
    """The store completes a row file's multipart upload (the POST ``?uploadId=``), the
    connection is reset before its answer: the client completes it again (the store answers
    200), the round commits once."""
    table, good, bad = start(js, names, s3)
    proxy.add("POST", DATA_COMPLETE, "reset_after")

    report = drain(spark, names, nats_server.url, table)

    assert isinstance(report, RunReport), report
    [fault] = proxy.faults()
    again = [e for e in proxy.log() if e["action"] == "pass" and e["target"] == fault["target"]]
    assert (fault["upstream_status"], [e["upstream_status"] for e in again]) == (200, [200])
    assert report.messages_written == len(good)
    assert rounds_committed(table, report.job) == [1]
    clean_rerun(spark, js, names, nats_server.url, table, proxy, good, bad)


@pytest.mark.parametrize("status", [503, 500])
def test_an_error_answer_to_the_commit_put_is_retried(status, spark, js, names, nats_server, s3,
                                                      proxy):
    """503 SlowDown or 500 InternalError on the PUT of round 1's log file, which did not reach
    the store: the client retries the conditional PUT, which lands; one commit of the round."""
    table, good, bad = start(js, names, s3)
    proxy.add("PUT", COMMIT, "error", status=status)

    report = drain(spark, names, nats_server.url, table)

    assert isinstance(report, RunReport), report
    assert [f["status"] for f in proxy.faults()] == [status]
    assert report.delta_versions == [1]
    assert rounds_committed(table, report.job) == [1]
    clean_rerun(spark, js, names, nats_server.url, table, proxy, good, bad)


@pytest.mark.parametrize("lost", ["reset", "503", "timeout"])
def test_a_commit_that_reached_the_store_with_its_answer_lost_is_committed_once_and_acked(
        lost, spark, js, names, nats_server, s3, proxy, monkeypatch):
    """Round 1's log file is written by the store, but the client does not learn it: the
    connection is reset before the answer (not retried: a conditional PUT is not idempotent),
    the answer is replaced by a 503 (retried: the retry is refused with 412, the key exists, and
    deltalake takes that for another writer's commit of the version; the conflict check refuses
    to commit the round again, its txn being the one the winner recorded), or it comes after the
    client's timeout. js-etl reads the table back, finds the round and acks it: one commit of
    the round, every message once."""
    table, good, bad = start(js, names, s3)
    if lost == "reset":
        proxy.add("PUT", COMMIT, "reset_after")
    elif lost == "503":
        proxy.add("PUT", COMMIT, "error_after", status=503)
    else:
        monkeypatch.setenv("AWS_TIMEOUT", "2s")  # the driver's deltalake client gives up at 2 s
        proxy.add("PUT", COMMIT, "delay", seconds=4)

    report = drain(spark, names, nats_server.url, table)

    assert isinstance(report, RunReport), report
    [fault] = wait_for_faults(proxy, 1)
    assert fault["upstream_status"] == 200  # the store wrote it
    if lost == "503":  # the client's retry of the PUT, refused: the key exists
        retries = [e for e in proxy.log() if e["method"] == "PUT" and e["action"] == "pass"
                   and e["target"].endswith(fault["target"])]
        assert [e["upstream_status"] for e in retries] == [412]
    assert report.messages_written == len(good)
    assert rounds_committed(table, report.job) == [1]
    rerun = clean_rerun(spark, js, names, nats_server.url, table, proxy, good, bad)
    assert (rerun.messages_written, rerun.reacked_at_start) == (0, 0)


@pytest.mark.parametrize("lost", ["reset", "503"])
def test_a_lock_create_that_reached_the_store_with_its_answer_lost_is_the_runs_lock(
        lost, spark, js, names, nats_server, s3, proxy):
    """The run's lock is created (a PUT with If-None-Match) but the answer is lost: a reset
    (not retried), or a 503 (retried: refused with 412, the key exists). The lock the store
    holds is this run's own: the run goes on with it, and releases it at the end."""
    table, good, bad = start(js, names, s3)
    proxy.add("PUT", LOCK, "reset_after" if lost == "reset" else "error_after", status=503)

    report = drain(spark, names, nats_server.url, table)

    assert isinstance(report, RunReport), report
    [fault] = proxy.faults()
    assert fault["upstream_status"] == 200  # the store wrote the lock
    assert report.messages_written == len(good)
    assert TableFiles(table).names("_js_etl") == []  # released
    clean_rerun(spark, js, names, nats_server.url, table, proxy, good, bad)


def test_slow_answers_to_reads_of_the_log_slow_the_run_and_change_nothing(
        spark, js, names, nats_server, s3, proxy):
    """The store answers four reads of the table's log files 3 s late each."""
    table, good, bad = start(js, names, s3)
    proxy.add("GET", LOG_FILES, "delay", seconds=3, times=4)
    started = time.monotonic()

    report = drain(spark, names, nats_server.url, table)

    assert isinstance(report, RunReport), report
    assert len(proxy.faults()) == 4
    assert time.monotonic() - started >= 12
    assert report.messages_written == len(good)
    clean_rerun(spark, js, names, nats_server.url, table, proxy, good, bad)


# --- faults a run cannot go on after ---------------------------------------------------------

def test_a_connection_reset_mid_upload_of_the_commit_fails_the_round_transiently(
        spark, js, names, nats_server, s3, proxy):
    """The connection drops halfway through the commit's PUT body: the store wrote nothing,
    deltalake does not retry a conditional PUT, the round is not in the table: nothing of it is
    acked, the run ends with the transient error, the rerun writes it."""
    table, good, bad = start(js, names, s3)
    proxy.add("PUT", COMMIT, "reset_mid_body")

    outcome = drain(spark, names, nats_server.url, table)

    assert_transient_in_one_line(outcome)
    assert len(proxy.faults()) == 1
    assert rounds_committed(table, f"js-etl:{names.stream}:{names.consumer}") == []
    info = js.consumer_info(names.stream, names.consumer)
    # Nothing acked, not even the round's dead letters, committed before its rows: the rerun's
    # fence acks those.
    assert info.ack_floor.stream_seq == 0
    rerun = clean_rerun(spark, js, names, nats_server.url, table, proxy, good, bad)
    assert (rerun.messages_written, rerun.reacked_at_start) == (len(good), len(bad))


def test_a_store_refusing_the_commit_until_the_client_gives_up_exits_75_in_one_line(
        spark, js, names, nats_server, s3, proxy):
    """Every PUT of round 1's log file answered 503 (SlowDown): deltalake's client gives up
    after its retries; a real ``js-etl drain`` exits 75 with one js-etl line; nothing of the
    round is acked."""
    table, good, bad = start(js, names, s3)
    proxy.add("PUT", COMMIT, "error", status=503, times=1000)
    marker = uuid.uuid4().hex

    proc = drain_process(names, nats_server.url, table, None, marker)
    _, err = proc.communicate(timeout=180)

    assert proc.returncode == 75, f"exit {proc.returncode}: {err[-1500:]}"
    lines = [line for line in err.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("js-etl: ")]
    assert len(ours) == 1 and ours[0] == lines[-1], lines[-6:]
    assert ours[0].startswith("js-etl: TransientError: the commit of round 1")
    assert len(proxy.faults()) > 1  # the client's retries
    assert_no_process_left(marker)
    clean_rerun(spark, js, names, nats_server.url, table, proxy, good, bad)


@pytest.mark.parametrize("reads", ["lock", "log"])
def test_a_store_failing_every_read_exits_75_in_one_line(reads, spark, js, names, nats_server, s3,
                                                         proxy):
    """Every read of the run's lock (from the first check before the round's commit on), or of
    the table's log files, answered 503 (SlowDown) beyond the clients' retries: a real ``js-etl
    drain`` exits 75 with one js-etl line, and acked nothing; the next run takes every message
    once."""
    table, good, bad = start(js, names, s3)
    proxy.add("GET", LOCK if reads == "lock" else LOG_FILES, "error", status=503, times=10**6)
    marker = uuid.uuid4().hex

    # Spark reads the log through S3A where deltalake could not: it gives up after one retry.
    proc = drain_process(names, nats_server.url, table, None, marker,
                         "spark.conf.spark.hadoop.fs.s3a.attempts.maximum=1",
                         "spark.conf.spark.hadoop.fs.s3a.retry.limit=1")
    _, err = proc.communicate(timeout=180)

    assert proc.returncode == 75, f"exit {proc.returncode}: {err[-1500:]}"
    lines = [line for line in err.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("js-etl: ")]
    assert len(ours) == 1 and ours[0] == lines[-1], lines[-6:]
    assert ours[0].startswith("js-etl: the object store failed a request"), ours[0]
    assert "503" in ours[0], ours[0]
    assert_no_process_left(marker)
    assert js.consumer_info(names.stream, names.consumer).ack_floor.stream_seq == 0
    clean_rerun(spark, js, names, nats_server.url, table, proxy, good, bad)


def test_a_store_failing_every_data_file_upload_ends_the_run_transiently(
        spark, js, names, nats_server, s3, proxy):
    """Every part upload of the round's Parquet files answered 503 beyond the client's retries:
    the run must end with the transient error, having spent no more than a delivery of each
    message, so that a job parking poison after 3 deliveries (source.max_deliver=3) still
    writes every good message into the table, not into the dead letters."""
    table, good, bad = start(js, names, s3)
    proxy.add("PUT", DATA_PARTS, "error", status=503, times=10**6)

    outcome = drain(spark, names, nats_server.url, table)

    assert not isinstance(outcome, RunReport), \
        f"the run ended {outcome.stopped_because} after {outcome.rounds} rounds"
    assert_transient_in_one_line(outcome)
    proxy.clear()
    run_drain(spark, config_for(names, nats_server.url, table, "source.max_deliver=3"))
    assert_exactly_once(spark, js, names, table, good, bad)
