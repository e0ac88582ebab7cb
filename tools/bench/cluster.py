"""``js-etl bench --cluster 1,2,4``: the drain job on a Spark standalone cluster with N executors
against the same job on ``local[N]``, on the same published data.

The bench starts one standalone cluster of max(N) one-core workers (:mod:`tools.spark_cluster`,
loopback only, stopped by pid) and packs js-etl for the executors once
(:mod:`tools.shipping`: the wheel of this checkout plus the executors' dependencies, cached
in ``.cache/executor-env``). It publishes the workload once into one stream and, for each N,
runs two legs on their own fresh durable consumers of that stream, ``local[N]`` first and then
``cluster-N``: the packaged drain job (``js_etl/jobs/drain.py``) submitted with docs/running.md's
spark-submit ("Running on a cluster") — ``--master spark://…``, client deploy mode, Delta's jars
with ``--jars``, the packed environment with ``--archives env.tar.gz#environment``,
``spark.pyspark.python=./environment/bin/python``, ``spark.cores.max=N`` (N of the one-core
executors) — and the same command with ``--master local[N]`` and this venv's Python. Both legs
run with ``fetch.partitions=N``.

Every leg is verified like the other legs of the bench: the spark-submit exits 0, its run report
says N written and no dead letters, the table holds every message once (read with the
``deltalake`` package in a child process: the bench itself starts no Spark here), and the consumer
ends with nothing pending or ack-pending. Per leg: msg/s over the run report's own seconds (the
drain, from the job's connect to its last ack) and over the spark-submit's wall time (with JVM
start and exit), the phase seconds, and the load average at its start and end. Ratios:
cluster-N / local-N, and each leg's rate over its N=1 leg's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tools.bench.report import first_line, machine, ratio
from tools.bench.runner import Bench
from tools.bench.settings import JS_ETL_MAX_ACK_PENDING, Settings
from tools.bench.verify import table_counts_deltalake, table_problems

# Spark's defaults (200 shuffle partitions, 50 snapshot partitions) make a small table's first
# commit a 50-task stage: 29 s on two loaded one-core executors (tests/cluster measured it).
SMALL_TABLE_CONF = ("spark.sql.shuffle.partitions=4", "spark.databricks.delta.snapshotPartitions=2")
EXECUTOR_MEMORY = "1g"


def leg_name(mode: str, n: int) -> str:
    return f"local[{n}]" if mode == "local" else f"cluster-{n}"


def submit_command(master: str, n: int, job_args: Sequence[str],
                   env_archive: Path | None) -> list[str]:
    """docs/running.md's spark-submit of the drain job: on a standalone cluster (``env_archive``
    given: client mode, the packed environment for the executors, ``spark.cores.max=n``) or on
    ``local[n]`` (this venv's Python everywhere)."""
    from importlib.util import find_spec

    from js_etl.spark.jars import delta_artifacts
    from tools.spark_cluster import SPARK_SUBMIT

    cmd = [str(SPARK_SUBMIT), "--master", master]
    if env_archive is not None:
        cmd += ["--deploy-mode", "client", "--archives", f"{env_archive}#environment",
                "--conf", "spark.pyspark.python=./environment/bin/python",
                # The driver runs here, in the venv that has pyspark and delta-spark.
                "--conf", f"spark.pyspark.driver.python={sys.executable}",
                "--conf", f"spark.cores.max={n}",
                "--conf", f"spark.executor.memory={EXECUTOR_MEMORY}"]
    else:
        cmd += ["--conf", f"spark.pyspark.python={sys.executable}"]
    cmd += [*delta_artifacts().submit_args(), "--conf", "spark.ui.enabled=false",
            "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1"]
    for conf in SMALL_TABLE_CONF:
        cmd += ["--conf", conf]
    # The job's file, found without importing it (the tooling sits below the entry points).
    job = find_spec("js_etl.jobs.drain")
    assert job is not None and job.origin is not None
    return [*cmd, job.origin, *job_args]


class ClusterBench:
    """One ``--cluster`` run against a running nats-server: ``run()`` returns the result dict."""

    def __init__(self, settings: Settings, executors: Sequence[int], url: str,
                 out: Callable[[str], None]) -> None:
        self.s = settings
        self.executors = sorted(set(executors))
        self.url = url
        self.out = out
        # Publishing, consumers and consumer checks are the other legs' (one JetStream session).
        self.bench = Bench(settings, url, out)

    def close(self) -> None:
        self.bench.close()

    def job_args(self, stream: str, consumer: str, table: Path, report: Path, n: int
                 ) -> list[str]:
        """The drain's --set flags: the bench's config (user --set included), with the master
        left to spark-submit and fetch.partitions = N."""
        sets = [o for o in self.bench.overrides(stream, consumer, str(table))
                if not o.startswith(("spark.master=", "fetch.partitions="))]
        sets.append(f"fetch.partitions={n}")
        return [*(a for s in sets for a in ("--set", s)), "--report-file", str(report)]

    def leg(self, mode: str, n: int, master: str, env_archive: Path | None,
            pub: dict[str, Any], messages: int) -> dict[str, Any]:
        from tools.spark_cluster import loopback_env, stop_tree

        name = leg_name(mode, n)
        consumer = f"{mode}{n}"
        table = self.s.workdir / f"{pub['stream']}_{consumer}"
        report_path = self.s.workdir / f"report-{consumer}.json"
        self.bench.add_consumer(pub["stream"], consumer, JS_ETL_MAX_ACK_PENDING)
        cmd = submit_command(master, n, self.job_args(pub["stream"], consumer, table,
                                                      report_path, n), env_archive)
        leg: dict[str, Any] = {"leg": name, "mode": mode, "executors": n, "master": master,
                               "table": str(table), "problems": []}
        log = self.s.workdir / f"spark-submit-{consumer}.log"
        leg["load_average_start"] = round(os.getloadavg()[0], 2)
        t0 = time.monotonic()
        timeout = 600 + messages / 50
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=loopback_env(),
                                    cwd=self.s.workdir, start_new_session=True)
            try:
                leg["exit_code"] = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                leg["exit_code"] = None
                leg["problems"].append(f"spark-submit timed out after {timeout:.0f} s")
            finally:
                # spark-submit's JVM starts the driver's Python as its child: a timeout or an
                # interrupt stops both, each by pid (stop_tree), not only the JVM.
                if proc.poll() is None:
                    stop_tree(proc, kill=True)
        leg["wall_seconds"] = round(time.monotonic() - t0, 3)
        leg["load_average_end"] = round(os.getloadavg()[0], 2)
        if leg["exit_code"] not in (0, None):
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
            leg["problems"].append(f"spark-submit exited {leg['exit_code']}: {tail[0][:300]} "
                                   f"(log {log})")
        report: dict[str, Any] = {}
        try:
            report = json.loads(report_path.read_text())
        except (OSError, ValueError) as e:
            leg["problems"].append(f"no run report: {first_line(e)}")
        written = int(report.get("messages_written", 0))
        seconds = float(report.get("seconds") or 0.0)
        leg.update({"messages": written, "seconds": seconds,
                    "msg_per_s": round(written / seconds) if seconds > 0 else 0,
                    "wall_msg_per_s": round(written / leg["wall_seconds"])
                    if leg["wall_seconds"] > 0 else 0,
                    "rounds": report.get("rounds"), "phase_seconds": report.get("phase_seconds"),
                    "stopped_because": report.get("stopped_because")})
        if report:
            if written != messages:
                leg["problems"].append(f"run report: {written} written, expected {messages}")
            if report.get("dead_letters"):
                leg["problems"].append(f"run report: {report['dead_letters']} dead letters")
        try:
            counts = table_counts_deltalake(str(table))
            leg["table_counts"] = counts
            leg["problems"] += table_problems(counts, messages, pub["first_seq"],
                                              pub["last_seq"])
        except Exception as e:  # a missing or unreadable table fails the leg, not the bench
            leg["problems"].append(f"table unreadable: {first_line(e)}")
        problems, state = self.bench.consumer_problems(pub["stream"], consumer)
        leg["problems"] += problems
        leg["consumer"] = state
        leg["verified"] = not leg["problems"]
        self.out(f"  {name:<11} {written:>9,} msgs in {seconds:7.2f} s  "
                 f"{leg['msg_per_s']:>7,} msg/s  wall {leg['wall_seconds']:7.2f} s  load "
                 f"{leg['load_average_start']:.1f}->{leg['load_average_end']:.1f}  "
                 f"{'ok' if leg['verified'] else 'FAILED'}")
        return leg

    def run(self) -> dict[str, Any]:
        from tools.shipping import build_wheel, packed_env
        from tools.spark_cluster import SparkCluster

        [(messages, size)] = self.s.workloads[:1]
        result: dict[str, Any] = {"machine": machine(), "settings": {
            "mode": "cluster", "executors": self.executors, "messages": messages, "size": size,
            "executor_cores": 1, "executor_memory": EXECUTOR_MEMORY,
            "spark_conf": list(SMALL_TABLE_CONF), "overrides": self.s.overrides}}
        t0 = time.monotonic()
        archive = packed_env(build_wheel(self.s.workdir / "dist"))
        result["executor_env"] = {"archive": str(archive),
                                  "mib": round(archive.stat().st_size / 2**20, 1),
                                  "seconds": round(time.monotonic() - t0, 2)}
        self.out(f"executors' environment {archive} ({result['executor_env']['mib']} MiB) "
                 f"ready in {result['executor_env']['seconds']} s (not timed)")
        workers = max(self.executors)
        with SparkCluster(self.s.workdir / "spark-cluster", workers=workers, cores=1,
                          memory=EXECUTOR_MEMORY) as cluster:
            self.out(f"spark standalone cluster {cluster.master_url}: {workers} one-core "
                     f"workers of {EXECUTOR_MEMORY} (pids master {cluster.master.pid}, workers "
                     f"{', '.join(str(w.pid) for w in cluster.workers)})")
            pub = self.bench.publish(messages, size)
            result["publish"] = pub
            self.out(f"\nworkload {messages:,} x {size} B: published in {pub['seconds']} s, "
                     f"stream {pub['stream']} (file storage, R1); load average "
                     f"{os.getloadavg()[0]:.2f}")
            legs = []
            for n in self.executors:  # local[N] then cluster-N: neighbours see similar load
                legs.append(self.leg("local", n, f"local[{n}]", None, pub, messages))
                legs.append(self.leg("cluster", n, cluster.master_url, archive, pub, messages))
            apps = (cluster.state() or {}).get("completedapps", [])
            result["cluster_apps"] = [{"name": a.get("name"), "cores": a.get("cores"),
                                       "state": a.get("state")} for a in apps]
        result["legs"] = legs
        result["ratios"] = cluster_ratios(legs)
        self.bench.js.run(self.bench.js.admin.delete_stream(pub["stream"]))
        if not self.s.keep:
            import shutil

            for leg in legs:
                shutil.rmtree(leg["table"], ignore_errors=True)
                shutil.rmtree(leg["table"] + "_dead_letters", ignore_errors=True)
        result["failed_legs"] = [leg["leg"] for leg in legs if not leg["verified"]]
        result["ok"] = not result["failed_legs"]
        return result


def cluster_ratios(legs: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Rates of verified legs only (a failed leg has none): cluster-N / local-N, and each leg
    over the N=1 leg of its mode; over the drain's seconds and over spark-submit's wall."""
    def rate(mode: str, n: int, key: str) -> float:
        return next((float(leg[key]) for leg in legs if leg["mode"] == mode
                     and leg["executors"] == n and leg["verified"]), 0.0)

    ns = sorted({leg["executors"] for leg in legs})
    out: dict[str, dict[str, float | None]] = {}
    for key, suffix in (("msg_per_s", ""), ("wall_msg_per_s", "_wall")):
        out["cluster_vs_local" + suffix] = {
            str(n): ratio(rate("cluster", n, key), rate("local", n, key)) for n in ns}
        for mode in ("local", "cluster"):
            out[f"{mode}_vs_{mode}1{suffix}"] = {
                str(n): ratio(rate(mode, n, key), rate(mode, 1, key)) for n in ns}
    return out


def format_cluster(result: dict[str, Any]) -> str:
    """The printed table of a ``--cluster`` run (report.py's style)."""
    m, v = result["machine"], result["machine"]["versions"]
    s = result["settings"]
    lines = [
        "",
        f"js-etl bench --cluster — {m['cpus']} CPUs, {m['memory_gib']} GiB RAM, "
        f"{m['platform']}, Python {m['python']}",
        f"nats-server {v['nats-server']}, pyspark {v['pyspark']}, delta-spark "
        f"{v['delta-spark']}, pyarrow {v['pyarrow']}",
        f"the drain job by spark-submit: local[N] vs a standalone cluster of N one-core "
        f"{s['executor_memory']} executors (spark.cores.max=N); fetch.partitions=N",
        "msg/s over the run report's seconds (connect to last ack); wall = spark-submit's, with "
        "JVM start and exit; load = 1-minute load average at the leg's start -> end",
        "",
        f"{s['messages']:,} x {s['size']} B  (published at "
        f"{result.get('publish', {}).get('msg_per_s', 0):,} msg/s)",
        f"{'leg':<11} {'msgs':>9} {'seconds':>8} {'msg/s':>7} {'wall s':>7} {'wall msg/s':>10} "
        f"{'rounds':>6} {'load':>11}  check",
    ]
    for leg in result.get("legs", []):
        check = "ok" if leg["verified"] else "FAILED: " + "; ".join(leg["problems"])
        load = f"{leg['load_average_start']:.1f}->{leg['load_average_end']:.1f}"
        lines.append(f"{leg['leg']:<11} {leg['messages']:>9,} {leg['seconds']:>8.2f} "
                     f"{leg['msg_per_s']:>7,} {leg['wall_seconds']:>7.1f} "
                     f"{leg['wall_msg_per_s']:>10,} {leg['rounds'] or '-':>6} {load:>11}  {check}")
    lines.append("phase seconds:")
    for leg in result.get("legs", []):
        phases = ", ".join(f"{k} {val:.1f}" for k, val in (leg.get("phase_seconds") or {}).items())
        lines.append(f"  {leg['leg']:<11} {phases or '-'}")

    def fmt(values: dict[str, float | None]) -> str:
        return ", ".join(f"N={n} {'n/a' if r is None else f'{r:.2f}'}" for n, r in values.items())

    r = result.get("ratios", {})
    if r:
        lines += ["ratios (msg/s; wall in brackets):",
                  f"  cluster-N / local[N]: {fmt(r['cluster_vs_local'])}  "
                  f"[{fmt(r['cluster_vs_local_wall'])}]",
                  f"  local[N] / local[1]:  {fmt(r['local_vs_local1'])}  "
                  f"[{fmt(r['local_vs_local1_wall'])}]",
                  f"  cluster-N / cluster-1: {fmt(r['cluster_vs_cluster1'])}  "
                  f"[{fmt(r['cluster_vs_cluster1_wall'])}]"]
    lines += ["", "result: " + ("every leg verified" if result["ok"] else
                                "FAILED: " + ", ".join(result.get("failed_legs", [])))]
    return "\n".join(lines)
