"""A real YARN for the tests: Hadoop's MiniYARNCluster (how Spark tests its own YARN support),
one ResourceManager and one NodeManager in one JVM, as dev tooling like
:mod:`tools.spark_cluster` (no pytest here).

``org.apache.hadoop:hadoop-minicluster`` of pyspark's Hadoop is resolved once with Maven into
``.jars/yarn-minicluster`` (git-ignored) and the launcher (``tools/yarn/MiniYarn.java``) compiled
beside it with ``javac``. The cluster picks its own free ports; the default filesystem stays
``file:///`` (one machine: spark-submit's staging directory and every container's work
directory are local). "Ready" is state: the launcher writes the effective configuration (a
``HADOOP_CONF_DIR``) once the NodeManager has registered, and the ResourceManager's REST API
says STARTED. Stopped by pid; the NodeManager keeps each container's launch script for an hour
(``launch_scripts``), so a test can read what an application was started with.

    with MiniYarn(tmp_path) as yarn:
        env = yarn.environment()        # HADOOP_CONF_DIR / YARN_CONF_DIR for spark-submit
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any, Self

from js_etl.demo.server import stop_process, wait_for
from js_etl.spark.jars import HADOOP_AWS_VERSION as HADOOP_VERSION
from js_etl.spark.jars import source_checkout

LAUNCHER = Path(__file__).parent / "yarn" / "MiniYarn.java"
LAUNCHER_CLASS = "io.jsetl.yarn.MiniYarn"
_POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>js-etl</groupId><artifactId>yarn-minicluster</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-minicluster</artifactId>
      <version>{HADOOP_VERSION}</version></dependency>
    <!-- MiniYARNCluster asserts with JUnit 5 (Hadoop's own tests bring it): Hadoop's version. -->
    <dependency><groupId>org.junit.jupiter</groupId><artifactId>junit-jupiter-api</artifactId>
      <version>5.13.3</version></dependency>
  </dependencies>
</project>
"""


def _jars_dir() -> Path:
    checkout = source_checkout()
    if checkout is None:
        raise RuntimeError("the MiniYARNCluster tooling runs from js-etl's source checkout")
    return checkout / ".jars" / "yarn-minicluster"


def _run(args: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=900,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: "
                           f"{(done.stdout + done.stderr)[-2000:]}")


def classpath() -> str:
    """The launcher's classpath: resolved with ``mvn`` and compiled with ``javac`` the first
    time, and again when the launcher's source or the Hadoop version changed."""
    folder = _jars_dir()
    key = hashlib.sha256(_POM.encode() + LAUNCHER.read_bytes()).hexdigest()[:16]
    marker, listing = folder / "RESOLVED", folder / "classpath.txt"
    if not marker.exists() or marker.read_text().strip() != key:
        mvn, javac = shutil.which("mvn"), shutil.which("javac")
        if not (mvn and javac):
            raise RuntimeError("the MiniYARNCluster needs Maven (mvn) and a JDK (javac) once")
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        with tempfile.TemporaryDirectory(prefix="js-etl-yarn-") as tmp:
            Path(tmp, "pom.xml").write_text(_POM)
            _run([mvn, "-q", "-B", "dependency:build-classpath",
                  f"-Dmdep.outputFile={listing}"], cwd=Path(tmp))
        _run([javac, "--release", "17", "-d", str(folder / "classes"), "-cp",
              listing.read_text().strip(), str(LAUNCHER)])
        marker.write_text(key + "\n")
    return os.pathsep.join([str(folder / "classes"), listing.read_text().strip()])


class MiniYarn:
    """One MiniYARNCluster process whose files live under ``work``."""

    def __init__(self, work: Path, *, memory_mb: int = 4096) -> None:
        self.work, self.memory_mb = work, memory_mb
        self.conf_dir = work / "conf"
        self.log = work / "mini-yarn.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the MiniYARNCluster is not running")
        return self.proc.pid

    def start(self, timeout: float = 180) -> Self:
        cp = classpath()
        self.work.mkdir(parents=True, exist_ok=True)
        java = str(Path(os.environ["JAVA_HOME"], "bin", "java")) if os.environ.get(
            "JAVA_HOME") else "java"
        env = {**os.environ, "TZ": "UTC"}
        env.pop("HADOOP_CONF_DIR", None)
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [java, "-Xmx768m", "-XX:+UseSerialGC", "-cp", cp, LAUNCHER_CLASS,
                 str(self.conf_dir), str(self.memory_mb)],
                cwd=self.work, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_for(self._started, timeout, "the MiniYARNCluster to start", interval=0.5)
        except TimeoutError as e:
            self.stop()
            raise TimeoutError(f"{e}; its log ends:\n{self._log_tail()}") from None
        return self

    def _started(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the MiniYARNCluster exited {self.proc.returncode}; its log "
                               f"ends:\n{self._log_tail()}")
        if not (self.conf_dir / "ready").exists():
            return False
        try:
            info = self._get("/ws/v1/cluster/info")["clusterInfo"]
        except (OSError, ValueError):
            return False
        return bool(info.get("state") == "STARTED")

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    @property
    def rm_web(self) -> str:
        """The ResourceManager's web (REST) address, ``http://host:port``."""
        return "http://" + (self.conf_dir / "ready").read_text().strip()

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.rm_web + path, timeout=10) as response:
            return json.load(response)

    def environment(self) -> dict[str, str]:
        """What spark-submit needs to find this YARN."""
        return {"HADOOP_CONF_DIR": str(self.conf_dir), "YARN_CONF_DIR": str(self.conf_dir)}

    def apps(self) -> list[dict[str, Any]]:
        """Every application the ResourceManager knows (REST ``/ws/v1/cluster/apps``)."""
        return list((self._get("/ws/v1/cluster/apps").get("apps") or {}).get("app") or [])

    def launch_scripts(self, app_id: str) -> list[str]:
        """The NodeManager's ``launch_container.sh`` of every container of ``app_id``: the
        environment and command each was started with."""
        found = self.work.rglob(f"nmPrivate/{app_id}/*/launch_container.sh")
        return [path.read_text(errors="replace") for path in sorted(found)]

    def stop(self) -> None:
        stop_process(self.proc, 30)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
