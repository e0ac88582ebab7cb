"""Planning a drain's rounds: how big the next round is, how long it may pull, when the run
stops, and what a round fetched. Pure logic on the config, the consumer's info, the run's report
and Arrow tables (no Spark, no server), so every rule here is tested without either
(``tests/unit/drain/test_round_plan.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from js_etl.report import StopReason

if TYPE_CHECKING:
    import pyarrow as pa

    from js_etl.config import JobConfig, RunConfig
    from js_etl.jetstream.api import ConsumerInfo
    from js_etl.report import RunReport

EMPTY_ROUNDS = 5  # rounds in a row that fetch nothing while messages are pending: stop then


@dataclass(frozen=True, slots=True)
class RoundSize:
    partitions: int
    batch: int  # messages per pull
    max_bytes: int  # bytes per pull
    partition_messages: int
    partition_bytes: int  # bytes one partition may fetch (its share of run.max_bytes)
    held_bytes: int  # ... and may hold until the commit (fetch.partition_max_bytes)
    extra_messages: int = 0  # the first this many partitions may take one message more


@dataclass(frozen=True, slots=True)
class RoundStats:
    """What a round fetched, counted on the driver from one narrow collect (seq, dead flag,
    payload bytes) with Arrow kernels, not by a Spark aggregate: ``count_distinct`` needs a
    shuffle, whose jobs cost a big round seconds (docs/design/driver-reads.md)."""

    n: int  # rows
    distinct: int  # distinct seqs: fewer than n means a redelivery within the round
    dead: int  # rows flagged as dead letters
    bytes: int  # payload bytes
    first: int  # lowest and highest seq (0 when n is 0)
    last: int

    @classmethod
    def of(cls, table: pa.Table) -> RoundStats:
        import pyarrow.compute as pc

        if not table.num_rows:
            return cls(0, 0, 0, 0, 0, 0)
        seq = table.column("seq")
        return cls(table.num_rows, pc.count_distinct(seq).as_py(),
                   pc.sum(table.column("dead").cast("int64")).as_py(),
                   pc.sum(table.column("bytes").cast("int64")).as_py() or 0,
                   pc.min(seq).as_py(), pc.max(seq).as_py())


def fetch_seconds(config: JobConfig, ack_wait: float) -> float:
    """How long after its start a round may send pulls (see
    :func:`js_etl.durable.policy.min_ack_wait`)."""
    return max(config.fetch.pull_timeout, ack_wait / 3)


# fetch.partition_max_messages when unset and the columnar writer writes. Why rounds have a
# message cap at all: a file-backed consumer writes its whole state, every ack-pending delivery
# in it, up to ten times a second while deliveries and acks change it (nats-server
# consumerFileStore.flushLoop, encodeConsumerState), so the server's CPU grows with how many
# deliveries a round holds; much smaller rounds pay more for the rounds themselves. Spark's
# writer has no default cap: its rounds cost several Spark jobs each. The measurements behind
# both caps: docs/design/round-size.md.
COLUMNAR_PARTITION_MESSAGES = 100_000
# ... and its byte twin, for large messages: the flusher re-encodes the pending deliveries for as
# long as the round's fetch keeps changing them, so the server's cost grows with how many a round
# holds *times how long it fetches*, and a round of 4 KiB messages fetches ~16x the bytes of one
# of 256 B. It binds above ~2 KiB a message; at 256 B the message cap does.
COLUMNAR_PARTITION_BYTES = 192 << 20


# Acks a second a loaded server applies at least (docs/design/acks-under-load.md). A round holds
# at most what it acks in a third of ack_wait, so its acks are applied before its first
# deliveries' ack_wait runs out even after a long fetch.
ROUND_ACK_RATE = 30_000


def plan_round(config: JobConfig, info: ConsumerInfo, *, messages_left: float,
               bytes_left: float, released: int = 0, columnar: bool = False
               ) -> RoundSize | None:
    """Size one round so partitions × batch never exceed the consumer's ack-pending headroom
    nor what the server confirms acked well within ack_wait (:data:`ROUND_ACK_RATE`), and no
    pull asks for more than the consumer allows (its ``max_batch`` / ``max_bytes``; the
    server refuses such a pull with 409).

    ``released``: messages this run just NAKed. They still count as ack-pending, yet a pull is
    served them even at the limit (nats-server ``getNextMsg`` serves its redelivery queue before
    checking ``max_ack_pending``), so they add to the headroom.

    ``columnar``: the columnar writer writes, so an unset fetch.partition_max_messages means
    :data:`COLUMNAR_PARTITION_MESSAGES` or :data:`COLUMNAR_PARTITION_BYTES` fetched, whichever
    comes first.

    Returns None when there is no headroom at all (every ack-pending slot taken).
    """
    fetch, consumer = config.fetch, info.config
    headroom = _limit(consumer.max_ack_pending) - info.num_ack_pending + released
    default_cap = columnar and not fetch.partition_max_messages
    cap = COLUMNAR_PARTITION_MESSAGES if default_cap else fetch.partition_max_messages
    acked_in_time = ROUND_ACK_RATE * (consumer.ack_wait or float("inf")) / 3
    budget = min(headroom, messages_left, _limit(cap) * fetch.partitions, acked_in_time)
    if budget < 1:
        return None
    partitions = int(min(fetch.partitions, budget))
    # Every free slot is used: 3 slots over 2 partitions are 2 + 1, not 1 + 1.
    partition_messages, extra = ((int(budget) // partitions, int(budget) % partitions)
                                 if budget < 2**31 else (2**31 - 1, 0))
    batch = int(max(1, min(fetch.batch, partition_messages + (extra > 0),
                           _limit(consumer.max_batch))))
    max_bytes = int(min(fetch.max_bytes, _limit(consumer.max_bytes)))
    partition_bytes = int(min(max(bytes_left / partitions, 1),
                              COLUMNAR_PARTITION_BYTES if default_cap else 2**62))
    return RoundSize(partitions, batch, max_bytes, partition_messages, partition_bytes,
                     fetch.partition_max_bytes, extra)


def _limit(value: int | None) -> float:
    """A consumer limit where 0, -1 and unset mean none."""
    return value if value and value > 0 else float("inf")


def budget_left(budget: int | None, used: int) -> float:
    return float("inf") if budget is None else budget - used


def budget_spent(run: RunConfig, report: RunReport, *, stopping: bool,
                 elapsed: float) -> StopReason | None:
    """Why the run stops before its next round (``run.*`` budgets), or None to go on.
    ``stopping``: the run was asked to stop (e.g. SIGTERM); ``elapsed``: seconds since it
    started."""
    if stopping:
        return StopReason.TERMINATED
    if run.max_rounds is not None and report.rounds >= run.max_rounds:
        return StopReason.MAX_ROUNDS
    if run.max_messages is not None and (report.messages_written + report.dead_letters
                                         >= run.max_messages):
        return StopReason.MAX_MESSAGES
    if run.max_bytes is not None and report.bytes >= run.max_bytes:
        return StopReason.MAX_BYTES
    if run.max_seconds is not None and elapsed >= run.max_seconds:
        return StopReason.MAX_SECONDS
    return None


def why_nothing_fetched(config: JobConfig, info: ConsumerInfo,
                        empty_rounds: int) -> StopReason | None:
    """After a round that fetched nothing while the consumer is not empty: why to stop, or
    None to release this run's stray deliveries and try again."""
    min_pending = config.source.min_pending
    if min_pending is not None and info.num_pending < min_pending:
        return StopReason.BELOW_MIN_PENDING  # the overflow group is served only above it
    if empty_rounds >= EMPTY_ROUNDS:
        return StopReason.NOTHING_FETCHED
    return None
