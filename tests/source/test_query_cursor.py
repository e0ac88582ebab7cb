"""A durable consumer either follows a Structured Streaming query (``commit_consumer``) or is
drained, never both: a drain would miss what the query moves the consumer past
(js_etl.durable.cursor). Against a real nats-server; no Spark session is needed to start a
stream reader on the driver, which is where the query claims its consumer."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from drains import assert_no_process_left, config_for, drain_process
from streams import ack, add_stream, consumer, publish_and_wait

from js_etl.drain.preflight import check_drainable
from js_etl.durable import cursor
from js_etl.durable.cursor import MARK
from js_etl.durable.lease import ConsumerLease
from js_etl.errors import ConfigError, RunRefusedError
from js_etl.jetstream.errors import ConsumerConfigError
from js_etl.source.options import SourceOptions
from js_etl.source.stream import NatsJetStreamStreamReader


def follow(url: str, stream: str, consumer_name: str) -> NatsJetStreamStreamReader:
    """A stream reader on the driver, as ``readStream…load()`` makes one, its consumer named."""
    return NatsJetStreamStreamReader(SourceOptions.parse(
        {"servers": url, "stream": stream, "commit_consumer": consumer_name}), None)


def metadata(js: Any, names: Any) -> dict[str, str]:
    return js.consumer_info(names.stream, names.consumer).config.metadata


@pytest.fixture
def ten(js: Any, names: Any) -> None:
    add_stream(js, names)
    consumer(js, names.stream, names.consumer)
    publish_and_wait(js, names, [(f"{names.prefix}.e", b"%d" % i) for i in range(10)])


def test_a_query_claims_a_fresh_consumer_and_a_drain_then_refuses_it(ten, js, names,
                                                                      nats_server, tmp_path):
    reader = follow(nats_server.url, names.stream, names.consumer)
    try:
        reader.commit({"stream": names.stream, "seq": 7})
    finally:
        reader.stop()
    assert MARK in metadata(js, names)
    assert js.consumer_info(names.stream, names.consumer).num_pending == 4
    follow(nats_server.url, names.stream, names.consumer).stop()  # its next run: still its own

    config = config_for(names, nats_server.url, tmp_path / "table")
    with pytest.raises(ConsumerConfigError, match="follows a Structured Streaming query"):
        check_drainable(config, config.nats.connection_options())
    # `js-etl drain` stops in seconds, in one line, before Spark starts, having taken nothing
    # (a run checks the same again once it holds the lease, before it pulls).
    marker = uuid.uuid4().hex
    proc = drain_process(names, nats_server.url, tmp_path / "table", None, marker)
    _, err = proc.communicate(timeout=120)
    assert_no_process_left(marker)
    assert proc.returncode == ConsumerConfigError.exit_code, err[-800:]
    lines = [line for line in err.splitlines() if line.startswith("js-etl:")]
    assert len(lines) == 1 and "follows a Structured Streaming query" in lines[0], err[-800:]
    assert "log4j" not in err
    info = js.consumer_info(names.stream, names.consumer)
    assert (info.delivered.consumer_seq, info.num_pending) == (0, 4)


def test_a_consumer_a_reader_took_messages_from_is_refused_by_a_query_and_its_job(
        ten, js, names, nats_server, tmp_path):
    taken = js.pull(js.puller(names.stream, names.consumer), 3)
    ack(js, [m.reply for m in taken.messages])

    with pytest.raises(ConfigError, match="has delivered messages to a reader"):
        follow(nats_server.url, names.stream, names.consumer)
    assert MARK not in metadata(js, names)

    marker = uuid.uuid4().hex
    proc = drain_process(names, nats_server.url, tmp_path / "table", None, marker,
                         f"streaming.checkpoint={tmp_path / 'checkpoint'}",
                         "streaming.commit_consumer=true", command="stream")
    _, err = proc.communicate(timeout=120)
    assert_no_process_left(marker)
    assert proc.returncode == ConfigError.exit_code, err[-800:]
    lines = [line for line in err.splitlines() if line.startswith("js-etl:")]
    assert len(lines) == 1 and "has delivered messages to a reader" in lines[0], err[-800:]
    assert "log4j" not in err  # refused before Spark started


def test_a_drain_starting_while_a_query_marks_its_consumer_keeps_it(
        ten, js, names, nats_server, nats_options, monkeypatch):
    """The race of js_etl.durable.cursor: a drain read the consumer unmarked and takes its
    lease just after the query wrote its mark. The query reads the lease after its mark, so it
    takes the mark back and stops; the drain goes on with its consumer unmarked."""
    lease = ConsumerLease(nats_options, names.stream, names.consumer, uuid.uuid4().hex,
                          target="/t", bucket="js-etl-leases")
    set_mark = cursor._set_mark

    def then_a_drain_starts(*args: Any, **kwargs: Any) -> None:
        set_mark(*args, **kwargs)
        if not kwargs.get("take_back"):  # the mark was written
            lease.acquire()

    monkeypatch.setattr(cursor, "_set_mark", then_a_drain_starts)
    try:
        with pytest.raises(RunRefusedError, match="another run holds this consumer"):
            follow(nats_server.url, names.stream, names.consumer)
        assert MARK not in metadata(js, names)
    finally:
        lease.release()


def test_a_reader_or_a_drain_that_came_after_the_claim_stops_the_querys_next_move(
        ten, js, names, nats_server, nats_options):
    """The query claims its consumer again before every move: a consumer recreated (or its
    config re-applied) without the mark and read by a drain meanwhile, or one whose mark was
    taken back while a drain took its lease, is not moved past what that drain has not read."""
    reader = follow(nats_server.url, names.stream, names.consumer)
    try:
        js.run(js.admin.delete_consumer(names.stream, names.consumer))
        consumer(js, names.stream, names.consumer)  # the same name, unmarked
        taken = js.pull(js.puller(names.stream, names.consumer), 2)  # a drain's first round
        ack(js, [m.reply for m in taken.messages])
        with pytest.raises(ConfigError, match="has delivered messages to a reader"):
            reader.commit({"stream": names.stream, "seq": 8})
        assert js.consumer_info(names.stream, names.consumer).delivered.stream_seq == 2

        js.run(js.admin.delete_consumer(names.stream, names.consumer))
        consumer(js, names.stream, names.consumer)
        lease = ConsumerLease(nats_options, names.stream, names.consumer, uuid.uuid4().hex,
                              target="/t", bucket="js-etl-leases")
        with lease:  # a drain holds it and has not pulled yet
            with pytest.raises(RunRefusedError, match="another run holds this consumer"):
                reader.commit({"stream": names.stream, "seq": 8})
        info = js.consumer_info(names.stream, names.consumer)
        assert MARK not in info.config.metadata and info.delivered.stream_seq == 0
    finally:
        reader.stop()


def test_a_push_consumer_is_refused_and_a_marked_one_is_not_rewound(
        ten, js, names, nats_server, tmp_path):
    from js_etl.durable.rewind import plan_rewind

    consumer(js, names.stream, f"{names.consumer}_push", deliver_subject=f"{names.prefix}push")
    with pytest.raises(ConfigError, match="is a push consumer"):
        follow(nats_server.url, names.stream, f"{names.consumer}_push")

    follow(nats_server.url, names.stream, names.consumer).stop()
    config = config_for(names, nats_server.url, tmp_path / "table")
    with pytest.raises(ConsumerConfigError, match="follows a Structured Streaming query"):
        plan_rewind(js, config, 1)


def test_a_second_query_on_a_consumer_another_query_moves_is_refused(
        ten, js, names, nats_server):
    """Each query names itself in its offsets, and the consumer's mark names the query that
    moves it: another query is refused before it plans a batch and before a move, so neither
    moves the consumer past what the other has not written (on an Interest stream that would
    delete it). The first query's next run, from its checkpoint, keeps the consumer."""
    first, second = (follow(nats_server.url, names.stream, names.consumer) for _ in range(2))
    try:
        start = first.initialOffset()
        end = first.latestOffset(start, first.getDefaultReadLimit())
        first.commit(end)  # its sink committed seqs 1..10: the consumer follows, named
        assert js.consumer_info(names.stream, names.consumer).num_pending == 0

        other = second.initialOffset()
        assert other["query"] != end["query"]
        with pytest.raises(ConfigError, match="follows another query"):
            second.latestOffset(other, second.getDefaultReadLimit())
        with pytest.raises(ConfigError, match="follows another query"):
            second.commit({**other, "seq": 5})
    finally:
        first.stop()
        second.stop()
    publish_and_wait(js, names, [(f"{names.prefix}.e", b"10")])
    rerun = follow(nats_server.url, names.stream, names.consumer)  # from the checkpoint's end
    try:
        rerun.initialOffset()  # Spark asks a restarted query too, then starts from its offsets
        later = rerun.latestOffset(end, rerun.getDefaultReadLimit())
        assert later["query"] == end["query"] and later["seq"] == 12
        rerun.commit(later)
    finally:
        rerun.stop()
    assert js.consumer_info(names.stream, names.consumer).delivered.stream_seq == 11
