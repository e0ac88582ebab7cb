"""The fence: before its first round, a run finishes what earlier runs of the consumer left (the
PIP-84 "epoch" idea applied to runs). Holding the lease, it acks every row the tables hold in the
consumer's unacked window (a run died between its commit and its acks), then releases (NAKs)
whatever else is still delivered-but-unacked — a dead run's or a failed task's deliveries — so
those come back now, in order, instead of after ack_wait.

Its cost follows what a dead run can have left, not the consumer's history: every round
confirms its acks before the next fetch, so only each table's *last* round of this job can hold
rows the server never saw acked. Those rows — the round's commit tag names its seq range — are
re-acked, not every row above the ack floor. A committed row outside that range that is still
pending (its ack lost with a server's state) is released with the rest and, when redelivered,
found in the table by the round's "never write a seq twice" check and acked there. The
measurements behind it: ``docs/design/fence.md``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from js_etl.delta.keys import range_keys
from js_etl.delta.table import DeltaTarget, JobTables, same_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from js_etl.drain.acks import RunAcks
    from js_etl.durable.owner import LockOwner
    from js_etl.jetstream import ConsumerInfo, JetStreamSession

log = logging.getLogger("js_etl.drain")


@dataclass(frozen=True, slots=True)
class Fenced:
    reacked: int  # rows and dead letters acked again (at most what was ack-pending)
    released: int  # deliveries NAKed


def fence(spark: SparkSession, js: JetStreamSession, info: ConsumerInfo, acks: RunAcks,
          tables: JobTables, job_id: str, previous: LockOwner | None) -> Fenced:
    """Finish what earlier runs left; ``previous`` is the dead run whose lease this run took
    over, if any."""
    if info.num_ack_pending == 0:
        return Fenced(0, 0)  # nothing delivered and unacked: nothing to finish, no Spark job
    stream = info.stream_name
    floor, delivered = info.ack_floor.stream_seq, info.delivered.stream_seq
    reacked = 0
    for table, dead in fenced_tables(spark, tables, previous):
        seqs = table.last_round_seqs(spark, job_id)
        if seqs is None:
            continue  # this job never committed here
        first, last = max(floor + 1, seqs[0]), min(delivered, seqs[1])
        if first > last:
            continue  # its last round is all at or below the ack floor: acked
        keys = range_keys(spark, table, stream, first, last, with_error=dead)
        if keys is not None:
            reacked += acks.ack(keys, dead=dead)
    # Rows above the floor may have been acked already; at most num_ack_pending were not.
    reacked = min(reacked, info.num_ack_pending)
    if reacked:
        # Those acks are confirmed applied: what is still pending, and the floor, are now the
        # server's to say. A NAK of an acked message is ignored.
        info = js.consumer_info(stream, info.name)
    return Fenced(reacked, acks.release(info))


def fenced_tables(spark: SparkSession, tables: JobTables, previous: LockOwner | None
                  ) -> list[tuple[DeltaTarget, bool]]:
    """This run's tables, and the dead previous run's where those are others (a changed
    target.path): that run's last round may be committed there and unacked, and releasing it
    would land its sequences in a second table. Each with whether it holds dead letters."""
    fenced = [(tables.target, False), (tables.dead_letters, True)]
    if previous is None or not previous.tables:
        return fenced
    for (path, name), dead in zip(previous.tables, (False, True), strict=False):
        other = DeltaTarget(path, name)
        if not any(same_table(other, mine) for mine in tables) and other.exists(spark):
            log.warning("fencing the last round of the dead run %s in its table %s",
                        previous.run_id, other)
            fenced.append((other, dead))
    return fenced
