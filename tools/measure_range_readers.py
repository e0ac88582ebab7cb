"""Which range reader a micro-batch (or a batch read, or a backfill) should use: the one js-etl
uses — an ephemeral ack-none consumer by start sequence, pulled in batches
(js_etl.source.read_range) — against ADR-31's batch direct get (``$JS.API.DIRECT.GET.<stream>``
with ``seq`` and ``batch``: the server answers with up to ``batch`` stored messages, then a 204
end-of-batch status; at most 1,000 a request on the servers measured). The same range of a
local nats-server's stream (``allow_direct``), read whole by each, one reader at a time; rates
and the reader process's CPU are printed, and the ratio.

    .venv/bin/python tools/measure_range_readers.py [MESSAGES] [SIZE]
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from js_etl.demo.publish import publish, wait_for_messages
from js_etl.demo.server import LocalNatsServer
from js_etl.jetstream import ConnectionOptions, JetStreamSession
from js_etl.source.read_range import RangeFetchPlan, read_range

DIRECT_BATCH = 1000  # the most one batch direct get answers


def consumer_read(options: ConnectionOptions, stream: str, n: int) -> int:
    plan = RangeFetchPlan(options=options, stream=stream, name_prefix="measure",
                          bounds=((1, n),), filter_subjects=(), batch=4000, max_bytes=8 << 20,
                          pull_timeout=5.0, inactive_threshold=30.0)
    return sum(batch.num_rows for batch in read_range(plan, 0))


def direct_read(options: ConnectionOptions, stream: str, n: int) -> int:
    async def read(js: JetStreamSession) -> int:
        nc = js.conn.nc
        got, seq = 0, 1
        inbox = nc.new_inbox()
        queue: asyncio.Queue[object] = asyncio.Queue()

        async def take(msg: object) -> None:
            await queue.put(msg)

        sub = await nc.subscribe(inbox, cb=take)
        try:
            while seq <= n:
                ask = min(DIRECT_BATCH, n - seq + 1)
                await nc.publish(f"$JS.API.DIRECT.GET.{stream}",
                                 json.dumps({"seq": seq, "batch": ask}).encode(), reply=inbox)
                while True:
                    msg = await asyncio.wait_for(queue.get(), 10)
                    headers = getattr(msg, "headers", None) or {}
                    if headers.get("Status") == "204" or not getattr(msg, "data", b""):
                        if headers.get("Status") not in (None, "204"):
                            raise RuntimeError(f"direct get answered {headers}")
                        break
                    got += 1
                    seq = int(headers["Nats-Sequence"]) + 1
        finally:
            await sub.unsubscribe()
        return got

    with JetStreamSession(options) as js:
        return js.run(read(js))


def timed(reader, options: ConnectionOptions, stream: str, n: int) -> tuple[float, float]:
    started, cpu = time.perf_counter(), time.process_time()
    got = reader(options, stream, n)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert got == n, f"{reader.__name__} read {got} of {n}"
    return seconds, cpu


def main(n: int, size: int) -> None:
    with tempfile.TemporaryDirectory() as work, LocalNatsServer(Path(work)) as server:
        options = ConnectionOptions(servers=(server.url,))
        with JetStreamSession(options) as js:
            js.run(js.admin.add_stream("RANGE", ["range.>"], allow_direct=True))
            js.run(publish(js.conn, (("range.x", b"x" * size) for _ in range(n))))
            js.run(wait_for_messages(js.conn, "RANGE", n))
        results = {}
        for name, reader in (("consumer", consumer_read), ("direct get", direct_read)) * 2:
            seconds, cpu = timed(reader, options, "RANGE", n)
            best = results.get(name)
            if best is None or seconds < best[0]:
                results[name] = (seconds, cpu)  # the faster of two alternating runs
        for name, (seconds, cpu) in results.items():
            print(f"{name:<11} {n:,} x {size} B in {seconds:.2f} s: {n / seconds:,.0f} msg/s, "
                  f"reader CPU {cpu:.2f} s ({n / max(cpu, 1e-9):,.0f} msg/CPU-s)")
        c, d = results["consumer"], results["direct get"]
        print(f"consumer / direct get: rate {d[0] / c[0]:.2f}, per CPU-second {d[1] / c[1]:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000,
         int(sys.argv[2]) if len(sys.argv) > 2 else 256)
