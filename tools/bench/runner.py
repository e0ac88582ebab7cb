"""One bench run against a running nats-server: publish each workload once, run the selected
legs on fresh consumers (alternating over repeats), verify them, or run the memory check."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
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
    PEER_MAX_BYTES,
    PEER_TARGET,
    SCHEMA_DDL,
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


class Bench:
    """One run: owns the bench's JetStream session, sampler and Spark session (``close()``
    releases them); ``run()`` returns the whole result as the JSON-able dict printed last."""

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
            self.out(f"(spark.stop failed: {first_line(e)})")
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
        from js_etl.demo.publish import publish, wait_for_messages

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
        return consumer_problems(self.js, stream, durable)

    # legs ---------------------------------------------------------------------------------------
    def client_leg(self, pub: dict[str, Any], n: int, config: JobConfig, run: int) -> Leg:
        fetch = config.fetch
        return self._pull_loop_leg(
            "client_limit", client_child, (fetch.batch, fetch.max_bytes, fetch.pull_timeout),
            pub, n, fetch.partitions, f"client{run}",
            {"batch": fetch.batch, "max_bytes": fetch.max_bytes})

    def natspy_leg(self, pub: dict[str, Any], n: int, config: JobConfig, run: int) -> Leg:
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

    def peer_leg(self, pub: dict[str, Any], n: int, run: int) -> Leg:
        stream, durable = pub["stream"], f"peer{run}"
        table = str(self.s.workdir / f"{stream}_peer{run}")
        self.add_consumer(stream, durable, -1)
        args = [(self.url, stream, durable, table, self.s.peer_batch, PEER_MAX_BYTES, 10.0)]
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
                    "table": table})

    def js_etl_leg(self, pub: dict[str, Any], n: int, run: int) -> Leg:
        from js_etl.drain.run import run_drain

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
                    "writer": report.writer, "writer_note": report.writer_note,
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
                                                f"{first_line(spark_error)})")
            except Exception as e:  # a missing or unreadable table fails the leg, not the bench
                leg.problems.append(f"table unreadable: {first_line(e)}")
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
            from js_etl.drain.run import run_drain

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
                   "js_etl": lambda run: self.js_etl_leg(pub, n, run),
                   "nats_py_fetch": lambda run: self.natspy_leg(pub, n, config, run)}
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
        pooled = {name: leg["msg_per_cpu_s_all_runs"] if leg["verified"] else 0.0
                  for name, leg in summary.items()}
        result: dict[str, Any] = {
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
                warm = self.overrides(warm_pub["stream"], "warmup", f"{warm_pub['stream']}_warm")
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

            [result] = run_children(
                memory_child, [(self.overrides(stream, "jsetl", f"{stream}_jsetl"), warm, n,
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


