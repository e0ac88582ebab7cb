"""The backfill's reader on executors: one partition = one ephemeral consumer reading one
contiguous sub-range of the stream by position, without acks, then deleted. It emits the same raw
Arrow rows as the drain's fetch (:func:`js_etl.spark.fetch.to_record_batch`).

Re-executing a partition reads exactly the same messages again (its own consumer, by position,
no acks), as long as the range and the stream's content are the same: see
:mod:`js_etl.spark.backfill`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from js_etl.jetstream import (
    AckPolicy,
    ConnectionOptions,
    ConsumerConfig,
    DeliverPolicy,
    JetStreamSession,
    PullEnd,
    ack_prefix,
)
from js_etl.jetstream.errors import JetStreamError, NatsUnavailableError
from js_etl.spark.fetch import raise_for_pull, to_record_batch


@dataclass(frozen=True, slots=True)
class RangeFetchPlan:
    """What every partition of a backfill does. Picklable: it travels to the executors."""

    options: ConnectionOptions
    stream: str
    name_prefix: str  # ephemeral consumer names: <prefix>_<partition>_<attempt nonce>
    bounds: tuple[tuple[int, int], ...]  # partition i reads bounds[i], inclusive
    filter_subjects: tuple[str, ...]
    batch: int
    max_bytes: int
    pull_timeout: float
    inactive_threshold: float


def fetch_range_partition(plan: RangeFetchPlan, batches: Iterator[pa.RecordBatch]
                          ) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body. The input is one row per partition: its index."""
    for index in [i for batch in batches for i in batch.column(0).to_pylist()]:
        yield from read_range(plan, index)


def read_range(plan: RangeFetchPlan, index: int) -> Iterator[pa.RecordBatch]:
    """Every message of sub-range ``index`` (that matches the filter), in order, exactly once.

    The consumer's name is unique to this attempt: creating a consumer under an existing name
    with the same config answers the *existing* consumer, already advanced (measured), so a
    retried task reusing the name would skip what its failed attempt read.
    """
    lo, hi = plan.bounds[index]
    name = f"{plan.name_prefix}_{index}_{uuid.uuid4().hex[:8]}"
    prefix = ack_prefix(plan.stream, name)
    with JetStreamSession(plan.options) as js:
        js.run(js.admin.create_consumer(plan.stream, ConsumerConfig(
            name=name, description="js-etl backfill (ephemeral)",
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=lo,
            ack_policy=AckPolicy.NONE, inactive_threshold=plan.inactive_threshold,
            filter_subjects=plan.filter_subjects, mem_storage=True, num_replicas=1)))
        puller = js.puller(plan.stream, name)
        try:
            next_seq = lo
            while next_seq <= hi:
                # Never ask for more than the sequences left in the range: without a filter
                # nothing beyond `hi` is ever delivered.
                result = js.pull(puller, min(plan.batch, hi - next_seq + 1),
                                 max_bytes=plan.max_bytes, timeout=plan.pull_timeout)
                if result.messages:
                    batch = to_record_batch(result.messages, prefix)
                    last = batch.column("seq")[-1].as_py()
                    if last > hi:  # filtered consumers skip ahead: drop what lies beyond hi
                        batch = batch.filter(pc.less_equal(batch.column("seq"), hi))
                    if batch.num_rows:
                        yield batch
                    next_seq = last + 1
                    if result.messages[-1].metadata.num_pending == 0:
                        break  # pending token 0: the consumer has nothing more at all
                if result.end is PullEnd.NO_MESSAGES:
                    break
                if result.end not in (PullEnd.BATCH_FULL, PullEnd.BYTES_FULL, PullEnd.OVERSIZE) \
                        or not result.messages:
                    # Never end a partition short without saying so: fail the task, and the
                    # retry (a new consumer) reads the same sub-range again.
                    raise_for_pull(result)
                    raise NatsUnavailableError(
                        f"backfill pull on {plan.stream}/{name} ended with {result.end.value} "
                        f"({result.status or 'no status'}) before seq {hi}; the task is retried")
        finally:
            js.run(puller.close())
            try:
                js.run(js.admin.delete_consumer(plan.stream, name))
            except JetStreamError:
                pass  # inactive_threshold removes it anyway
