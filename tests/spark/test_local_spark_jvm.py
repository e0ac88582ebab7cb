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


def test_local_workers_fork_from_a_daemon_that_imported_the_fetch_modules(spark):
    """Fresh Python workers (every new process; PySpark kills idle ones after a minute) start
    with pyarrow and js-etl's fetch modules imported: forked from js_etl.drain.worker_daemon,
    which imported them (its process maps pyarrow's library), not importing them each."""

    def worker_and_daemon(_: object) -> dict[str, object]:  # in a worker: its parent, the daemon
        parent = os.getppid()
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            command = [c.decode() for c in f.read().split(b"\0") if c]
        with open(f"/proc/{parent}/maps") as f:
            libraries = {line.rsplit("/", 1)[-1].strip() for line in f if ".so" in line}
        return {"daemon": command,
                "arrow_in_daemon": any(lib.startswith("libarrow_python") for lib in libraries)}

    [seen] = spark.sparkContext.parallelize([0], 1).map(worker_and_daemon).collect()
    assert seen["daemon"][1:3] == ["-m", "js_etl.drain.worker_daemon"], seen
    assert seen["arrow_in_daemon"], seen
