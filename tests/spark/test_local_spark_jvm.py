"""The JVM local Spark starts really runs with the options js_etl.spark.session.local_jvm_options
gives it, and starts at all when the environment picks a collector itself (two collectors stop a
JVM from starting). Each case starts its own JVM in a child process, without the suite's
SPARK_SUBMIT_OPTS (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, sys
from js_etl.spark.session import local_session
spark = local_session("local[1]", "js-etl-jvm-probe", log_level="ERROR",
                      columnar=sys.argv[1] == "columnar")
management = spark._jvm.java.lang.management.ManagementFactory
print(json.dumps({
    "arguments": list(management.getRuntimeMXBean().getInputArguments()),
    "collectors": [c.getName() for c in management.getGarbageCollectorMXBeans()]}))
spark.stop()
"""


@pytest.mark.parametrize(("writer", "submit_opts", "collectors", "c1_only"), [
    ("columnar", None, ["Copy", "MarkSweepCompact"], True),  # the serial collector's two
    ("spark", "-XX:+UseG1GC", ["G1 Young Generation", "G1 Old Generation"], False),
])
def test_local_spark_starts_its_jvm_with_js_etls_options(writer, submit_opts, collectors,
                                                          c1_only):
    env = {k: v for k, v in os.environ.items() if k != "SPARK_SUBMIT_OPTS"}
    if submit_opts:
        env["SPARK_SUBMIT_OPTS"] = submit_opts
    done = subprocess.run([sys.executable, "-c", PROBE, writer], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    jvm = json.loads(done.stdout.strip().splitlines()[-1])
    assert [name for name in jvm["collectors"] if name in collectors] == collectors, jvm
    assert ("-XX:TieredStopAtLevel=1" in jvm["arguments"]) is c1_only, jvm
    assert "-Duser.timezone=UTC" in jvm["arguments"], jvm


def test_python_workers_are_forked_from_a_daemon_that_imported_the_task_modules(spark):
    """Each task reports its parent process: the daemon local Spark started with
    js_etl.spark.worker_daemon, holding pyarrow's Parquet and JSON extension modules and nats-py
    before any task ran (what the worker then inherits instead of importing itself)."""

    def parent_of_this_worker(_):
        import os

        pid = os.getppid()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = [part.decode() for part in f.read().split(b"\0") if part]
        with open(f"/proc/{pid}/maps") as f:
            mapped = {line.split("/")[-1].strip() for line in f if "/" in line}
        yield command, sorted(name for name in mapped if name.startswith(("_parquet.", "_json.")))

    results = spark.sparkContext.parallelize(range(4), 4).mapPartitions(
        parent_of_this_worker).collect()
    for command, extensions in results:
        assert command[1:3] == ["-m", "js_etl.spark.worker_daemon"], command
        assert [name.split(".")[0] for name in extensions] == ["_json", "_parquet"], extensions
