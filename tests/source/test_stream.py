"""``spark.readStream.format("nats_jetstream")`` against a real nats-server, the session's Spark
and Delta's streaming sink: Trigger.AvailableNow runs that stop, batches within their limits,
restarts from the checkpoint, messages gone from the stream, the durable consumer that follows
the query's commits. The reader's offsets are also driven directly (no Spark) where what matters
is their order, not Spark's timing: the AvailableNow target is frozen however much is published
after it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes
from streams import add_stream, consumer, publish_and_wait, purge_stream, wait_until

from js_etl.errors import ConfigError, PurgedRangeError, RangeError, StreamReplacedError
from js_etl.source import register
from js_etl.source.datasource import load_error
from js_etl.source.options import SourceOptions
from js_etl.source.stream import NatsJetStreamStreamReader


@pytest.fixture(scope="module")
def source(spark: Any) -> Any:
    register(spark)
    return spark


def numbered(names: Any, lo: int, hi: int) -> list[tuple[str, bytes]]:
    return [(f"{names.prefix}.e", b'{"n": %d}' % i) for i in range(lo, hi)]


def stream_df(spark: Any, url: str, stream: str, **options: Any) -> Any:
    r = spark.readStream.format("nats_jetstream").option("servers", url).option("stream", stream)
    for key, value in options.items():
        r = r.option(key, str(value))
    return r.load()


def available_now(df: Any, table: Path, checkpoint: Path) -> list[tuple[int, dict[str, Any]]]:
    """Run ``df`` into the Delta table with Trigger.AvailableNow until it stops; the rows and
    end offset of each batch that read something."""
    query = (df.writeStream.format("delta").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start(str(table)))
    assert query.awaitTermination(600), "the AvailableNow query did not stop"
    if query.exception() is not None:
        raise query.exception()
    batches = []
    for progress in query.recentProgress:  # by attribute: over Connect its dict is empty
        end = progress.sources[0].endOffset
        if progress.numInputRows:
            batches.append((progress.numInputRows,
                            json.loads(end) if isinstance(end, str) else end))
    return batches


def rows_per_batch(batches: list[tuple[int, dict[str, Any]]]) -> list[int]:
    return [rows for rows, _ in batches]


def table_seqs(table: Path) -> list[int]:
    """The table's seqs; [] before its first commit (a running query may have made the log's
    folder but not written a commit yet)."""
    try:
        return sorted(DeltaTable(str(table)).to_pyarrow_table(columns=["seq"])
                      .column("seq").to_pylist())
    except TableNotFoundError:
        return []


def created(js: Any, names: Any) -> str:
    """The stream's creation time as an offset carries it."""
    return js.stream_info(names.stream).created.isoformat()


def direct_reader(url: str, stream: str, **options: Any) -> NatsJetStreamStreamReader:
    parsed = SourceOptions.parse({"servers": url, "stream": stream,
                                  **{k: str(v) for k, v in options.items()}})
    return NatsJetStreamStreamReader(parsed, None)


def test_available_now_reads_what_is_there_in_limited_batches_then_resumes(
        source, js, names, nats_server, tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 251))
    table, checkpoint = tmp_path / "table", tmp_path / "checkpoint"

    def run() -> list[dict[str, Any]]:
        return available_now(stream_df(source, nats_server.url, names.stream,
                                       max_messages_per_batch=100, partitions=3),
                             table, checkpoint)

    batches = run()
    assert rows_per_batch(batches) == [100, 100, 50]
    assert [end["seq"] for _, end in batches] == [101, 201, 251]
    assert table_seqs(table) == list(range(1, 251))

    publish_and_wait(js, names, numbered(names, 251, 281))
    assert rows_per_batch(run()) == [30]  # from the checkpoint: only what came since
    assert table_seqs(table) == list(range(1, 281))
    assert run() == []  # nothing new: a run that reads nothing and stops


def test_an_empty_stream_starts_a_query_that_reads_nothing_until_messages_come(
        source, js, names, nats_server, tmp_path):
    add_stream(js, names)
    table, checkpoint = tmp_path / "table", tmp_path / "checkpoint"
    df = stream_df(source, nats_server.url, names.stream)  # a batch read would refuse this
    assert available_now(df, table, checkpoint) == []
    publish_and_wait(js, names, numbered(names, 1, 11))
    assert rows_per_batch(available_now(df, table, checkpoint)) == [10]
    assert table_seqs(table) == list(range(1, 11))


def test_the_available_now_target_is_frozen_when_the_query_starts(js, names, nats_server):
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 101))
    reader = direct_reader(nats_server.url, names.stream, max_messages_per_batch=40)
    try:
        start = reader.initialOffset()
        assert start == {"stream": names.stream, "seq": 1, "created": created(js, names)}
        reader.prepareForTriggerAvailableNow()
        publish_and_wait(js, names, numbered(names, 101, 201))  # after the query started
        ends, offset = [], start
        while (end := reader.latestOffset(offset, reader.getDefaultReadLimit())) != offset:
            ends.append(end["seq"])
            offset = end
        assert ends == [41, 81, 101]  # never past what the stream held at the start
        rows = [seq for p in reader.partitions(start, offset)
                for batch in reader.read(p) for seq in batch.column("seq").to_pylist()]
        assert rows == list(range(1, 101))
    finally:
        reader.stop()


def test_a_batch_whose_messages_go_before_its_tasks_read_them_fails_there_unless_told_not_to(
        js, names, nats_server):
    """A purge between the driver's plan of a batch and its tasks: the task that finds its
    range's start gone fails (and with it the query), or reads what is left."""
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 41))
    strict = direct_reader(nats_server.url, names.stream, partitions=2)
    lenient = direct_reader(nats_server.url, names.stream, partitions=2,
                            fail_on_data_loss="false")
    try:
        start = strict.initialOffset()
        end = strict.latestOffset(start, strict.getDefaultReadLimit())
        first_half, second_half = strict.partitions(start, end)
        purge_stream(js, names.stream, keep=30)  # seqs 1..10 gone
        with pytest.raises(PurgedRangeError,
                           match="no longer holds seqs 1..10,.* first available is seq 11;"):
            list(strict.read(first_half))
        assert [seq for batch in lenient.read(first_half)
                for seq in batch.column("seq").to_pylist()] == list(range(11, 21))
        assert [seq for batch in strict.read(second_half)
                for seq in batch.column("seq").to_pylist()] == list(range(21, 41))
        purge_stream(js, names.stream, keep=15)  # now past the first half's end too
        with pytest.raises(PurgedRangeError,
                           match="no longer holds seqs 1..20,.* first available is seq 26;"):
            list(strict.read(first_half))
    finally:
        strict.stop()
        lenient.stop()


def test_messages_the_streams_limits_dropped_fail_the_next_batch_or_are_skipped(
        js, names, nats_server):
    """Retention, not a purge: a stream that keeps its last 10 messages drops the oldest as new
    ones come, between one batch's end and the next batch's planning."""
    js.run(js.admin.add_stream(names.stream, [names.subject], max_msgs=10))
    publish_and_wait(js, names, numbered(names, 1, 11))
    strict = direct_reader(nats_server.url, names.stream, max_messages_per_batch=4)
    lenient = direct_reader(nats_server.url, names.stream, max_messages_per_batch=4,
                            fail_on_data_loss="false")
    try:
        limit = strict.getDefaultReadLimit()
        first_end = strict.latestOffset(strict.initialOffset(), limit)
        assert first_end["seq"] == 5
        publish_and_wait(js, names, numbered(names, 11, 21))  # seqs 1..10 dropped
        with pytest.raises(PurgedRangeError,
                           match="no longer holds seqs 5..10,.* first available is seq 11;"):
            strict.latestOffset(first_end, limit)
        assert lenient.latestOffset(first_end, limit) == {
            "stream": names.stream, "seq": 15, "created": created(js, names), "skipped": 6}
    finally:
        strict.stop()
        lenient.stop()


def test_a_stream_deleted_and_created_again_is_not_resumed_from_the_old_checkpoint(
        source, js, names, nats_server, tmp_path):
    """Its sequences start over: resuming at the checkpoint's seq would skip the new stream's
    first messages (or, had it fewer, wait for them in silence)."""
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 21))
    table, checkpoint = tmp_path / "table", tmp_path / "checkpoint"
    assert rows_per_batch(available_now(
        stream_df(source, nats_server.url, names.stream), table, checkpoint)) == [20]
    js.run(js.admin.delete_stream(names.stream))
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 31))  # past the checkpoint's seq 21

    with pytest.raises(Exception) as raised:
        available_now(stream_df(source, nats_server.url, names.stream), table, checkpoint)
    error = load_error(raised.value)
    assert isinstance(error, StreamReplacedError), str(raised.value)[-600:]
    assert f"stream {names.stream} was deleted and created again" in str(error)
    assert "the checkpoint is at seq 21" in str(error) and "\n" not in str(error)
    assert table_seqs(table) == list(range(1, 21))  # nothing read from the new stream

    # An offset from before offsets carried the creation time: a sequence the stream has not
    # reached is the one sign left.
    reader = direct_reader(nats_server.url, names.stream)
    try:
        limit = reader.getDefaultReadLimit()
        assert reader.latestOffset({"stream": names.stream, "seq": 21}, limit)["seq"] == 31
        with pytest.raises(StreamReplacedError, match="below the query's checkpoint at seq 32:"):
            reader.latestOffset({"stream": names.stream, "seq": 32}, limit)
        with pytest.raises(StreamReplacedError):  # a restart runs its logged batch again
            reader.partitions({"stream": names.stream, "seq": 32},
                              {"stream": names.stream, "seq": 40})
    finally:
        reader.stop()


def test_max_bytes_per_batch_cuts_by_the_streams_average_message_size(js, names, nats_server):
    add_stream(js, names)
    publish_and_wait(js, names, [(f"{names.prefix}.e", b"x" * 1000)] * 100)
    state = js.stream_info(names.stream).state
    per_batch = 20 * 1024 // (state.bytes // state.messages)
    reader = direct_reader(nats_server.url, names.stream, max_bytes_per_batch="20KiB")
    try:
        start = reader.initialOffset()
        limit = reader.getDefaultReadLimit()
        assert isinstance(limit, ReadMaxBytes) and limit.max_bytes == 20 * 1024
        assert reader.latestOffset(start, limit)["seq"] == 1 + per_batch < 101
        assert reader.latestOffset(start, ReadAllAvailable())["seq"] == 101  # lifted by Spark
    finally:
        reader.stop()


def test_start_positions(js, names, nats_server):
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 11))
    tenth = js.stream_info(names.stream).state.last_ts  # when seq 10 was stored
    publish_and_wait(js, names, numbered(names, 11, 21))
    cases = {
        (): 1, (("start", "earliest"),): 1, (("start", "latest"),): 21,
        (("from_seq", 7),): 7,
        (("from_time", tenth.isoformat().replace("+00:00", "Z")),): 10,
        (("from_time", "2200-01-01T00:00:00Z"),): 21,  # the first message stored from then on
    }
    for options, seq in cases.items():
        reader = direct_reader(nats_server.url, names.stream, **dict(options))
        try:
            assert reader.initialOffset()["seq"] == seq, options
        finally:
            reader.stop()
    with pytest.raises(ConfigError, match="give at most one start"):
        direct_reader(nats_server.url, names.stream, start="latest", from_seq=3)
    with pytest.raises(ConfigError, match="a stream has no end"):
        direct_reader(nats_server.url, names.stream, to_seq=3)


def test_a_start_that_would_skip_messages_in_silence_is_refused(js, names, nats_server):
    """A from_seq past the stream's next message (the query would wait for it, then skip what
    came before), and a from_time before the first message left after a purge (what was
    stored from then on may be gone): one line each, before anything is read."""
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 21))
    purge_stream(js, names.stream, keep=5)  # seqs 1..15 gone
    before_all = "2000-01-01T00:00:00Z"
    cases = [({"from_seq": 22}, RangeError, "ends at seq 20: from_seq 22 is past its next"),
             ({"from_time": before_all}, PurgedRangeError,
              "no longer holds messages before seq 16 .* start at from_seq=16")]
    for options, error, text in cases:
        reader = direct_reader(nats_server.url, names.stream, **options)
        try:
            with pytest.raises(error, match=text):
                reader.initialOffset()
        finally:
            reader.stop()
    lenient = direct_reader(nats_server.url, names.stream, from_time=before_all,
                            fail_on_data_loss="false")
    try:
        assert lenient.initialOffset()["seq"] == 16
    finally:
        lenient.stop()


def test_messages_that_leave_the_front_while_a_task_reads_its_range_fail_it(
        js, names, nats_server):
    """Retention or a purge overtaking a task mid-read: the front passes what it has not
    read yet, though the task's first message was there. A gap the front did not make — a
    message deleted earlier, one the filter skips — is no loss, even when the front passes it
    once the task has read beyond it."""
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 101))
    options = {"partitions": 1, "batch": 10}
    strict = direct_reader(nats_server.url, names.stream, **options)
    lenient = direct_reader(nats_server.url, names.stream, fail_on_data_loss="false", **options)
    filtered = direct_reader(nats_server.url, names.stream, filter_subjects=f"{names.prefix}.a",
                             **options)

    def the_range(reader: Any, lo: int, hi: int) -> Any:
        (whole,) = reader.partitions({"stream": names.stream, "seq": lo},
                                     {"stream": names.stream, "seq": hi + 1})
        return whole

    try:
        strict_read, lenient_read = (r.read(the_range(r, 1, 100)) for r in (strict, lenient))
        assert next(strict_read).column("seq").to_pylist() == list(range(1, 11))
        assert next(lenient_read).column("seq").to_pylist() == list(range(1, 11))
        purge_stream(js, names.stream, keep=70)  # seqs 1..30 gone, 11..30 not read yet
        with pytest.raises(PurgedRangeError, match="no longer holds seqs 11..30,"):
            list(strict_read)
        assert [seq for batch in lenient_read for seq in batch.column("seq").to_pylist()] == (
            list(range(31, 101)))

        # Seqs 101..120, 105 deleted before the read; the front passes all once it is read.
        publish_and_wait(js, names, numbered(names, 101, 121))
        js.run(js.conn.request(f"STREAM.MSG.DELETE.{names.stream}", {"seq": 105}))
        holed = strict.read(the_range(strict, 101, 120))
        seqs = [*next(holed).column("seq").to_pylist(), *next(holed).column("seq").to_pylist()]
        purge_stream(js, names.stream, keep=0)
        assert list(holed) == [] and seqs == [s for s in range(101, 121) if s != 105]

        # Seqs 121..123 on a subject the filter skips, 124..143 on its own; those three go.
        publish_and_wait(js, names, [(f"{names.prefix}.b", b"{}")] * 3 + [
            (f"{names.prefix}.a", b"{}")] * 20)
        read = filtered.read(the_range(filtered, 121, 143))
        first = next(read).column("seq").to_pylist()
        js.run(js.conn.request(f"STREAM.PURGE.{names.stream}", {"filter": f"{names.prefix}.b"}))
        assert first + [seq for batch in read for seq in batch.column("seq").to_pylist()] == (
            list(range(124, 144)))
    finally:
        for reader in (strict, lenient, filtered):
            reader.stop()


def test_messages_gone_before_the_query_read_them_fail_it_in_one_line_or_are_skipped(
        source, js, names, nats_server, tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 21))
    table, checkpoint = tmp_path / "table", tmp_path / "checkpoint"
    assert rows_per_batch(available_now(
        stream_df(source, nats_server.url, names.stream), table, checkpoint)) == [20]
    publish_and_wait(js, names, numbered(names, 21, 41))
    purge_stream(js, names.stream, keep=5)  # seqs 21..35 gone before the query read them

    with pytest.raises(Exception) as raised:
        available_now(stream_df(source, nats_server.url, names.stream), table, checkpoint)
    error = load_error(raised.value)
    assert isinstance(error, PurgedRangeError), str(raised.value)[-600:]
    assert "no longer holds seqs 21..35" in str(error) and "first available is seq 36" in str(
        error) and "fail_on_data_loss=false" in str(error) and "\n" not in str(error)
    assert table_seqs(table) == list(range(1, 21))  # nothing written by the failed run

    batches = available_now(stream_df(source, nats_server.url, names.stream,
                                      fail_on_data_loss="false"), table, checkpoint)
    assert rows_per_batch(batches) == [5]
    assert batches[0][1] == {  # the gap, as the query reports it
        "stream": names.stream, "seq": 41, "created": created(js, names), "skipped": 15}
    assert table_seqs(table) == [*range(1, 21), *range(36, 41)]


def test_commit_consumer_follows_what_the_sink_committed(source, js, names, nats_server,
                                                         tmp_path):
    add_stream(js, names)
    consumer(js, names.stream, names.consumer, ack_policy="explicit")
    publish_and_wait(js, names, numbered(names, 1, 151))
    table, checkpoint = tmp_path / "table", tmp_path / "checkpoint"
    df = stream_df(source, nats_server.url, names.stream, max_messages_per_batch=100,
                   commit_consumer=names.consumer)
    assert rows_per_batch(available_now(df, table, checkpoint)) == [100, 50]
    info = js.consumer_info(names.stream, names.consumer)
    # Spark commits a batch to its source when it starts the next one: the last batch's end is
    # committed by the next run (and never before the sink committed it).
    assert info.num_pending == 50 and info.delivered.stream_seq == 100
    publish_and_wait(js, names, numbered(names, 151, 161))
    assert rows_per_batch(available_now(df, table, checkpoint)) == [10]
    info = js.consumer_info(names.stream, names.consumer)
    assert info.num_pending <= 10 and info.delivered.stream_seq >= 150
    assert table_seqs(table) == list(range(1, 161))


def test_hostile_payloads_become_error_rows(source, js, names, nats_server, tmp_path):
    add_stream(js, names)
    bad = [b"", b"{", b"\xff\xfe", b'{"n": "x"}', b"[1]", b'{"n": 1e999}']
    publish_and_wait(js, names, [(f"{names.prefix}.e", p) for p in
                                 [b'{"n": 1}', *bad, b'{"n": 2}']])
    table, checkpoint = tmp_path / "table", tmp_path / "checkpoint"
    df = stream_df(source, nats_server.url, names.stream, decode="json", schema="n BIGINT")
    assert rows_per_batch(available_now(df, table, checkpoint)) == [8]
    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["seq", "n", "error"]).to_pylist()
    rows.sort(key=lambda r: r["seq"])
    assert [r["n"] for r in rows if r["error"] is None] == [1, 2]
    assert [r["seq"] for r in rows if r["error"] is not None] == list(range(2, 8))


def test_a_query_with_the_default_trigger_reads_messages_as_they_come(
        source, js, names, nats_server, tmp_path):
    add_stream(js, names)
    publish_and_wait(js, names, numbered(names, 1, 11))
    table = tmp_path / "table"
    query = (stream_df(source, nats_server.url, names.stream).writeStream.format("delta")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start(str(table)))
    try:
        wait_until(lambda: table_seqs(table), lambda seqs: len(seqs) >= 10, timeout=300,
                   interval=0.2)
        publish_and_wait(js, names, numbered(names, 11, 16))
        seqs = wait_until(lambda: table_seqs(table), lambda seqs: len(seqs) >= 15, timeout=300,
                          interval=0.2)
    finally:
        query.stop()
    assert seqs == list(range(1, 16)) and query.exception() is None


def test_an_interest_stream_trims_behind_the_consumer_and_a_work_queue_one_is_refused(
        js, names, nats_server):
    """commit_consumer on an Interest stream: what the query committed is removed once no other
    consumer needs it. A WorkQueue stream refuses the ack-none consumers a read by position
    uses: refused when the DataFrame is made, in one line."""
    from js_etl.source.datasource import plan_read

    js.run(js.admin.add_stream(names.stream, [names.subject], retention="interest"))
    consumer(js, names.stream, names.consumer, ack_policy="explicit")
    publish_and_wait(js, names, numbered(names, 1, 11))
    reader = direct_reader(nats_server.url, names.stream, commit_consumer=names.consumer)
    try:
        reader.commit({"stream": names.stream, "seq": 8})
    finally:
        reader.stop()
    state = js.stream_info(names.stream).state
    assert (state.first_seq, state.messages) == (8, 3)

    queue = f"{names.stream}_WQ"
    js.run(js.admin.add_stream(queue, [f"{names.prefix}wq.>"], retention="workqueue"))
    with pytest.raises(ConfigError, match=f"stream {queue} is a WorkQueue stream"):
        plan_read(SourceOptions.parse({"servers": nats_server.url, "stream": queue}))
