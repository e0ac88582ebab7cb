"""Delta's JVM jars, and Hadoop's S3A connector, resolved from Maven Central once into a jars
folder and reused offline.

``configure_spark_with_delta_pip`` would resolve through Ivy on every session start (network
each time) and asks for ``delta-spark_4.2_2.13:<python package version>``. We resolve once with
Maven and keep only the artifacts pyspark does not already ship: Spark's own classes are loaded
parent-first, so duplicates (older jackson, parquet, hadoop) would only be dead weight.

S3A (``s3a://`` tables on Spark's writer) is ``hadoop-aws`` of pyspark's Hadoop with the AWS SDK
modules it calls, not the SDK's 686 MB ``bundle`` jar its POM names: the ``s3``,
``s3-transfer-manager`` and ``sts`` modules of the SDK version that hadoop-aws was built with.
And js-etl's own Delta log store for S3 (:data:`LOG_STORE_CLASS`, compiled from the Java source
shipped in this package with ``javac``): Spark's commits to S3 with a conditional PUT.

The jars folder (:func:`default_jar_dir`), first that applies:

1. ``$JS_ETL_JARS_DIR`` — a folder of jars you provide (or want them resolved into);
2. ``<repository>/.jars/<JARS_NAME>`` when js_etl runs from its source checkout
   (``pip install -e``; git-ignored);
3. ``${XDG_CACHE_HOME:-~/.cache}/js-etl/jars/<JARS_NAME>``, a per-user cache, for an
   installed wheel.

    python -m js_etl.spark.jars            # resolve (idempotent), print the jar paths
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from js_etl.errors import TerminalError

DELTA_VERSION = "4.4.0"  # newest delta-spark_4.2_2.13 on Maven Central (there is no 4.4.1 jar)
DELTA_ARTIFACT = f"io.delta:delta-spark_4.2_2.13:{DELTA_VERSION}"
HADOOP_AWS_VERSION = "3.5.0"  # the Hadoop of pyspark 4.2.0 (hadoop-client-api-3.5.0.jar)
AWS_SDK_VERSION = "2.35.4"  # the AWS SDK hadoop-aws 3.5.0 was built with
JARS_NAME = f"delta-{DELTA_VERSION}-s3a-{HADOOP_AWS_VERSION}"
_MARKER = "RESOLVED"
LOG_STORE_CLASS = "io.jsetl.delta.ConditionalPutLogStore"
_LOG_STORE_SOURCE = Path(__file__).parent / "java" / "io" / "jsetl" / "delta" / \
    "ConditionalPutLogStore.java"

_POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>js-etl</groupId><artifactId>delta-jars</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>io.delta</groupId><artifactId>delta-spark_4.2_2.13</artifactId>
      <version>{DELTA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-aws</artifactId>
      <version>{HADOOP_AWS_VERSION}</version>
      <exclusions><exclusion><groupId>software.amazon.awssdk</groupId>
        <artifactId>bundle</artifactId></exclusion></exclusions></dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>s3</artifactId>
      <version>{AWS_SDK_VERSION}</version></dependency>
    <dependency><groupId>software.amazon.awssdk</groupId>
      <artifactId>s3-transfer-manager</artifactId><version>{AWS_SDK_VERSION}</version></dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>sts</artifactId>
      <version>{AWS_SDK_VERSION}</version></dependency>
  </dependencies>
</project>
"""


def default_jar_dir() -> Path:
    """``$JS_ETL_JARS_DIR``, else ``.jars/<JARS_NAME>`` of the source checkout js_etl runs
    from, else the per-user cache ``${XDG_CACHE_HOME:-~/.cache}/js-etl/jars/<JARS_NAME>``."""
    if os.environ.get("JS_ETL_JARS_DIR"):
        return Path(os.environ["JS_ETL_JARS_DIR"])
    checkout = source_checkout()
    if checkout is not None:
        return checkout / ".jars" / JARS_NAME
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "js-etl" / "jars" / JARS_NAME


def source_checkout() -> Path | None:
    """The repository root when js_etl is imported from its source checkout (its own
    ``pyproject.toml`` beside the package), else None: an installed wheel has no repository."""
    root = Path(__file__).resolve().parents[2]
    try:
        pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return root if re.search(r'^name\s*=\s*"js-etl"', pyproject, re.MULTILINE) else None


def _artifact_name(jar: str) -> str:
    return re.sub(r"-\d[\w.\-]*\.jar$", "", jar)


def _spark_shipped() -> set[str]:
    import pyspark  # only for its jars folder; no session is started

    jars = Path(pyspark.__file__).parent / "jars"
    return {_artifact_name(p.name) for p in jars.glob("*.jar")}


def delta_jars(jar_dir: Path | None = None, *, resolve: bool = True) -> list[str]:
    """Paths of Delta's jars; resolves them with ``mvn`` the first time (and builds the log
    store again when its source changed)."""
    jar_dir = jar_dir or default_jar_dir()
    marker = jar_dir / _MARKER
    current = marker.read_text() if marker.exists() else None
    if current != _marker_text():
        if not resolve:
            raise TerminalError(f"Delta jars missing in {jar_dir}: run `js-etl jars` "
                                "(or `make setup`) once with Maven, a JDK and network access")
        if current is None:
            _resolve(jar_dir)
        _build_log_store(jar_dir)
        marker.write_text(_marker_text())
    return sorted(str(p) for p in jar_dir.glob("*.jar"))


def _marker_text() -> str:
    """What the jars folder was made of: the artifacts, and the log store's source."""
    digest = hashlib.sha256(_LOG_STORE_SOURCE.read_bytes()).hexdigest()[:16]
    return f"{JARS_NAME}\nlog store {digest}\n"


def _build_log_store(jar_dir: Path) -> None:
    """Compile :data:`LOG_STORE_CLASS` against the folder's Delta and pyspark's Hadoop, into
    ``js-etl-log-store.jar`` there."""
    import pyspark

    javac = shutil.which("javac")
    if not javac:
        raise TerminalError("javac (a JDK) is needed once to build js-etl's Delta log store "
                            f"into {jar_dir}; install a JDK 17 or set JS_ETL_JARS_DIR to a "
                            "folder of jars")
    classpath = [*jar_dir.glob("delta-storage-*.jar"),
                 *(Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")]
    with tempfile.TemporaryDirectory(prefix="js-etl-log-store-") as tmp:
        proc = subprocess.run(
            [javac, "--release", "17", "-d", tmp, "-cp", os.pathsep.join(map(str, classpath)),
             str(_LOG_STORE_SOURCE)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise TerminalError(f"javac could not build {LOG_STORE_CLASS}: "
                                f"{(proc.stdout + proc.stderr).strip()[-800:]}")
        with zipfile.ZipFile(jar_dir / "js-etl-log-store.jar", "w") as jar:
            for path in sorted(Path(tmp).rglob("*.class")):
                jar.write(path, path.relative_to(tmp).as_posix())


def _resolve(jar_dir: Path) -> None:
    mvn = shutil.which("mvn")
    if not mvn:
        raise TerminalError("Maven (mvn) is needed once to fetch Delta's jars into "
                            f"{jar_dir}; install it or set JS_ETL_JARS_DIR to a folder of jars")
    with tempfile.TemporaryDirectory(prefix="js-etl-jars-") as tmp:
        Path(tmp, "pom.xml").write_text(_POM)
        out = Path(tmp, "out")
        proc = subprocess.run(
            [mvn, "-q", "-B", "dependency:copy-dependencies", "-DincludeScope=runtime",
             f"-DoutputDirectory={out}"], cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0:
            raise TerminalError(f"mvn could not resolve {DELTA_ARTIFACT} and hadoop-aws: "
                                f"{(proc.stdout + proc.stderr).strip()[-800:]}")
        shipped = _spark_shipped()
        jar_dir.mkdir(parents=True, exist_ok=True)
        for jar in out.glob("*.jar"):
            if _artifact_name(jar.name) not in shipped:
                shutil.copy2(jar, jar_dir / jar.name)


if __name__ == "__main__":
    try:
        print("\n".join(delta_jars()))
    except TerminalError as e:
        sys.exit(f"js-etl: {e}")
