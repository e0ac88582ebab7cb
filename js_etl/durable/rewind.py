"""The explicit ``rewind`` of the durable consumer, the one way to move a drain's position (NATS
only): plan it, with what it will redeliver or skip, then reset the consumer, or say how to
delete and recreate it on a server that cannot reset one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from js_etl.durable.cursor import MARK, marked
from js_etl.durable.policy import consumer_add_command_at, source_stream_info
from js_etl.errors import PurgedRangeError, RangeError, RewindUnsupportedError, RunRefusedError
from js_etl.jetstream.api import ConsumerConfig, ConsumerInfo, StreamInfo
from js_etl.jetstream.errors import (
    BadRequestError,
    ConsumerConfigError,
    ConsumerNotFoundError,
    NatsUnavailableError,
)

if TYPE_CHECKING:
    from js_etl.config import JobConfig
    from js_etl.jetstream.sync import JetStreamSession


@dataclass(frozen=True, slots=True)
class RewindPlan:
    stream: StreamInfo
    consumer: ConsumerInfo
    to_seq: int
    target: str  # the drain's table, for the warning
    target_sql: str  # ... as SQL names it

    def describe(self) -> str:
        s, c, n = self.stream, self.consumer, self.to_seq
        delivered, floor = c.delivered.stream_seq, c.ack_floor.stream_seq
        lines = [
            (f"consumer {s.name}/{c.name}  (the stream holds seqs {s.state.first_seq}.."
             f"{s.state.last_seq})"),
            (f"  now:   delivered up to seq {delivered}, ack floor {floor}, "
             f"{c.num_pending} pending"),
            (f"  after: the next delivery is seq {n} (or the first one after it that matches "
             "the consumer's filter)"),
        ]
        if n <= delivered:
            lines.append(f"  seqs {n}..{delivered} will be delivered again")
            if n <= floor:
                lines.append(
                    f"  seqs {n}..{floor} are already in {self.target}: the drain acks them "
                    "without writing them again (it checks each round against the table). To "
                    f"load them anew, delete them first (DELETE FROM {self.target_sql} WHERE "
                    f"stream = '{s.name}' AND seq >= {n}).")
        elif n > delivered + 1:
            lines.append(f"  seqs {delivered + 1}..{n - 1} will be skipped (never delivered to "
                         "this consumer, so never drained)")
        else:
            lines.append("  this is the consumer's current position: nothing changes")
        return "\n".join(lines)


def plan_rewind(js: JetStreamSession, config: JobConfig, to_seq: int) -> RewindPlan:
    """Check that the durable consumer can be moved to ``to_seq`` now (NATS only)."""
    s = config.source
    stream = source_stream_info(js, s.stream)
    first, last = stream.state.first_seq, stream.state.last_seq
    try:
        info = js.consumer_info(s.stream, s.consumer)
    except ConsumerNotFoundError:
        raise ConsumerNotFoundError(
            f"consumer {s.consumer!r} not found on stream {s.stream!r}: nothing to rewind; to "
            f"create it starting at seq {to_seq}: "
            f"`{consumer_add_command_at(s.stream, s.consumer, to_seq, None, config)}`",
            code=404, err_code=10014) from None
    if to_seq < 1:
        raise RangeError(f"--to-seq must be a stream sequence (1 or more), got {to_seq}")
    if to_seq > last + 1:
        raise RangeError(f"stream {s.stream} ends at seq {last}: --to-seq can be at most "
                         f"{last + 1} (= deliver only messages published from now on)")
    if to_seq < first:
        raise PurgedRangeError(f"seq {to_seq} is no longer in stream {s.stream} (purged or "
                               f"expired): the first available is seq {first}; rewind to "
                               f"--to-seq {first} or later")
    if marked(info.config.metadata):
        raise ConsumerConfigError(
            f"consumer {s.stream}/{s.consumer} follows a Structured Streaming query "
            f"(commit_consumer; metadata {MARK}): the query reads by its checkpoint, not through "
            "the consumer, so a rewind would move nothing the query reads")
    if info.num_ack_pending:
        raise RunRefusedError(
            f"consumer {s.stream}/{s.consumer} has {info.num_ack_pending} deliveries in flight: "
            "a drain is running, or one died less than ack_wait ago; let it finish (or run "
            "`js-etl drain`, whose fence settles them), then rewind")
    # The drain's table as people and SQL name it (a catalog table, or a Delta path).
    target = config.target
    return RewindPlan(stream, info, to_seq, target.table or target.path or "?",
                      target.table or f"delta.`{target.path}`")


def rewind_consumer(js: JetStreamSession, config: JobConfig, plan: RewindPlan) -> ConsumerInfo:
    """Reset the durable consumer to ``plan.to_seq`` (server 2.14+); on a server that cannot,
    raise RewindUnsupportedError with the exact commands to delete and recreate it."""
    s = config.source
    try:
        js.run(js.admin.reset_consumer(s.stream, s.consumer, plan.to_seq))
    except (NatsUnavailableError, BadRequestError) as e:
        rm = f"nats consumer rm {s.stream} {s.consumer} -f"
        add = consumer_add_command_at(s.stream, s.consumer, plan.to_seq, plan.consumer.config,
                                      config)
        raise RewindUnsupportedError(
            f"the server did not reset consumer {s.stream}/{s.consumer} ({e}); consumer reset "
            "needs nats-server 2.14 or later. To rewind on this server, make sure no drain is "
            f"running, then delete and recreate the consumer at seq {plan.to_seq} (it holds "
            f"only its position): `{rm} && {add}`{_priority_hint(plan.consumer.config)}"
        ) from None
    return js.consumer_info(s.stream, s.consumer)


def _priority_hint(existing: ConsumerConfig) -> str:
    if not existing.priority_groups:
        return ""
    policy = existing.priority_policy.value if existing.priority_policy else "none"
    return (f"; then give it back its priority groups {list(existing.priority_groups)} "
            f"(policy {policy})")
