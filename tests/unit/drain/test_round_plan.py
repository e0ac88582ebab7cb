"""How a drain sizes a round (pure logic, no server, no Spark)."""

from __future__ import annotations

from typing import Any

from js_etl.config import load_config
from js_etl.drain.rounds import RoundSize, RoundStats, plan_round
from js_etl.jetstream import ConsumerInfo

MiB = 1 << 20
ANY = 2**62  # no run.max_bytes: a partition may fetch any number of bytes
INF = float("inf")


def info(ack_pending: int = 0, **config: Any) -> ConsumerInfo:
    return ConsumerInfo.from_response({
        "stream_name": "S", "name": "c",
        "config": {"durable_name": "c", "ack_policy": "explicit", **config},
        "delivered": {"consumer_seq": 0, "stream_seq": 0}, "ack_floor": {"consumer_seq": 0,
                                                                          "stream_seq": 0},
        "num_ack_pending": ack_pending, "num_redelivered": 0, "num_waiting": 0,
        "num_pending": 10_000})


def plan(consumer: ConsumerInfo, *overrides: str, messages_left: float = INF,
         bytes_left: float = INF, released: int = 0, columnar: bool = False
         ) -> RoundSize | None:
    config = load_config(None, ["source.stream=S", "source.consumer=c", "target.path=/t",
                                "fetch.partitions=2", "fetch.batch=1000", "fetch.max_bytes=8MiB",
                                "fetch.partition_max_bytes=128MiB", *overrides], environ={})
    return plan_round(config, consumer, messages_left=messages_left, bytes_left=bytes_left,
                      released=released, columnar=columnar)


def test_unlimited_consumer_gets_the_configured_sizes():
    assert plan(info(max_ack_pending=-1)) == RoundSize(2, 1000, 8 * MiB, 2**31 - 1, ANY, 128 * MiB)


def test_the_columnar_writers_rounds_hold_at_most_100000_messages_a_partition_by_default():
    # The server's CPU grows with the deliveries a round holds and how long it fetches them
    # (rounds.py says how, measured): 100,000 messages or 192 MiB a partition, whichever first.
    assert plan(info(max_ack_pending=-1), columnar=True) == RoundSize(
        2, 1000, 8 * MiB, 100_000, 192 * MiB, 128 * MiB)
    # A smaller run.max_bytes share still bounds it.
    assert plan(info(max_ack_pending=-1), columnar=True, bytes_left=100 * MiB).partition_bytes \
        == 50 * MiB
    # A cap the user sets replaces both: no byte cap beyond the run's.
    assert plan(info(max_ack_pending=-1), "fetch.partition_max_messages=7", columnar=True) \
        == RoundSize(2, 7, 8 * MiB, 7, ANY, 128 * MiB)
    assert plan(info(max_ack_pending=-1), "fetch.partition_max_messages=300") == RoundSize(
        2, 300, 8 * MiB, 300, ANY, 128 * MiB)
    # The cap is per partition (3 partitions of 10 take 30), and the headroom still bounds it.
    three = ("fetch.partition_max_messages=10", "fetch.partitions=3")
    assert plan(info(max_ack_pending=-1), *three).partition_messages == 10
    assert plan(info(max_ack_pending=25), *three).partition_messages == 8


def test_ack_pending_headroom_caps_the_round_and_the_pulls():
    # 1,000 slots, 200 taken: 800 left for two partitions.
    assert plan(info(200, max_ack_pending=1000)) == RoundSize(2, 400, 8 * MiB, 400, ANY, 128 * MiB)


def test_every_free_slot_is_used_when_they_do_not_split_evenly():
    # 3 free slots over 2 partitions: 2 + 1 (it used to be 1 + 1, rounds of 2 messages).
    size = plan(info(0, max_ack_pending=3))
    assert (size.partitions, size.partition_messages, size.extra_messages, size.batch) == (
        2, 1, 1, 2)


def test_no_headroom_plans_no_round():
    assert plan(info(1000, max_ack_pending=1000)) is None


def test_released_deliveries_are_pulled_even_with_every_slot_taken():
    # The fence NAKed 300 of the 1,000 deliveries that fill every slot: the server serves its
    # redelivery queue before it checks max_ack_pending, so a round can fetch those 300.
    assert plan(info(1000, max_ack_pending=1000), released=300) == RoundSize(
        2, 150, 8 * MiB, 150, ANY, 128 * MiB)


def test_consumer_pull_limits_cap_each_pull():
    size = plan(info(max_ack_pending=-1, max_batch=250, max_bytes=MiB))
    assert (size.batch, size.max_bytes) == (250, MiB)


def test_run_budgets_shrink_the_last_round():
    size = plan(info(max_ack_pending=-1), messages_left=3, bytes_left=10 * MiB)
    assert size == RoundSize(2, 2, 8 * MiB, 1, 5 * MiB, 128 * MiB, extra_messages=1)  # 2 + 1


def test_round_stats_count_redeliveries_dead_letters_and_bytes():
    import pyarrow as pa

    fetched = pa.table({"seq": pa.array([7, 3, 7, 9], pa.int64()),
                        "dead": [False, True, False, False],
                        "bytes": pa.array([10, 20, 30, 40], pa.int32())})
    assert RoundStats.of(fetched) == RoundStats(n=4, distinct=3, dead=1, bytes=100, first=3,
                                                last=9)
    assert RoundStats.of(fetched.slice(0, 0)) == RoundStats(0, 0, 0, 0, 0, 0)


def test_a_short_ack_wait_caps_a_round_at_what_can_be_acked_in_a_third_of_it():
    # ack_wait 6 s: 30,000 acks/s x 2 s. Its acks are confirmed well before its first
    # deliveries' ack_wait runs out (one round of 400,000 could not be: issue 45).
    size = plan(info(max_ack_pending=-1, ack_wait=6_000_000_000))
    assert size is not None and size.partitions * size.partition_messages == 60_000
    assert plan(info(max_ack_pending=-1, ack_wait=300_000_000_000)).partition_messages > 10**6
