"""The bounded drain against a real nats-server, real Spark and real Delta."""

from __future__ import annotations

import json
from typing import Any

import pytest
from chispa import assert_df_equality
from streams import add_stream, nak, publish_and_wait

from js_etl.config import JobConfig, load_config
from js_etl.drain.run import run_drain
from js_etl.errors import TerminalError
from js_etl.jetstream import AckPolicy, ConsumerConfig, JetStreamSession
from js_etl.jetstream.errors import ConsumerConfigError, ConsumerNotFoundError, StreamNotFoundError
from js_etl.spark.failures import failure_reason

SCHEMA = "id BIGINT, kind STRING"


def make_config(names: Any, nats_server: Any, tmp_path: Any, *extra: str) -> JobConfig:
    return load_config(None, [
        f"nats.servers={nats_server.url}",
        f"source.stream={names.stream}", f"source.consumer={names.consumer}",
        "source.create_consumer=true", f"target.path={tmp_path / 'table'}",
        "fetch.partitions=2", "fetch.batch=100", "fetch.pull_timeout=2", *extra,
    ], environ={})


def read_table(spark: Any, path: Any) -> Any:
    return spark.read.format("delta").load(str(path))


def seqs(spark: Any, path: Any) -> list[int]:
    return [r.seq for r in read_table(spark, path).select("seq").orderBy("seq").collect()]


def consumer_state(js: JetStreamSession, names: Any) -> tuple[int, int]:
    # Read once, no settling: a run returns only after the server confirmed applying its acks.
    info = js.consumer_info(names.stream, names.consumer)
    return info.num_pending, info.num_ack_pending


def test_drains_every_message_exactly_once_with_origin_columns(spark, js, names, nats_server,
                                                               tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.raw", f"m{i}".encode()) for i in range(1, 501)])
    config = make_config(names, nats_server, tmp_path)

    report = run_drain(spark, config)

    assert report.messages_written == 500
    assert report.dead_letters == 0
    assert (report.first_seq, report.last_seq) == (1, 500)
    assert report.stopped_because in {"drained", "target_reached"}
    assert report.pending_after == 0
    table = read_table(spark, tmp_path / "table")
    assert table.columns == ["subject", "stream", "seq", "consumer_seq", "num_delivered",
                             "published_at", "headers", "data"]
    expected = spark.createDataFrame(
        [(f"{names.prefix}.raw", names.stream, i, 1, bytearray(f"m{i}".encode()))
         for i in range(1, 501)],
        "subject STRING, stream STRING, seq BIGINT, num_delivered BIGINT, data BINARY")
    actual = table.select("subject", "stream", "seq", "num_delivered", "data").orderBy("seq")
    assert_df_equality(actual, expected, ignore_nullable=True)
    published = [r.published_at for r in table.select("published_at").collect()]
    assert all(p is not None for p in published)
    assert consumer_state(js, names) == (0, 0)


def test_second_run_resumes_without_gaps_or_duplicates(spark, js, names, nats_server, tmp_path):
    add_stream(js, names)
    config = make_config(names, nats_server, tmp_path)
    publish_and_wait(js, names, [(f"{names.prefix}.x", b"%d" % i) for i in range(300)])
    first = run_drain(spark, config)
    publish_and_wait(js, names, [(f"{names.prefix}.x", b"%d" % i) for i in range(300, 700)])
    second = run_drain(spark, config)

    assert (first.messages_written, second.messages_written) == (300, 400)
    assert second.first_seq == 301 and second.last_seq == 700
    assert seqs(spark, tmp_path / "table") == list(range(1, 701))
    assert second.reacked_at_start == 0  # the first run acked everything it committed


def test_json_decoded_on_schema_and_bad_payloads_dead_lettered(spark, js, names, nats_server,
                                                               tmp_path):
    add_stream(js, names)
    good = [(f"{names.prefix}.e", json.dumps({"id": i, "kind": "k"}).encode()) for i in range(20)]
    bad = [(f"{names.prefix}.e", b'{"id": 1'), (f"{names.prefix}.e", b"\xff\xfe"),
           (f"{names.prefix}.e", b'{"id": "x"}'), (f"{names.prefix}.e", b"")]
    publish_and_wait(js, names, good[:10] + bad + good[10:])
    config = make_config(names, nats_server, tmp_path, "decode.format=json",
                         f"decode.schema={SCHEMA}")

    report = run_drain(spark, config)

    assert (report.messages_written, report.dead_letters) == (20, 4)
    rows = read_table(spark, tmp_path / "table")
    assert rows.columns[-2:] == ["id", "kind"]
    assert sorted(r.id for r in rows.collect()) == list(range(20))
    dead = read_table(spark, tmp_path / "table_dead_letters").orderBy("seq").collect()
    assert [d.seq for d in dead] == [11, 12, 13, 14]
    assert [d.error for d in dead] == [
        "malformed JSON", "payload is not valid UTF-8",
        f"JSON does not match decode.schema ({SCHEMA})", "empty payload"]
    assert [bytes(d.data) for d in dead] == [b'{"id": 1', b"\xff\xfe", b'{"id": "x"}', b""]
    assert consumer_state(js, names) == (0, 0)  # dead letters are acked after their commit


def test_partitioned_table_by_date_of_published_at(spark, js, names, nats_server, tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.p", b"x")] * 30)
    config = make_config(names, nats_server, tmp_path, "decode.format=text",
                         "target.partition_by=[to_date(published_at) AS date]")

    run_drain(spark, config)

    detail = spark.sql(f"DESCRIBE DETAIL delta.`{tmp_path / 'table'}`").first()
    assert detail.partitionColumns == ["date"]
    rows = read_table(spark, tmp_path / "table").collect()
    assert len(rows) == 30
    assert {(r.text, r.date) for r in rows} == {("x", rows[0].published_at.date())}


@pytest.mark.classic_spark  # counts Spark jobs through the SparkContext's status tracker
def test_empty_consumer_ends_at_once_with_nothing_written(spark, js, names, nats_server,
                                                         tmp_path):
    add_stream(js, names)
    config = make_config(names, nats_server, tmp_path)
    tracker = spark.sparkContext.statusTracker()
    jobs_before = set(tracker.getJobIdsForGroup(None))

    report = run_drain(spark, config)

    assert (report.messages_written, report.rounds, report.writer) == (0, 0, "none")
    assert report.stopped_because == "drained"
    # No Spark job was needed to learn that nothing is pending.
    assert set(tracker.getJobIdsForGroup(None)) == jobs_before
    assert not (tmp_path / "table" / "_delta_log").exists()


def test_filter_subjects_take_only_matching_messages(spark, js, names, nats_server, tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.{'keep' if i % 3 else 'skip'}", b"%d" % i)
                                 for i in range(90)])
    config = make_config(names, nats_server, tmp_path,
                         f"source.filter_subjects=[{names.prefix}.keep]")

    report = run_drain(spark, config)

    assert report.messages_written == 60
    subjects = {r.subject for r in read_table(spark, tmp_path / "table").collect()}
    assert subjects == {f"{names.prefix}.keep"}


def test_repeated_headers_keep_every_value(spark, js, names, nats_server, tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [
        (f"{names.prefix}.h", b"a", [("Tag", "one"), ("Tag", "two"), ("Trace", "t-1")]),
        (f"{names.prefix}.h", b"b"),
    ])
    run_drain(spark, make_config(names, nats_server, tmp_path))

    rows = read_table(spark, tmp_path / "table").orderBy("seq").collect()
    assert rows[0].headers == {"Tag": ["one", "two"], "Trace": ["t-1"]}
    assert rows[1].headers is None


def test_message_larger_than_fetch_max_bytes_is_not_stuck(spark, js, names, nats_server,
                                                          tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.s", b"small")] * 5
                     + [(f"{names.prefix}.s", b"B" * 5000)]
                     + [(f"{names.prefix}.s", b"small")] * 5)
    config = make_config(names, nats_server, tmp_path, "fetch.max_bytes=1024")

    report = run_drain(spark, config)

    assert report.messages_written == 11
    big = read_table(spark, tmp_path / "table").where("seq = 6").first()
    assert bytes(big.data) == b"B" * 5000
    assert consumer_state(js, names) == (0, 0)


def test_max_ack_pending_below_partitions_times_batch(spark, js, names, nats_server, tmp_path):
    add_stream(js, names)
    js.run(js.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_wait=60, max_ack_pending=30)))
    publish_and_wait(js, names, [(f"{names.prefix}.m", b"%d" % i) for i in range(200)])
    config = make_config(names, nats_server, tmp_path, "fetch.partitions=2", "fetch.batch=100")

    report = run_drain(spark, config)

    # Rounds of at most 30 in flight: nothing stalls at the limit and nothing is lost.
    assert report.messages_written == 200
    assert report.rounds >= 7
    assert seqs(spark, tmp_path / "table") == list(range(1, 201))


def test_consumer_pull_limits_cap_every_pull(spark, js, names, nats_server, tmp_path):
    # A consumer with max_batch / max_bytes refuses larger pulls (409): the drain asks for less.
    add_stream(js, names)
    js.run(js.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_wait=60, max_batch=7, max_bytes=2048)))
    publish_and_wait(js, names, [(f"{names.prefix}.m", b"x" * 300) for _ in range(60)])
    config = make_config(names, nats_server, tmp_path, "fetch.batch=100", "fetch.max_bytes=1MiB")

    report = run_drain(spark, config)

    assert report.messages_written == 60
    assert seqs(spark, tmp_path / "table") == list(range(1, 61))
    assert consumer_state(js, names) == (0, 0)


def test_budgets_stop_early_and_the_next_run_continues(spark, js, names, nats_server, tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.b", b"%d" % i) for i in range(100)])
    config = make_config(names, nats_server, tmp_path, "run.max_messages=40", "fetch.batch=10")

    first = run_drain(spark, config)
    assert first.stopped_because == "max_messages"
    assert first.messages_written == 40
    assert first.pending_after == 60

    rounds = run_drain(spark, make_config(names, nats_server, tmp_path, "run.max_rounds=1"))
    assert rounds.rounds == 1 and rounds.stopped_because in {"max_rounds", "target_reached"}

    rest = run_drain(spark, make_config(names, nats_server, tmp_path))
    total = first.messages_written + rounds.messages_written + rest.messages_written
    assert total == 100
    assert seqs(spark, tmp_path / "table") == list(range(1, 101))


def test_missing_stream_and_consumer_are_clear_errors(spark, js, names, nats_server, tmp_path):
    with pytest.raises(StreamNotFoundError):
        run_drain(spark, make_config(names, nats_server, tmp_path))
    add_stream(js, names)
    with pytest.raises(ConsumerNotFoundError, match="source.create_consumer"):
        run_drain(spark, make_config(names, nats_server, tmp_path,
                                     "source.create_consumer=false"))


def test_existing_consumer_that_cannot_work_is_refused(spark, js, names, nats_server, tmp_path):
    add_stream(js, names)
    js.run(js.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_policy=AckPolicy.NONE)))
    with pytest.raises(ConsumerConfigError, match="explicit"):
        run_drain(spark, make_config(names, nats_server, tmp_path))


def test_every_slot_held_by_a_dead_client_is_released_and_drained(spark, js, names,
                                                                   nats_server, tmp_path):
    add_stream(js, names)
    js.run(js.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_wait=60, max_ack_pending=5)))
    publish_and_wait(js, names, [(f"{names.prefix}.n", b"x")] * 10)
    other = js.puller(names.stream, names.consumer)
    assert len(js.pull(other, 5).messages) == 5  # a client that died holds every slot

    # The fence NAKs them (the lock says no live run owns them); NAKed deliveries still count
    # as ack-pending, but the server redelivers them even at the limit, so the run goes on.
    report = run_drain(spark, make_config(names, nats_server, tmp_path))

    assert report.released_at_start == 5
    assert (report.messages_written, report.stopped_because) == (10, "drained")
    assert seqs(spark, tmp_path / "table") == list(range(1, 11))
    assert consumer_state(js, names) == (0, 0)


@pytest.mark.parametrize("kind", ["other files", "under a regular file"])
def test_unusable_target_path_is_refused_before_fetching(kind, spark, js, names, nats_server,
                                                         tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.raw", b"m")] * 5)
    if kind == "other files":
        (tmp_path / "table").mkdir()
        (tmp_path / "table" / "notes.csv").write_text("a,b\n")
        expected = r"is not a Delta table but holds other files \(notes.csv\)"
    else:
        (tmp_path / "table").write_text("a regular file")
        expected = "cannot create the run's lock .*table/_js_etl.* must be a writable directory"
    config = make_config(names, nats_server, tmp_path)

    with pytest.raises(TerminalError, match=expected) as refused:
        run_drain(spark, config)

    assert refused.value.exit_code == 2
    assert js.consumer_info(names.stream, names.consumer).delivered.stream_seq == 0


@pytest.mark.parametrize("writer", ["spark", "auto"])
def test_a_first_write_that_never_committed_does_not_block_the_next_run(writer, spark, js, names,
                                                                        nats_server, tmp_path):
    """A first write that failed (or was killed) before its commit leaves Delta's log directory
    and data files but no commit. The next run creates the table there; those files are not
    in it. (A fault schedule SIGKILLed a first run there, and every later run was refused.)"""
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", json.dumps({"id": i}).encode())
                                 for i in range(30)])
    table = tmp_path / "table"

    def dies(batches: Any) -> Any:
        for batch in batches:
            if batch.num_rows:
                raise RuntimeError("the first write dies before its commit")
            yield batch

    with pytest.raises(Exception, match="dies before its commit"):
        spark.range(10, numPartitions=2).mapInArrow(dies, "id long").write.format(
            "delta").save(str(table))
    left = {p.name for p in table.iterdir()}
    assert "_delta_log" in left and not any((table / "_delta_log").glob("*.json"))

    report = run_drain(spark, make_config(names, nats_server, tmp_path, "decode.format=json",
                                          f"decode.schema={SCHEMA}", f"target.writer={writer}"))

    assert (report.messages_written, report.writer) == (
        30, "columnar" if writer == "auto" else "spark")
    assert seqs(spark, table) == list(range(1, 31))
    assert consumer_state(js, names) == (0, 0)


def test_a_table_another_writer_creates_during_the_first_append_is_appended_to(
        spark, js, names, nats_server, tmp_path, monkeypatch):
    """Another writer (a drain of another consumer, say) creates the table while this run's
    first append is writing its files: Delta refuses that commit (both made version 0). The
    append is made again on the table as it now is; every message lands once."""
    from js_etl.delta.table import DeltaTarget

    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", b"m%d" % i) for i in range(40)])
    table, marker = tmp_path / "table", tmp_path / "created"
    real_append = DeltaTarget.append

    def create_elsewhere_once(batches: Any) -> Any:
        # In the append's own write task, after its transaction read the (missing) table.
        import os

        import pyarrow as pa
        from deltalake import write_deltalake

        for batch in batches:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                write_deltalake(str(table), pa.Table.from_batches([batch.slice(0, 0)]))
            yield batch

    def append(self: Any, spark: Any, df: Any, *args: Any, **kw: Any) -> int:
        if self.path == str(table):
            df = df.mapInArrow(create_elsewhere_once, df.schema)
        return real_append(self, spark, df, *args, **kw)

    monkeypatch.setattr(DeltaTarget, "append", append)
    report = run_drain(spark, make_config(names, nats_server, tmp_path, "decode.format=raw",
                                          "target.writer=spark"))

    assert marker.exists()  # the other writer did create the table mid-append
    assert report.messages_written == 40
    assert seqs(spark, table) == list(range(1, 41))
    assert consumer_state(js, names) == (0, 0)


# --- mistakes found before the first fetch, and a failed round released at once -------------
def test_a_table_whose_types_disagree_with_the_schema_is_refused_before_any_fetch(
        spark, js, names, nats_server, tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", json.dumps({"id": i}).encode())
                                 for i in range(20)])
    run_drain(spark, make_config(names, nats_server, tmp_path, "decode.format=json",
                                 "decode.schema=id STRING", "run.max_messages=5"))
    before = js.consumer_info(names.stream, names.consumer)

    with pytest.raises(TerminalError) as refused:
        run_drain(spark, make_config(names, nats_server, tmp_path, "decode.format=json",
                                     "decode.schema=id BIGINT"))

    assert str(refused.value) == (
        f"table {tmp_path / 'table'} has column id STRING, but this job writes it as BIGINT: "
        "make decode.schema declare id STRING, or write into a new table")
    after = js.consumer_info(names.stream, names.consumer)
    assert after.delivered == before.delivered and after.num_ack_pending == 0  # nothing fetched


def test_a_round_that_fails_after_its_fetch_releases_its_deliveries_at_once(
        spark, js, names, nats_server, tmp_path, monkeypatch):
    from js_etl.drain import run as drain_module

    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", b"m") for _ in range(50)])
    config = make_config(names, nats_server, tmp_path)  # ack_wait 300 s: nothing times out here

    def commit_fails(*args: Any, **kw: Any) -> bool:
        raise RuntimeError("the write failed")

    monkeypatch.setattr(drain_module.Drain, "_commit_and_ack", commit_fails)
    with pytest.raises(RuntimeError, match="the write failed"):
        run_drain(spark, config)

    assert js.consumer_info(names.stream, names.consumer).delivered.stream_seq == 50
    # Another client's pull is served them now, not after the 300 s ack_wait.
    again = js.pull(js.puller(names.stream, names.consumer), 100).messages
    assert sorted(m.metadata.stream_seq for m in again) == list(range(1, 51))
    assert {m.metadata.num_delivered for m in again} == {2}
    nak(js, [m.reply for m in again])
    monkeypatch.undo()
    assert run_drain(spark, config).messages_written == 50
    assert seqs(spark, tmp_path / "table") == list(range(1, 51))


def test_a_user_with_the_documented_permissions_drains_and_one_without_pulls_exits_2(
        spark, names, tmp_path, monkeypatch):
    """The permissions block of docs/running.md ("Permissions"), as written, on a real server:
    a user without the pull subject fails the run at once with exit 2 naming it (else its
    pulls, dropped by the server, looked like an empty consumer); the user with the block
    drains every message."""
    import re
    from pathlib import Path

    from js_etl.demo.server import LocalNatsServer
    from js_etl.jetstream import ConnectionOptions, Secret

    page = (Path(__file__).resolve().parents[2] / "docs" / "running.md").read_text()
    block = re.search(r"## Permissions\n.*?```\n(.*?)```", page, re.DOTALL)
    assert block, "docs/running.md has no Permissions block"
    granted = (block[1].replace("<stream>", names.stream).replace("<consumer>", names.consumer)
               .replace("<bucket>", "js-etl-leases"))
    pull = f'"$JS.API.CONSUMER.MSG.NEXT.{names.stream}.{names.consumer}", '
    assert pull in granted
    users = (f"authorization {{ users = [ {{user: admin, password: a}}\n"
             f"{{user: etl, password: e, {granted}}}\n"
             f"{{user: nopull, password: e, {granted.replace(pull, '')}}} ] }}\n")
    monkeypatch.setenv("JS_ETL_TEST_PASSWORD", "e")  # where the driver and executors read it
    with LocalNatsServer(tmp_path / "nats", config_text=users) as server:
        with JetStreamSession(ConnectionOptions(servers=(server.url,), user="admin",
                                                password=Secret("a"))) as admin:
            add_stream(admin, names)
            publish_and_wait(admin, names, [(f"{names.prefix}.e", b"%d" % i)
                                            for i in range(20)])

            def drain(user: str) -> Any:
                return run_drain(spark, load_config(None, [
                    f"nats.servers={server.url}", f"nats.user={user}",
                    "nats.password_env=JS_ETL_TEST_PASSWORD",
                    f"source.stream={names.stream}", f"source.consumer={names.consumer}",
                    "source.create_consumer=true", f"target.path={tmp_path / 'table'}",
                    "fetch.partitions=2", "fetch.pull_timeout=1"], environ={}))

            with pytest.raises(Exception) as denied:  # raised in the fetch tasks
                drain("nopull")
            line, exit_code = failure_reason(denied.value)  # what `js-etl drain` prints
            assert exit_code == 2
            assert line.startswith("AuthorizationError: NATS does not allow this user to publish "
                                   f"to $JS.API.CONSUMER.MSG.NEXT.{names.stream}.{names.consumer}"
                                   " (the server's permissions violation)"), line
            assert admin.consumer_info(names.stream, names.consumer).num_ack_pending == 0

            report = drain("etl")
            assert (report.messages_written, report.stopped_because) == (20, "drained")
            assert seqs(spark, tmp_path / "table") == list(range(1, 21))
