"""A class-data-sharing archive for the JVMs the tests start, so each of them maps Spark's and
Delta's classes, already parsed and verified, from one file instead of reading them from jars.

Why: the suite is CPU-bound on the 2-core box (``vmstat`` with three pytest-xdist workers: 0 %
idle in 87 of ~108 samples; two workers took 1,102 s, three 1,088), and every SparkSession,
``spark-submit`` and ``js-etl drain`` it starts pays for a JVM start-up: a child Python that
starts local Spark, writes and reads a 10-row Delta table and stops took 20-22 s and 25-27 CPU-s
of the otherwise quiet box, with this archive 12-14 s and 17-18.5 CPU-s (three runs each,
2026-11-27, ``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC`` both times). In the suite, the tests
that start JVMs took 17-42 % less; the in-process ones, most of the suite, are unchanged (1,021 s
with the archive in place; 1,158 and 1,134 s on clean clones that built it during the run, hours
the box was slower).

How (Java 17): one JVM of the same Java, Spark and jars is run with
``-XX:ArchiveClassesAtExit`` doing representative work; at its exit it writes the classes it
loaded. The others get ``-XX:SharedArchiveFile``. What this relies on, each point tried here:

* a JVM whose class path differs from the archive's (a Spark-cluster daemon, another Spark
  install) or of another Java build ignores the archive silently and starts as before;
* a *damaged* archive crashes every JVM given it (a truncated copy: "A fatal error has been
  detected", even for ``java -version``). So the archive is written under a temporary name, kept
  only when its JVM exited 0 and ``java -XX:SharedArchiveFile=<it> -version`` starts, and then
  renamed into place whole;
* only speed changes: a class comes from the archive only if it is the class the JVM would have
  loaded (class path and JAR checks at start-up; Java's own validation), so nothing the tests
  check changes.

The archive lives in ``.cache/jvm-classes/`` (ignored by git), named by a hash of everything it
depends on, and built once per checkout (about 50 s) in the background while the first tests run:
a JVM given an archive not there yet starts without it, silently (tried). Without ``java`` or
when the build fails, the suite runs without it, only slower.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "jvm-classes"

# The archive's JVM does what the suite's JVMs do most: start local Spark with Delta, write,
# append, read and merge a Delta table. It must end by itself: the archive is written at exit.
_WORK = r"""
import sys, tempfile
from js_etl.spark.session import local_session
spark = local_session("local[2]", "js-etl-class-archive", log_level="ERROR")
jvm = spark.sparkContext._gateway.proc
with tempfile.TemporaryDirectory() as path:
    spark.range(10).write.format("delta").save(path)
    spark.range(10, 20).write.format("delta").mode("append").save(path)
    spark.range(15, 25).createOrReplaceTempView("updates")
    spark.sql(f"MERGE INTO delta.`{path}` t USING updates u ON t.id = u.id "
              "WHEN NOT MATCHED THEN INSERT *")
    assert spark.read.format("delta").load(path).count() == 25
spark.stop()
jvm.stdin.close()  # the gateway JVM exits on EOF; wait for it: it writes the archive then
sys.exit(jvm.wait())
"""


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else shutil.which("java")


def _key(java: str, options: str) -> str:
    """Everything the archive depends on: the Java build, Spark's and Delta's jars, the options."""
    from pyspark.find_spark_home import _find_spark_home

    from js_etl.spark.jars import delta_artifacts

    version = subprocess.run([java, "-version"], capture_output=True, text=True,
                             check=False).stderr
    spark_jars = sorted((Path(_find_spark_home()) / "jars").iterdir())
    parts = [os.path.realpath(java), version, options,
             *(f"{p}:{p.stat().st_size}" for p in [*spark_jars,
                                                     *map(Path, delta_artifacts().jars)])]
    return hashlib.sha256("\n".join(map(str, parts)).encode()).hexdigest()[:16]


def archive_for(options: str) -> Path | None:
    """Where the archive for JVMs started with ``options`` is (or will be); None without Java
    or Delta's jars (the tests that need them say so)."""
    from js_etl.errors import TerminalError

    java = _java()
    try:
        return CACHE / f"{_key(java, options)}.jsa" if java is not None else None
    except TerminalError:  # Delta's jars not resolved
        return None


def start_build(archive: Path, options: str) -> subprocess.Popen[bytes]:
    """Builds ``archive`` in the background (:func:`build`). The JVMs started meanwhile run
    without it: a JVM given an archive that does not exist (yet) starts as if it had none,
    silently."""
    CACHE.mkdir(parents=True, exist_ok=True)
    # Other keys' archives are stale (other jars, Java or options): removed at once, safely: a
    # JVM that mapped one keeps its mapping, one started later finds none and runs without.
    for stale in CACHE.glob("*.jsa"):
        stale.unlink(missing_ok=True)
    return subprocess.Popen([sys.executable, __file__, str(archive), options],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_build(builder: subprocess.Popen[bytes]) -> None:
    """Waits for a build a few seconds, then stops it, its Python child and their JVM, each by
    its pid (``stop_tree``); what it left half-written is removed (never renamed into place)."""
    from tools.spark_cluster import stop_tree

    try:
        builder.wait(timeout=5)
    except subprocess.TimeoutExpired:
        stop_tree(builder, kill=True)
    for partial in CACHE.glob(f"*.{builder.pid}.partial"):
        partial.unlink(missing_ok=True)


def build(archive: Path, options: str) -> int:
    """Runs the archive's JVM and renames what it wrote into place, whole, if it is good."""
    java = _java()
    partial = archive.with_name(f"{archive.stem}.{os.getpid()}.partial")
    try:
        env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{options} -XX:ArchiveClassesAtExit={partial}"}
        if subprocess.run([sys.executable, "-c", _WORK], env=env, timeout=900,
                          check=False).returncode != 0 or not partial.exists():
            return 1
        # A damaged archive crashes every JVM given it; one this JVM starts with is whole.
        if java is None or subprocess.run([java, f"-XX:SharedArchiveFile={partial}", "-version"],
                                          timeout=60, check=False).returncode != 0:
            return 1
        os.replace(partial, archive)
        return 0
    finally:
        partial.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(build(Path(sys.argv[1]), sys.argv[2]))
