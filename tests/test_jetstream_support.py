"""Shared helpers for the JetStream tests (no tests here).

Imported by the ``test_jetstream_*`` modules; pytest puts ``tests/`` on ``sys.path`` (no package
``__init__``), so ``from test_jetstream_support import ...`` works from any of them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from js_etl.jetstream import ConsumerConfig, ConsumerInfo, JetStreamSession, Puller, PullResult

T = TypeVar("T")


async def publish(session: JetStreamSession, subject: str, n: int, size: int = 100,
                  payload: bytes | None = None) -> list[int]:
    """Publish ``n`` messages and wait for every PubAck; returns the stream sequences in order."""
    nc = session.conn.nc
    body = payload if payload is not None else b"x" * size
    answers = await asyncio.gather(*(nc.request(subject, body, timeout=5) for _ in range(n)))
    seqs = []
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


def timed_pull(session: JetStreamSession, puller: Puller, batch: int,
               **kw: Any) -> tuple[PullResult, float]:
    t0 = time.monotonic()
    result = session.pull(puller, batch, **kw)
    return result, time.monotonic() - t0


def wait_until(fetch: Callable[[], T], check: Callable[[T], bool], timeout: float = 30.0,
               interval: float = 0.02) -> T:
    """Poll ``fetch()`` until ``check`` holds (the server applies acks asynchronously). The
    timeout only bounds a failing test: a passing one returns as soon as the state is there."""
    deadline = time.monotonic() + timeout
    value = fetch()
    while not check(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s; last value: {value!r}")
        time.sleep(interval)
        value = fetch()
    return value


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
