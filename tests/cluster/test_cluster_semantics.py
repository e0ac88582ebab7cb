"""What js-etl relies on from a clustered (R3) consumer, measured against a real 3-node cluster.

docs/reference/clustered-jetstream.md records these with the numbers; each test pins one fact
the drain depends on: the consumer leader's num_pending / num_ack_pending / ack floor, read once
after confirmed acks, are exact; the NAK window is the same as on one server; and a change of
consumer leader (step-down through the JetStream API, or a SIGKILLed leader) keeps the
delivered-but-unacked state, so the fence's NAKs and the run's acks still apply afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest
from nats_cluster import (
    NatsCluster,
    add_replicated_stream,
    raw,
    wait_consumer_current,
    wait_for,
)
from streams import ack, consumer, nak, pub

from js_etl.jetstream import JetStreamSession, PullEnd
from js_etl.jetstream.errors import JetStreamError
from js_etl.jetstream.subjects import ack_subject


def _setup(cjs: JetStreamSession, names: Any, n: int) -> None:
    add_replicated_stream(cjs, names.stream, [names.subject], replicas=3)
    pub(cjs, f"{names.prefix}.a", n, size=50)
    consumer(cjs, names.stream, names.consumer, ack_wait=600, max_ack_pending=100_000)
    wait_consumer_current(cjs, names.stream, names.consumer)


def _drain_no_wait(cjs: JetStreamSession, names: Any) -> list[int]:
    puller = cjs.puller(names.stream, names.consumer)
    seqs: list[int] = []
    while True:
        result = cjs.pull(puller, 500, max_bytes=1 << 20, timeout=20)
        seqs.extend(m.metadata.stream_seq for m in result.messages)
        if result.end is PullEnd.NO_MESSAGES:
            return seqs
        assert result.end in (PullEnd.BATCH_FULL, PullEnd.BYTES_FULL), result


def _prefix(names: Any) -> str:
    return f"$JS.ACK.{names.stream}.{names.consumer}"


def test_counts_and_ack_floor_are_exact_after_confirmed_acks_on_r3(
        cjs: JetStreamSession, names: Any) -> None:
    _setup(cjs, names, 1_000)
    result = cjs.pull(cjs.puller(names.stream, names.consumer), 300, timeout=20)
    assert len(result.messages) == 300
    info = cjs.consumer_info(names.stream, names.consumer)
    assert (info.num_pending, info.num_ack_pending, info.delivered.stream_seq) == (700, 300, 300)

    ack(cjs, [m.reply for m in result.messages[:100]])  # confirmed applied, then read once
    info = cjs.consumer_info(names.stream, names.consumer)
    assert (info.ack_floor.stream_seq, info.num_ack_pending) == (100, 200)

    dseq = info.delivered.consumer_seq
    # In the window (ack floor, last delivered]: applied. At or below the floor: ignored.
    nak(cjs, [ack_subject(_prefix(names), 1, 150, dseq)])
    nak(cjs, [ack_subject(_prefix(names), 1, 250, 50)])
    again = _drain_no_wait(cjs, names)
    assert sorted(again) == [150, *range(301, 1_001)]
    info = cjs.consumer_info(names.stream, names.consumer)
    assert (info.num_pending, info.num_ack_pending) == (0, 900)


def test_consumer_leader_step_down_keeps_unacked_deliveries(
        cjs: JetStreamSession, names: Any) -> None:
    _setup(cjs, names, 500)
    held = cjs.pull(cjs.puller(names.stream, names.consumer), 200, timeout=20).messages
    assert len(held) == 200
    before = wait_consumer_current(cjs, names.stream, names.consumer)
    answer = raw(cjs, f"CONSUMER.LEADER.STEPDOWN.{names.stream}.{names.consumer}")
    assert answer.get("success") is True
    after = wait_for(lambda: _new_leader(cjs, names, before), 60, "a new consumer leader")
    assert after != before
    _acks_and_naks_still_apply(cjs, names, held, total=500)


def test_sigkilled_consumer_leader_keeps_unacked_deliveries(
        nats_cluster: NatsCluster, names: Any) -> None:
    # Its own session: the node this test kills may be the one a shared session talks to.
    with JetStreamSession(nats_cluster.options("sigkill-test")) as cjs:
        _setup(cjs, names, 500)
        held = cjs.pull(cjs.puller(names.stream, names.consumer), 200, timeout=20).messages
        assert len(held) == 200
        leader = wait_consumer_current(cjs, names.stream, names.consumer)
        node = nats_cluster.node_of(leader)
        node.stop(kill=True)
        try:
            wait_for(lambda: _new_leader(cjs, names, leader, replicas=2), 60,
                     "a new consumer leader after SIGKILL")
            _acks_and_naks_still_apply(cjs, names, held, total=500)
        finally:
            node.start(timeout=60)
        wait_consumer_current(cjs, names.stream, names.consumer)


def _new_leader(cjs: JetStreamSession, names: Any, old: str, replicas: int = 3) -> str | None:
    try:
        info = raw(cjs, f"CONSUMER.INFO.{names.stream}.{names.consumer}")
    except JetStreamError:
        return None
    leader = (info.get("cluster") or {}).get("leader")
    return leader if leader and leader != old else None


def _acks_and_naks_still_apply(cjs: JetStreamSession, names: Any, held: list[Any],
                               total: int) -> None:
    info = wait_for(lambda: _info(cjs, names), 30, "consumer info from the new leader")
    # The delivered state was replicated before the frames were sent (pull.py module doc).
    assert (info.delivered.stream_seq, info.num_ack_pending, info.ack_floor.stream_seq) == \
        (200, 200, 0)
    ack(cjs, [m.reply for m in held[:100]])
    info = cjs.consumer_info(names.stream, names.consumer)
    assert (info.ack_floor.stream_seq, info.num_ack_pending) == (100, 100)
    nak(cjs, [ack_subject(_prefix(names), 1, m.metadata.stream_seq,
                          info.delivered.consumer_seq) for m in held[100:]])
    rest = _drain_no_wait(cjs, names)
    assert sorted(rest) == list(range(101, total + 1))


def _info(cjs: JetStreamSession, names: Any) -> Any:
    try:
        return cjs.consumer_info(names.stream, names.consumer)
    except JetStreamError:
        return None


@pytest.fixture(autouse=True)
def _cluster_whole(nats_cluster: NatsCluster) -> None:
    """Every node is up before each test (a test that kills one restarts it)."""
    nats_cluster.wait_meta_leader()
