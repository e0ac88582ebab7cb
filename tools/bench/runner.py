"""One bench run against a running nats-server (and, for tables on S3, a running object store):
for each schema, publish each workload once, and for each target run the selected legs on fresh
consumers of that stream (alternating over repeats) and verify them — one cell per workload,
target and schema; or run the memory check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from js_etl.errors import TerminalError
from js_etl.jetstream import ConnectionOptions, ConsumerConfig, JetStreamSession
from tools.bench.children import RssSampler, run_children
from tools.bench.legs import client_child, memory_child, natspy_child, peer_child
from tools.bench.report import Leg, first_line, machine, ratio, summarize
from tools.bench.settings import (
    ACK_WAIT,
    JS_ETL_MAX_ACK_PENDING,
    LEG_LABELS,
    MEMORY_TARGET,
    PARTITION_BY,
    PEER_CPU_TARGET,
    PEER_MAX_BYTES,
    PEER_TARGET,
    SCHEMAS,
    WARMUP_MESSAGES,
    Settings,
    client_target,
    payload,
)
from tools.bench.verify import (
    consumer_problems,
    start_spark,
    table_counts,
    table_counts_deltalake,
    table_problems,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from js_etl.config import JobConfig
    from tools.object_store import LocalS3Server
    from tools.spark_connect import LocalSparkConnectServer


class Bench:
    """One run: owns the bench's JetStream session, sampler and Spark session (``close()``
    releases them); ``run()`` returns the whole result as the JSON-able dict printed last.
    ``store``: the running object store of the ``s3`` target (its process's CPU is counted as
    the store's, apart from the legs'); its AWS_* variables are this process's already, as
    js-etl reads them."""

    def __init__(self, settings: Settings, url: str, out: Callable[[str], None],
                 store: LocalS3Server | None = None) -> None:
        self.s = settings
        self.url = url
        self.out = out
        self.store = store
        self.js = JetStreamSession(ConnectionOptions(servers=(url,), name="js-etl-bench"))
        self.sampler = RssSampler()
        if store is not None:
            self.sampler.store_pid = store.pid
        self.sampler.start()
        self.spark: SparkSession | None = None
        self.spark_columnar: bool | None = None  # the JVM's flavour (see start_spark)
        self.connect: LocalSparkConnectServer | None = None  # the js_etl_connect leg's server
        self.counter = 0
        self.buckets = 0
        self.partitions = settings.partitions[0] if settings.partitions else None  # the cell's

    def close(self) -> None:
        self.sampler.stop()
        if self.connect is not None:
            self.connect.stop()
            self.connect = None
        try:
            if self.spark is not None:
                self.spark.stop()
        except Exception as e:  # a JVM that died (e.g. OutOfMemoryError) cannot be stopped
            self.out(f"(spark.stop failed: {first_line(e)})")
        finally:
            self.spark = None
            self.js.close()

    # config ---------------------------------------------------------------------------------
    def overrides(self, stream: str = "BENCH", consumer: str = "jsetl",
                  table: str | None = None, schema: str = "flat") -> list[str]:
        """The js-etl drain config as overrides: bench defaults < user --set < what the bench
        owns (server, stream, consumer, table: a location, by default ``t`` in the work
        directory). A user's ``--set decode.format=raw`` (or ``text``) drops the bench's
        decode.schema, which only a json drain takes."""
        from js_etl.config import load_config

        formats = [o.split("=", 1)[1].strip() for o in self.s.overrides
                   if o.split("=", 1)[0].strip() == "decode.format"]
        base = ["decode.format=json", f"target.partition_by=[{PARTITION_BY}]"]
        if (formats or ["json"])[-1] == "json":
            base.insert(1, f"decode.schema={SCHEMAS[schema]}")
        if self.partitions is not None:
            base.append(f"fetch.partitions={self.partitions}")
        probe = load_config(None, [*base, "source.stream=x", "source.consumer=x",
                                   "target.path=x", *self.s.overrides], environ={})
        # One session (and Connect server) for every --partitions value: slots for the most.
        slots = max(probe.fetch.partitions, *(self.s.partitions or ()), 2)
        base.append(f"spark.master=local[{slots}]")
        owned = [f"nats.servers={self.url}", f"source.stream={stream}",
                 f"source.consumer={consumer}", "source.create_consumer=false",
                 f"target.path={table or self.s.workdir / 't'}"]
        return [*base, *self.s.overrides, *owned]

    def config(self, stream: str = "BENCH", consumer: str = "jsetl", table: str | None = None,
               schema: str = "flat") -> JobConfig:
        from js_etl.config import load_config

        return load_config(None, self.overrides(stream, consumer, table, schema), environ={})

    # tables -------------------------------------------------------------------------------------
    def new_bucket(self) -> str:
        """A fresh bucket of the store, for one run of a cell (both legs' tables)."""
        assert self.store is not None
        self.buckets += 1
        bucket = f"js-etl-bench-{self.buckets}"
        self.store.create_bucket(bucket)
        return bucket

    def location(self, name: str, bucket: str | None) -> str:
        """Where a table called ``name`` goes: in the work directory, or in ``bucket``."""
        return f"s3://{bucket}/{name}" if bucket else str(self.s.workdir / name)

    def storage(self, location: str) -> dict[str, str] | None:
        """The storage options of a table on the store: its AWS_* variables; None if local."""
        return self.store.environment() if location.startswith("s3://") and self.store else None

    def remove_table(self, location: str) -> None:
        """Delete a table and its dead-letter table (``<table>_dead_letters``)."""
        if not location.startswith("s3://"):
            shutil.rmtree(location, ignore_errors=True)
            shutil.rmtree(location + "_dead_letters", ignore_errors=True)
            return
        import obstore

        assert self.store is not None
        bucket, _, name = location.removeprefix("s3://").partition("/")
        store = self.store.store(bucket)
        for prefix in (name, name + "_dead_letters"):
            for batch in obstore.list(store, prefix=prefix):
                obstore.delete(store, [meta["path"] for meta in batch])

    # stream and consumers ----------------------------------------------------------------------
    def publish(self, n: int, size: int, schema: str = "flat") -> dict[str, Any]:
        from js_etl.demo.publish import publish, wait_for_messages

        self.counter += 1
        stream, subject = f"BENCH{self.counter}_{size}", f"bench.w{self.counter}"
        self.js.run(self.js.admin.add_stream(stream, [subject]))
        pad = b"x" * size
        total = 0

        def messages() -> Iterator[tuple[str, bytes]]:
            nonlocal total
            for i in range(n):
                body = payload(i, size, pad, schema)
                total += len(body)
                yield subject, body

        t0 = time.monotonic()
        self.js.run(publish(self.js.conn, messages()))
        self.js.run(wait_for_messages(self.js.conn, stream, n, timeout=60 + n / 5_000))
        seconds = time.monotonic() - t0
        state = self.js.stream_info(stream).state
        if state.messages != n:
            raise TerminalError(f"stream {stream} holds {state.messages} messages, expected {n}")
        return {"stream": stream, "schema": schema, "seconds": round(seconds, 2),
                "msg_per_s": round(n / seconds), "payload_bytes": total,
                "first_seq": state.first_seq, "last_seq": state.last_seq,
                "stream_bytes": state.bytes}

    def add_consumer(self, stream: str, durable: str, max_ack_pending: int) -> None:
        self.js.run(self.js.admin.create_consumer(stream, ConsumerConfig(
            durable_name=durable, ack_wait=ACK_WAIT, max_ack_pending=max_ack_pending,
            description="js-etl bench")))

    def consumer_problems(self, stream: str, durable: str) -> tuple[list[str], dict[str, int]]:
        return consumer_problems(self.js, stream, durable)

    # legs ---------------------------------------------------------------------------------------
    def client_leg(self, pub: dict[str, Any], n: int, config: JobConfig, run: str) -> Leg:
        fetch = config.fetch
        return self._pull_loop_leg(
            "client_limit", client_child, (fetch.batch, fetch.max_bytes, fetch.pull_timeout),
            pub, n, fetch.partitions, f"client{run}",
            {"batch": fetch.batch, "max_bytes": fetch.max_bytes})

    def natspy_leg(self, pub: dict[str, Any], n: int, config: JobConfig, run: str) -> Leg:
        """Like the client limit (same processes, batch, consumer settings), through nats-py's
        own ``fetch``; nats-py has no byte limit per pull, so ``fetch.max_bytes`` does not apply.
        Timed to each process's last ack: a process that finds nothing left waits out a fetch."""
        fetch = config.fetch
        return self._pull_loop_leg(
            "nats_py_fetch", natspy_child, (fetch.batch, fetch.pull_timeout), pub, n,
            fetch.partitions, f"natspy{run}", {"batch": fetch.batch}, end="last_ack")

    def _pull_loop_leg(self, name: str, child: Callable[..., None], child_args: tuple[Any, ...],
                       pub: dict[str, Any], n: int, procs: int, durable: str,
                       details: dict[str, Any], end: str = "end") -> Leg:
        """A leg of ``procs`` processes pulling + acking one fresh consumer until it is empty,
        counting what they received (payloads discarded)."""
        stream = pub["stream"]
        self.add_consumer(stream, durable, -1)
        results = run_children(child, [(self.url, stream, durable, *child_args)] * procs,
                               timeout=120 + n / 2_000,
                               before_go=lambda _infos, pids: self.sampler.reset(None, pids))
        memory = self.sampler.snapshot()
        received = sum(r["received"] for r in results)
        seconds = max(r[end] for r in results) - min(r["start"] for r in results)
        problems = [p for r in results for p in r["problems"]]
        if received != n:
            problems.append(f"received {received}, expected {n}")
        consumer, state = self.consumer_problems(stream, durable)
        return Leg(name, procs, received, seconds, pub["payload_bytes"],
                   problems + consumer, memory,
                   {**details, "pulls": sum(r["pulls"] for r in results),
                    "client_cpu_seconds": round(sum(r["cpu"] for r in results), 2),
                    "consumer": state})

    def peer_leg(self, pub: dict[str, Any], n: int, run: str, table: str) -> Leg:
        stream, durable = pub["stream"], f"peer{run}"
        self.add_consumer(stream, durable, -1)
        args = [(self.url, stream, durable, table, self.s.peer_batch, PEER_MAX_BYTES, 10.0,
                 pub["schema"], self.storage(table))]
        [result] = run_children(peer_child, args, timeout=120 + n / 500,
                                before_go=lambda _infos, pids: self.sampler.reset(None, pids))
        memory = self.sampler.snapshot()
        problems = list(result["problems"])
        consumer, state = self.consumer_problems(stream, durable)
        return Leg("simple_peer", 1, result["received"], result["end"] - result["start"],
                   pub["payload_bytes"], problems + consumer, memory,
                   {"batch": self.s.peer_batch, "max_bytes": PEER_MAX_BYTES,
                    "pulls": result["pulls"], "delta_commits": result["writes"],
                    "peer_cpu_seconds": round(result["cpu"], 2), "consumer": state,
                    "table": table, "expect": {"ids": True, "filled": pub["schema"] == "rich"}})

    def js_etl_leg(self, pub: dict[str, Any], n: int, run: str, table: str) -> Leg:
        from js_etl.drain.run import run_drain

        stream, durable = pub["stream"], f"jsetl{run}"
        config = self.config(stream, durable, table, pub["schema"])
        self.add_consumer(stream, durable,
                          config.source.max_ack_pending or JS_ETL_MAX_ACK_PENDING)
        return self._in_process_leg("js_etl", run_drain, config, pub, n)

    def js_etl_stream_leg(self, pub: dict[str, Any], n: int, run: str, table: str) -> Leg:
        """``js-etl stream`` on the same data and session: an AvailableNow query from a fresh
        checkpoint into its own table, moving a consumer of its own (so the consumer check
        holds it to having committed every message); timed as the drain leg is."""
        from js_etl.streaming.run import run_stream

        stream, durable = pub["stream"], f"stream{run}"
        config = self.stream_config(stream, durable, table, pub["schema"])
        return self._in_process_leg("js_etl_stream", run_stream, config, pub, n)

    def stream_config(self, stream: str, durable: str, table: str, schema: str) -> JobConfig:
        """The stream job's config: the drain's, a checkpoint of its own, and ``durable`` (made
        here) as the consumer that follows the query."""
        from js_etl.config import load_config

        overrides = [*self.overrides(stream, durable, table, schema),
                     f"streaming.checkpoint={self.s.workdir / f'{stream}_{durable}_checkpoint'}",
                     "streaming.commit_consumer=true"]
        self.add_consumer(stream, durable, -1)
        return load_config(None, overrides, environ={})

    def _in_process_leg(self, name: str, run: Callable[[Any, JobConfig], Any],
                        config: JobConfig, pub: dict[str, Any], n: int) -> Leg:
        """A js-etl run on the bench's session, timed around the call, sampled from its start."""
        assert self.spark is not None
        self.sampler.reset(os.getpid())
        t0 = time.monotonic()
        report = run(self.spark, config)
        seconds = time.monotonic() - t0
        return self._drain_leg(name, config, report.as_dict(), seconds, pub, n)

    def js_etl_connect_leg(self, pub: dict[str, Any], n: int, run: str, table: str) -> Leg:
        """js-etl's drain as a Spark Connect client of the bench's server, on the same data, in
        a process of its own (Connect mode is process-wide): timed by its run report (connect
        to last ack), as the classic leg's ``run_drain`` call is, without the client's start;
        its CPU is the client's (its start included), the server's JVM's and its Python
        workers' (and the classic session's idle JVM's)."""
        stream, durable = pub["stream"], f"connect{run}"
        config = self.config(stream, durable, table, pub["schema"])
        self.add_consumer(stream, durable,
                          config.source.max_ack_pending or JS_ETL_MAX_ACK_PENDING)
        report = self.connect_drain(self.overrides(stream, durable, table, pub["schema"]),
                                    timeout=300 + n / 1_000)
        return self._drain_leg("js_etl_connect", config, report, report["seconds"], pub, n)

    def connect_drain(self, overrides: list[str], timeout: float) -> dict[str, Any]:
        """``js-etl drain`` with SPARK_REMOTE naming the bench's Spark Connect server: its run
        report (the last line it prints). The sampler's window starts with the process."""
        assert self.connect is not None
        args = [str(Path(sys.executable).with_name("js-etl")), "drain"]
        for item in overrides:
            args += ["--set", item]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "SPARK_REMOTE": self.connect.url})
        self.sampler.reset(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:  # a hung drain (or Ctrl-C) leaves no process behind
            proc.kill()
            proc.wait()
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"js-etl drain over Spark Connect exited {proc.returncode}: "
                               + ((err.strip().splitlines() or [""])[-1])[:300])
        return dict(json.loads(out.strip().splitlines()[-1]))

    def _drain_leg(self, name: str, config: JobConfig, report: dict[str, Any], seconds: float,
                   pub: dict[str, Any], n: int) -> Leg:
        """A js-etl leg's measurement from its run report (``RunReport.as_dict``)."""
        memory = self.sampler.snapshot()
        problems = []
        if report["messages_written"] != n:
            problems.append(f"run report: {report['messages_written']} written, expected {n}")
        if report["dead_letters"]:
            problems.append(f"run report: {report['dead_letters']} dead letters")
        consumer, state = self.consumer_problems(pub["stream"], report["consumer"])
        json_rows = config.decode.format == "json"
        return Leg(name, config.fetch.partitions, report["messages_written"], seconds,
                   pub["payload_bytes"], problems + consumer, memory,
                   {"batch": config.fetch.batch, "max_bytes": config.fetch.max_bytes,
                    "partition_max_bytes": config.fetch.partition_max_bytes,
                    "rounds": report["rounds"], "phase_seconds": report["phase_seconds"],
                    "writer": report["writer"], "writer_note": report["writer_note"],
                    "run_seconds": report["seconds"],
                    "stopped_because": report["stopped_because"],
                    "consumer": state, "table": config.target.path,
                    # a raw or text drain keeps the payload whole: no ids to count
                    "expect": {"ids": json_rows,
                               "filled": json_rows and pub["schema"] == "rich"}})

    def verify_table(self, leg: Leg, n: int, pub: dict[str, Any]) -> None:
        """Read the leg's table back: one on S3 with deltalake (in a child process, with the
        store's storage options); a local one with Spark, or, if Spark is unusable (an earlier
        leg killed its JVM), like one on S3."""
        path = leg.details["table"]
        try:
            if self.storage(path) is not None:
                raise RuntimeError("a table on S3")
            if self.spark is None:
                raise RuntimeError("Spark did not start")
            counts = table_counts(self.spark, path)
            leg.details["verified_with"] = "spark"
        except Exception as spark_error:
            try:
                counts = table_counts_deltalake(path, storage=self.storage(path))
                leg.details["verified_with"] = (
                    "deltalake (S3 storage options)" if self.storage(path) is not None else
                    f"deltalake (Spark unusable: {first_line(spark_error)})")
            except Exception as e:  # a missing or unreadable table fails the leg, not the bench
                leg.problems.append(f"table unreadable: {first_line(e)}")
                return
        leg.details["table_counts"] = counts
        expect = leg.details.get("expect", {})
        leg.problems.extend(table_problems(counts, n, pub["first_seq"], pub["last_seq"],
                                           ids=expect.get("ids", True),
                                           filled=expect.get("filled", False)))

    # the whole run --------------------------------------------------------------------------------
    def start_spark(self, schema: str) -> dict[str, Any]:
        """Spark for the js-etl drains of ``schema``, its JVM started as ``js-etl drain`` starts
        it for that config (:func:`tools.bench.verify.start_spark`: the columnar writer's JVM
        runs C1 only, Spark's writer's both compilers). A session whose JVM is of the other
        flavour is stopped with its JVM first. Then, unless ``--no-warmup``, a small untimed
        drain per target, so no timed leg pays JIT, Delta's or S3A's first use."""
        from js_etl.drain.writers.columnar_plan import expects_columnar

        config = self.config(schema=schema)
        columnar = expects_columnar(config)
        info: dict[str, Any] = {"schema": schema, "columnar_jvm": columnar}
        if self.spark is None or self.spark_columnar != columnar:
            if self.spark is not None:
                self.stop_spark_jvm()
            t0 = time.monotonic()
            self.spark = start_spark(config, object_store="s3" in self.s.targets)
            self.spark_columnar = columnar
            info["spark_startup_seconds"] = round(time.monotonic() - t0, 2)
            self.out(f"spark {self.spark.version} started in {info['spark_startup_seconds']} s "
                     f"(master {self.spark.sparkContext.master}; JVM for "
                     f"{'the columnar' if columnar else 'Spark' + chr(39) + 's'} writer, as "
                     f"js-etl drain starts it for the {schema} schema; not timed)")
        if "js_etl_connect" in self.s.legs:
            info["connect_startup_seconds"] = self.start_connect(config, columnar)
        if self.s.warmup:
            from js_etl.drain.run import run_drain

            info["warmup_seconds"] = {}
            for target in self.s.targets:
                pub = self.publish(WARMUP_MESSAGES, 256, schema)
                self.add_consumer(pub["stream"], "warmup", JS_ETL_MAX_ACK_PENDING)
                bucket = self.new_bucket() if target == "s3" else None
                table = self.location(f"{pub['stream']}_warmup", bucket)
                t0 = time.monotonic()
                report = run_drain(self.spark, self.config(pub["stream"], "warmup", table, schema))
                info["warmup_seconds"][target] = round(time.monotonic() - t0, 2)
                if "js_etl_stream" in self.s.legs:  # Spark's own writer and a query's first use
                    from js_etl.streaming.run import run_stream

                    run_stream(self.spark, self.stream_config(pub["stream"], "warmupstream",
                                                              f"{table}_stream", schema))
                if self.connect is not None:  # the server's JIT, Delta and Python workers too
                    self.add_consumer(pub["stream"], "warmupconnect", JS_ETL_MAX_ACK_PENDING)
                    self.connect_drain(self.overrides(pub["stream"], "warmupconnect",
                                                      f"{table}_connect", schema), timeout=300)
                self.js.run(self.js.admin.delete_stream(pub["stream"]))
                if not self.s.keep:
                    self.remove_table(table)
                    if self.connect is not None:
                        self.remove_table(f"{table}_connect")
                    if "js_etl_stream" in self.s.legs:
                        self.remove_table(f"{table}_stream")
                self.out(f"warm-up drain of {report.messages_written:,} messages, {target} "
                         f"table, {schema} schema: {info['warmup_seconds'][target]} s (JIT, "
                         f"Delta classes{', S3A' if target == 's3' else ''}; not timed)")
        return info

    def start_connect(self, config: JobConfig, columnar: bool) -> float | None:
        """The js_etl_connect leg's Spark Connect server (tools/spark_connect.py), its JVM as
        ``js-etl drain`` starts one for ``config`` and on the same master; started again when the
        JVM's flavour changes (see start_spark). Returns its start-up seconds, None if running."""
        from tools.spark_connect import LocalSparkConnectServer

        if self.connect is not None and self.connect.columnar == columnar:
            return None
        if self.connect is not None:
            self.connect.stop()
        t0 = time.monotonic()
        self.connect = LocalSparkConnectServer(self.s.workdir / "spark-connect",
                                               master=config.spark.master, columnar=columnar)
        self.connect.start()
        seconds = round(time.monotonic() - t0, 2)
        self.out(f"Spark Connect server on {config.spark.master} started in {seconds} s "
                 f"({self.connect.url}; not timed)")
        return seconds

    def stop_spark_jvm(self) -> None:
        """Stop the session and its JVM, so that the next one starts a JVM with its own options
        (a stopped session leaves PySpark's JVM running, with the options it was started
        with). The JVM exits when its standard input closes."""
        from pyspark import SparkContext

        assert self.spark is not None
        self.spark.stop()
        self.spark = None
        gateway = SparkContext._gateway
        if gateway is not None:
            proc = getattr(gateway, "proc", None)
            gateway.shutdown()
            if proc is not None:
                proc.stdin.close()
                proc.wait(60)
        SparkContext._gateway = None
        SparkContext._jvm = None

    def workload(self, n: int, size: int, schema: str) -> list[dict[str, Any]]:
        """Publish ``n`` messages of ``size`` bytes of ``schema`` once; one cell per target on
        that stream (each leg on its own fresh consumer)."""
        pub = self.publish(n, size, schema)
        parts = f", fetch.partitions {self.partitions}" if self.s.partitions else ""
        self.out(f"\nworkload {n:,} x {size} B, {schema} schema{parts}: published in "
                 f"{pub['seconds']} s "
                 f"({pub['msg_per_s']:,} msg/s), stream {pub['stream']} (file storage, R1); "
                 f"load average {os.getloadavg()[0]:.2f}")
        try:
            return [self.cell(pub, n, size, target) for target in self.s.targets]
        finally:
            self.js.run(self.js.admin.delete_stream(pub["stream"]))

    def cell(self, pub: dict[str, Any], n: int, size: int, target: str) -> dict[str, Any]:
        """The selected legs on one published stream, their tables on ``target``: the legs
        alternate over the repeats; each run of a cell on S3 writes into a bucket of its own."""
        schema = pub["schema"]
        config = self.config(schema=schema)
        if len(self.s.targets) > 1:
            self.out(f" target {target}:")
        legs: list[Leg] = []
        buckets: dict[int, str | None] = {}

        def table(name: str, run_no: int) -> str:
            if run_no not in buckets:
                buckets[run_no] = self.new_bucket() if target == "s3" else None
            return self.location(f"{pub['stream']}_{name}{run_no}", buckets[run_no])

        def tag(run_no: int) -> str:
            return f"{run_no}{target}"

        runners = {"client_limit": lambda r: self.client_leg(pub, n, config, tag(r)),
                   "simple_peer": lambda r: self.peer_leg(pub, n, tag(r), table("peer", r)),
                   "js_etl": lambda r: self.js_etl_leg(pub, n, tag(r), table("jsetl", r)),
                   "js_etl_connect": lambda r: self.js_etl_connect_leg(pub, n, tag(r),
                                                                       table("connect", r)),
                   "js_etl_stream": lambda r: self.js_etl_stream_leg(pub, n, tag(r),
                                                                     table("stream", r)),
                   "nats_py_fetch": lambda r: self.natspy_leg(pub, n, config, tag(r))}
        for run_no in range(1, self.s.repeat + 1):  # legs alternate: A B C A B C ...
            for name, runner in runners.items():
                if name not in self.s.legs:
                    continue
                try:
                    leg = runner(run_no)
                except Exception as e:  # a leg that crashes counts as failed; others still run
                    leg = Leg(name, 0, 0, 0.0, pub["payload_bytes"],
                              [f"crashed: {first_line(e)}"],
                              self.sampler.snapshot())  # peaks up to the crash
                leg.details["run"] = run_no
                self.out(f"  {LEG_LABELS[name]:<13} {leg.messages:>10,} msgs in "
                         f"{leg.seconds:7.2f} s  {leg.msg_per_s:>9,.0f} msg/s"
                         f"  {'ok' if leg.verified else 'FAILED'}")
                legs.append(leg)
        for leg in legs:
            if "table" in leg.details:
                self.verify_table(leg, n, pub)
        if not self.s.keep:
            for leg in legs:
                if "table" in leg.details:
                    try:
                        self.remove_table(leg.details["table"])
                    except Exception as e:  # a table left in the store fails nothing
                        self.out(f"(could not remove {leg.details['table']}: {first_line(e)})")
        summary = {name: summarize([leg for leg in legs if leg.name == name])
                   for name in runners if name in self.s.legs}
        rate = {name: leg["msg_per_s"] if leg["verified"] else 0.0
                for name, leg in summary.items()}
        per_cpu = {name: leg.get("msg_per_cpu_s") or 0.0 if leg["verified"] else 0.0
                   for name, leg in summary.items()}
        pooled = {name: leg["msg_per_cpu_s_all_runs"] if leg["verified"] else 0.0
                  for name, leg in summary.items()}
        result: dict[str, Any] = {
            "messages": n, "size": size, "target": target, "schema": schema,
            "partitions": config.fetch.partitions, "publish": pub,
            "legs": summary,
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
            "cpu_ratios_all_runs": {
                "js_etl_vs_client_limit": ratio(pooled.get("js_etl", 0.0),
                                                pooled.get("client_limit", 0.0)),
                "js_etl_vs_simple_peer": ratio(pooled.get("js_etl", 0.0),
                                               pooled.get("simple_peer", 0.0))},
            "targets": {"js_etl_vs_client_limit": client_target(size),
                        "js_etl_vs_simple_peer": PEER_TARGET},
        }
        result["targets_met"] = {k: (v is not None and v >= result["targets"][k])
                                 for k, v in result["ratios"].items()}
        result["cpu_targets"] = {"js_etl_vs_simple_peer": PEER_CPU_TARGET}
        result["cpu_targets_met"] = {
            k: (v is not None and v >= target) for k, target in result["cpu_targets"].items()
            for v in [result["cpu_ratios"][k]]}
        if "js_etl_connect" in summary:  # the drain over Spark Connect against the classic one
            result["connect_ratios"] = {
                "js_etl_connect_vs_js_etl": ratio(rate["js_etl_connect"], rate.get("js_etl", 0.0)),
                "per_cpu_second": ratio(per_cpu["js_etl_connect"], per_cpu.get("js_etl", 0.0))}
        if "js_etl_stream" in summary:  # the AvailableNow query against the drain
            result["stream_ratios"] = {
                "js_etl_stream_vs_js_etl": ratio(rate["js_etl_stream"], rate.get("js_etl", 0.0)),
                "per_cpu_second": ratio(per_cpu["js_etl_stream"], per_cpu.get("js_etl", 0.0))}
        if "nats_py_fetch" in summary:  # what js-etl's pull layer gains over nats-py's own
            result["pull_layer_ratios"] = {
                "client_limit_vs_nats_py_fetch": ratio(rate.get("client_limit", 0.0),
                                                       rate["nats_py_fetch"]),
                "per_cpu_second": ratio(per_cpu.get("client_limit", 0.0),
                                        per_cpu["nats_py_fetch"])}
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
                warm = self.overrides(warm_pub["stream"], "warmup",
                                      self.location(f"{warm_pub['stream']}_warm", None))
            self.out(f"\nmemory check: {n:,} x {size} B published in {pub['seconds']} s; "
                     "draining in a fresh process and JVM"
                     + (f" after a {WARMUP_MESSAGES:,}-message warm-up drain" if warm else ""))
            memory: dict[str, Any] = {}
            startup: list[float] = []

            def before_go(infos: list[Any], pids: list[int],
                          startup: list[float] = startup) -> None:
                startup.append(infos[0])
                self.sampler.reset(pids[0])  # that process is the driver of this run

            def on_event(kind: str, index: int, value: Any,
                         memory: dict[str, Any] = memory) -> None:
                if kind == "drained":  # peaks of the drain, before the verification read
                    memory.update(self.sampler.snapshot())

            table = self.location(f"{stream}_jsetl", None)
            [result] = run_children(
                memory_child, [(self.overrides(stream, "jsetl", table), warm, n,
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
        if self.store is not None:
            result["store"] = {"kind": "SeaweedFS (weed server -s3)",
                               "endpoint": self.store.endpoint, "pid": self.store.pid,
                               "cpu": "its own process: the store's CPU seconds are reported "
                                      "per leg as cpu_seconds.store, never in a leg's cpu or "
                                      "msg/cpu-s"}
        result["spark_starts"] = []
        result["workloads"] = []  # one cell per workload, target and schema
        for schema in self.s.schemas:
            if {"js_etl", "js_etl_connect", "simple_peer"} & set(self.s.legs):
                # js-etl runs on it; local tables are read back with it
                result["spark_starts"].append(self.start_spark(schema))
            for partitions in self.s.partitions or (None,):
                self.partitions = partitions
                for n, size in self.s.workloads:
                    result["workloads"] += self.workload(n, size, schema)
        first = result["spark_starts"][0] if result["spark_starts"] else {}
        for key in ("spark_startup_seconds", "warmup_seconds"):  # as before, the first start's
            if key in first:
                result[key] = first[key]
        failed = [f"{w['messages']}x{w['size']}/{w['target']}/{w['schema']}"
                  f"{'/p' + str(w['partitions']) if self.s.partitions else ''}:{name}"
                  for w in result["workloads"]
                  for name, leg in w["legs"].items() if not leg["verified"]]
        result["failed_legs"] = failed
        result["ok"] = not failed
        return result

    def settings_dict(self) -> dict[str, Any]:
        config = self.config()
        return {"workloads": [{"messages": n, "size": s} for n, s in self.s.workloads],
                "targets": list(self.s.targets), "schemas": list(self.s.schemas),
                "decode_schemas": {name: SCHEMAS[name] for name in self.s.schemas},
                "partitions": config.fetch.partitions,
                "partitions_swept": list(self.s.partitions or ()),
                "fetch_batch": config.fetch.batch,
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


