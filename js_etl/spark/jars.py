"""Delta's JVM side for Spark: what a session or a spark-submit needs, the Spark way.

By default Spark's own dependency resolution (``--packages``, Ivy) fetches Delta from Maven
Central on the machine that submits, once per Ivy cache: nothing to install, no Maven. Two
things ride along:

* Ivy settings of our own (:data:`IVY_SETTINGS`: Maven Central and Ivy's cache), unless the
  session sets ``spark.jars.ivySettings``: Spark's default chain reads ``~/.m2`` first, and an
  ``~/.m2`` holding an artifact's POM without its jar (``mvn`` leaves such) fails the
  resolution instead of falling through to Maven Central. ``spark.jars.repositories`` still adds
  a mirror.
* js-etl's Delta log store for S3 (:data:`LOG_STORE_CLASS`): Spark's commits to S3 with a
  conditional PUT. Its jar (:data:`LOG_STORE_JAR`) ships in this package, built from the Java
  source beside it (``python -m js_etl.spark.jars --build-log-store``; a test checks the two
  agree).

For ``s3://``/``s3a://`` tables S3A comes too: ``hadoop-aws`` of pyspark's Hadoop with the AWS SDK
modules it calls, not the SDK's whole ``bundle`` jar its POM names (excluded; its size:
docs/design/object-storage.md).

Offline, a folder of jars replaces the resolution: ``$JS_ETL_JARS_DIR`` (:func:`jars_folder`).
The repository's ``make`` sets it to ``.jars/delta``, which ``make setup`` fills with Maven
(keeping only what pyspark does not ship), so the test suite runs offline.

    python -m js_etl.spark.jars DIR        # resolve into DIR (once per JARS_NAME), print the jars
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from js_etl.errors import TerminalError

DELTA_VERSION = "4.4.0"  # newest delta-spark_4.2_2.13 on Maven Central (there is no 4.4.1 jar)
DELTA_ARTIFACT = f"io.delta:delta-spark_4.2_2.13:{DELTA_VERSION}"
HADOOP_AWS_VERSION = "3.5.0"  # the Hadoop of pyspark 4.2.0 (hadoop-client-api-3.5.0.jar)
AWS_SDK_VERSION = "2.35.4"  # the AWS SDK hadoop-aws 3.5.0 was built with
JARS_NAME = f"delta-{DELTA_VERSION}-s3a-{HADOOP_AWS_VERSION}"
_MARKER = "RESOLVED"
S3A_ARTIFACTS = (f"org.apache.hadoop:hadoop-aws:{HADOOP_AWS_VERSION}",
                 *(f"software.amazon.awssdk:{name}:{AWS_SDK_VERSION}"
                   for name in ("s3", "s3-transfer-manager", "sts")))
S3A_EXCLUDES = ("software.amazon.awssdk:bundle",)
_HERE = Path(__file__).parent
IVY_SETTINGS = _HERE / "ivysettings.xml"
LOG_STORE_CLASS = "io.jsetl.delta.ConditionalPutLogStore"
LOG_STORE_JAR = _HERE / "java" / "js-etl-log-store.jar"
_LOG_STORE_SOURCE = _HERE / "java" / "io" / "jsetl" / "delta" / "ConditionalPutLogStore.java"


def _dependency(coordinate: str) -> str:
    """A Maven ``<dependency>`` of ``group:artifact:version``, without :data:`S3A_EXCLUDES`."""
    group, artifact, version = coordinate.split(":")
    exclusions = "".join(f"<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId>"
                         "</exclusion>" for g, a in (x.split(":") for x in S3A_EXCLUDES))
    return (f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version><exclusions>{exclusions}</exclusions></dependency>")


# What `make setup` resolves into the jars folder: the coordinates Spark resolves by default.
_POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>js-etl</groupId><artifactId>delta-jars</artifactId><version>1</version>
  <dependencies>{"".join(map(_dependency, (DELTA_ARTIFACT, *S3A_ARTIFACTS)))}</dependencies>
</project>
"""


@dataclass(frozen=True)
class SparkArtifacts:
    """What Spark needs for Delta: jar files (``spark.jars``), Maven coordinates Spark resolves
    (``spark.jars.packages``) with their exclusions, and the Ivy settings to resolve them by."""

    jars: tuple[str, ...]
    packages: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    ivy_settings: str | None = None

    def conf(self, given: Mapping[str, str] | None = None) -> dict[str, str]:
        """The session settings (a builder's ``config``), each list after what ``given`` (the
        session's own settings) has in it."""
        given = given or {}
        conf = {key: ",".join(filter(None, [given.get(key), *values]))
                for key, values in (("spark.jars", self.jars),
                                    ("spark.jars.packages", self.packages),
                                    ("spark.jars.excludes", self.excludes)) if values}
        if self.ivy_settings:
            conf["spark.jars.ivySettings"] = self.ivy_settings
        return conf

    def submit_args(self) -> list[str]:
        """The same as spark-submit options: its own flag where it has one, else ``--conf``."""
        args: list[str] = []
        for key, value in self.conf().items():
            args += [_SUBMIT_FLAGS[key], value] if key in _SUBMIT_FLAGS else [
                "--conf", f"{key}={value}"]
        return args


# spark-submit's flags for the settings it also reads from --conf.
_SUBMIT_FLAGS = {"spark.jars": "--jars", "spark.jars.packages": "--packages",
                 "spark.jars.excludes": "--exclude-packages"}


def delta_artifacts(*, object_store: bool = False,
                    conf: Mapping[str, str] | None = None) -> SparkArtifacts:
    """Delta for a session or a spark-submit: the jars of :func:`jars_folder` when there is one,
    else Maven coordinates (S3A's too when ``object_store``) and js-etl's Ivy settings unless
    ``conf`` (the session's settings) has its own."""
    folder = jars_folder()
    if folder is not None:
        return SparkArtifacts(jars=(*delta_jars(folder), str(LOG_STORE_JAR)))
    settings = None if (conf or {}).get("spark.jars.ivySettings") else str(IVY_SETTINGS)
    return SparkArtifacts(
        jars=(str(LOG_STORE_JAR),),
        packages=(DELTA_ARTIFACT, *(S3A_ARTIFACTS if object_store else ())),
        excludes=S3A_EXCLUDES if object_store else (), ivy_settings=settings)


def jars_folder() -> Path | None:
    """``$JS_ETL_JARS_DIR`` (a folder of jars, for machines that cannot reach Maven Central),
    else None: Spark resolves Delta itself."""
    folder = os.environ.get("JS_ETL_JARS_DIR")
    return Path(folder) if folder else None


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


def delta_jars(jar_dir: Path, *, resolve: bool = False) -> list[str]:
    """Paths of the jars in ``jar_dir``; ``resolve``: (re)fill it with ``mvn`` first unless it
    holds :data:`JARS_NAME` already (``make setup``)."""
    marker = jar_dir / _MARKER
    if resolve and (not marker.exists() or marker.read_text().strip() != JARS_NAME):
        shutil.rmtree(jar_dir, ignore_errors=True)
        _resolve(jar_dir)
        marker.write_text(JARS_NAME + "\n")
    jars = sorted(str(p) for p in jar_dir.glob("*.jar"))
    if not jars:
        raise TerminalError(f"no jars in {jar_dir} (JS_ETL_JARS_DIR): put Delta's jars there, "
                            "or unset it to let Spark fetch Delta from Maven Central")
    return jars


def build_log_store(jar: Path = LOG_STORE_JAR) -> None:
    """Compile :data:`LOG_STORE_CLASS` against Delta's storage jar and pyspark's Hadoop into
    ``jar`` (for maintainers: the package ships the result)."""
    import pyspark

    javac = shutil.which("javac")
    if not javac:
        raise TerminalError("javac (a JDK 17) is needed to build the log store")
    folder = jars_folder()
    storage = sorted(folder.glob("delta-storage-*.jar")) if folder else []
    if not storage:
        raise TerminalError("Delta's storage jar is needed to build the log store: set "
                            "JS_ETL_JARS_DIR to a folder that has it (`make setup` fills "
                            ".jars/delta)")
    classpath = [*storage,
                 *(Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")]
    with tempfile.TemporaryDirectory(prefix="js-etl-log-store-") as tmp:
        proc = subprocess.run(
            [javac, "--release", "17", "-d", tmp, "-cp", os.pathsep.join(map(str, classpath)),
             str(_LOG_STORE_SOURCE)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise TerminalError(f"javac could not build {LOG_STORE_CLASS}: "
                                f"{(proc.stdout + proc.stderr).strip()[-800:]}")
        with zipfile.ZipFile(jar, "w") as out:
            for path in sorted(Path(tmp).rglob("*.class")):
                # A fixed date: the same classes make the same jar.
                info = zipfile.ZipInfo(path.relative_to(tmp).as_posix(), (2026, 1, 1, 0, 0, 0))
                out.writestr(info, path.read_bytes())


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
        if sys.argv[1:] == ["--build-log-store"]:
            build_log_store()
            print(LOG_STORE_JAR)
        elif len(sys.argv) == 2:
            print("\n".join(delta_jars(Path(sys.argv[1]), resolve=True)))
        else:
            sys.exit("usage: python -m js_etl.spark.jars DIR | --build-log-store")
    except TerminalError as e:
        sys.exit(f"js-etl: {e}")
