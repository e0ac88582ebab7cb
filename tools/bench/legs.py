"""What the processes of each leg do, each in a fresh spawned process (see
:func:`tools.bench.children.run_children`): the client limit, nats-py fetch, the simple
peer, and one memory-check run of js-etl."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from js_etl.jetstream import (
    Acker,
    ConnectionOptions,
    Deliveries,
    JetStreamConnection,
    PullEnd,
    Puller,
)
from js_etl.spark.session import spark_jvm
from tools.bench.settings import MiB
from tools.bench.verify import start_spark, table_counts, table_problems


async def _connect(url: str, name: str) -> JetStreamConnection:
    return await JetStreamConnection.open(ConnectionOptions(servers=(url,), name=name))


def _nats_child(index: int, url: str, name: str, events: Any, go: Any,
                prepare: Callable[[Any], Callable[[], Awaitable[dict[str, Any]]]],
                connect: Callable[[str, str], Awaitable[Any]] = _connect) -> None:
    """The run_children protocol for a leg that drains over one NATS connection: ``connect``
    (js-etl's connection by default), ``prepare(conn)`` the leg's drain, report ready, wait for
    go, then time the drain (wall and CPU) and report its result."""
    loop = asyncio.new_event_loop()
    conn = None
    try:
        conn = loop.run_until_complete(connect(url, name))
        drain = prepare(conn)
        events.put(("ready", index, None))
        go.wait()
        cpu0, start = time.process_time(), time.monotonic()
        result = loop.run_until_complete(drain())
        events.put(("done", index, {**result, "start": start, "end": time.monotonic(),
                                    "cpu": time.process_time() - cpu0}))
    except BaseException as e:  # reported to the parent, which fails the leg
        events.put(("error", index, f"{type(e).__name__}: {e}"))
    finally:
        if conn is not None:
            loop.run_until_complete(conn.close())
        loop.close()


async def _pull_until_empty(conn: JetStreamConnection, stream: str, durable: str, batch: int,
                            max_bytes: int, pull_timeout: float,
                            handle: Callable[[Deliveries], None] = lambda messages: None
                            ) -> dict[str, Any]:
    """Pull, ``handle`` each batch, ack it (one write + one flush), until 404."""
    puller, acker = Puller(conn, stream, durable), Acker(conn)
    received = pulls = 0
    while True:
        result = await puller.pull(batch, max_bytes=max_bytes, timeout=pull_timeout)
        pulls += 1
        if result.messages:
            handle(result.messages)
            received += await acker.ack([r.decode() for r in result.messages.replies])
        if result.end is PullEnd.NO_MESSAGES:
            return {"received": received, "pulls": pulls, "problems": []}
        if result.end is PullEnd.REQUESTS_PENDING:
            # Another process's pull asks for more than is left: it is being served; ask
            # again (404 once the stream is drained).
            await asyncio.sleep(0.001)
            continue
        if result.end not in (PullEnd.BATCH_FULL, PullEnd.BYTES_FULL):
            return {"received": received, "pulls": pulls,
                    "problems": [f"pull ended {result.end.value} ({result.status})"]}


def client_child(index: int, url: str, stream: str, durable: str, batch: int, max_bytes: int,
                 pull_timeout: float, events: Any, go: Any) -> None:
    """Client-limit leg, one process: pull + ack until 404, counting, payloads discarded."""
    _nats_child(index, url, f"js-etl-bench-client-{index}", events, go,
                lambda conn: lambda: _pull_until_empty(conn, stream, durable, batch, max_bytes,
                                                       pull_timeout))


async def _connect_nats_py(url: str, name: str) -> Any:
    """A plain nats-py client, without js-etl's connection layer on top."""
    import nats

    return await nats.connect(servers=[url], name=name)


def natspy_child(index: int, url: str, stream: str, durable: str, batch: int,
                 pull_timeout: float, events: Any, go: Any) -> None:
    """nats-py fetch leg, one process: nats-py's own pull API on the leg's durable consumer —
    ``fetch(batch)``, ``msg.ack()`` per message, one ``flush()`` per batch — until a message
    says nothing is left to deliver, or a fetch gets nothing for ``pull_timeout`` (another
    process took the rest). ``last_ack``, the time of the last flushed ack, ends the leg's
    timing: that idle wait is not work. Payloads discarded."""

    def prepare(nc: Any) -> Callable[[], Awaitable[dict[str, Any]]]:
        async def drain() -> dict[str, Any]:
            subscription = await nc.jetstream().pull_subscribe_bind(durable=durable,
                                                                    stream=stream)
            received = pulls = 0
            last_ack = time.monotonic()
            while True:
                try:
                    messages = await subscription.fetch(batch, timeout=pull_timeout)
                except TimeoutError:  # nothing left for this process
                    break
                pulls += 1
                for message in messages:
                    await message.ack()
                await nc.flush()
                last_ack = time.monotonic()
                received += len(messages)
                # A fetch on an empty consumer waits its whole timeout: stop on the last one.
                if messages[-1].metadata.num_pending == 0:
                    break
            await subscription.unsubscribe()
            return {"received": received, "pulls": pulls, "problems": [], "last_ack": last_ack}

        return drain

    _nats_child(index, url, f"js-etl-bench-natspy-{index}", events, go, prepare,
                connect=_connect_nats_py)


def peer_arrow_schema(schema: str) -> Any:
    """The payload's fields as the simple peer declares them: the Arrow types a user would write
    by hand for ``SCHEMAS[schema]`` (tools.bench.settings)."""
    import pyarrow as pa

    fields = [("id", pa.int64()), ("kind", pa.string()), ("amount", pa.float64()),
              ("pad", pa.string())]
    if schema == "rich":
        fields += [("ts", pa.timestamp("us", tz="UTC")), ("price", pa.decimal128(18, 4)),
                   ("customer", pa.struct([
                       ("id", pa.int64()), ("name", pa.string()),
                       ("address", pa.struct([("city", pa.string()), ("zip", pa.string())]))]))]
    return pa.schema(fields)


def peer_child(index: int, url: str, stream: str, durable: str, table: str, batch: int,
               max_bytes: int, pull_timeout: float, schema_name: str,
               storage: dict[str, str] | None, events: Any, go: Any) -> None:
    """Simple-peer leg: pull a batch → pyarrow table (JSON decoded by pyarrow with the declared
    schema) → deltalake append (to an ``s3://`` table with ``storage`` as its storage options)
    → ack, in one process."""

    def prepare(conn: JetStreamConnection) -> Callable[[], Awaitable[dict[str, Any]]]:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pj
        from deltalake import write_deltalake

        from js_etl.jetstream.subjects import ack_prefix, parse_ack_columns

        schema = peer_arrow_schema(schema_name)
        parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        writes = 0

        def write(messages: Deliveries) -> None:
            nonlocal writes
            n = len(messages)
            acks = parse_ack_columns(pa.array(messages.replies, pa.binary()).cast(pa.string()),
                                     ack_prefix(stream, durable))
            decoded = pj.read_json(pa.BufferReader(b"\n".join(messages.payloads)),
                                   parse_options=parse)
            if decoded.num_rows != n:
                raise RuntimeError(f"pyarrow decoded {decoded.num_rows} rows from {n} messages")
            published = pc.cast(pc.divide(acks.timestamp_ns, 1000),
                                pa.timestamp("us", tz="UTC"))
            write_deltalake(table, pa.table({
                "subject": pa.array(messages.subjects, pa.binary()).cast(pa.string()),
                "seq": acks.stream_seq,
                "consumer_seq": acks.consumer_seq,
                "num_delivered": acks.num_delivered,
                "published_at": published,
                **{name: decoded.column(name) for name in schema.names},
                "date": pc.cast(published, pa.date32()),
            }), mode="append", partition_by=["date"], storage_options=storage)
            writes += 1

        async def drain() -> dict[str, Any]:
            result = await _pull_until_empty(conn, stream, durable, batch, max_bytes,
                                             pull_timeout, write)
            return {**result, "writes": writes}

        return drain

    _nats_child(index, url, "js-etl-bench-peer", events, go, prepare)


def memory_child(index: int, overrides: list[str], warmup: list[str] | None, n: int,
                 first_seq: int, last_seq: int, events: Any, go: Any) -> None:
    """One memory-check run in a fresh process and JVM: start Spark (and drain the small warm-up
    stream, so both runs compare JVMs that loaded and compiled the same code), wait for go,
    drain, verify."""
    spark = None
    try:
        from js_etl.config import load_config
        from js_etl.drain.run import run_drain

        config = load_config(None, overrides, environ={})
        started = time.monotonic()
        spark = start_spark(config)
        if warmup:
            run_drain(spark, load_config(None, warmup, environ={}))
        events.put(("ready", index, round(time.monotonic() - started, 2)))
        go.wait()
        t0 = time.monotonic()
        report = run_drain(spark, config)
        seconds = time.monotonic() - t0
        events.put(("drained", index, None))
        # What the JVM still holds after the run, once garbage is collected (outside the
        # measured peak): RSS mostly follows the heap limit, this follows what was kept.
        jvm = spark_jvm(spark)
        jvm.java.lang.System.gc()
        heap = jvm.java.lang.management.ManagementFactory.getMemoryMXBean().getHeapMemoryUsage()
        retained = {"heap_used_after_gc_mib": round(heap.getUsed() / MiB, 1),
                    "heap_max_mib": round(heap.getMax() / MiB, 1)}
        counts = table_counts(spark, config.target.path or "")
        problems = table_problems(counts, n, first_seq, last_seq)
        events.put(("done", index, {"seconds": seconds, "report": report.as_dict(),
                                    "counts": counts, "problems": problems, **retained}))
    except BaseException as e:  # reported to the parent, which fails the run
        events.put(("error", index, f"{type(e).__name__}: {e}"))
    finally:
        if spark is not None:
            spark.stop()


