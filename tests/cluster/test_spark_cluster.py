"""The drain job on a real Spark standalone cluster, submitted as the README tells users to.

``spark-submit --master spark://… --deploy-mode client --jars <Delta's jars> --archives
env.tar.gz#environment --conf spark.pyspark.python=./environment/bin/python`` of the packaged
job script (js_etl/jobs/drain.py), against an R3 stream of the 3-node nats-server cluster. The
executors are separate JVMs launched by two 1-core workers; their Python is the packed
environment's, unpacked next to each executor.
Checked with an independent reader (the ``deltalake`` package), and the consumer left clean.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from nats_cluster import (
    NatsCluster,
    add_replicated_stream,
    assert_exactly_once,
    wait_consumer_current,
    wait_for,
)
from streams import publish_and_wait

from js_etl.jetstream import ConsumerConfig, JetStreamSession
from tools.bench.cluster import submit_command as bench_submit_command
from tools.spark_cluster import SparkCluster, gone, loopback_env, stop_tree

PAD = "x" * 1000  # ~1 KiB messages: a few thousand of them still make several rounds


def submit_command(cluster: SparkCluster, env_archive: Path, *job_args: str) -> list[str]:
    """The README's spark-submit of the drain on the standalone cluster (client mode, both
    workers' cores): the command ``js-etl bench --cluster`` runs, so both test the same one."""
    return bench_submit_command(cluster.master_url, len(cluster.workers), job_args, env_archive)


def job_args(names: Any, nats: NatsCluster, table: Path, report: Path, *extra: str) -> list[str]:
    sets = [f"nats.servers={','.join(nats.urls)}", f"source.stream={names.stream}",
            f"source.consumer={names.consumer}", f"target.path={table}",
            "decode.format=json", "decode.schema=id BIGINT", "fetch.pull_timeout=2", *extra]
    return [arg for s in sets for arg in ("--set", s)] + ["--report-file", str(report)]


def setup_r3(cjs: JetStreamSession, names: Any, n: int) -> None:
    add_replicated_stream(cjs, names.stream, [names.subject], replicas=3)
    cjs.run(cjs.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_wait=60, max_ack_pending=100_000)))
    wait_consumer_current(cjs, names.stream, names.consumer)
    publish_ids(cjs, names, range(n))


def publish_ids(cjs: JetStreamSession, names: Any, ids: range) -> None:
    """~1 KiB JSON messages carrying ``ids``, at seqs ``ids.start + 1 …`` of the test's stream."""
    publish_and_wait(cjs, names, [(f"{names.prefix}.e", json.dumps({"id": i, "pad": PAD}).encode())
                                  for i in ids])


class Submitted:
    """A spark-submit child; its merged output read line by line as it comes (so a test can
    act on a state the job logs, e.g. a round done), kept whole for the assertions."""

    def __init__(self, command: list[str], cwd: Path, **env: str) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, cwd=cwd, env={**loopback_env(), **env},
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def saw(self, predicate: Callable[[str], bool]) -> bool:
        return any(predicate(line) for line in list(self.lines))

    def wait(self, timeout: float = 300) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(
                f"spark-submit still running after {timeout}s:\n{self.output}") from None
        self._reader.join(30)
        return code

    def stop(self) -> None:
        """SIGKILL spark-submit's JVM and its children (the driver's Python), each by pid."""
        stop_tree(self.proc, kill=True)

    def __enter__(self) -> Submitted:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def output(self) -> str:
        return "".join(self.lines)[-4000:]


def test_a_worker_killed_mid_round_is_transient_and_the_next_run_takes_every_message_once(
        spark_cluster: SparkCluster, executor_env: Path, nats_cluster: NatsCluster,
        cjs: JetStreamSession, names: Any, tmp_path: Path) -> None:
    """Two spark-submit runs of the README's command on the standalone cluster.

    1. The run (Spark's writer, whose round lives in a checkpoint on the executors) is held
       right after its first round's fetch is checkpointed (fault point ``hold_after_fetch``):
       each of the two executors holds the checkpoint block of one fetch partition. A worker JVM
       and its executor are SIGKILLed, then the run goes on: the round cannot be committed
       without the lost block, and the run must end with the documented transient exit 75 and
       say an executor was lost, with nothing acked.
    2. The worker back and more messages published: the next run (the columnar writer, which
       ``target.writer=auto`` picks here) drains all of them on both workers' executors and
       exits 0; every message is in the table exactly once.

    (One test, not two: each spark-submit starts a driver JVM and two executors that unpack the
    80 MiB environment, ~50 s of the suite's longest chain on this box. Without the hold, a kill
    after a round's log line raced the run: in the three runs seen it survived on the other
    executor, and the exit-75 path was never exercised on a real cluster.)"""
    first_n, n = 1_000, 2_000
    setup_r3(cjs, names, first_n)
    table, gate = tmp_path / "table", tmp_path / "gate"
    gate.mkdir()
    started = time.monotonic()
    try:
        with Submitted(submit_command(spark_cluster, executor_env, *job_args(
                names, nats_cluster, table, tmp_path / "first.json", "fetch.partitions=2",
                "target.writer=spark")),
                tmp_path, JS_ETL_FAULT="hold_after_fetch", JS_ETL_FAULT_GATE=str(gate)) as first:
            try:
                wait_for(lambda: (gate / "held").exists() or first.proc.poll() is not None,
                         300, "the first round's fetch")
                assert first.proc.poll() is None, f"the run ended before a kill:\n{first.output}"
                victims = [psutil.Process(spark_cluster.workers[0].pid),
                           *spark_cluster.executors(0)]
                assert len(victims) == 2, f"worker 0 runs no executor of the job: {victims}"
                spark_cluster.kill_worker(0)
                assert all(gone(p) for p in victims)
                spark_cluster.wait_alive(1)  # the master has dropped it
            finally:
                (gate / "release").touch()
            code = first.wait()
        assert code == 75, first.output
        assert "js-etl: an executor was lost during the run" in first.output, first.output
        # Nothing of the held round was acked (the consumer leader's ack floor).
        assert cjs.consumer_info(names.stream, names.consumer).ack_floor.stream_seq == 0
    finally:
        spark_cluster.restart_worker(0)  # back to two workers, for the next run and other tests

    publish_ids(cjs, names, range(first_n, n))
    with Submitted(submit_command(spark_cluster, executor_env, *job_args(
            names, nats_cluster, table, tmp_path / "second.json", "fetch.partitions=2")),
            tmp_path) as second:
        assert second.wait() == 0, second.output
    report = json.loads((tmp_path / "second.json").read_text())
    assert (report["writer"], report["messages_written"]) == ("columnar", n), report
    assert report["stopped_because"] in ("drained", "target_reached"), report
    assert_exactly_once(cjs, names, table, n)
    # The second run's work ran on both workers' executors, not in the driver: the master saw
    # the application use both workers' cores.
    apps = (spark_cluster.state() or {}).get("completedapps", [])
    assert apps and max(apps, key=lambda app: app.get("starttime", 0)).get("cores") == 2, apps
    print(f"worker kill: first run exit 75; second run {n} written in {report['rounds']} "
          f"rounds; both {time.monotonic() - started:.1f}s")
