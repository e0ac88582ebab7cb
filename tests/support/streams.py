"""Stream helpers and the ``stream`` fixture shared by the tests (no tests here).

``tests/support`` is on pytest's ``pythonpath`` (pyproject) and the root conftest loads this module
as a plugin, so tests import helpers with ``from streams import ...`` and get its fixtures without
importing them.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import nats.errors
import pytest

from js_etl.demo.publish import publish as publish_messages
from js_etl.demo.publish import wait_for_messages
from js_etl.errors import RunRefusedError
from js_etl.jetstream import (
    ConsumerConfig,
    ConsumerInfo,
    JetStreamSession,
    JsMessage,
    PullEnd,
    Puller,
    PullResult,
)
from js_etl.jetstream.ack import ACK, AckBlock, nak_body, term_body
from js_etl.jetstream.errors import ConsumerNotFoundError

T = TypeVar("T")
_PUBLISH_WINDOW = 1000


async def publish(session: JetStreamSession, subject: str, n: int, size: int = 100,
                  payload: bytes | None = None) -> list[int]:
    """Publish ``n`` messages and wait for every PubAck; returns the stream sequences in order.

    At most ``_PUBLISH_WINDOW`` requests are in flight, so each request's timeout runs from its
    own send, not from the start of a burst of thousands: with all 16,000 of a test sent at once,
    the last PubAcks missed a 5 s timeout on a box running two suites. The timeout only bounds a
    failing publish."""
    nc = session.conn.nc
    body = payload if payload is not None else b"x" * size
    seqs = []
    for start in range(0, n, _PUBLISH_WINDOW):
        count = min(_PUBLISH_WINDOW, n - start)
        answers = await asyncio.gather(*(nc.request(subject, body, timeout=60)
                                         for _ in range(count)))
        for a in answers:
            ack = json.loads(a.data)
            assert "error" not in ack, ack
            seqs.append(int(ack["seq"]))
    return seqs


def pub(session: JetStreamSession, subject: str, n: int, size: int = 100,
        payload: bytes | None = None) -> list[int]:
    return session.run(publish(session, subject, n, size, payload))


def consumer(session: JetStreamSession, stream: str, name: str, **config: Any) -> ConsumerInfo:
    """Create a durable pull consumer (explicit ack unless told otherwise)."""
    return session.run(session.admin.create_consumer(
        stream, ConsumerConfig(durable_name=name, **config)))


def add_stream(js: JetStreamSession, names: Any) -> None:
    js.run(js.admin.add_stream(names.stream, [names.subject]))


def publish_and_wait(js: JetStreamSession, names: Any, messages: list[Any]) -> None:
    before = js.stream_info(names.stream).state.last_seq
    js.run(publish_messages(js.conn, messages))
    js.run(wait_for_messages(js.conn, names.stream, before + len(messages)))


def purge_stream(js: JetStreamSession, name: str, *, keep: int | None = None) -> None:
    js.run(js.conn.request(f"STREAM.PURGE.{name}", {"keep": keep} if keep is not None else None))


# --- acks and message facts the product does not need itself -----------------------------------
IN_PROGRESS = b"+WPI"


def ack(session: JetStreamSession, replies: Iterable[str]) -> int:
    """``+ACK`` each reply subject, in one block confirmed applied."""
    return session.run(session.acker.ack(replies))


def nak(session: JetStreamSession, replies: Iterable[str], delay: float | None = None) -> int:
    return session.run(session.acker.send(AckBlock.of(replies, nak_body(delay))))


def term(session: JetStreamSession, replies: Iterable[str], reason: str | None = None) -> int:
    return session.run(session.acker.send(AckBlock.of(replies, term_body(reason))))


def in_progress(session: JetStreamSession, replies: Iterable[str]) -> int:
    return session.run(session.acker.send(AckBlock.of(replies, IN_PROGRESS)))


async def ack_confirmed(session: JetStreamSession, reply: str, timeout: float = 2.0) -> bool:
    """A "double ack" of one delivery: True once the server applied it.

    The answer is the same for a first ack and a repeat, so this cannot tell them apart
    (measured). False means no answer: the subject names a delivery the server never made.
    """
    try:
        msg = await session.conn.nc.request(reply, ACK, timeout=timeout)
    except nats.errors.NoRespondersError as e:
        raise ConsumerNotFoundError(f"no consumer for ack subject {reply}", code=503) from e
    except nats.errors.TimeoutError:
        return False
    # nats-py turns the 503 answer for a missing consumer into NoRespondersError above.
    return msg.data == b""


def size(message: JsMessage) -> int:
    """What a message costs against a pull's ``max_bytes`` (measured formula)."""
    return (len(message.subject.encode()) + len(message.reply.encode())
            + len(message.raw_headers or b"") + len(message.data))


def drained(end: PullEnd) -> bool:
    """The consumer had nothing more for this request."""
    return end is PullEnd.NO_MESSAGES


def timed_pull(session: JetStreamSession, puller: Puller, batch: int,
               **kw: Any) -> tuple[PullResult, float]:
    t0 = time.monotonic()
    result = session.pull(puller, batch, **kw)
    return result, time.monotonic() - t0


def wait_until(fetch: Callable[[], T], check: Callable[[T], bool] = bool, timeout: float = 30.0,
               interval: float = 0.02, what: str = "condition") -> T:
    """Poll ``fetch()`` until ``check`` holds (the server applies acks asynchronously). The
    timeout only bounds a failing test: a passing one returns as soon as the state is there."""
    deadline = time.monotonic() + timeout
    value = fetch()
    while not check(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s; last value: {value!r}")
        time.sleep(interval)
        value = fetch()
    return value


def settled(js: JetStreamSession, stream: str, consumer: str, ack_pending: int = 0
            ) -> ConsumerInfo:
    """The consumer's info once ``num_ack_pending`` is ``ack_pending``: acks sent without a
    confirmation (tests' fire-and-forget ones) are applied by the server asynchronously."""
    return wait_until(lambda: js.consumer_info(stream, consumer),
                      lambda info: info.num_ack_pending == ack_pending)


def run_until(session: JetStreamSession, check: Callable[[], bool], timeout: float = 30.0) -> None:
    """Run ``session``'s event loop (so subscription callbacks are delivered) until ``check``."""
    async def wait() -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not reached within {timeout}s")
            await asyncio.sleep(0.01)

    session.run(wait())


@pytest.fixture
def stream(js: JetStreamSession, names: Any) -> Iterator[str]:
    """This test's stream over ``<prefix>.>``; deleted afterwards."""
    js.run(js.admin.add_stream(names.stream, [names.subject]))
    try:
        yield names.stream
    finally:
        try:
            js.run(js.admin.delete_stream(names.stream))
        except Exception:  # the test may have broken the connection on purpose
            pass


class AfterEachRound:
    """A run's :class:`~js_etl.report.Progress` that calls ``fn(report)`` after each committed
    round: how a test acts at a round boundary of a real run."""

    def __init__(self, fn: Callable[[Any], None]) -> None:
        self.fn = fn

    def round_done(self, report: Any) -> None:
        self.fn(report)

    def finished(self, report: Any) -> None:
        pass


def started_together(calls: list[Callable[[], T]]) -> dict[int, T | RunRefusedError]:
    """Each call in its own thread, all released by one barrier: index -> its result, or the
    RunRefusedError it raised (anything else fails the test)."""
    start = threading.Barrier(len(calls))
    outcomes: dict[int, T | RunRefusedError] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        start.wait()
        try:
            outcomes[i] = calls[i]()
        except RunRefusedError as e:
            outcomes[i] = e
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return outcomes
