"""Acks by reply subject, from any connection, each block confirmed applied.

The server keys explicit acks by stream sequence (acking from a second connection, and with a
stale delivery's subject, both work), so acks need not travel with the messages: the driver can
ack what a Delta commit holds.

**A flush is not an ack.** A flush returns once the server has *read* the acks; the consumer
applies them later, from its own queue, while pulls from other connections are served by other
code with no ordering between the two: a pull right after a flush can be served messages that
were just acked. So every block is **confirmed**: after its PUB commands we send the block's
last subject once more *with a reply inbox*, and wait for the answer. What that relies on
(nats-server 2.15 ``server/consumer.go``):

* every message to a consumer's ack subject goes through ``pushAck`` into one FIFO queue
  (``o.ackMsgs``), which one goroutine (``processInboundAcks``) applies in order;
* one client connection's messages reach ``pushAck`` in the order the client wrote them (one
  read loop per connection);
* the answer to an ack with a reply is sent after that ack was applied (``processAck`` ->
  ``sendAckReply``, or ``updateAcks`` once stored/replicated), for ``+ACK`` (idempotent: a
  repeat is answered the same), ``-NAK`` (a second NAK of a message already queued for
  redelivery is ignored: "If already queued up also ignore") and ``+WPI``.

So the answer proves that every command of the block, sent before it on the same connection, has
been applied.
``tests/jetstream/test_jetstream_ack.py::test_confirmed_block_is_applied_before_the_next_pull``
checks it: a NAK block then an ACK block of the same messages, then a pull from another
connection, repeated; with the confirmation the pull finds nothing every time.

A ``+TERM`` block confirms with ``+ACK`` (a TERM is an ack plus an advisory: a second TERM would
send the advisory twice). If the connection was re-established while a block was in flight, the
answer proves nothing about the commands written before the reconnect, so the whole block is
sent again (acks, TERMs and NAKs of queued messages are idempotent).

Fire-and-forget plus one confirmation costs one round trip per block, not one per ack. The
evidence for all of this: ``docs/design/confirmed-acks.md``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import nats.errors

from js_etl.errors import JsEtlError
from js_etl.jetstream.client import JetStreamConnection
from js_etl.jetstream.errors import ConsumerUnavailableError, NatsUnavailableError
from js_etl.jetstream.subjects import (
    ACK_SUBJECTS,
    ack_subject,
    framed_ack_subjects,
    parse_ack_subject,
)

if TYPE_CHECKING:
    import pyarrow as pa

ACK = b"+ACK"
TERM = b"+TERM"
# Acks a second the slowest server js-etl waits for while it sees them applied: a block's
# confirmation waits at most ``confirm_timeout + count / MIN_ACK_RATE`` seconds.
MIN_ACK_RATE = 5_000


def nak_body(delay: float | None = None) -> bytes:
    # The delay must be integer nanoseconds: the server silently ignores a string like "1s".
    return b"-NAK" if not delay else b"-NAK " + json.dumps({"delay": int(delay * 1e9)}).encode()


def term_body(reason: str | None = None) -> bytes:
    return TERM if not reason else TERM + b" " + " ".join(reason.split()).encode()


@dataclass(frozen=True, slots=True)
class AckBlock:
    """One ack body for many deliveries: their PUB commands back to back, and the subject the
    confirmation goes to (the block's last)."""

    commands: bytes
    count: int
    last_subject: str
    body: bytes

    @property
    def confirm_body(self) -> bytes:
        return ACK if self.body.startswith(TERM) else self.body

    @classmethod
    def of(cls, subjects: Iterable[str], body: bytes) -> AckBlock:
        tail = b" %d\r\n" % len(body) + body + b"\r\n"
        listed = list(subjects)
        commands = b"".join(b"PUB " + s.encode() + tail for s in listed)
        return cls(commands, len(listed), listed[-1] if listed else "", body)


def ack_block(prefix: str, num_delivered: pa.Array, stream_seq: pa.Array, consumer_seq: pa.Array,
              body: bytes) -> AckBlock:
    """The block that sends ``body`` to the ack subject of every delivery.

    Same subjects as :func:`~js_etl.jetstream.subjects.ack_subject`, built by Arrow kernels in
    one pass: a round's acks are hundreds of thousands of subjects, too many to build one Python
    string at a time.
    """
    n = len(stream_seq)
    if n == 0:
        return AckBlock(b"", 0, "", body)
    # "PUB <ack subject> <len>\r\n<body>\r\n" per delivery.
    commands = framed_ack_subjects(prefix, num_delivered, stream_seq, consumer_seq,
                                   before=b"PUB ", after=b" %d\r\n" % len(body) + body + b"\r\n")
    # The commands lie back to back in the array's data buffer: that buffer is the block.
    _, offsets, data = commands.buffers()
    first, last = memoryview(offsets).cast("q")[commands.offset::n][:2]
    last_subject = ack_subject(prefix, *(a[n - 1].as_py() for a in
                                         (num_delivered, stream_seq, consumer_seq)))
    return AckBlock(bytes(memoryview(data)[first:last]), n, last_subject, body)


def _ack_subjects_of(block: AckBlock) -> str:
    """The prefix of the ack subjects of the block's consumer, ``$JS.ACK.<stream>.<consumer>.``
    (or its domain form); ``$JS.ACK.`` for a subject that does not parse."""
    try:
        return parse_ack_subject(block.last_subject).ack_prefix + "."
    except ValueError:
        return ACK_SUBJECTS


class Acker:
    """Sends ack blocks (acks, NAKs, TERMs) over one connection, each confirmed applied (module
    docstring).

    >>> acker = Acker(conn)
    >>> await acker.ack([m.reply for m in result.messages])   # one write, one confirmed request
    """

    def __init__(self, conn: JetStreamConnection, *, confirm_timeout: float = 10.0,
                 attempts: int = 3, ack_rate: float = 50_000) -> None:
        self.conn = conn
        self.confirm_timeout = confirm_timeout
        self.attempts = attempts
        # Each wait for an answer allows for a loaded machine, and longer while the block is
        # seen applied (send; docs/design/acks-under-load.md).
        self.ack_rate = ack_rate

    async def send(self, block: AckBlock) -> int:
        """Send the block and wait until the server has applied all of it; returns the count.

        The answer may take a while for a large block on a busy server: while the consumer's
        ack floor or ack-pending count moves, the server is applying it, and the wait goes on
        (up to a limit that grows with the block) instead of sending it all again. Raises
        NatsUnavailableError (transient) when no confirmation came after ``attempts`` sends,
        ConsumerUnavailableError when no consumer answers (gone, or no leader yet).
        """
        if not block.count:
            return 0
        nc = self.conn.nc
        loop = asyncio.get_running_loop()
        step = self.confirm_timeout + block.count / self.ack_rate
        limit = loop.time() + self.confirm_timeout + block.count / MIN_ACK_RATE
        problem = ""
        for _ in range(self.attempts):
            reconnects = self.conn.reconnects
            try:
                await nc.publish_block(block.commands, block.count)
                state: tuple[int, int] | None = None  # read only once an answer is late
                while True:
                    try:
                        await nc.request(block.last_subject, block.confirm_body, timeout=step)
                        break
                    except nats.errors.TimeoutError:
                        before, state = state, await self._consumer_state(block)
                        if (self.conn.reconnects != reconnects or loop.time() > limit
                                or state is None or state == before):
                            raise
            except nats.errors.NoRespondersError as e:
                raise ConsumerUnavailableError(
                    f"no consumer answers {block.last_subject} (503): its leader is being "
                    "elected, or it was deleted", code=503) from e
            except (nats.errors.TimeoutError, nats.errors.ConnectionClosedError,
                    NatsUnavailableError) as e:
                # Acks this user may not send (the block's consumer's ack subjects).
                refusal = self.conn.refused(_ack_subjects_of(block))
                if refusal is not None:
                    raise refusal from e
                problem = f"{type(e).__name__}: {e}"
            else:
                if self.conn.reconnects == reconnects:
                    return block.count
                problem = "the connection was re-established while they were in flight"
            await self._connected(step)
        raise NatsUnavailableError(f"{block.count} acks ({block.body[:5].decode()}) not "
                                   f"confirmed applied after {self.attempts} sends: {problem}")

    async def _consumer_state(self, block: AckBlock) -> tuple[int, int] | None:
        """The block's consumer's ``(ack floor, ack-pending)``: it moves while the server
        applies acks and TERMs (not NAKs: a NAKed delivery stays ack-pending). None when the
        consumer does not answer."""
        try:
            meta = parse_ack_subject(block.last_subject)
            info = await self.conn.request(f"CONSUMER.INFO.{meta.stream}.{meta.consumer}")
        except (ValueError, JsEtlError):
            return None
        return int((info.get("ack_floor") or {}).get("stream_seq", 0)), int(
            info.get("num_ack_pending", 0))

    async def _connected(self, timeout: float) -> None:
        """Wait (bounded) for nats-py to re-establish the connection before sending again."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        nc = self.conn.nc
        while not nc.is_connected and not nc.is_closed and loop.time() < deadline:
            await asyncio.sleep(0.05)

    async def ack(self, replies: Iterable[str]) -> int:
        return await self.send(AckBlock.of(replies, ACK))
