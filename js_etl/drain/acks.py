"""A run's acks, TERMs and NAKs. Every block is *confirmed applied* before anything else happens
(:mod:`js_etl.jetstream.ack`: a flush only proves the server read it), and sent only while the run
still holds the consumer's lease and the table's lock."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from js_etl import faults
from js_etl.jetstream import ack_subject
from js_etl.jetstream.ack import ACK, AckBlock, ack_block, nak_body, term_body

if TYPE_CHECKING:
    import pyarrow as pa

    from js_etl.drain.lock import TableLock
    from js_etl.durable.lease import ConsumerLease
    from js_etl.jetstream import ConsumerInfo, JetStreamSession

log = logging.getLogger("js_etl.drain")

MAX_RELEASE = 1_000_000  # widest (ack floor, delivered] window released sequence by sequence


@dataclass(frozen=True, slots=True)
class Holds:
    """What a run holds: one run per consumer (the lease) and per consumer and table (the
    lock). Checked before the fence's releases, every fetch, commit and ack block."""

    lease: ConsumerLease
    lock: TableLock

    def check(self) -> None:
        self.lease.check()
        self.lock.check()


class RunAcks:
    """Acks and releases of one run, on its consumer."""

    def __init__(self, js: JetStreamSession, holds: Holds, ack_prefix: str,
                 fault: str | None = None) -> None:
        self.js, self.holds, self.ack_prefix, self.fault = js, holds, ack_prefix, fault
        self.released = 0  # deliveries NAKed since the last round (see plan_round)
        # Deliveries this run NAKed that no round has fetched again since: still ack-pending
        # to the server, so a later release must not count them a second time.
        self._outstanding = 0

    def ack(self, keys: pa.Table, *, dead: bool = False) -> int:
        """+ACK committed table rows; +TERM dead letters with their reason. Returns how many."""
        import pyarrow.compute as pc

        if not dead:
            half = keys.num_rows // 2 if self.fault == "kill_mid_ack" else keys.num_rows
            self._send(keys.slice(0, half), ACK)
            faults.kill_here("kill_mid_ack")
            self._send(keys.slice(half), ACK)
            return keys.num_rows
        errors = pc.fill_null(keys.column("error"), "dead letter")
        for reason in pc.unique(errors).to_pylist():
            self._send(keys.filter(pc.equal(errors, reason)),
                       term_body(f"js-etl dead letter: {reason}"))
        return keys.num_rows

    def _send(self, rows: pa.Table, body: bytes) -> None:
        delivered, seq, consumer_seq = (rows.column(c).combine_chunks()
                                        for c in ("num_delivered", "seq", "consumer_seq"))
        self.holds.check()
        self.js.run(self.js.acker.send(ack_block(self.ack_prefix, delivered, seq, consumer_seq,
                                                 body)))

    def release(self, info: ConsumerInfo) -> int:
        """NAK every delivered-but-unacked message, so it comes back now, in order, rather than
        after ack_wait. Sound only while this run holds the lease: no live run owns those
        deliveries. Returns how many were unacked and not released by this run before.

        A NAK is applied only if its delivery-sequence token lies in the consumer's window
        (ack floor, last delivered] and the stream sequence is pending, so the NAKs carry the
        last delivered consumer sequence, and a NAK of a message no longer pending is ignored."""
        floor, delivered = info.ack_floor.stream_seq, info.delivered.stream_seq
        if info.num_ack_pending == 0 or delivered <= floor:
            return 0
        if delivered - floor > MAX_RELEASE:
            log.warning("not releasing %d unacked deliveries one by one (window %d..%d too "
                        "wide); they return after ack_wait", info.num_ack_pending, floor,
                        delivered)
            return 0
        dseq = info.delivered.consumer_seq
        subjects = (ack_subject(self.ack_prefix, 1, seq, dseq)
                    for seq in range(floor + 1, delivered + 1))
        self.holds.check()
        self.js.run(self.js.acker.send(AckBlock.of(subjects, nak_body())))
        self.released = info.num_ack_pending
        fresh = max(self.released - self._outstanding, 0)
        self._outstanding = self.released
        return fresh

    def fetched(self, deliveries: int) -> None:
        """A round fetched this many: a pull is served the NAKed deliveries before anything new
        (nats-server's getNextMsg)."""
        self._outstanding = max(self._outstanding - deliveries, 0)
