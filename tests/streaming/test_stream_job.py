"""``js-etl stream``: the job's stream into its Delta tables with Trigger.AvailableNow, against
a real nats-server, Spark and Delta; SIGKILLed at random points of its micro-batches and run
again from its checkpoint, every message lands once (read back with ``deltalake``, a reader
independent of Spark).

``JS_ETL_STREAM_KILLS=N`` sets how many kills the randomized test makes (default 1, ``make
test``'s share; docs/design/streaming.md gives a run of 30), and ``JS_ETL_STREAM_SEED`` its
seed (default fixed); the kill points drawn are printed."""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from drains import assert_no_process_left, config_for, drain_process, events, table_seqs
from streams import add_stream, consumer, publish_and_wait, purge_stream

from js_etl import faults
from js_etl.errors import ConfigError, PurgedRangeError, RunRefusedError, TerminalError
from js_etl.streaming.run import run_stream

pytestmark = [pytest.mark.slow, pytest.mark.classic_spark]  # Connect: not run over it yet

BATCH = 80  # sequences a batch of the randomized kill test
KILL_POINTS = ("kill_before_batch_write", "kill_between_tables", "kill_after_batch_write",
               "offsets_logged")  # the last: Spark logged the batch's offsets (test kills)


def seqs(table: Path) -> list[int]:
    if not (table / "_delta_log").exists():
        return []
    return sorted(DeltaTable(str(table)).to_pyarrow_table(columns=["seq"])
                  .column("seq").to_pylist())


def test_a_stream_run_writes_rows_and_dead_letters_and_the_next_run_resumes(
        spark, js, names, nats_server, tmp_path):
    messages, good, bad = events(names, 300, poison_every=29)
    add_stream(js, names)
    consumer(js, names.stream, names.consumer)
    publish_and_wait(js, names, messages)
    table = tmp_path / "table"
    config = config_for(names, nats_server.url, table,
                        f"streaming.checkpoint={tmp_path / 'checkpoint'}",
                        "streaming.max_messages_per_batch=120",
                        "streaming.commit_consumer=true")

    report = run_stream(spark, config)

    assert (report.messages_written, report.dead_letters) == (len(good), len(bad))
    assert [(b["first_seq"], b["last_seq"]) for b in report.batches] == [
        (1, 120), (121, 240), (241, 300)]
    # [from, to) in sequences; Spark gives no start for a new query's first batch
    assert [b["offsets"] for b in report.batches] == [[None, 121], [121, 241], [241, 301]]
    assert report.batches_already_written == 0 and len(report.delta_versions) == 3
    assert seqs(table) == good and seqs(Path(f"{table}_dead_letters")) == bad
    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["seq", "id"]).to_pylist()
    assert all(r["id"] == r["seq"] - 1 for r in rows)  # decoded as the drain decodes
    info = js.consumer_info(names.stream, names.consumer)
    assert (info.num_pending, info.delivered.stream_seq) == (0, 300)  # follows the commits

    more, _, _ = events(names, 10)
    publish_and_wait(js, names, more)
    again = run_stream(spark, config)
    assert (again.messages_written, [b["first_seq"] for b in again.batches]) == (10, [301])
    assert seqs(table) == [*good, *range(301, 311)]
    assert run_stream(spark, config).batches == []  # nothing new: nothing written

    publish_and_wait(js, names, more)
    purge_stream(js, names.stream, keep=5)  # seqs 311..315 gone before a run read them
    with pytest.raises(PurgedRangeError, match="no longer holds seqs 311..315") as raised:
        run_stream(spark, config)
    assert raised.value.exit_code == 2


def test_a_stream_run_keeps_its_table_and_checkpoint_in_s3_and_resumes_from_there(
        spark, js, names, nats_server, s3):
    """The table, its dead letters and the query's checkpoint in a bucket of a real
    S3-compatible store, reached through the AWS_* variables only; the next run reads the
    checkpoint back from the bucket and writes only what is new."""
    from js_etl.delta.store import TableFiles

    messages, good, bad = events(names, 200, poison_every=29)
    add_stream(js, names)
    publish_and_wait(js, names, messages)
    table, checkpoint = f"{s3}/events", f"{s3}/checkpoints/events"
    config = config_for(names, nats_server.url, table, f"streaming.checkpoint={checkpoint}",
                        "streaming.max_messages_per_batch=120")
    report = run_stream(spark, config)
    assert [(b["first_seq"], b["last_seq"]) for b in report.batches] == [(1, 120), (121, 200)]
    assert TableFiles(checkpoint).names("commits")  # Spark's commit log, in the bucket

    more, _, _ = events(names, 10)
    publish_and_wait(js, names, more)
    again = run_stream(spark, config)
    assert [(b["first_seq"], b["last_seq"]) for b in again.batches] == [(201, 210)]
    assert table_seqs(spark, names, table) == [*good, *range(201, 211)]
    assert table_seqs(spark, names, f"{table}_dead_letters") == bad


def test_a_stream_run_without_a_checkpoint_or_stream_or_over_connect_fails_in_one_line(
        names, nats_server, tmp_path):
    table = tmp_path / "table"
    cases = [
        ((), "streaming.checkpoint is required"),
        ((f"streaming.checkpoint={tmp_path / 'cp'}",), f"stream {names.stream!r} not found"),
        ((f"streaming.checkpoint={tmp_path / 'cp'}", "spark.remote=sc://127.0.0.1:15002"),
         "js-etl stream does not run over Spark Connect"),
    ]
    for extra, text in cases:
        proc = drain_process(names, nats_server.url, table, None, uuid.uuid4().hex, *extra,
                             command="stream")
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == ConfigError.exit_code, err[-800:]
        lines = [line for line in err.splitlines() if line.startswith("js-etl:")]
        assert len(lines) == 1 and text in lines[0], err[-800:]
        assert "log4j" not in err  # refused before Spark started


def _committed(checkpoint: Path) -> tuple[int, int]:
    """How many batches the query has committed (Spark's commit log: one file per batch), and
    the first sequence after them (the last line of the last one's offset log entry)."""
    commits = checkpoint / "commits"
    done = len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0
    if done == 0:
        return 0, 1
    entry = (checkpoint / "offsets" / str(done - 1)).read_text().strip().splitlines()[-1]
    return done, int(json.loads(entry)["seq"])


def test_a_checkpoint_older_than_its_table_is_refused_not_resumed(
        spark, js, names, nats_server, tmp_path):
    """A checkpoint put back from an earlier copy: Spark plans the next batch afresh, under a
    batch id the table already holds with another range. Skipping it as written before would
    lose the difference where the batch now goes beyond it (seqs 36..40 here), or write again
    what the held batch has past its new end (a smaller batch: a lower limit, or a byte limit
    after the stream's average size grew)."""
    add_stream(js, names)
    table, checkpoint = tmp_path / "table", tmp_path / "checkpoint"

    def config(per_batch: int) -> Any:
        return config_for(names, nats_server.url, table, f"streaming.checkpoint={checkpoint}",
                          f"streaming.max_messages_per_batch={per_batch}")

    def publish(n: int) -> None:
        publish_and_wait(js, names, events(names, n)[0])

    def put_back_the_copy() -> None:
        shutil.rmtree(checkpoint)
        shutil.copytree(tmp_path / "copy", checkpoint)

    publish(30)
    assert len(run_stream(spark, config(10)).batches) == 3
    shutil.copytree(checkpoint, tmp_path / "copy")
    publish(5)
    assert [b["first_seq"] for b in run_stream(spark, config(10)).batches] == [31]  # 31..35
    publish(20)
    for per_batch, planned in ((10, "31..40"), (2, "31..32")):
        put_back_the_copy()
        with pytest.raises(TerminalError, match="already holds batch 3 of this query as seqs "
                           f"31..35, but its checkpoint now plans batch 3 as seqs {planned}: the "
                           "checkpoint is older than the table") as raised:
            run_stream(spark, config(per_batch))
        assert raised.value.exit_code == 2 and "\n" not in str(raised.value)
        assert seqs(table) == list(range(1, 36))  # nothing more written


def test_a_batch_written_before_a_crash_is_skipped_though_a_message_left_it_since(
        spark, js, names, nats_server, tmp_path, monkeypatch):
    """The run dies once its batch 1 is in the table, before Spark logged its commit (the
    random-kill test's SIGKILL there, as an error in this process); then a message of that
    batch is deleted (a GDPR delete, retention). The next run reads the batch again from its
    logged offsets, less that message: the same batch, not a checkpoint older than the
    table."""
    add_stream(js, names)
    table, checkpoint = tmp_path / "table", tmp_path / "checkpoint"
    config = config_for(names, nats_server.url, table, f"streaming.checkpoint={checkpoint}",
                        "streaming.max_messages_per_batch=10")
    publish_and_wait(js, names, events(names, 30)[0])

    def crash_after_batch_1(point: str, batch_id: int) -> None:
        if (point, batch_id) == ("kill_after_batch_write", 1):
            raise RuntimeError("crashed after the batch's appends")

    monkeypatch.setattr(faults, "kill_at_batch", crash_after_batch_1)
    with pytest.raises(Exception, match="crashed after the batch's appends"):
        run_stream(spark, config)
    monkeypatch.undo()
    assert seqs(table) == list(range(1, 21))  # batches 0 and 1 written, 1 not committed
    js.run(js.conn.request(f"STREAM.MSG.DELETE.{names.stream}", {"seq": 11}))

    report = run_stream(spark, config)
    assert report.batches_already_written == 1 and report.messages_written == 10
    assert seqs(table) == list(range(1, 31))  # seq 11 was written before it was deleted


def test_stream_runs_killed_at_random_points_write_every_message_once(
        spark, js, names, nats_server, tmp_path):
    rng = random.Random(int(os.environ.get("JS_ETL_STREAM_SEED", "20261129")))
    kills = int(os.environ.get("JS_ETL_STREAM_KILLS", "1"))
    add_stream(js, names)
    consumer(js, names.stream, names.consumer)
    table, checkpoint = tmp_path / "table", tmp_path / "checkpoint"
    settings = (f"streaming.checkpoint={checkpoint}",
                f"streaming.max_messages_per_batch={BATCH}",
                "streaming.commit_consumer=true")
    good: list[int] = []
    bad: list[int] = []
    log: list[str] = []

    def publish(n: int) -> None:
        base = js.stream_info(names.stream).state.last_seq
        messages, g, b = events(names, n, poison_every=13)
        publish_and_wait(js, names, messages)
        good.extend(base + s for s in g)
        bad.extend(base + s for s in b)

    def run(point: str, batch: int) -> int:
        marker = uuid.uuid4().hex
        fault = point if point != "offsets_logged" else None
        proc = drain_process(names, nats_server.url, table, fault, marker, *settings,
                             command="stream", env_extra={"JS_ETL_FAULT_BATCH": str(batch)})
        if point == "offsets_logged":  # Spark logged the batch's offsets: kill it there
            offsets = checkpoint / "offsets" / str(batch)
            while proc.poll() is None and not offsets.exists():
                time.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
        _, err = proc.communicate(timeout=300)
        assert_no_process_left(marker)
        assert proc.returncode in (0, -9), f"{log}: {proc.returncode}: {err[-1500:]}"
        return proc.returncode

    publish(160)
    for _ in range(kills):
        done, next_seq = _committed(checkpoint)
        unread = js.stream_info(names.stream).state.last_seq - next_seq + 1
        if unread <= 0 or rng.random() < 0.3:  # the next run's AvailableNow target moves
            publish(rng.randint(1, 200))
            unread = js.stream_info(names.stream).state.last_seq - next_seq + 1
        # One of the batches this run will make (80 sequences each), at one of its points.
        point = rng.choice(KILL_POINTS)
        batch = done + rng.randint(0, (unread - 1) // BATCH)
        code = run(point, batch)
        log.append(f"{point}@batch{batch}: {'killed' if code == -9 else 'ran to its end'}")
    # The last run, which nothing kills, in this process: the same query from the checkpoint.
    run_stream(spark, config_for(names, nats_server.url, table, *settings))

    assert seqs(table) == sorted(good), log  # every good message once
    assert seqs(Path(f"{table}_dead_letters")) == sorted(bad), log
    info = js.consumer_info(names.stream, names.consumer)
    assert info.num_pending == 0, log  # the consumer followed to the end
    assert any(entry.endswith("killed") for entry in log), log  # else it tested no kill
    if "JS_ETL_STREAM_SEED" not in os.environ:
        # The default seed's first kill lands after a batch's appends, before Spark commits the
        # batch: the window in which only the tables' transactions keep it from being written
        # twice when the next run runs it again.
        assert log[0] == "kill_after_batch_write@batch1: killed", log
    print(f"kill points ({sum(e.endswith('killed') for e in log)} of {len(log)} landed):", log)


def test_two_runs_of_one_stream_job_at_once_write_every_message_once(
        js, names, nats_server, tmp_path):
    """A second run started while the first runs (a scheduler retry, a manual run): the
    checkpoint has one writer, so one of them stops, in one line; the table holds every message
    once."""
    messages, good, bad = events(names, 120, poison_every=31)
    add_stream(js, names)
    publish_and_wait(js, names, messages)
    table = tmp_path / "table"
    settings = (f"streaming.checkpoint={tmp_path / 'checkpoint'}",
                "streaming.max_messages_per_batch=40")
    marker = uuid.uuid4().hex
    runs = [drain_process(names, nats_server.url, table, None, marker, *settings,
                          command="stream") for _ in range(2)]
    outcomes = [(proc.returncode, err) for proc in runs
                for _, err in [proc.communicate(timeout=600)]]
    assert_no_process_left(marker)
    codes = sorted(code for code, _ in outcomes)
    assert codes[0] == 0, outcomes  # one ran to its AvailableNow target: all of the stream
    for code, err in outcomes:
        if code != 0:  # the second writer of the checkpoint, stopped by Spark
            assert code == RunRefusedError.exit_code, err[-2000:]
            lines = [line for line in err.splitlines() if line.startswith("js-etl:")]
            assert len(lines) == 1 and "another run of this stream job" in lines[0], err[-2000:]
    assert seqs(table) == good and seqs(Path(f"{table}_dead_letters")) == bad
