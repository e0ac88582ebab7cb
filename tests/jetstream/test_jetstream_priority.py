"""Priority groups (ADR-42) against a real nats-server: overflow and pinned_client
(docs/reference/jetstream-wire-facts.md §7)."""

from __future__ import annotations

import pytest
from streams import pub, timed_pull

from js_etl.jetstream import (
    ConsumerConfig,
    JetStreamSession,
    PriorityGroupRequest,
    PriorityPolicy,
    PullEnd,
)
from js_etl.jetstream.errors import PinMismatchError, PriorityGroupError

FAST = 4.0  # well before the 5 s deadlines these pulls have: ended by a status, not by it


def grouped(js: JetStreamSession, stream: str, name: str, policy: PriorityPolicy,
            **config: object) -> None:
    js.run(js.admin.create_consumer(stream, ConsumerConfig(
        durable_name=name, priority_groups=("jobs",), priority_policy=policy, **config)))


# --- overflow ------------------------------------------------------------------------------------
def test_overflow_min_pending(js, names, stream):
    pub(js, f"{names.prefix}.a", 10)
    grouped(js, stream, names.consumer, PriorityPolicy.OVERFLOW)

    above = js.puller(stream, names.consumer,
                      priority_group=PriorityGroupRequest("jobs", min_pending=1000))
    result, elapsed = timed_pull(js, above, 5, timeout=5)
    assert result.end is PullEnd.NO_MESSAGES and result.messages == []
    assert elapsed < FAST

    below = js.puller(stream, names.consumer,
                      priority_group=PriorityGroupRequest("jobs", min_pending=5))
    result, elapsed = timed_pull(js, below, 5, timeout=5)
    assert result.end is PullEnd.BATCH_FULL
    assert [m.metadata.stream_seq for m in result.messages] == [1, 2, 3, 4, 5]
    assert elapsed < FAST


def test_overflow_min_ack_pending(js, names, stream):
    pub(js, f"{names.prefix}.a", 10)
    grouped(js, stream, names.consumer, PriorityPolicy.OVERFLOW)
    first = js.pull(js.puller(stream, names.consumer,
                              priority_group=PriorityGroupRequest("jobs")), 5, timeout=5)
    assert len(first.messages) == 5  # now 5 ack-pending

    above = js.puller(stream, names.consumer,
                      priority_group=PriorityGroupRequest("jobs", min_ack_pending=50))
    result, elapsed = timed_pull(js, above, 5, timeout=5)
    assert result.end is PullEnd.NO_MESSAGES and result.messages == []
    assert elapsed < FAST

    at = js.puller(stream, names.consumer,
                   priority_group=PriorityGroupRequest("jobs", min_ack_pending=5))
    result = js.pull(at, 5, timeout=5)
    assert [m.metadata.stream_seq for m in result.messages] == [6, 7, 8, 9, 10]


@pytest.mark.parametrize("group", [None, "nope"], ids=["no-group", "unknown-group"])
@pytest.mark.parametrize("policy", [PriorityPolicy.OVERFLOW, PriorityPolicy.PINNED_CLIENT])
def test_wrong_group_is_a_priority_group_error(js, names, stream, policy, group):
    pub(js, f"{names.prefix}.a", 3)
    grouped(js, stream, names.consumer, policy)
    puller = js.puller(stream, names.consumer,
                       priority_group=PriorityGroupRequest(group) if group else None)
    result, elapsed = timed_pull(js, puller, 5, timeout=5)
    assert result.end is PullEnd.ERROR and result.messages == []
    assert result.status is not None and result.status.code == 400
    assert result.status.description == ("Bad Request - Priority Group missing" if group is None
                                         else "Bad Request - Invalid Priority Group")
    assert elapsed < FAST
    with pytest.raises(PriorityGroupError):
        result.raise_for_status()


def test_pin_id_on_overflow_consumer_is_a_priority_group_error(js, names, stream):
    grouped(js, stream, names.consumer, PriorityPolicy.OVERFLOW)
    result = js.pull(js.puller(stream, names.consumer,
                               priority_group=PriorityGroupRequest("jobs", id="X" * 22)), 5,
                     timeout=5)
    assert str(result.status) == "400 Bad Request - Not a Pinned Client Priority consumer"
    with pytest.raises(PriorityGroupError):
        result.raise_for_status()


# --- pinned client -------------------------------------------------------------------------------
def test_pinned_client_lifecycle(js, names, stream, nats_options):
    pub(js, f"{names.prefix}.a", 20)
    grouped(js, stream, names.consumer, PriorityPolicy.PINNED_CLIENT)
    info = js.consumer_info(stream, names.consumer)
    assert info.config.priority_timeout == 120.0  # server default when not given

    holder = js.puller(stream, names.consumer, priority_group=PriorityGroupRequest("jobs"))
    first = js.pull(holder, 2, timeout=5)
    assert first.end is PullEnd.BATCH_FULL and len(first.messages) == 2
    pin = holder.pin_id
    assert pin is not None and len(pin) == 22
    # The pin comes as a header on every message, even though none was published with headers.
    assert all(m.headers == {"Nats-Pin-Id": [pin]} for m in first.messages)
    assert js.consumer_info(stream, names.consumer).pinned_id("jobs") == pin

    # A wrong id while someone holds the pin: 423, and the puller forgets its id.
    intruder = js.puller(stream, names.consumer,
                         priority_group=PriorityGroupRequest("jobs", id="WRONG"))
    refused = js.pull(intruder, 2, timeout=5)
    assert refused.end is PullEnd.PIN_MISMATCH and refused.messages == []
    assert str(refused.status) == "423 Nats-Pin-Id mismatch"
    assert intruder.pin_id is None
    with pytest.raises(PinMismatchError):
        refused.raise_for_status()

    # No id while someone holds the pin: nothing for you (no_wait).
    other = js.puller(stream, names.consumer, priority_group=PriorityGroupRequest("jobs"))
    result, elapsed = timed_pull(js, other, 2, timeout=5)
    assert result.end is PullEnd.NO_MESSAGES and result.messages == [] and elapsed < FAST
    assert other.pin_id is None

    # The holder keeps pulling; a partition on another connection given the id is served too.
    assert len(js.pull(holder, 2, timeout=5).messages) == 2 and holder.pin_id == pin
    with JetStreamSession(nats_options) as js2:
        partition = js2.puller(stream, names.consumer,
                               priority_group=PriorityGroupRequest("jobs", id=pin))
        assert len(js2.pull(partition, 2, timeout=5).messages) == 2
        assert partition.pin_id == pin

    # Unpin: the pin is gone from consumer info ...
    js.run(js.admin.unpin(stream, names.consumer, "jobs"))
    assert js.consumer_info(stream, names.consumer).pinned_id("jobs") is None
    # ... the old holder's id is now stale: 423, id dropped ...
    stale = js.pull(holder, 2, timeout=5)
    assert stale.end is PullEnd.PIN_MISMATCH and stale.messages == []
    assert str(stale.status) == "423 Nats-Wrong-Pin-Id"
    assert holder.pin_id is None
    # ... and retrying without an id takes a new pin and gets messages.
    again = js.pull(holder, 2, timeout=5)
    assert len(again.messages) == 2
    assert holder.pin_id is not None and holder.pin_id != pin
    assert js.consumer_info(stream, names.consumer).pinned_id("jobs") == holder.pin_id
