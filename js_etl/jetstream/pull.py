"""The raw ``no_wait`` pull of NATS ADR-13/ADR-37/ADR-42 (nats-io/nats-architecture-and-design),
spoken as the server actually speaks it.

One pull = one ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`` request, answered on our inbox
by data frames and at most one status frame. How a pull ends (nats-server 2.15;
docs/reference/jetstream-wire-facts.md, and ``tests/jetstream/test_jetstream_pull.py`` pins each
case against a real server):

* ``batch`` messages arrived: **no terminator** is sent, so we count.
* ``max_bytes`` consumed exactly: **no terminator** either, so we count bytes with the server's
  formula (subject + reply + header block + payload).
* a status frame: 404 (nothing more; on R>1 consumers a no_wait pull that delivered some
  messages ends with 408 Request Timeout instead, read as 404), 408 (expired / Requests
  Pending), 409 (batch completed, max bytes, consumer deleted, request limits), 400 (bad
  request, priority group), 423 (pin), 503 (no consumer / JetStream unavailable). 100 is a
  heartbeat and never ends a pull.
* nothing at all: a no_wait pull that hits ``max_ack_pending`` waits on the server for ever.
  Every pull therefore has a client deadline, after which its inbox is unsubscribed so the
  server drops the request and delivers nothing more to it.

**Replicated consumers (R>1): a 409 can overtake its own pull's data.** On an R>1 explicit-ack
consumer the leader holds each delivery until the consumer's Raft group has the delivered state
(nats-server ``consumer.go`` ``deliverMsg`` → ``addReplicatedQueuedMsg``), and makes 404/408 wait
for those deliveries (``waitingDeliveries``). ``409 Batch Completed`` (sent when ``batch`` is used
up but bytes are left) and ``409 Message Size Exceeds MaxBytes`` go out at once, so on R3 they
can arrive *before* some or all of the data frames (``tests/cluster/test_cluster_pull.py``).
What the server does promise: those statuses carry ``Nats-Pending-Messages`` = the request's
batch still unused, so ``batch - Nats-Pending-Messages`` frames were delivered to this pull. We
keep listening until that many arrived (bounded by the pull's deadline, after which the inbox is
dropped as for any deadline). See docs/reference/clustered-jetstream.md.

A single message larger than ``max_bytes`` blocks a consumer for good (every retry answers 409
at once); :meth:`Puller.pull` detects that and fetches the message alone without ``max_bytes``.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any

from js_etl.jetstream.client import JetStreamConnection
from js_etl.jetstream.errors import (
    BadRequestError,
    ConsumerDeletedError,
    ConsumerUnavailableError,
    JetStreamError,
    NatsUnavailableError,
    PinMismatchError,
    PriorityGroupError,
    PullLimitError,
)
from js_etl.jetstream.message import Deliveries, Status

PIN_HEADER = b"Nats-Pin-Id:"


class PullEnd(StrEnum):
    """Why a pull ended."""

    BATCH_FULL = "batch_full"  # got `batch` messages (no terminator), or 409 Batch Completed
    BYTES_FULL = "bytes_full"  # max_bytes used up: exactly (no terminator) or 409 after >= 1 msg
    NO_MESSAGES = "no_messages"  # 404: nothing (more) to deliver to this request right now
    OVERSIZE = "oversize"  # next message > max_bytes; it was fetched alone (see messages)
    EXPIRED = "expired"  # 408 Request Timeout: `expires` passed
    REQUESTS_PENDING = "requests_pending"  # 408 Requests Pending: other pulls queued ahead
    DEADLINE = "deadline"  # no terminator before our deadline (e.g. at max_ack_pending)
    DISCONNECTED = "disconnected"  # connection dropped mid-pull (e.g. slow consumer)
    PIN_MISMATCH = "pin_mismatch"  # 423: another client holds the pin, or our id is stale
    ERROR = "error"  # any other status: see `status`; raise_for_status() raises it


@dataclass(frozen=True, slots=True)
class PriorityGroupRequest:
    """What a pull from a priority-group consumer (ADR-42) adds to its request: the group, the
    overflow thresholds that gate it, the pin id a ``pinned_client`` group handed us, a priority.
    One object from the drain's plan to the wire, so the fields travel together."""

    group: str
    min_pending: int | None = None
    min_ack_pending: int | None = None
    id: str | None = None  # the pin id (``Nats-Pin-Id``) of a pinned_client group
    priority: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


@dataclass(frozen=True, slots=True)
class PullRequest:
    """The JSON body of one pull. ``expires`` in seconds; ``None`` fields are not sent."""

    batch: int
    max_bytes: int | None = None
    no_wait: bool = True
    expires: float | None = None
    priority_group: PriorityGroupRequest | None = None

    def as_json(self) -> bytes:
        body: dict[str, Any] = {"batch": self.batch}
        if self.max_bytes:
            body["max_bytes"] = self.max_bytes
        if self.no_wait:
            body["no_wait"] = True
        if self.expires is not None:
            body["expires"] = int(self.expires * 1e9)
        if self.priority_group is not None:
            body.update(self.priority_group.as_dict())
        return json.dumps(body, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class PullResult:
    messages: Deliveries
    end: PullEnd
    status: Status | None = None
    bytes: int = 0  # max_bytes cost of the messages (server formula)

    def raise_for_status(self) -> None:
        """Raise the typed error for ends that need a decision; messages already received are
        still in ``messages`` and must be handled (or left to redeliver) by the caller."""
        if self.end is PullEnd.ERROR and self.status is not None:
            raise status_error(self.status)
        if self.end is PullEnd.PIN_MISMATCH:
            raise PinMismatchError(f"pull refused: {self.status}", code=423)
        if self.end is PullEnd.DISCONNECTED:
            raise NatsUnavailableError("NATS connection dropped during a pull (slow consumer?); "
                                       "delivered messages will be redelivered after ack_wait")


def status_error(status: Status) -> JetStreamError:
    """Map a terminating status frame to the typed error a caller can act on. The message says
    what the server said; which setting of the caller fixes it is the caller's to add
    (:meth:`JetStreamError.with_hint`)."""
    code, text = status.code, status.description
    if code == 409 and text == "Consumer Deleted":
        return ConsumerDeletedError("consumer was deleted during the pull", code=409)
    if code == 409 and (text.startswith("Exceeded Max") or text.startswith("Exceeded")):
        return PullLimitError(f"pull exceeds a consumer limit: {text}", code=409)
    # "Priority Group missing", "Invalid Priority Group", "Not a Pinned Client / Overflow
    # Priority consumer". Not "Priority must be between 0 and 9": a bad value, no group issue.
    if code == 400 and ("Priority Group" in text or "Priority consumer" in text):
        return PriorityGroupError(f"pull refused: {text}", code=400)
    if code == 400:
        return BadRequestError(f"pull refused: {text}", code=400)
    if code == 503:
        subject = status.header("Nats-Subject") or "the consumer"
        return ConsumerUnavailableError(f"no consumer answered {subject} (503): its leader "
                                        "is being elected, or it does not exist", code=503)
    return NatsUnavailableError(f"pull ended with status {status}", code=code)


class _Collector:
    """Receives the frames of one pull from the parser, without any queue hop."""

    __slots__ = (
        "_batch",
        "_done",
        "_due",
        "_max_bytes",
        "_reply_to",
        "_request_batch",
        "bytes",
        "messages",
        "pin_id",
        "status",
    )

    def __init__(self, request: PullRequest, reply_to: bytes, done: asyncio.Future[None]) -> None:
        self.messages = Deliveries()
        self.bytes = 0
        self.status: Status | None = None
        self.pin_id: str | None = None
        # Without max_bytes a full batch gets no terminator, so we count. With max_bytes it
        # does (409 Batch Completed) and only an exactly used-up budget gets none.
        self._batch = request.batch if not request.max_bytes else None
        self._request_batch = request.batch
        self._max_bytes = request.max_bytes
        self._reply_to = reply_to
        self._done = done
        # Frames still due after a status that overtook them (R>1 consumers, see module doc).
        self._due = 0

    def on_frame(self, subject: bytes, reply: bytes, data: bytes | memoryview,
                 headers: bytes | None) -> None:
        if self._done.done():
            return  # frames after the end belong to nobody (never seen, but cheap to guard)
        if not reply:  # status frames are the only ones without an ack reply
            if subject != self._reply_to:
                return  # a late status of an earlier pull on this inbox
            status = Status.parse(headers or b"")
            if status.code == 100:
                return  # idle heartbeat
            self.status = status
            self._due = self._frames_due(status)
            if self._due <= 0:
                self._done.set_result(None)
            return
        if headers and PIN_HEADER in headers:
            self.pin_id = Status.parse(headers).header("Nats-Pin-Id")
        self.messages.append(subject, reply, data, headers)
        self.bytes += len(subject) + len(reply) + len(headers or b"") + len(data)
        if self.status is not None:
            self._due -= 1
            if self._due <= 0:
                self._done.set_result(None)
        elif (self._batch is not None and len(self.messages) >= self._batch) or (
                self._max_bytes and self.bytes >= self._max_bytes):
            self._done.set_result(None)

    def _frames_due(self, status: Status) -> int:
        """Data frames of this pull not yet received when ``status`` came: the server's
        ``Nats-Pending-Messages`` is the batch left unused, so ``batch - pending`` were delivered.
        Statuses without the header (404 at once, 409 Leadership Change, ...) promise nothing."""
        pending = status.header("Nats-Pending-Messages")
        if pending is None or not pending.lstrip("-").isdigit():
            return 0
        delivered = self._request_batch - max(int(pending), 0)
        return delivered - len(self.messages)


class Puller:
    """Pulls from one durable (or named) pull consumer over one connection.

    Keeps the pin id of a ``pinned_client`` group (from ``Nats-Pin-Id``) and clears it on 423.
    Reuses one inbox subscription for pulls that ended cleanly and replaces it after any pull
    that did not, so a late frame can never be mistaken for the next pull's.

    >>> puller = Puller(conn, "ORDERS", "orders_to_delta")
    >>> result = await puller.pull(500, max_bytes=8 << 20)
    >>> result.end, len(result.messages)
    (<PullEnd.NO_MESSAGES: 'no_messages'>, 42)
    """

    def __init__(self, conn: JetStreamConnection, stream: str, consumer: str, *,
                 priority_group: PriorityGroupRequest | None = None) -> None:
        self.conn = conn
        self.stream = stream
        self.consumer = consumer
        self.priority_group = priority_group  # its ``id`` follows the pin the server hands us
        self._subject = f"{conn.options.api_prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._inbox: str | None = None
        self._sid: int | None = None
        self._pulls = 0

    @property
    def pin_id(self) -> str | None:
        """The pin of a ``pinned_client`` group this puller holds, if any."""
        return self.priority_group.id if self.priority_group else None

    async def pull(self, batch: int, *, max_bytes: int | None = None, timeout: float = 5.0,
                   expires: float | None = None) -> PullResult:
        """One ``no_wait`` pull of up to ``batch`` messages / ``max_bytes`` bytes.

        ``timeout`` is the client-side deadline. With ``expires`` the server waits up to that
        long for the first message (no_wait + expires semantics); keep ``timeout`` above it.
        """
        request = PullRequest(batch=batch, max_bytes=max_bytes, expires=expires,
                              priority_group=self.priority_group)
        loop = asyncio.get_running_loop()
        ends = loop.time() + timeout  # the whole call, lone fetch included, ends within timeout
        result = await self._send(request, timeout)
        left = ends - loop.time()
        if (result.end is PullEnd.BYTES_FULL and not result.messages and max_bytes
                and left > 0):
            # 409 with nothing delivered: the next message alone is larger than max_bytes and
            # would block this consumer for ever. Fetch it by itself, without max_bytes.
            group = self.priority_group and replace(self.priority_group, min_pending=None,
                                                     min_ack_pending=None)
            lone = await self._send(PullRequest(batch=1, priority_group=group), left)
            end = PullEnd.OVERSIZE if lone.messages else lone.end
            return PullResult(lone.messages, end, lone.status or result.status, lone.bytes)
        return result

    async def _send(self, request: PullRequest, timeout: float) -> PullResult:
        nc = self.conn.nc
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        sid, inbox = await self._subscription()
        self._pulls += 1
        reply_to = f"{inbox}.{self._pulls}"
        collector = _Collector(request, reply_to.encode(), done)
        reconnects = self.conn.reconnects
        nc.raw_sinks[sid] = collector.on_frame
        clean = False
        try:
            await nc.publish(self._subject, request.as_json(), reply=reply_to)
            try:
                await asyncio.wait_for(asyncio.shield(done), timeout)
                clean = True
            except TimeoutError:
                pass
        finally:
            nc.raw_sinks.pop(sid, None)
            if not clean or self.conn.reconnects != reconnects:
                await self._drop_subscription()
        end = self._end(collector, request, clean, self.conn.reconnects != reconnects)
        if end is PullEnd.DEADLINE and not collector.messages:
            # Nothing at all: at max_ack_pending, or a pull or an inbox this user may not use,
            # which the server drops (else five empty rounds would end the run as if done).
            refusal = self.conn.refused(self._subject)
            if refusal is not None:
                raise refusal
        if self.priority_group is not None:
            if end is PullEnd.PIN_MISMATCH:  # the server wants a retry without an id (ADR-42)
                self.priority_group = replace(self.priority_group, id=None)
            elif collector.pin_id:  # a delivery carries the pin we hold now
                self.priority_group = replace(self.priority_group, id=collector.pin_id)
        return PullResult(collector.messages, end, collector.status, collector.bytes)

    @staticmethod
    def _end(c: _Collector, request: PullRequest, clean: bool, reconnected: bool) -> PullEnd:
        if reconnected:
            return PullEnd.DISCONNECTED
        if not clean:
            return PullEnd.DEADLINE
        if c.status is None:
            return PullEnd.BATCH_FULL if len(c.messages) >= request.batch else PullEnd.BYTES_FULL
        code, text = c.status.code, c.status.description
        if code == 404:
            return PullEnd.NO_MESSAGES
        if code == 408 and text == "Request Timeout" and request.no_wait and not request.expires:
            # A no_wait pull without `expires` cannot expire: on an R>1 consumer this is how the
            # server ends one that reached the end after delivering some messages (404 on one
            # server), sent once those deliveries are replicated (nats-server
            # jetstream_cluster.go, waitingDeliveries; tests/cluster/test_cluster_semantics.py).
            return PullEnd.NO_MESSAGES
        if code == 408:
            return PullEnd.REQUESTS_PENDING if text == "Requests Pending" else PullEnd.EXPIRED
        if code == 409 and text == "Batch Completed":
            return PullEnd.BATCH_FULL
        if code == 409 and text == "Message Size Exceeds MaxBytes":
            return PullEnd.BYTES_FULL
        if code == 423:
            return PullEnd.PIN_MISMATCH
        return PullEnd.ERROR

    async def _subscription(self) -> tuple[int, str]:
        if self._sid is None or self._inbox is None:
            self._inbox = self.conn.nc.new_inbox()
            sub = await self.conn.nc.subscribe(self._inbox + ".*")
            self._sid = sub._id
        return self._sid, self._inbox

    async def _drop_subscription(self) -> None:
        """Unsubscribe the inbox: the server then drops any request still queued for it."""
        sid, self._sid, self._inbox = self._sid, None, None
        if sid is None:
            return
        sub = self.conn.nc._subs.get(sid)
        if sub is not None and not self.conn.nc.is_closed:
            try:
                await sub.unsubscribe()
            except Exception:  # the connection may be gone; nothing is left to cancel then
                pass

    async def close(self) -> None:
        await self._drop_subscription()
