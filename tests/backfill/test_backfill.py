"""Backfills and rewinds against a real nats-server, real Spark and real Delta."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from streams import ack, add_stream, publish_and_wait, purge_stream, settled, wait_until

from js_etl import cli
from js_etl.backfill import run as backfill_module
from js_etl.backfill.run import (
    Backfill,
    RangeRequest,
    run_backfill,
    split_range,
)
from js_etl.config import JobConfig, load_config
from js_etl.delta.table import CommitTag, DeltaTarget
from js_etl.drain.run import run_drain
from js_etl.errors import ConfigError, PurgedRangeError, RangeError, RunRefusedError
from js_etl.instant import format_instant, parse_instant
from js_etl.jetstream import ConsumerConfig, DeliverPolicy, JetStreamSession
from js_etl.jetstream.admin import JetStreamAdmin
from js_etl.jetstream.errors import NatsUnavailableError, StreamNotFoundError

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SCHEMA = "id BIGINT, kind STRING"
DRAIN_COLUMNS = ["subject", "stream", "seq", "consumer_seq", "num_delivered", "published_at",
                 "headers", "data"]


def settings(names: Any, nats_server: Any, table: Path, *extra: str) -> list[str]:
    return [f"nats.servers={nats_server.url}", f"source.stream={names.stream}",
            f"source.consumer={names.consumer}", "source.create_consumer=true",
            f"target.path={table}", "fetch.partitions=2", "fetch.batch=100",
            "fetch.pull_timeout=2", *extra]


def make_config(names: Any, nats_server: Any, table: Path, *extra: str) -> JobConfig:
    return load_config(None, settings(names, nats_server, table, *extra), environ={})


def numbered(names: Any, start: int, stop: int, kind: str = "x") -> list[tuple[str, bytes]]:
    return [(f"{names.prefix}.{kind}", b"m%d" % i) for i in range(start, stop)]


def seqs(spark: Any, path: Path) -> list[int]:
    table = spark.read.format("delta").load(str(path))
    return [r.seq for r in table.select("seq").orderBy("seq").collect()]


def plan(config: JobConfig, drain_target: Any = None, **request: Any) -> Any:
    """Resolve a range without Spark (what the CLI does before it starts Spark)."""
    return Backfill(config, RangeRequest.parse(**request), drain_target=drain_target).plan()


def durable_state(js: JetStreamSession, names: Any) -> tuple[Any, ...]:
    info = js.consumer_info(names.stream, names.consumer)
    return (info.delivered.consumer_seq, info.delivered.stream_seq, info.ack_floor.consumer_seq,
            info.ack_floor.stream_seq, info.num_pending, info.num_ack_pending,
            info.num_redelivered, info.config)


def settled_state(js: JetStreamSession, names: Any, ack_pending: int = 0) -> tuple[Any, ...]:
    """The durable consumer's state once ``ack_pending`` deliveries are ack-pending (a drain's
    acks are confirmed applied before it returns; the wait covers anything else)."""
    settled(js, names.stream, names.consumer, ack_pending)
    return durable_state(js, names)


# --- writing ----------------------------------------------------------------------------------
def test_middle_range_into_an_empty_table_and_a_rerun_inserts_nothing(
        spark, js, names, nats_server, tmp_path, capsys):
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 301))
    table = tmp_path / "copy"
    config = make_config(names, nats_server, table)

    report = run_backfill(spark, config, RangeRequest.parse(from_seq=101, to_seq=200),
                          drain_target=None)

    assert seqs(spark, table) == list(range(101, 201))
    rows = spark.read.format("delta").load(str(table))
    assert rows.columns == DRAIN_COLUMNS  # the drain's schema and decoding
    assert {(r.seq, bytes(r.data), r.subject, r.stream) for r in rows.collect()} == {
        (i, b"m%d" % i, f"{names.prefix}.x", names.stream) for i in range(101, 201)}
    assert all(r.published_at is not None for r in rows.select("published_at").collect())
    # An ephemeral consumer's sequence means nothing in the table: null, as the data source's.
    assert {r.consumer_seq for r in rows.select("consumer_seq").collect()} == {None}
    assert (report.messages_read, report.messages_written, report.already_present) == (100, 100, 0)
    assert report.requested_range == {"from_seq": 101, "to_seq": 200, "from_time": None,
                                      "to_time": None}
    assert report.covered_range == report.resolved_range == [101, 200]
    assert not report.clamped and report.stopped_because == "range_done"
    assert (report.first_seq, report.last_seq, report.target_seq) == (101, 200, 300)
    assert len(report.delta_versions) == 1
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").first()
    tag = CommitTag.from_json(history.userMetadata)
    assert tag is not None and tag.job == f"js-etl-backfill:{names.stream}:{names.consumer}"
    assert js.stream_info(names.stream).state.consumer_count == 0  # ephemeral ones deleted

    # The same backfill again, through the CLI: nothing is inserted twice.
    report_file = tmp_path / "report.json"
    code = cli.main(["backfill", *[a for s in settings(
        names, nats_server, table) for a in ("--set", s)], "--from-seq", "101", "--to-seq", "200",
        "--report-file", str(report_file)])
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 0
    again = json.loads(out)
    assert again == json.loads(report_file.read_text())
    assert out.startswith('{"job":')  # what the Airflow operator looks for
    assert (again["messages_read"], again["messages_written"], again["already_present"]) == (
        100, 0, 100)
    assert again["covered_range"] == [101, 200] and again["clamped"] is False
    assert seqs(spark, table) == list(range(101, 201))


def test_backfill_over_drained_rows_fills_gaps_and_leaves_the_rest_to_the_drain(
        spark, js, names, nats_server, tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 401))
    table = tmp_path / "table"
    config = make_config(names, nats_server, table)
    first = run_drain(spark, make_config(names, nats_server, table, "run.max_messages=200"))
    assert first.messages_written == 200
    spark.sql(f"DELETE FROM delta.`{table}` WHERE seq BETWEEN 150 AND 170")  # lost rows
    before = settled_state(js, names)

    report = run_backfill(spark, config, RangeRequest.parse(from_seq=100))  # the drain's table

    # Seqs above the consumer's ack floor (200) are the drain's to write: clamped, reported.
    assert report.resolved_range == [100, 400] and report.covered_range == [100, 200]
    assert report.clamped and "ack" in report.notes[0] and names.consumer in report.notes[0]
    assert (report.messages_read, report.messages_written, report.already_present) == (101, 21, 80)
    assert seqs(spark, table) == list(range(1, 201))
    assert settled_state(js, names) == before  # the durable consumer was not touched

    rest = run_drain(spark, config)
    assert rest.messages_written == 200
    assert seqs(spark, table) == list(range(1, 401))  # nothing missing, nothing twice


def test_a_concurrent_append_makes_the_merge_retry_instead_of_duplicating(
        spark, js, names, nats_server, tmp_path, monkeypatch):
    """What the no-duplicate guarantee rests on: Delta's conflict check (Serializable) fails our
    MERGE when a drain-style blind append lands while it runs; the retry sees the new rows."""
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 101))
    table = tmp_path / "table"
    config = make_config(names, nats_server, table)
    gate = str(tmp_path)
    original = backfill_module.with_partition_columns

    def gated(df: Any, expressions: list[str]) -> Any:
        rows, partition_names = original(df, expressions)

        def wait_for_the_append(batches: Any) -> Any:  # runs in the MERGE, on the executors
            import os
            import time
            open(os.path.join(gate, "merge_started"), "w").close()
            deadline = time.time() + 30
            while not os.path.exists(os.path.join(gate, "appended")) and time.time() < deadline:
                time.sleep(0.05)
            yield from batches

        # One gated task: the other local core must stay free for the append's own job.
        return rows.coalesce(1).mapInArrow(wait_for_the_append, rows.schema), partition_names

    def drain_like_append() -> None:
        while not (tmp_path / "merge_started").exists():
            time.sleep(0.05)
        rows = spark.createDataFrame(
            [(f"{names.prefix}.x", names.stream, i, i, 1, datetime.now(UTC), None,
              bytearray(b"m%d" % i)) for i in range(40, 46)],
            "subject STRING, stream STRING, seq BIGINT, consumer_seq BIGINT, "
            "num_delivered BIGINT, published_at TIMESTAMP, headers MAP<STRING, ARRAY<STRING>>, "
            "data BINARY")
        rows.write.format("delta").mode("append").save(str(table))  # a blind append
        (tmp_path / "appended").touch()

    failed: list[BaseException] = []

    def appender_thread() -> None:
        try:
            drain_like_append()
        except BaseException as e:
            failed.append(e)
            raise

    monkeypatch.setattr(backfill_module, "with_partition_columns", gated)
    appender = threading.Thread(target=appender_thread)
    appender.start()
    report = run_backfill(spark, config, RangeRequest.parse(from_seq=1, to_seq=100),
                          drain_target=None)
    appender.join(30)

    assert not failed and (tmp_path / "appended").exists()

    assert report.merge_attempts == 2  # the first MERGE lost to the append and was retried
    assert (report.messages_written, report.already_present) == (94, 6)
    assert seqs(spark, table) == list(range(1, 101))


@pytest.mark.slow
def test_a_backfill_killed_mid_merge_then_run_again_writes_every_message_once(
        spark, js, names, nats_server, tmp_path):
    """SIGKILL of the process running ``js-etl backfill`` while its MERGE runs (held in a task
    by the fault point). On a classic session the MERGE dies with the driver; a Spark Connect
    client's MERGE goes on in the server after the client died, and races the next run's. Either
    way the next run leaves every message once: a MERGE that read the table before another's
    commit cannot commit after it."""
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 301))
    table, gate = tmp_path / "table", tmp_path / "gate"
    gate.mkdir()
    args = [a for s in settings(names, nats_server, table) for a in ("--set", s)]
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("js-etl")), "backfill", *args, "--from-seq", "1",
         "--to-seq", "300"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "JS_ETL_FAULT": "hold_mid_merge", "JS_ETL_FAULT_GATE": str(gate)})
    try:
        wait_until(lambda: (gate / "held").exists() or proc.poll() is not None, timeout=300,
                   what="the backfill's MERGE held in its task")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        proc.kill()  # SIGKILL
        proc.communicate(timeout=120)
    finally:
        (gate / "release").touch()  # a Connect server's orphaned MERGE goes on from here
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -9

    report = run_backfill(spark, make_config(names, nats_server, table),
                          RangeRequest.parse(from_seq=1, to_seq=300), drain_target=None)

    from deltalake import DeltaTable  # an independent reader of what every MERGE committed

    written = DeltaTable(str(table)).to_pyarrow_table(columns=["seq"]).column("seq").to_pylist()
    assert sorted(written) == list(range(1, 301))
    assert report.messages_written + report.already_present == 300


def test_parallel_sub_ranges_add_up_to_exactly_the_range(spark, js, names, nats_server,
                                                         tmp_path):
    assert split_range(1, 1000, 3) == [(1, 333), (334, 666), (667, 1000)]
    assert split_range(5, 6, 3) == [(5, 5), (6, 6)]
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 1001))
    table = tmp_path / "copy"
    # Small pulls, so every partition ends on batch and byte limits many times.
    config = make_config(names, nats_server, table, "fetch.partitions=3", "fetch.batch=64",
                         "fetch.max_bytes=2KiB")

    report = run_backfill(spark, config, RangeRequest.parse(from_seq=1, to_seq=1000),
                          drain_target=None)

    assert report.partitions == 3 and report.messages_read == 1000
    assert seqs(spark, table) == list(range(1, 1001))  # no gap, no seam read twice
    assert js.stream_info(names.stream).state.consumer_count == 0


@pytest.mark.nats_side  # which sequences: the Spark side is the other tests'
def test_the_durable_consumer_is_unchanged_and_filters_apply(spark, js, names, nats_server,
                                                            tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.{'keep' if i % 3 else 'skip'}", b"%d" % i)
                                 for i in range(1, 301)])
    js.run(js.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_wait=60, filter_subjects=(f"{names.prefix}.keep",))))
    pulled = js.pull(js.puller(names.stream, names.consumer), 30)
    ack(js, [m.reply for m in pulled.messages[:20]])  # 20 acked, 10 in flight
    before = settled_state(js, names, ack_pending=10)
    table = tmp_path / "copy"
    # No filter in the config: the durable consumer's filter is the job's.
    config = make_config(names, nats_server, table, "fetch.partitions=3", "fetch.batch=7")

    report = run_backfill(spark, config, RangeRequest.parse(from_seq=10, to_seq=200),
                          drain_target=None)

    expected = [i for i in range(10, 201) if i % 3]
    assert seqs(spark, table) == expected
    assert report.messages_read == len(expected)
    assert settled_state(js, names, ack_pending=10) == before
    assert js.stream_info(names.stream).state.consumer_count == 1  # only the durable one


@pytest.mark.nats_side  # which sequences: the Spark side is the other tests'
def test_time_bounds_pick_the_messages_stored_in_the_window(spark, js, names, nats_server,
                                                            tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 31))
    time.sleep(0.3)
    t1 = datetime.now(UTC)
    time.sleep(0.3)
    publish_and_wait(js, names, numbered(names, 31, 71))
    time.sleep(0.3)
    t2 = datetime.now(UTC)
    time.sleep(0.3)
    publish_and_wait(js, names, numbered(names, 71, 101))
    table = tmp_path / "copy"
    config = make_config(names, nats_server, table)

    report = run_backfill(spark, config, RangeRequest.parse(
        from_time=t1.isoformat().replace("+00:00", "Z"),
        to_time=t2.astimezone(timezone(timedelta(hours=2))).isoformat()),  # an offset
        drain_target=None)

    assert seqs(spark, table) == list(range(31, 71))
    assert report.resolved_range == report.covered_range == [31, 70]
    assert report.requested_range["from_time"] == format_instant(parse_instant(t1.isoformat()))
    # No zone means UTC; no end means the stream's last message.
    naive = t1.replace(tzinfo=None).isoformat()
    assert (plan(config, from_time=naive).lo, plan(config, from_time=naive).hi) == (31, 100)
    # The bound is inclusive, at nanosecond precision: a window of exactly one message's time.
    stored = js.run(backfill_module.first_message_at_or_after(js.admin, names.stream,
                                                              format_instant(0)))
    assert stored is not None and stored[0] == 1
    one = plan(config, from_time=stored[1], to_time=stored[1])
    assert (one.lo, one.hi) == (1, 1)


# --- clear errors -----------------------------------------------------------------------------
def test_impossible_ranges_are_clear_errors(js, names, nats_server, tmp_path, capsys):
    config = make_config(names, nats_server, tmp_path / "t")
    with pytest.raises(StreamNotFoundError, match=f"stream '{names.stream}' not found"):
        plan(config, from_seq=1)
    add_stream(js, names)
    with pytest.raises(RangeError, match="is empty"):
        plan(config, from_seq=1)
    publish_and_wait(js, names, numbered(names, 1, 21))
    time.sleep(0.2)
    gap = datetime.now(UTC)
    time.sleep(0.2)
    publish_and_wait(js, names, numbered(names, 21, 41))

    with pytest.raises(RangeError, match="--to-seq 3 is before --from-seq 5"):
        plan(config, from_seq=5, to_seq=3)
    with pytest.raises(RangeError, match="ends at seq 40: nothing at or after seq 41"):
        plan(config, from_seq=41)
    with pytest.raises(RangeError, match="no message in stream .* at or after 2099-01-01"):
        plan(config, from_time="2099-01-01T00:00:00Z")
    with pytest.raises(RangeError, match="no message in stream .* between"):
        plan(config, from_time=gap.isoformat(), to_time=gap.isoformat())
    with pytest.raises(ConfigError, match="not an RFC 3339"):
        plan(config, from_time="yesterday")
    clamped = plan(config, from_seq=30, to_seq=999)
    assert (clamped.lo, clamped.hi, clamped.clamped) == (30, 40, True)
    assert "clamped from seq 999 to seq 40" in clamped.notes[0]

    # Through the command: exit 2 and one line saying why, before any Spark starts.
    args = [a for s in settings(names, nats_server, tmp_path / "t") for a in ("--set", s)]
    assert cli.main(["backfill", *args, "--from-seq", "50"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("js-etl: RangeError:") and "ends at seq 40" in err[-1]


def test_purged_prefix_is_a_clear_error_naming_the_first_available_seq(js, names, nats_server,
                                                                       tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 101))
    purge_stream(js, names.stream, keep=40)  # seqs 1..60 are gone
    config = make_config(names, nats_server, tmp_path / "t")

    with pytest.raises(PurgedRangeError, match="first available is seq 61.*--from-seq 61"):
        plan(config, from_seq=10, to_seq=80)
    with pytest.raises(PurgedRangeError, match="whole range is gone"):
        plan(config, from_seq=10, to_seq=50)
    with pytest.raises(PurgedRangeError, match="before seq 61.*--from-seq 61"):
        plan(config, from_time="2000-01-01T00:00:00Z")
    assert (plan(config, from_seq=61).lo, plan(config, from_seq=61).hi) == (61, 100)

    # The spark-submit entry point fails the same way, before Spark does anything.
    args = [a for s in settings(names, nats_server, tmp_path / "t") for a in ("--set", s)]
    result = subprocess.run([sys.executable, str(REPO / "jobs" / "backfill_to_delta.py"), *args,
                             "--from-seq", "10"], capture_output=True, text=True, timeout=60,
                            cwd=REPO, env={**os.environ, "TZ": "UTC"})
    assert result.returncode == 2
    assert "PurgedRangeError" in result.stderr.strip().splitlines()[-1]
    assert "seq 61" in result.stderr.strip().splitlines()[-1]


def test_a_range_the_drain_will_write_itself_is_clamped_or_refused(js, names, nats_server,
                                                                   tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 101))
    config = make_config(names, nats_server, tmp_path / "table")
    # No durable consumer yet: its first drain would start at seq 1 and write the range again.
    with pytest.raises(RangeError, match="does not exist yet.*--deliver 51"):
        plan(config, drain_target=backfill_module.SAME_AS_TARGET, from_seq=1, to_seq=50)
    # Initial load: the consumer starts after the range, the backfill loads what lies before.
    js.run(js.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=51, ack_wait=60)))
    ok = plan(config, drain_target=backfill_module.SAME_AS_TARGET, from_seq=1, to_seq=50)
    assert (ok.lo, ok.hi, ok.clamped) == (1, 50, False)
    part = plan(config, drain_target=backfill_module.SAME_AS_TARGET, from_seq=40)
    assert (part.lo, part.hi, part.clamped) == (40, 50, True)
    with pytest.raises(RangeError, match="above the ack floor.*rewind --to-seq 81"):
        plan(config, drain_target=backfill_module.SAME_AS_TARGET, from_seq=60, to_seq=80)
    # Into another table nothing is clamped.
    other = plan(config, drain_target=DeltaTarget(str(tmp_path / "elsewhere")), from_seq=60)
    assert (other.lo, other.hi) == (60, 100)


def test_json_decoding_and_dead_letters_via_backfill(spark, js, names, nats_server, tmp_path):
    add_stream(js, names)
    good = [(f"{names.prefix}.e", json.dumps({"id": i, "kind": "k"}).encode()) for i in range(20)]
    bad = [(f"{names.prefix}.e", b'{"id": 1'), (f"{names.prefix}.e", b"\xff\xfe"),
           (f"{names.prefix}.e", b'{"id": "x"}'), (f"{names.prefix}.e", b"")]
    publish_and_wait(js, names, good[:10] + bad + good[10:])
    table = tmp_path / "copy"
    config = make_config(names, nats_server, table, "decode.format=json",
                         f"decode.schema={SCHEMA}")

    report = run_backfill(spark, config, RangeRequest.parse(from_seq=1), drain_target=None)
    again = run_backfill(spark, config, RangeRequest.parse(from_seq=1), drain_target=None)

    assert (report.messages_written, report.dead_letters) == (20, 4)
    assert (again.messages_written, again.dead_letters, again.already_present) == (0, 0, 24)
    rows = spark.read.format("delta").load(str(table))
    assert rows.columns == [*DRAIN_COLUMNS[:-1], "id", "kind"]
    assert sorted(r.id for r in rows.collect()) == list(range(20))
    dead = spark.read.format("delta").load(str(tmp_path / "copy_dead_letters"))
    dead = dead.orderBy("seq").collect()
    assert [d.seq for d in dead] == [11, 12, 13, 14]  # once each, after two backfills
    assert [d.error for d in dead] == [
        "malformed JSON", "payload is not valid UTF-8",
        f"JSON does not match decode.schema ({SCHEMA})", "empty payload"]
    assert [bytes(d.data) for d in dead] == [b'{"id": 1', b"\xff\xfe", b'{"id": "x"}', b""]


# --- rewind -----------------------------------------------------------------------------------
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def rewind_args(names: Any, nats_server: Any, table: Path, seq: int, *extra: str) -> list[str]:
    return ["rewind", *[a for s in settings(names, nats_server, table) for a in ("--set", s)],
            "--to-seq", str(seq), *extra]


def test_rewind_then_drain_rereads_from_the_new_position(spark, js, names, nats_server,
                                                         tmp_path, capsys, monkeypatch):
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 101))
    table = tmp_path / "table"
    assert run_drain(spark, make_config(names, nats_server, table)).messages_written == 100

    assert cli.main(rewind_args(names, nats_server, table, 61, "--yes")) == 0
    out = capsys.readouterr().out
    assert "seqs 61..100 will be delivered again" in out
    assert "the drain acks them without writing them again" in out
    info = js.consumer_info(names.stream, names.consumer)
    assert (info.ack_floor.stream_seq, info.num_pending) == (60, 40)

    # Into the same table: the rows are there already, acked and not written a second time.
    report = run_drain(spark, make_config(names, nats_server, table))
    assert (report.first_seq, report.last_seq) == (61, 100)
    assert (report.messages_written, report.already_committed) == (0, 40)
    assert report.reacked_at_start == 0  # nothing was outstanding after the rewind
    assert seqs(spark, table) == list(range(1, 101))
    assert js.consumer_info(names.stream, names.consumer).num_ack_pending == 0
    # Into another table: all of them.
    again = tmp_path / "again"
    assert cli.main(rewind_args(names, nats_server, table, 61, "--yes")) == 0
    report = run_drain(spark, make_config(names, nats_server, again))
    assert (report.first_seq, report.last_seq, report.messages_written) == (61, 100, 40)
    assert seqs(spark, again) == list(range(61, 101))

    # Asked on a terminal: "n" leaves it alone, "y" rewinds.
    monkeypatch.setattr(sys, "stdin", _Terminal("n\n"))
    assert cli.main(rewind_args(names, nats_server, table, 91)) == 1
    assert js.consumer_info(names.stream, names.consumer).num_pending == 0
    monkeypatch.setattr(sys, "stdin", _Terminal("y\n"))
    assert cli.main(rewind_args(names, nats_server, table, 91)) == 0
    assert js.consumer_info(names.stream, names.consumer).num_pending == 10


def test_rewind_refuses_without_confirmation_and_explains_old_servers(
        js, names, nats_server, tmp_path, capsys, monkeypatch):
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 51))
    js.run(js.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_wait=60, filter_subjects=(f"{names.prefix}.x",))))
    before = settled_state(js, names)
    table = tmp_path / "table"

    # Not a terminal and no --yes: refused, nothing changed.
    result = subprocess.run([str(BIN / "js-etl"), *rewind_args(names, nats_server, table, 5)],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                            cwd=REPO, env={**os.environ, "TZ": "UTC"})
    assert result.returncode == 2
    assert "--yes" in result.stderr.strip().splitlines()[-1]
    assert settled_state(js, names) == before

    # A server without consumer reset (it does not answer): the exact commands instead.
    async def no_answer(self: Any, stream: str, consumer: str, seq: int) -> int:
        raise NatsUnavailableError(f"JetStream did not answer $JS.API.CONSUMER.RESET.{stream}")

    monkeypatch.setattr(JetStreamAdmin, "reset_consumer", no_answer)
    assert cli.main(rewind_args(names, nats_server, table, 5, "--yes")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"nats consumer rm {names.stream} {names.consumer} -f && nats consumer add " \
           f"{names.stream} {names.consumer} --pull --deliver 5 --ack explicit --wait 60s" in err
    assert f"--filter {names.prefix}.x" in err
    monkeypatch.undo()

    # Deliveries in flight (a drain is running): refused, retry later.
    assert len(js.pull(js.puller(names.stream, names.consumer), 5).messages) == 5
    assert cli.main(rewind_args(names, nats_server, table, 5, "--yes")) == RunRefusedError.exit_code
    # Out of range: clear errors.
    purge_stream(js, names.stream, keep=30)
    assert cli.main(rewind_args(names, nats_server, table, 99, "--yes")) == 2
    assert "at most 51" in capsys.readouterr().err.strip().splitlines()[-1]
