"""Acks against a real nats-server, sent from a second connection as the driver does
(docs/reference/jetstream-wire-facts.md §4)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from streams import (
    ack,
    ack_confirmed,
    consumer,
    in_progress,
    nak,
    pub,
    publish_and_wait,
    settled,
    term,
    wait_until,
)

from js_etl.jetstream import JetStreamSession, PullEnd, ack_subject
from js_etl.jetstream.errors import ConsumerNotFoundError


@pytest.fixture
def js2(nats_options) -> Iterator[JetStreamSession]:
    """A second connection: acks need not travel with the messages."""
    with JetStreamSession(nats_options) as session:
        yield session


def test_ack_from_another_connection_after_the_puller_closed(js, js2, names, stream,
                                                             nats_options):
    pub(js, f"{names.prefix}.a", 4)
    consumer(js, stream, names.consumer)
    with JetStreamSession(nats_options) as puller_session:
        result = puller_session.pull(puller_session.puller(stream, names.consumer), 10)
        replies = [m.reply for m in result.messages]
    assert len(replies) == 4
    assert ack(js2, replies) == 4
    info = settled(js, stream, names.consumer, 0)
    assert (info.ack_floor.consumer_seq, info.ack_floor.stream_seq) == (4, 4)
    assert info.num_pending == 0


def test_nak_redelivers_at_once(js, js2, names, stream):
    pub(js, f"{names.prefix}.a", 1)
    consumer(js, stream, names.consumer)
    puller = js.puller(stream, names.consumer)
    (msg,) = js.pull(puller, 5).messages
    nak(js2, [msg.reply])
    again = wait_until(lambda: js.pull(puller, 5), lambda r: len(r.messages) == 1)
    meta = again.messages[0].metadata
    assert (meta.stream_seq, meta.num_delivered, meta.consumer_seq) == (1, 2, 2)


def test_nak_with_delay_redelivers_after_the_delay(js, js2, names, stream):
    pub(js, f"{names.prefix}.a", 1)
    consumer(js, stream, names.consumer)
    puller = js.puller(stream, names.consumer)
    (msg,) = js.pull(puller, 5).messages
    t0 = time.monotonic()
    nak(js2, [msg.reply], delay=1.0)

    during = js.pull(puller, 5)
    assert during.end is PullEnd.NO_MESSAGES and during.messages == []
    assert js.consumer_info(stream, names.consumer).num_ack_pending == 1  # still pending

    after = wait_until(lambda: js.pull(puller, 5), lambda r: len(r.messages) == 1,
                       interval=0.05)
    assert time.monotonic() - t0 >= 0.9  # not before its delay
    meta = after.messages[0].metadata
    assert (meta.stream_seq, meta.num_delivered) == (1, 2)


def test_term_is_never_redelivered_and_counts_as_acked(js, js2, names, stream):
    pub(js, f"{names.prefix}.a", 2)
    consumer(js, stream, names.consumer, ack_wait=1.0)
    puller = js.puller(stream, names.consumer)
    first, second = js.pull(puller, 5).messages
    t0 = time.monotonic()
    term(js2, [first.reply], reason="bad   payload\nxyz")

    # After ack_wait only the unacked second message comes back.
    time.sleep(max(0.0, 1.3 - (time.monotonic() - t0)))
    redelivered = wait_until(lambda: js.pull(puller, 5), lambda r: len(r.messages) >= 1)
    assert [m.metadata.stream_seq for m in redelivered.messages] == [2]
    assert redelivered.messages[0].metadata.num_delivered == 2
    ack(js2, [m.reply for m in redelivered.messages])
    info = settled(js, stream, names.consumer, 0)
    assert info.ack_floor.stream_seq == 2  # the termed message counts as acked
    assert second.metadata.stream_seq == 2
    # Not asserted: the server's MSG_TERMINATED advisory. It arrived in most runs, but in about
    # one run of six under load (two test workers, load ~7) it never reached a subscriber that
    # had subscribed and flushed before the TERM, within 30 s, though the TERM was applied; the
    # cause is not found (consumer.go sends it whenever the account has interest). js-etl does
    # not rely on it; the reason's folding to one line is tested in
    # tests/unit/jetstream/test_jetstream_wire.py.


def test_in_progress_keeps_a_message_from_redelivery(js, js2, names, stream):
    pub(js, f"{names.prefix}.a", 2)
    consumer(js, stream, names.consumer, ack_wait=3.0)
    puller = js.puller(stream, names.consumer)
    working, idle = js.pull(puller, 5).messages

    def progress_then_pull():
        in_progress(js2, [working.reply])  # confirmed: applied before the pull
        return js.pull(puller, 5)

    # Keep reporting progress on one while waiting: only the idle one comes back, at its
    # ack_wait; the one in progress never does.
    got = wait_until(progress_then_pull, lambda r: len(r.messages) >= 1, interval=0.05)
    assert [m.metadata.stream_seq for m in got.messages] == [idle.metadata.stream_seq]
    assert progress_then_pull().messages == []
    ack(js2, [working.reply, got.messages[0].reply])
    settled(js, stream, names.consumer, 0)


def test_ack_confirmed(js, js2, names, stream):
    pub(js, f"{names.prefix}.a", 2)
    consumer(js, stream, names.consumer)
    first, second = js.pull(js.puller(stream, names.consumer), 5).messages
    assert js2.run(ack_confirmed(js2, first.reply)) is True
    # A repeat gets the same answer: the server cannot tell them apart.
    assert js2.run(ack_confirmed(js2, first.reply)) is True
    # A delivery the server never made gets no answer.
    never = ack_subject(first.metadata.ack_prefix, 1, 999, 999)
    assert js2.run(ack_confirmed(js2, never, timeout=0.3)) is False
    info = js.consumer_info(stream, names.consumer)
    assert info.num_ack_pending == 1 and info.ack_floor.stream_seq == 1
    assert second.metadata.stream_seq == 2


def test_ack_confirmed_on_missing_consumer_raises(js, js2, names, stream):
    pub(js, f"{names.prefix}.a", 1)
    consumer(js, stream, names.consumer)
    (msg,) = js.pull(js.puller(stream, names.consumer), 5).messages
    js.run(js.admin.delete_consumer(stream, names.consumer))
    with pytest.raises(ConsumerNotFoundError):
        js2.run(ack_confirmed(js2, msg.reply, timeout=1.0))


def test_ack_on_rebuilt_subject(js, js2, names, stream):
    """The product acks from Delta rows: subjects rebuilt with timestamp/pending sent as 0."""
    pub(js, f"{names.prefix}.a", 5)
    consumer(js, stream, names.consumer, ack_wait=1.0)
    puller = js.puller(stream, names.consumer)
    result = js.pull(puller, 5)
    t0 = time.monotonic()
    rebuilt = []
    for m in result.messages:
        meta = m.metadata
        subject = ack_subject(meta.ack_prefix, meta.num_delivered, meta.stream_seq,
                              meta.consumer_seq)
        assert subject != m.reply and subject.endswith(".0.0")
        assert len(subject.split(".")) == 9
        rebuilt.append(subject)
    # One confirmed (the server applied it), the rest fire-and-forget.
    assert js2.run(ack_confirmed(js2, rebuilt[0])) is True
    assert ack(js2, rebuilt[1:]) == 4
    info = settled(js, stream, names.consumer, 0)
    assert info.ack_floor.stream_seq == 5 and info.num_redelivered == 0
    # Truly acked: nothing comes back after ack_wait.
    time.sleep(max(0.0, 1.3 - (time.monotonic() - t0)))
    assert js.pull(puller, 5).end is PullEnd.NO_MESSAGES


def test_late_ack_on_rebuilt_subject_of_an_earlier_delivery(js, js2, names, stream):
    pub(js, f"{names.prefix}.a", 1)
    consumer(js, stream, names.consumer)
    puller = js.puller(stream, names.consumer)
    (first,) = js.pull(puller, 5).messages
    nak(js2, [first.reply])
    second = wait_until(lambda: js.pull(puller, 5), lambda r: len(r.messages) == 1).messages[0]
    assert second.metadata.num_delivered == 2
    # A row written from delivery #1 acks the message now pending as delivery #2.
    meta = first.metadata
    subject = ack_subject(meta.ack_prefix, meta.num_delivered, meta.stream_seq, meta.consumer_seq)
    assert js2.run(ack_confirmed(js2, subject)) is True
    info = settled(js, stream, names.consumer, 0)
    assert info.ack_floor.stream_seq == 1


def test_ack_block_is_the_pub_commands_of_ack_subject_back_to_back():
    import pyarrow as pa

    from js_etl.jetstream.ack import ACK, AckBlock, ack_block, term_body

    delivered, seqs, cseqs = [1, 3, 1], [7, 12, 900_000_001], [2, 5, 6]
    columns = [pa.array(c, pa.int64()) for c in (delivered, seqs, cseqs)]
    subjects = [ack_subject("$JS.ACK.S.c", d, s, c)
                for d, s, c in zip(delivered, seqs, cseqs, strict=True)]
    expected = b"".join(b"PUB %s 4\r\n+ACK\r\n" % s.encode() for s in subjects)
    block = ack_block("$JS.ACK.S.c", *columns, ACK)
    assert block == AckBlock(expected, 3, subjects[-1], ACK) == AckBlock.of(subjects, ACK)
    # A slice (non-zero offset) and a non-ASCII body; a TERM block confirms with +ACK
    body = term_body("not JSON: ü")
    one = ack_block("$JS.ACK.S.c", *(c[1:2] for c in columns), body)
    assert one.commands == b"PUB $JS.ACK.S.c.3.12.5.0.0 %d\r\n%s\r\n" % (len(body), body)
    assert (one.count, one.last_subject, one.confirm_body) == (1, subjects[1], ACK)
    assert ack_block("$JS.ACK.S.c", *(c[:0] for c in columns), ACK).count == 0


def test_confirmed_block_is_applied_before_the_next_pull(js, js2, names, stream, nats_options):
    """The ordering every confirmed ack relies on (js_etl/jetstream/ack.py): a NAK block, then
    an ACK block of the same deliveries, confirmed; a pull from a third connection right after
    the confirmation must find nothing. Had the server not applied every NAK and ACK sent
    before the confirmation, the pull would be served NAKed messages (with a flush instead of
    the confirmation it was: see the ack module)."""
    from js_etl.jetstream.ack import ACK, AckBlock, nak_body

    consumer(js, stream, names.consumer, max_ack_pending=-1, ack_wait=300)
    puller = js.puller(stream, names.consumer)
    with JetStreamSession(nats_options) as js3:
        other = js3.puller(stream, names.consumer)
        for _ in range(10):
            pub(js, f"{names.prefix}.a", 2000)
            replies: list[str] = []
            while len(replies) < 2000:
                replies += [m.reply for m in js.pull(puller, 2000 - len(replies)).messages]
            naks = AckBlock.of(replies, nak_body())
            js2.run(js2.conn.nc.publish_block(naks.commands, naks.count))  # not confirmed
            assert js2.run(js2.acker.send(AckBlock.of(replies, ACK))) == 2000
            result = js3.pull(other, 2000, timeout=60)  # answered at once; bounds a failure
            assert result.end is PullEnd.NO_MESSAGES and result.messages == []
    info = js.consumer_info(stream, names.consumer)
    assert (info.num_ack_pending, info.num_pending, info.ack_floor.stream_seq) == (0, 0, 20_000)


def test_a_late_confirmation_is_waited_for_while_the_server_applies_the_block(js, js2, names,
                                                                             stream):
    """A big block on a busy server answers late. While the consumer's ack floor moves, the
    server is applying it: the wait goes on rather than sending it all again, and failing after
    the last send (400,000 acks exited 75 on a healthy server). The wait per answer here is
    100 ms: far shorter than the server needs for 200,000 acks, and longer than the pauses of a
    server on a loaded box (docs/design/acks-under-load.md)."""
    from js_etl.jetstream.ack import ACK, AckBlock, Acker

    n = 200_000
    publish_and_wait(js, names, [(f"{names.prefix}.a", b"x") for _ in range(n)])
    consumer(js, stream, names.consumer, max_ack_pending=-1)
    puller = js.puller(stream, names.consumer)
    replies: list[str] = []
    while len(replies) < n:
        replies += [m.reply for m in js.pull(puller, 20_000, max_bytes=8 << 20).messages]
    assert js.consumer_info(stream, names.consumer).num_ack_pending == n

    impatient = Acker(js2.conn, confirm_timeout=0.1, attempts=1, ack_rate=1e12)
    assert js2.run(impatient.send(AckBlock.of(replies, ACK))) == n
    info = js.consumer_info(stream, names.consumer)
    assert (info.num_ack_pending, info.ack_floor.stream_seq) == (0, n)
