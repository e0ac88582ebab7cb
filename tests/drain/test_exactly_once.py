"""Each way issue 12 broke exactly-once, tried against a real nats-server, Spark and Delta.

Every test creates the condition on purpose (a write phase longer than ack_wait, fetch tasks
starting after the round's deadline, 101 commits of another writer, column mapping with OPTIMIZE
and VACUUM, a SIGKILLed server, a stolen lock) and then checks the outcome, never a timing: every
good message once in the table, every bad one once in the dead-letter table, the consumer clean.
Where a mechanism has a second line of defence behind it, the test also checks that the second
line was not needed (``already_committed`` / ``duplicates_dropped`` stay 0), so removing the
first mechanism fails the test even though the data would stay right.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from drains import assert_exactly_once, config_for, events, setup_stream
from streams import AfterEachRound, publish_and_wait, started_together

from js_etl.config import load_config
from js_etl.delta.table import CommitTag, DeltaTarget
from js_etl.drain import lock as lock_module
from js_etl.drain import run as drain_module
from js_etl.drain.acks import RunAcks
from js_etl.drain.lock import TableLock
from js_etl.drain.rounds import RoundStats
from js_etl.drain.run import run_drain
from js_etl.drain.writers import WriteContext
from js_etl.drain.writers.spark import SparkWriter
from js_etl.durable import owner as owner_module
from js_etl.durable.cursor import MARK
from js_etl.durable.lease import lease_key
from js_etl.durable.owner import LockOwner, ProcessId
from js_etl.errors import RunRefusedError, TerminalError
from js_etl.jetstream import ConsumerConfig
from js_etl.jetstream.errors import ConsumerConfigError, ConsumerUnavailableError
from js_etl.jetstream.kv import KeyValue
from js_etl.schema import RAW_DDL

pytestmark = pytest.mark.slow


def die_before_first_ack(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's first ack raises: a round is committed and never acked (a crash there)."""
    real = RunAcks.ack

    def ack_once(self: Any, *args: Any, **kw: Any) -> int:
        monkeypatch.setattr(RunAcks, "ack", real)
        raise RuntimeError("died between commit and ack")

    monkeypatch.setattr(RunAcks, "ack", ack_once)


# --- 1. acks confirmed applied before the next round's pulls ---------------------------------
def test_acks_are_applied_before_the_next_round_pulls(spark, js, names, nats_server, tmp_path,
                                                      monkeypatch):
    messages, good, bad = events(names, 600, poison_every=50)
    setup_stream(js, names, messages, ack_wait=2, max_ack_pending=200)
    table = tmp_path / "table"
    # Every round waits ack_wait + 1 s between its commit and its acks: by then the server has
    # queued the round's messages for redelivery, and the next round's pulls would get them
    # if the acks were merely flushed.
    monkeypatch.setenv("JS_ETL_FAULT", "stall_before_ack")

    report = run_drain(spark, config_for(names, nats_server.url, table, "fetch.pull_timeout=0.5"))

    assert report.rounds >= 3
    assert (report.already_committed, report.duplicates_dropped) == (0, 0)
    assert_exactly_once(spark, js, names, table, good, bad)


def test_a_big_backlog_on_an_unlimited_consumer_with_a_short_ack_wait_drains_in_one_run(
        spark, js, names, nats_server, tmp_path):
    """400,000 messages, max_ack_pending unlimited, ack_wait 6 s: one round of all of them
    could not have its acks confirmed before their ack_wait ran out (it exited 75 twice on a
    healthy server). Rounds are capped by what is acked in time, and a late confirmation is
    waited for while the server applies the block (tests/jetstream/test_jetstream_ack.py);
    the run finishes on its own."""
    n = 400_000
    js.run(js.admin.add_stream(names.stream, [names.subject]))
    js.run(js.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_wait=6, max_ack_pending=-1)))
    publish_and_wait(js, names, [(f"{names.prefix}.e", b'{"id":%d}' % i) for i in range(n)])
    table = tmp_path / "table"

    report = run_drain(spark, config_for(names, nats_server.url, table, "fetch.pull_timeout=2",
                                         "fetch.batch=4000"))

    assert report.messages_written == n and report.stopped_because in ("drained",
                                                                       "target_reached")
    assert report.duplicates_dropped == 0 and report.already_committed == 0
    seqs = _deltalake_seqs(table)
    assert len(seqs) == n and len(set(seqs)) == n  # an independent reader: each once
    info = js.consumer_info(names.stream, names.consumer)
    assert (info.num_pending, info.num_ack_pending) == (0, 0)


def test_a_fetch_failed_by_a_nats_outage_is_ridden_out_within_the_run(spark, js, names,
                                                                      nats_server, tmp_path,
                                                                      monkeypatch):
    """A round's fetch job fails the way a consumer leader's loss fails it (a pull answered
    503), after its tasks received deliveries: the run waits for the consumer to answer,
    releases what the failed round left delivered and goes on, instead of exiting."""
    messages, good, bad = events(names, 300, poison_every=50)
    setup_stream(js, names, messages, max_ack_pending=100)
    real = drain_module.Drain._fetch
    failed: list[int] = []

    def fetch_then_fail(self: Any, *args: Any, **kw: Any) -> Any:
        if failed:
            return real(self, *args, **kw)
        fetched = real(self, *args, **kw)  # its tasks pulled: those deliveries are out
        self.writer.discard(fetched)
        failed.append(js.consumer_info(names.stream, names.consumer).num_ack_pending)
        raise ConsumerUnavailableError("no consumer answered (503): its leader is being "
                                       "elected, or it does not exist", code=503)

    monkeypatch.setattr(drain_module.Drain, "_fetch", fetch_then_fail)
    table = tmp_path / "table"
    report = run_drain(spark, config_for(names, nats_server.url, table))

    assert failed and failed[0] > 0
    assert report.released_at_end == failed[0]  # given back once, by the next round
    assert report.messages_written == len(good) and report.dead_letters == len(bad)
    assert_exactly_once(spark, js, names, table, good, bad)


def _deltalake_seqs(table: Path) -> list[int]:
    from deltalake import DeltaTable

    return DeltaTable(str(table)).to_pyarrow_table(columns=["seq"]).column("seq").to_pylist()


# --- 2. one deadline for the whole round -----------------------------------------------------
def test_fetch_tasks_starting_after_the_round_deadline_pull_nothing(spark, js, names, nats_server,
                                                                   tmp_path, monkeypatch):
    messages, good, bad = events(names, 400, poison_every=50)
    setup_stream(js, names, messages, ack_wait=2)
    table = tmp_path / "table"
    # Partitions 2 and 3 start ack_wait + 1 s into the round: with a clock per task they would
    # pull redeliveries of what partitions 0 and 1 hold, into the same commit.
    monkeypatch.setenv("JS_ETL_FAULT", "late_fetch_tasks")

    report = run_drain(spark, config_for(names, nats_server.url, table, "fetch.partitions=4",
                                         "fetch.pull_timeout=0.5"))

    assert report.stopped_because == "drained"
    assert (report.already_committed, report.duplicates_dropped) == (0, 0)
    assert_exactly_once(spark, js, names, table, good, bad)


def test_a_round_whose_tasks_all_start_after_its_window_widens_the_next(spark, js, names,
                                                                       nats_server, tmp_path,
                                                                       monkeypatch):
    messages, good, bad = events(names, 200, poison_every=50)
    setup_stream(js, names, messages, ack_wait=3)
    table = tmp_path / "table"
    # Every task starts 1.5 windows late (a loaded machine with a short ack_wait): the first
    # round pulls nothing; the next round's window is twice as long and gets the messages.
    monkeypatch.setenv("JS_ETL_FAULT", "slow_task_start")

    report = run_drain(spark, config_for(names, nats_server.url, table,
                                         "fetch.pull_timeout=0.5"))

    assert report.stopped_because == "drained" and report.rounds >= 1
    assert_exactly_once(spark, js, names, table, good, bad)


# --- 3. a server-side max_deliver is refused before anything is fetched -----------------------
def test_server_side_max_deliver_is_refused_before_fetching(spark, js, names, nats_server,
                                                            tmp_path):
    messages, good, bad = events(names, 60, poison_every=20)
    setup_stream(js, names, messages, max_deliver=2)
    table = tmp_path / "table"
    config = config_for(names, nats_server.url, table)

    with pytest.raises(ConsumerConfigError, match=r"max_deliver 2: .*--max-deliver=-1") as refused:
        run_drain(spark, config)

    assert refused.value.exit_code == 2
    info = js.consumer_info(names.stream, names.consumer)
    assert (info.delivered.stream_seq, info.num_ack_pending) == (0, 0)  # nothing fetched
    # The fix the message names, then the drain runs.
    js.run(js.admin.create_consumer(names.stream, replace(info.config, max_deliver=-1),
                                    action="update"))
    run_drain(spark, config)
    assert_exactly_once(spark, js, names, table, good, bad)


# --- 4. round numbers from the snapshot, whatever other writers commit ------------------------
def foreign_commits(table: Path, n: int) -> None:
    """``n`` appends by another writer (the deltalake package), rows of another stream."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    schema = pa.schema(DeltaTable(str(table)).schema().to_arrow())
    for i in range(n):
        row = {f.name: [None] for f in schema}
        row.update(stream=["OTHER"], seq=[i + 1], consumer_seq=[i + 1], num_delivered=[1],
                   subject=["other.x"], published_at=[datetime.now(UTC)])
        write_deltalake(str(table), pa.table(row, schema=schema), mode="append")


def test_rounds_and_fence_survive_a_hundred_commits_of_another_writer(spark, js, names,
                                                                       nats_server, tmp_path,
                                                                       monkeypatch):
    messages, good, _bad = events(names, 300)
    setup_stream(js, names, messages, max_ack_pending=100)
    table = tmp_path / "table"
    config = config_for(names, nats_server.url, table)
    first = run_drain(spark, config)
    assert first.rounds >= 3
    job_round = DeltaTarget(str(table)).job_round(spark, config.job_id)[0]
    more, more_good, _ = events(names, 200)
    publish_and_wait(js, names, more)
    die_before_first_ack(monkeypatch)
    with pytest.raises(RuntimeError, match="died between commit and ack"):
        run_drain(spark, config)
    foreign_commits(table, 101)  # more than any history window the fence ever read

    report = run_drain(spark, config)

    assert report.reacked_at_start > 0  # the committed, unacked round was found and acked
    assert DeltaTarget(str(table)).job_round(spark, config.job_id)[0] > job_round + 1
    rows = spark.read.format("delta").load(str(table)).where(f"stream = '{names.stream}'")
    assert rows.count() == 500
    assert_exactly_once(spark, js, names, table, good + [g + 300 for g in more_good], [])


def key_row(spark) -> Any:
    """One row with the columns an append and job_round need."""
    return spark.createDataFrame([("S", 1, 1, 1)], "stream STRING, seq BIGINT, "
                                 "consumer_seq BIGINT, num_delivered BIGINT")


def test_an_append_delta_skips_is_an_error_not_nothing_committed(spark, tmp_path):
    table = DeltaTarget(str(tmp_path / "t"))
    rows = key_row(spark)
    tag = CommitTag("js-etl:S:c", "run", 5, "$JS.ACK.S.c", 1, 1)
    table.append(spark, rows, tag, partition_by=[], merge_schema=False)
    assert table.job_round(spark, "js-etl:S:c")[0] == 5

    with pytest.raises(TerminalError, match="append was skipped"):
        table.append(spark, rows, replace(tag, round=4), partition_by=[], merge_schema=False)
    assert table.read(spark).count() == 1


def _snapshot_round(spark, target: DeltaTarget, job: str) -> tuple[int, int]:
    """(round, version) as Delta's own Spark snapshot records them: what job_round must read."""
    snapshot = target._snapshot(spark)
    recorded = snapshot.transactions().get(job)
    return (int(recorded.get()) if recorded.isDefined() else 0), int(snapshot.version())


def test_job_round_reads_the_round_sparks_snapshot_holds(spark, tmp_path):
    """job_round reads a local table through deltalake, without a Spark job: the same round
    and version as Delta's snapshot after Spark's appends, another writer's commits and the
    checkpoint Spark writes at version 10."""
    path = tmp_path / "t"
    table = DeltaTarget(str(path))
    rows = key_row(spark)
    tag = CommitTag("js-etl:S:c", "run", 1, "$JS.ACK.S.c", 1, 1)
    for round_no in (1, 2):
        table.append(spark, rows, replace(tag, round=round_no), partition_by=[],
                     merge_schema=False)
    foreign_commits(path, 8)
    assert table.job_round(spark, tag.job) == _snapshot_round(spark, table, tag.job) == (2, 9)
    table.append(spark, rows, replace(tag, round=3), partition_by=[], merge_schema=False)
    assert list((path / "_delta_log").glob("*10.checkpoint*.parquet"))
    assert table.job_round(spark, tag.job) == _snapshot_round(spark, table, tag.job) == (3, 10)
    assert table.job_round(spark, "another job") == (0, 10)


def test_job_round_of_a_path_with_a_percent_sign_is_sparks_not_its_unescaped_neighbours(
        spark, tmp_path):
    """deltalake lists "a%20b" but reads a commit of "a b" (a break-it review): such a path is
    read through Spark's snapshot."""
    rows = key_row(spark)
    tag = CommitTag("js-etl:S:c", "run", 3, "$JS.ACK.S.c", 1, 1)
    DeltaTarget(str(tmp_path / "a b")).append(spark, rows, tag, partition_by=[],
                                              merge_schema=False)
    table = DeltaTarget(str(tmp_path / "a%20b"))
    for round_no in (1, 9):
        table.append(spark, rows, replace(tag, round=round_no), partition_by=[],
                     merge_schema=False)
    assert table.job_round(spark, tag.job) == _snapshot_round(spark, table, tag.job) == (9, 1)


def test_job_round_of_a_table_deltalake_cannot_read_comes_from_sparks_snapshot(spark, tmp_path):
    from js_etl.delta.table import _deltalake_table

    path = tmp_path / "t"
    spark.sql(f"CREATE TABLE delta.`{path}` (stream STRING, seq BIGINT, consumer_seq BIGINT, "
              "num_delivered BIGINT) USING delta "
              "TBLPROPERTIES ('delta.feature.geospatial' = 'supported')")
    # deltalake 1.6.6 refuses it: "Feature 'geospatial' is not supported".
    assert _deltalake_table(str(path)) is None
    table = DeltaTarget(str(path))
    rows = key_row(spark)
    table.append(spark, rows, CommitTag("js-etl:S:c", "run", 4, "$JS.ACK.S.c", 1, 1),
                 partition_by=[], merge_schema=False)
    assert table.job_round(spark, "js-etl:S:c") == (4, 1)


# --- 5. the lock: right in containers, on long rounds, and checked before commits/acks --------
def write_owner(table: Path, consumer: str, owner: LockOwner) -> Path:
    path = table / "_js_etl" / f"{consumer}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(owner.to_json())
    return path


def test_lock_of_a_dead_owner_whose_pid_was_reused_is_taken_over(spark, tmp_path):
    me = LockOwner.me("dead-run")
    # Our own pid stands for "a live process now holds the pid": its start time differs.
    dead = replace(me, process=replace(me.process, pid_start=(me.process.pid_start or 0) - 1))
    write_owner(tmp_path, "c", dead)

    with TableLock(spark, str(tmp_path), "c", "new-run"):
        record = json.loads((tmp_path / "_js_etl" / "c.lock").read_text())
        assert record["run_id"] == "new-run"


def test_the_lock_file_through_hadoop_behaves_as_the_local_one(spark, tmp_path):
    """The lock's file on a store that is not the local disk (s3a://, abfss://, hdfs://) goes
    through Spark's Hadoop FileSystem; here Hadoop's own local one stands in for such a store."""
    path = tmp_path / "c.lock"
    hadoop = lock_module._HadoopFile(spark, f"file://{path}")
    assert hadoop.read() is None
    assert hadoop.create_exclusive(b"first") is True
    assert hadoop.create_exclusive(b"second") is False  # taken: the lock's one guarantee
    assert hadoop.read() == b"first" == path.read_bytes()
    hadoop.replace(b"third")
    assert hadoop.read() == b"third"
    hadoop.delete()
    assert hadoop.read() is None and not path.exists()


def test_lock_of_another_pid_namespace_on_the_same_host_is_not_taken_over(spark, tmp_path):
    me = LockOwner.me("container-run")
    # Same hostname (containers), another PID namespace, a pid that does not exist here, and a
    # fresh heartbeat: only the heartbeat can tell, and it says alive.
    other = replace(me, process=replace(me.process, pid=2**22 + 17,
                                        pid_namespace="pid:[4026530000]"))
    write_owner(tmp_path, "c", other)

    with pytest.raises(RunRefusedError, match="another run holds this consumer"):
        TableLock(spark, str(tmp_path), "c", "new-run").acquire()


def test_lock_heartbeat_keeps_a_long_held_lock_live(spark, tmp_path, monkeypatch):
    real_me = ProcessId.me
    # The holder looks like a run in another container, so only its heartbeat keeps it live.
    monkeypatch.setattr(owner_module.ProcessId, "me", classmethod(
        lambda cls: replace(real_me(), pid_namespace="pid:[4026530000]")))
    holder = TableLock(spark, str(tmp_path), "c", "long-run", ttl=0.5).acquire()
    monkeypatch.setattr(owner_module.ProcessId, "me", classmethod(lambda cls: real_me()))
    path = tmp_path / "_js_etl" / "c.lock"
    try:
        started = json.loads(path.read_text())["started"]
        # Wait for state: the heartbeat has moved on well past several TTLs.
        deadline = time.monotonic() + 60
        while json.loads(path.read_text())["heartbeat"] < started + 2.0:
            assert time.monotonic() < deadline, "the heartbeat thread never beat"
            time.sleep(0.05)
        with pytest.raises(RunRefusedError, match="another run holds this consumer"):
            TableLock(spark, str(tmp_path), "c", "second-run", ttl=0.5).acquire()
        holder.check()  # still ours
    finally:
        holder.release()
    assert not path.exists()


def test_a_run_whose_consumer_a_query_claimed_stops_before_its_next_round(
        spark, js, names, nats_server, tmp_path):
    """A Structured Streaming query that claimed the consumer during the run — its lease read in
    another bucket than the drain's, so the drain's lease did not stop it — moves it past what
    the run has not read: the run stops before its next round, what it committed acked."""
    messages, _good, _bad = events(names, 300)
    setup_stream(js, names, messages, max_ack_pending=100)
    table = tmp_path / "table"

    def claimed(report: Any) -> None:
        js.run(js.admin.update_consumer_metadata(names.stream, names.consumer,
                                                 {MARK: "a query"}))

    with pytest.raises(ConsumerConfigError, match="claimed by a Structured Streaming query"):
        run_drain(spark, config_for(names, nats_server.url, table),
                  progress=AfterEachRound(claimed))
    assert spark.read.format("delta").load(str(table)).count() == 100  # round 2 never ran
    info = js.consumer_info(names.stream, names.consumer)
    assert (info.num_ack_pending, info.num_pending) == (0, 200)


def test_run_that_lost_its_lock_stops_before_committing(spark, js, names, nats_server, tmp_path):
    messages, good, bad = events(names, 300)
    setup_stream(js, names, messages, max_ack_pending=100)
    table = tmp_path / "table"
    config = config_for(names, nats_server.url, table)
    me = LockOwner.me("thief")
    thief = replace(me, process=replace(me.process, pid_namespace="pid:[4026530000]"))

    def steal(report: Any) -> None:
        write_owner(table, names.consumer, thief)

    with pytest.raises(RunRefusedError, match="lost its lock"):
        run_drain(spark, config, progress=AfterEachRound(steal))

    lock = table / "_js_etl" / f"{names.consumer}.lock"
    assert json.loads(lock.read_text())["run_id"] == "thief"  # not deleted by the loser
    assert spark.read.format("delta").load(str(table)).count() == 100  # round 2 not committed
    lock.unlink()
    run_drain(spark, config)
    assert_exactly_once(spark, js, names, table, good, bad)


def test_runs_of_one_consumer_into_two_tables_started_together(spark, js, names, nats_server,
                                                               tmp_path):
    """Two runs of one consumer, each writing its own table, started at the same moment: one
    holds the consumer, the other is refused before it fetches; no sequence lands twice."""
    messages, good, bad = events(names, 300)
    setup_stream(js, names, messages, max_ack_pending=100)
    tables = [tmp_path / "a", tmp_path / "b"]
    outcomes = started_together([
        partial(run_drain, spark, config_for(names, nats_server.url, table))
        for table in tables])

    refused = [i for i, o in outcomes.items() if isinstance(o, RunRefusedError)]
    assert len(refused) == 1, outcomes
    winner = 1 - refused[0]
    assert "another run holds this consumer" in str(outcomes[refused[0]])
    assert outcomes[winner].messages_written == len(good)
    assert not tables[refused[0]].exists()
    assert_exactly_once(spark, js, names, tables[winner], good, bad)


def test_run_that_lost_its_lease_stops_before_committing(spark, js, names, nats_server,
                                                         tmp_path):
    messages, good, bad = events(names, 300)
    setup_stream(js, names, messages, max_ack_pending=100)
    table = tmp_path / "table"
    config = config_for(names, nats_server.url, table)
    me = LockOwner.me("successor", str(tmp_path / "elsewhere"))
    successor = replace(me, process=replace(me.process, host="other-host"))
    kv = KeyValue(js.conn, config.source.lease_bucket)
    key = lease_key(names.stream, names.consumer)

    def take_over(report: Any) -> None:  # as a successor would once this run's lease expired
        entry = js.run(kv.get(key))
        js.run(kv.update(key, successor.to_json(), entry.revision))

    with pytest.raises(RunRefusedError, match="lost its lease"):
        run_drain(spark, config, progress=AfterEachRound(take_over))

    entry = js.run(kv.get(key))
    assert json.loads(entry.value)["run_id"] == "successor"  # not deleted by the loser
    assert spark.read.format("delta").load(str(table)).count() == 100  # round 2 not committed
    js.run(kv.delete(key, entry.revision))  # the successor ends
    run_drain(spark, config)
    assert_exactly_once(spark, js, names, table, good, bad)


# --- 6. committed keys read through Delta ------------------------------------------------------
def test_column_mapping_and_optimize_vacuum_before_the_fence(spark, js, names, nats_server,
                                                             tmp_path, monkeypatch):
    messages, good, bad = events(names, 300, poison_every=30)
    setup_stream(js, names, messages, max_ack_pending=100)
    table = tmp_path / "table"
    config = config_for(names, nats_server.url, table)
    settings = {"spark.databricks.delta.properties.defaults.columnMapping.mode": "name",
                "spark.databricks.delta.retentionDurationCheck.enabled": "false",
                # VACUUM lists the table with this many tasks (Spark's default: 10,000 — 100 s
                # per VACUUM of a 2-file table here, beside a soak).
                "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2"}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        run_drain(spark, replace(config, run=replace(config.run, max_rounds=1)))
        die_before_first_ack(monkeypatch)
        with pytest.raises(RuntimeError, match="died between commit and ack"):
            run_drain(spark, config)
        for path in (table, Path(f"{table}_dead_letters")):
            spark.sql(f"OPTIMIZE delta.`{path}`")
            spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS")

        report = run_drain(spark, config)
    finally:
        for key in settings:
            spark.conf.unset(key)

    props = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").first()["properties"]
    assert props.get("delta.columnMapping.mode") == "name"
    assert report.reacked_at_start > 0
    assert_exactly_once(spark, js, names, table, good, bad)


# --- 7. a NATS server killed mid-run:
# tests/drain/test_faults.py::test_nats_server_restarted_mid_run


def test_fence_on_an_empty_consumer_runs_no_spark_job(spark, js, names, nats_server, tmp_path):
    messages, _good, _bad = events(names, 50)
    setup_stream(js, names, messages)
    table = tmp_path / "table"
    config = config_for(names, nats_server.url, table)
    run_drain(spark, config)
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(None))

    report = run_drain(spark, config)

    assert report.stopped_because == "drained" and report.reacked_at_start == 0
    assert set(tracker.getJobIdsForGroup(None)) == before  # NATS and the lock only


def test_a_round_holding_a_seq_twice_keeps_only_its_latest_delivery(spark, tmp_path):
    """The second line of defence behind the round deadline (js_etl.drain.run): a round whose
    fetch holds a seq twice — a redelivery inside the round — is seen by the round's stats,
    and only the latest delivery of that seq is kept for the tables."""
    config = load_config(None, [
        "nats.servers=nats://127.0.0.1:4222", "source.stream=S", "source.consumer=c",
        f"target.path={tmp_path / 'table'}", "decode.format=json", "decode.schema=id BIGINT",
    ], environ={})
    drain = drain_module.Drain(spark, config, config.nats.connection_options())
    writer = SparkWriter(WriteContext(spark, config, drain.target, drain.dead_letters,
                                      drain.decoder, drain.run_id, drain.ack_prefix, None))
    deliveries = [(1, 1, 1, b'{"id":1}'), (2, 2, 1, b'{"id":2}'), (1, 3, 2, b'{"id":10}'),
                  (3, 4, 1, b"[1]")]  # (seq, consumer_seq, num_delivered, payload)
    fetched = drain.decoder.flag(spark.createDataFrame(
        [("s.x", "S", seq, cseq, n, None, None, bytearray(data), True)
         for seq, cseq, n, data in deliveries], RAW_DDL))
    assert writer._stats(fetched)[0] == RoundStats(n=4, distinct=3, dead=1, bytes=28, first=1,
                                                   last=3)
    deduped = writer._dedupe(fetched)
    try:
        assert writer._stats(deduped.rows)[0] == RoundStats(n=3, distinct=3, dead=1, bytes=20,
                                                            first=1, last=3)
        kept = {(r.seq, r.consumer_seq, r.id)
                for r in drain.decoder.rows(deduped.rows).collect()}
        assert kept == {(1, 3, 10), (2, 2, 2)}
    finally:
        writer.discard(deduped)
