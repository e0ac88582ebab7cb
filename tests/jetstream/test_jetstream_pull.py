"""The no_wait pull against a real nats-server: how each kind of pull ends
(docs/reference/jetstream-wire-facts.md §1–§5).

Every timing assertion has a wide margin: the point is "ended on a terminator / by counting"
versus "waited for the client deadline", which differ by seconds.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from streams import (
    ack,
    consumer,
    drained,
    pub,
    size,
    timed_pull,
    wait_until,
)

from js_etl.jetstream import JetStreamSession, JsMessage, PriorityGroupRequest, PullEnd
from js_etl.jetstream.errors import (
    BadRequestError,
    ConsumerDeletedError,
    ConsumerNotFoundError,
    ConsumerUnavailableError,
    PriorityGroupError,
    PullLimitError,
)

# An answer that came on a terminator (or by counting) arrives well before the 5 s deadlines
# these tests give; generous, so a loaded machine does not fail them (the `end` tells too).
FAST = 4.0


def probe_costs(js: JetStreamSession, stream: str, probe: str, n: int) -> list[int]:
    """max_bytes cost of the first ``n`` deliveries, measured on a probe consumer whose name has
    the same length as the consumer under test (so its ack replies have the same length)."""
    consumer(js, stream, probe)
    result = js.pull(js.puller(stream, probe), n)
    assert len(result.messages) == n
    return [size(m) for m in result.messages]


# --- §1: no_wait without max_bytes -------------------------------------------------------------
def test_empty_consumer_answers_404_at_once(js, names, stream):
    consumer(js, stream, names.consumer)
    result, elapsed = timed_pull(js, js.puller(stream, names.consumer), 10, timeout=5)
    assert result.end is PullEnd.NO_MESSAGES and drained(result.end)
    assert result.messages == []
    assert result.status is not None and result.status.code == 404
    assert result.status.description == "No Messages"
    assert result.status.headers == {}  # a 404 carries no Nats-Pending-* headers
    assert elapsed < FAST
    result.raise_for_status()  # not an error


def test_partial_batch_returns_what_is_there_then_404(js, names, stream):
    pub(js, f"{names.prefix}.a", 3, payload=b"hello")
    consumer(js, stream, names.consumer)
    result, elapsed = timed_pull(js, js.puller(stream, names.consumer), 10, timeout=5)
    assert result.end is PullEnd.NO_MESSAGES
    assert [m.metadata.stream_seq for m in result.messages] == [1, 2, 3]
    assert all(m.data == b"hello" and m.subject == f"{names.prefix}.a" for m in result.messages)
    assert result.messages[-1].metadata.num_pending == 0
    assert elapsed < FAST


def test_exactly_full_batch_ends_by_counting_without_waiting(js, names, stream):
    pub(js, f"{names.prefix}.a", 10)
    consumer(js, stream, names.consumer)
    result, elapsed = timed_pull(js, js.puller(stream, names.consumer), 10, timeout=5)
    assert result.end is PullEnd.BATCH_FULL
    assert len(result.messages) == 10
    assert result.status is None  # the server sends no terminator for a full batch
    assert elapsed < FAST  # far from the 5 s deadline
    # The last reply's pending token says nothing is left, and the request is gone on the server.
    assert result.messages[-1].metadata.num_pending == 0
    info = js.consumer_info(stream, names.consumer)
    assert (info.num_pending, info.num_ack_pending, info.num_waiting) == (0, 10, 0)


def test_over_full_batch_returns_batch_and_the_rest_comes_next(js, names, stream):
    pub(js, f"{names.prefix}.a", 20)
    consumer(js, stream, names.consumer)
    puller = js.puller(stream, names.consumer)
    first, elapsed = timed_pull(js, puller, 10, timeout=5)
    assert first.end is PullEnd.BATCH_FULL and len(first.messages) == 10 and elapsed < FAST
    assert first.messages[-1].metadata.num_pending == 10
    second = js.pull(puller, 10, timeout=5)
    assert second.end is PullEnd.BATCH_FULL
    assert [m.metadata.stream_seq for m in second.messages] == list(range(11, 21))
    assert js.pull(puller, 10, timeout=5).end is PullEnd.NO_MESSAGES


# --- §2: max_bytes -----------------------------------------------------------------------------
def test_max_bytes_runs_out_mid_batch(js, names, stream):
    pub(js, f"{names.prefix}.a", 20)
    costs = probe_costs(js, stream, names.consumer + "p", 20)
    consumer(js, stream, names.consumer + "q")
    budget = 500
    expected = max(k for k in range(21) if sum(costs[:k]) <= budget)
    assert 0 < expected < 20

    result, elapsed = timed_pull(js, js.puller(stream, names.consumer + "q"), 20,
                                 max_bytes=budget, timeout=5)
    assert result.end is PullEnd.BYTES_FULL
    assert len(result.messages) == expected
    assert result.bytes == sum(size(m) for m in result.messages) == sum(costs[:expected])
    assert result.status is not None and result.status.code == 409
    assert result.status.description == "Message Size Exceeds MaxBytes"
    # The server's own accounting agrees with the client formula, byte for byte.
    assert result.status.header("Nats-Pending-Messages") == str(20 - expected)
    assert result.status.header("Nats-Pending-Bytes") == str(budget - result.bytes)
    assert elapsed < FAST


def test_full_batch_with_budget_left_gets_batch_completed(js, names, stream):
    pub(js, f"{names.prefix}.a", 5)
    consumer(js, stream, names.consumer)
    result, elapsed = timed_pull(js, js.puller(stream, names.consumer), 2, max_bytes=100_000,
                                 timeout=5)
    assert result.end is PullEnd.BATCH_FULL and len(result.messages) == 2
    assert result.status is not None and result.status.code == 409
    assert result.status.description == "Batch Completed"
    assert result.status.header("Nats-Pending-Bytes") == str(100_000 - result.bytes)
    assert elapsed < FAST


def test_budget_consumed_exactly_ends_without_waiting(js, names, stream):
    pub(js, f"{names.prefix}.a", 10)
    costs = probe_costs(js, stream, names.consumer + "p", 10)
    consumer(js, stream, names.consumer + "q")
    consumer(js, stream, names.consumer + "r")
    exact = sum(costs[:3])

    puller = js.puller(stream, names.consumer + "q")
    result, elapsed = timed_pull(js, puller, 10, max_bytes=exact, timeout=5)
    assert result.end is PullEnd.BYTES_FULL
    assert len(result.messages) == 3
    assert result.status is None  # no terminator: we ended by counting bytes
    assert result.bytes == exact == sum(size(m) for m in result.messages)
    assert elapsed < FAST
    # Nothing late from that request leaks into the next pull on the same inbox.
    rest = js.pull(puller, 10, max_bytes=100_000, timeout=5)
    assert rest.end is PullEnd.NO_MESSAGES
    assert [m.metadata.stream_seq for m in rest.messages] == list(range(4, 11))

    # One byte less and the third message no longer fits: the server says so with a 409.
    short = js.pull(js.puller(stream, names.consumer + "r"), 10, max_bytes=exact - 1, timeout=5)
    assert short.end is PullEnd.BYTES_FULL and len(short.messages) == 2
    assert short.status is not None and short.status.code == 409


def test_oversize_message_at_the_head_is_fetched_alone(js, names, stream):
    pub(js, f"{names.prefix}.big", 1, size=2000)
    pub(js, f"{names.prefix}.small", 3, size=10)
    consumer(js, stream, names.consumer)
    puller = js.puller(stream, names.consumer)

    result, elapsed = timed_pull(js, puller, 10, max_bytes=1000, timeout=5)
    assert result.end is PullEnd.OVERSIZE
    assert [(m.metadata.stream_seq, len(m.data)) for m in result.messages] == [(1, 2000)]
    assert result.status is not None and result.status.code == 409
    assert elapsed < FAST
    ack(js, [m.reply for m in result.messages])

    # The consumer is not stuck: the messages behind it come with the next pull.
    rest = js.pull(puller, 10, max_bytes=1000, timeout=5)
    assert rest.end is PullEnd.NO_MESSAGES
    assert [m.metadata.stream_seq for m in rest.messages] == [2, 3, 4]
    ack(js, [m.reply for m in rest.messages])
    info = wait_until(lambda: js.consumer_info(stream, names.consumer),
                      lambda i: i.num_ack_pending == 0)
    assert info.num_pending == 0 and info.ack_floor.stream_seq == 4


def test_oversize_message_behind_small_ones(js, names, stream):
    pub(js, f"{names.prefix}.small", 2, size=10)
    pub(js, f"{names.prefix}.big", 1, size=2000)
    pub(js, f"{names.prefix}.small", 1, size=10)
    consumer(js, stream, names.consumer)
    puller = js.puller(stream, names.consumer)

    first = js.pull(puller, 10, max_bytes=1000, timeout=5)
    assert first.end is PullEnd.BYTES_FULL  # 409 after >= 1 message: not the oversize case
    assert [m.metadata.stream_seq for m in first.messages] == [1, 2]
    second = js.pull(puller, 10, max_bytes=1000, timeout=5)
    assert second.end is PullEnd.OVERSIZE
    assert [m.metadata.stream_seq for m in second.messages] == [3]
    third = js.pull(puller, 10, max_bytes=1000, timeout=5)
    assert third.end is PullEnd.NO_MESSAGES
    assert [m.metadata.stream_seq for m in third.messages] == [4]


# --- §5: at the ack-pending limit ----------------------------------------------------------------
def test_pull_at_max_ack_pending_ends_on_the_deadline_and_is_dropped(js, names, stream):
    pub(js, f"{names.prefix}.a", 20)
    consumer(js, stream, names.consumer, max_ack_pending=5)
    result, elapsed = timed_pull(js, js.puller(stream, names.consumer), 10, timeout=1.0)
    assert result.end is PullEnd.DEADLINE
    assert [m.metadata.stream_seq for m in result.messages] == [1, 2, 3, 4, 5]
    assert result.status is None
    assert elapsed >= 0.9  # it waited for its deadline: no status ever came
    # The inbox was unsubscribed, so the server no longer keeps the request waiting.
    info = wait_until(lambda: js.consumer_info(stream, names.consumer),
                      lambda i: i.num_waiting == 0)
    assert (info.num_ack_pending, info.num_pending) == (5, 15)


def test_requests_pending_408_while_a_larger_request_is_queued(js, names, stream):
    # docs/reference/jetstream-wire-facts.md §5: a no_wait pull gets "408 Requests Pending" at once
    # while another
    # queued request
    # wants more than the consumer has pending.
    pub(js, f"{names.prefix}.a", 20)
    consumer(js, stream, names.consumer, max_ack_pending=5)
    big, small = js.puller(stream, names.consumer), js.puller(stream, names.consumer)

    async def both():
        first = asyncio.create_task(big.pull(30, timeout=1.5))  # 5 msgs, then stuck (25 > 15)
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        second = await small.pull(10, timeout=1.0)
        elapsed = time.monotonic() - t0
        return await first, second, elapsed

    first, second, _elapsed = js.run(both())
    assert first.end is PullEnd.DEADLINE and len(first.messages) == 5
    assert second.end is PullEnd.REQUESTS_PENDING and second.messages == []
    assert second.status is not None and str(second.status) == "408 Requests Pending"
    # (the status came at once: a deadline would have ended it as DEADLINE)


# --- §3: expires + no_wait -----------------------------------------------------------------------
def test_expires_with_nothing_pending_ends_with_408_after_expires(js, names, stream):
    consumer(js, stream, names.consumer)
    result, elapsed = timed_pull(js, js.puller(stream, names.consumer), 10, expires=1.0,
                                 timeout=4)
    assert result.end is PullEnd.EXPIRED
    assert result.status is not None and str(result.status) == "408 Request Timeout"
    assert result.status.header("Nats-Pending-Messages") == "10"
    assert elapsed >= 0.9  # the server waited for expires (our deadline was 4 s: the end says)


def test_expires_waits_for_the_first_message_then_stops_when_drained(js, names, stream):
    consumer(js, stream, names.consumer)
    puller = js.puller(stream, names.consumer)

    async def pull_and_publish_later():
        task = asyncio.create_task(puller.pull(10, expires=3.0, timeout=5))
        await asyncio.sleep(0.3)
        for _ in range(3):
            await js.conn.nc.publish(f"{names.prefix}.a", b"late")
        await js.conn.nc.flush()
        return await task

    result = js.run(pull_and_publish_later())
    # Ended by the 404 once the stream was drained, not by the 3 s expiry (that is a 408),
    # with what the stream held when the first message came: the first at least; those stored
    # after that moment (a loaded box stores them apart) stay pending.
    assert result.end is PullEnd.NO_MESSAGES
    got = [m.data for m in result.messages]
    assert 1 <= len(got) <= 3 and set(got) == {b"late"}
    # A flush answered means the server read the publishes, not that the stream stored them
    # (its ingest queue runs apart): the count below is taken once all three are stored.
    wait_until(lambda: js.stream_info(stream).state.messages, lambda n: n == 3,
               what="three stored messages")
    assert js.consumer_info(stream, names.consumer).num_pending == 3 - len(got)


# --- error statuses ------------------------------------------------------------------------------
def test_priority_out_of_range_is_a_bad_request(js, names, stream):
    pub(js, f"{names.prefix}.a", 1)
    consumer(js, stream, names.consumer)
    result = js.pull(js.puller(stream, names.consumer,
                               priority_group=PriorityGroupRequest("jobs", priority=10)), 5,
                     timeout=5)
    assert result.end is PullEnd.ERROR
    assert str(result.status) == "400 Bad Request - Priority must be between 0 and 9"
    with pytest.raises(BadRequestError) as err:
        result.raise_for_status()
    # A bad value, not a priority-group problem: nothing about the group needs fixing.
    assert not isinstance(err.value, PriorityGroupError)
    assert "between 0 and 9" in str(err.value)


def test_request_above_consumer_limits_raises_pull_limit_error(js, names, stream):
    pub(js, f"{names.prefix}.a", 3)
    consumer(js, stream, names.consumer, max_batch=2, max_bytes=1000)
    puller = js.puller(stream, names.consumer)
    too_many = js.pull(puller, 5, timeout=5)
    assert too_many.end is PullEnd.ERROR
    assert str(too_many.status) == "409 Exceeded MaxRequestBatch of 2"
    with pytest.raises(PullLimitError, match="MaxRequestBatch"):
        too_many.raise_for_status()
    too_big = js.pull(puller, 2, max_bytes=5000, timeout=5)
    assert too_big.end is PullEnd.ERROR  # not mistaken for the oversize-message case
    assert str(too_big.status) == "409 Exceeded MaxRequestMaxBytes of 1000"
    with pytest.raises(PullLimitError):
        too_big.raise_for_status()
    # Within the limits the consumer serves normally.
    assert len(js.pull(puller, 2, max_bytes=1000, timeout=5).messages) == 2


def test_pull_on_missing_consumer_is_unavailable_until_its_info_says_missing(js, names, stream):
    result, elapsed = timed_pull(js, js.puller(stream, "nosuch"), 5, timeout=5)
    assert result.end is PullEnd.ERROR
    assert result.status is not None and result.status.code == 503
    assert result.status.header("Nats-Subject") == f"$JS.API.CONSUMER.MSG.NEXT.{stream}.nosuch"
    assert elapsed < FAST
    # The same 503 answers a pull while a consumer's leader is elected: transient.
    with pytest.raises(ConsumerUnavailableError, match="nosuch"):
        result.raise_for_status()
    with pytest.raises(ConsumerNotFoundError, match="nosuch"):  # its info confirms it missing
        js.consumer_info(stream, "nosuch")


def test_consumer_deleted_while_a_pull_waits(js, names, stream):
    consumer(js, stream, names.consumer)
    puller = js.puller(stream, names.consumer)

    async def pull_then_delete():
        task = asyncio.create_task(puller.pull(5, expires=3.0, timeout=5))
        await asyncio.sleep(0.3)
        await js.admin.delete_consumer(stream, names.consumer)
        return await task

    result = js.run(pull_then_delete())
    assert result.end is PullEnd.ERROR
    assert str(result.status) == "409 Consumer Deleted"  # ended by it, not by expiry (408)
    with pytest.raises(ConsumerDeletedError):
        result.raise_for_status()


# --- headers as stored ---------------------------------------------------------------------------
def test_repeated_header_keeps_every_value_in_order(js, names, stream):
    subject = f"{names.prefix}.h"
    header = b"NATS/1.0\r\nX-Tag: first\r\nX-Other: 1\r\nX-Tag: second\r\nX-Tag: third\r\n\r\n"
    payload = b'{"id":1}'

    async def hpub():
        nc = js.conn.nc
        cmd = b"HPUB %s %d %d\r\n%s%s\r\n" % (subject.encode(), len(header),
                                               len(header) + len(payload), header, payload)
        await nc._send_command(cmd)
        await nc.flush()

    js.run(hpub())
    # A plain HPUB is stored asynchronously: pull only once the stream holds it.
    wait_until(lambda: js.stream_info(stream).state.messages, lambda n: n == 1)
    consumer(js, stream, names.consumer)
    result = js.pull(js.puller(stream, names.consumer), 5, timeout=5)
    assert result.end is PullEnd.NO_MESSAGES and len(result.messages) == 1
    msg: JsMessage = result.messages[0]
    assert msg.data == payload
    assert msg.raw_headers == header  # stored and delivered byte for byte
    assert msg.headers == {"X-Tag": ["first", "second", "third"], "X-Other": ["1"]}
    assert size(msg) == len(subject) + len(msg.reply) + len(header) + len(payload)
    assert result.bytes == size(msg)


def test_message_size_with_headers_matches_server_accounting(js, names, stream):
    # With headers the cost includes the header block (docs/reference/jetstream-wire-facts.md §2:
    # 180 = 147 + 33).
    async def publish_with_header():
        for _i in range(3):
            await js.conn.nc.publish(f"{names.prefix}.h", b"y" * 50,
                                     headers={"X-Probe": "0123456789"})
        await js.conn.nc.flush()

    js.run(publish_with_header())
    # Plain publishes are stored asynchronously: probe only once the stream holds them.
    wait_until(lambda: js.stream_info(stream).state.messages, lambda n: n == 3)
    costs = probe_costs(js, stream, names.consumer + "p", 3)
    consumer(js, stream, names.consumer + "q")
    result = js.pull(js.puller(stream, names.consumer + "q"), 3, max_bytes=sum(costs[:2]),
                     timeout=5)
    assert result.end is PullEnd.BYTES_FULL and len(result.messages) == 2
    assert result.status is None
    assert all(m.raw_headers and m.headers == {"X-Probe": ["0123456789"]}
               for m in result.messages)
