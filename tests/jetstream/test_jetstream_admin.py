"""Admin requests against a real nats-server: typed info, err_code mapping, the drain consumer,
consumer reset (docs/reference/jetstream-wire-facts.md §7, §8)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from streams import ack, consumer, pub, wait_until

from js_etl.durable.policy import ensure_drain_consumer
from js_etl.errors import TerminalError
from js_etl.jetstream import (
    AckPolicy,
    ConsumerConfig,
    JetStreamAdmin,
    PriorityGroupRequest,
    PriorityGroupState,
    PriorityPolicy,
    PullEnd,
)
from js_etl.jetstream.errors import (
    BadRequestError,
    ConsumerConfigError,
    ConsumerExistsError,
    ConsumerNotFoundError,
    PriorityGroupError,
    StreamNotFoundError,
)


def test_stream_info_typed_fields(js, names, stream):
    empty = js.stream_info(stream)
    assert empty.name == stream and empty.subjects == (names.subject,)
    assert empty.storage == "file"
    assert (empty.state.messages, empty.state.first_seq, empty.state.last_seq) == (0, 0, 0)
    assert empty.state.first_ts is None and empty.state.last_ts is None  # zero time -> None

    subject = f"{names.prefix}.a"
    pub(js, subject, 10, size=256)
    info = js.stream_info(stream)
    state = info.state
    assert (state.messages, state.first_seq, state.last_seq) == (10, 1, 10)
    # docs/reference/jetstream-wire-facts.md §8: subject + payload + 30 B
    assert state.bytes == 10 * (len(subject) + 256 + 30)
    assert state.num_subjects == 1 and state.consumer_count == 0
    now = datetime.now(UTC)
    assert state.first_ts is not None and state.last_ts is not None
    assert state.first_ts.tzinfo is not None and abs(now - state.last_ts) < timedelta(minutes=1)
    assert state.first_ts <= state.last_ts
    assert info.created is not None and info.created <= state.first_ts


def test_consumer_info_typed_fields(js, names, stream):
    pub(js, f"{names.prefix}.a", 10)
    created = consumer(js, stream, names.consumer, ack_wait=45)
    assert created.name == names.consumer and created.stream_name == stream
    assert created.config.ack_policy is AckPolicy.EXPLICIT
    assert created.config.ack_wait == 45.0  # ns on the wire, seconds here
    assert created.config.max_ack_pending == 1000 and created.config.max_waiting == 512
    assert created.num_pending == 10 and created.delivered.last_active is None
    assert created.priority_groups == ()

    result = js.pull(js.puller(stream, names.consumer), 5)
    ack(js, [m.reply for m in result.messages[:2]])
    info = wait_until(lambda: js.consumer_info(stream, names.consumer),
                      lambda i: i.num_ack_pending == 3)
    assert info.num_pending == 5
    assert (info.delivered.consumer_seq, info.delivered.stream_seq) == (5, 5)
    assert (info.ack_floor.consumer_seq, info.ack_floor.stream_seq) == (2, 2)
    assert info.delivered.last_active is not None and info.ack_floor.last_active is not None
    assert info.num_redelivered == 0 and info.num_waiting == 0
    assert info.ts is not None and info.created is not None


def test_consumer_info_priority_group_state(js, names, stream):
    js.run(js.admin.create_consumer(stream, ConsumerConfig(
        durable_name=names.consumer, priority_groups=("jobs", "extra"),
        priority_policy=PriorityPolicy.OVERFLOW)))
    info = js.consumer_info(stream, names.consumer)
    assert info.config.priority_groups == ("jobs", "extra")
    assert info.config.priority_policy is PriorityPolicy.OVERFLOW
    assert info.config.metadata.get("_nats.req.level") == "1"
    # Measured on 2.15.1: the state lists only the first group, though both are configured.
    assert info.priority_groups[0] == PriorityGroupState("jobs")
    assert info.pinned_id("jobs") is None and info.pinned_id("nope") is None

    pinned = names.consumer + "p"
    js.run(js.admin.create_consumer(stream, ConsumerConfig(
        durable_name=pinned, priority_groups=("jobs",),
        priority_policy=PriorityPolicy.PINNED_CLIENT, priority_timeout=30)))
    pub(js, f"{names.prefix}.a", 1)
    puller = js.puller(stream, pinned, priority_group=PriorityGroupRequest("jobs"))
    # The consumer existed before the publish: it learns of the message asynchronously, and a
    # no_wait pull in between is answered 404 (seen once, at load ~11, three test workers).
    wait_until(lambda: js.pull(puller, 1), lambda r: len(r.messages) == 1)
    state = js.consumer_info(stream, pinned)
    assert state.config.priority_timeout == 30.0
    (group,) = state.priority_groups
    assert group.group == "jobs" and group.pinned_client_id == puller.pin_id
    assert group.pinned_ts is not None and group.pinned_ts.tzinfo is not None


def test_missing_names_map_to_typed_errors(js, names, stream):
    with pytest.raises(StreamNotFoundError) as err:
        js.stream_info("NOPE" + names.stream)
    assert (err.value.code, err.value.err_code) == (404, 10059)
    with pytest.raises(ConsumerNotFoundError) as err:
        js.consumer_info(stream, "nope")
    assert (err.value.code, err.value.err_code) == (404, 10014)
    # The stream is checked first.
    with pytest.raises(StreamNotFoundError):
        js.consumer_info("NOPE" + names.stream, "nope")


def test_create_consumer_errors_are_typed(js, names, stream):
    consumer(js, stream, names.consumer)
    with pytest.raises(ConsumerExistsError) as err:
        consumer(js, stream, names.consumer, ack_wait=5)
    assert err.value.err_code == 10148
    with pytest.raises(BadRequestError) as err:
        consumer(js, stream, "g1", priority_groups=("jobs",))
    assert err.value.err_code == 10196
    with pytest.raises(BadRequestError) as err:
        consumer(js, stream, "g2", priority_policy=PriorityPolicy.OVERFLOW)
    assert err.value.err_code == 10159
    # action=update changes an existing consumer instead.
    updated = js.run(js.admin.create_consumer(
        stream, ConsumerConfig(durable_name=names.consumer, ack_wait=5), action="update"))
    assert updated.config.ack_wait == 5.0


def test_unpin_unknown_group_is_a_priority_group_error(js, names, stream):
    js.run(js.admin.create_consumer(stream, ConsumerConfig(
        durable_name=names.consumer, priority_groups=("jobs",),
        priority_policy=PriorityPolicy.PINNED_CLIENT)))
    with pytest.raises(PriorityGroupError) as err:
        js.run(js.admin.unpin(stream, names.consumer, "nope"))
    assert err.value.err_code == 10160
    js.run(js.admin.unpin(stream, names.consumer, "jobs"))  # nobody pinned: still fine


# --- the drain consumer --------------------------------------------------------------------------
def test_ensure_drain_consumer_creates_when_missing(js, names, stream):
    desired = ConsumerConfig(durable_name=names.consumer, ack_wait=10, max_ack_pending=20_000)
    info = js.run(ensure_drain_consumer(js.admin, stream, desired, create=True, min_ack_wait=60))
    assert info.name == names.consumer
    assert info.config.ack_wait == 60.0  # raised to what one round needs
    assert info.config.max_ack_pending == 20_000
    assert info.config.ack_policy is AckPolicy.EXPLICIT
    # Existing and fit: returned as is, nothing changed.
    again = js.run(ensure_drain_consumer(js.admin, stream, desired, create=False, min_ack_wait=60))
    assert again.config == info.config


def test_ensure_drain_consumer_refuses_to_create_when_not_allowed(js, names, stream):
    desired = ConsumerConfig(durable_name=names.consumer)
    with pytest.raises(ConsumerNotFoundError) as err:
        js.run(ensure_drain_consumer(js.admin, stream, desired, create=False, min_ack_wait=60))
    message = str(err.value)
    assert names.consumer in message and stream in message
    assert "create_consumer: true" in message and "nats consumer add" in message
    with pytest.raises(ConsumerNotFoundError):  # and nothing was created
        js.consumer_info(stream, names.consumer)


@pytest.mark.parametrize("policy", [AckPolicy.NONE, AckPolicy.ALL])
def test_ensure_drain_consumer_refuses_wrong_ack_policy(js, names, stream, policy):
    consumer(js, stream, names.consumer, ack_policy=policy, ack_wait=120)
    desired = ConsumerConfig(durable_name=names.consumer)
    with pytest.raises(ConsumerConfigError) as err:
        js.run(ensure_drain_consumer(js.admin, stream, desired, create=True, min_ack_wait=60))
    assert isinstance(err.value, TerminalError)
    message = str(err.value)
    assert f"ack policy is '{policy.value}'" in message
    assert "'explicit'" in message and "create a new consumer" in message


def test_ensure_drain_consumer_refuses_short_ack_wait(js, names, stream):
    consumer(js, stream, names.consumer, ack_wait=5)
    desired = ConsumerConfig(durable_name=names.consumer)
    with pytest.raises(ConsumerConfigError) as err:
        js.run(ensure_drain_consumer(js.admin, stream, desired, create=True, min_ack_wait=60))
    message = str(err.value)
    assert "ack_wait 5s is shorter than one round needs (60s)" in message
    assert f"nats consumer edit {stream} {names.consumer} --wait 61s -f" in message
    assert js.consumer_info(stream, names.consumer).config.ack_wait == 5.0  # left alone


# --- consumer reset ------------------------------------------------------------------------------
def test_reset_consumer_moves_delivery(js, names, stream):
    pub(js, f"{names.prefix}.a", 10)
    consumer(js, stream, names.consumer)
    puller = js.puller(stream, names.consumer)
    assert [m.metadata.stream_seq for m in js.pull(puller, 4).messages] == [1, 2, 3, 4]

    assert js.run(js.admin.reset_consumer(stream, names.consumer, 7)) == 7
    after = js.pull(puller, 10)
    assert after.end is PullEnd.NO_MESSAGES
    assert [m.metadata.stream_seq for m in after.messages] == [7, 8, 9, 10]

    # Backwards works too: messages already delivered come again.
    assert js.run(js.admin.reset_consumer(stream, names.consumer, 2)) == 2
    again = js.pull(puller, 3)
    assert [m.metadata.stream_seq for m in again.messages] == [2, 3, 4]


def test_reset_missing_consumer_raises_consumer_not_found(js, names, stream):
    # The server does not answer CONSUMER.RESET for a missing consumer (measured: no reply);
    # that must not surface as a transient "NATS unavailable".
    admin = JetStreamAdmin(js.conn, timeout=0.5)
    with pytest.raises(ConsumerNotFoundError):
        js.run(admin.reset_consumer(stream, "nope", 1))
    with pytest.raises(StreamNotFoundError):
        js.run(admin.reset_consumer("NOPE" + names.stream, "nope", 1))


def test_ack_subject_timestamp_is_the_stored_time(js, names, stream):
    pub(js, f"{names.prefix}.a", 3)
    consumer(js, stream, names.consumer)
    messages = js.pull(js.puller(stream, names.consumer), 3).messages
    state = js.stream_info(stream).state
    # The same instant, to the microsecond, whichever way it is read.
    assert messages[0].metadata.timestamp == state.first_ts
    assert messages[-1].metadata.timestamp == state.last_ts
