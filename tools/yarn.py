"""A real YARN for the tests: Hadoop's MiniYARNCluster (how Hadoop and Spark test their own YARN
code) in a JVM of its own, as dev tooling like :mod:`tools.spark_cluster` (no pytest here).

What it relies on:

* ``org.apache.hadoop:hadoop-minicluster`` of pyspark's Hadoop (:data:`HADOOP_VERSION`), its
  class path resolved once with ``mvn dependency:build-classpath`` (the jars stay in Maven's
  local repository) and listed in ``.jars/yarn-minicluster-<version>/`` (git-ignored;
  ``$JS_ETL_YARN_JARS`` names another folder, which may instead hold the jars themselves, e.g.
  from ``mvn dependency:copy-dependencies``, for a machine without Maven Central). A marker
  file holds what was resolved; a listed jar gone missing resolves again.
* A launcher, ``tools/yarn/MiniYarnLauncher.java``, compiled with ``javac --release 17`` into
  that folder and again whenever its source changes (a digest of it is kept beside the
  classes). It starts one ResourceManager and one NodeManager in one JVM, every port chosen by
  the kernel and bound on 127.0.0.1 (two suites side by side do not collide); enough memory and
  vcores for a Spark application master and an executor, nothing policed (no pmem/vmem or
  disk health checks: a small box with a fuller disk still runs containers); every file of
  the cluster under a directory we own. Once the NodeManager has registered it writes the
  effective configuration as ``yarn-site.xml`` and ``core-site.xml`` into :attr:`conf_dir`
  (``HADOOP_CONF_DIR``/``YARN_CONF_DIR`` of spark-submit), then ``ready.json``.
* "Ready" is state, not time: that file exists and the ResourceManager's REST API says
  ``STARTED`` with one active node. Stopped by pid, the containers' processes too
  (:meth:`MiniYarn.stop`); a SIGTERM from elsewhere runs the launcher's shutdown hook, which
  stops the cluster and so the containers.
* The default filesystem stays ``file:///`` (one machine): spark-submit's staging directory
  (:meth:`spark_conf`: under our directory, not ``~/.sparkStaging``) and every container's work
  directory are local paths.
* The NodeManager keeps an application's files after it ended for ``delete_delay_s``
  (``yarn.nodemanager.delete.debug-delay-sec``), among them its own copy of each container's
  ``launch_container.sh`` (``nmPrivate``) and the one in the container's log directory (the
  copy in the container's work directory goes when the container ends, whatever the delay):
  :meth:`MiniYarn.launch_scripts` reads them (the environment, as ``export`` lines, and the
  command), to check what a container was started with.
* The launcher's environment is a node's, not the test process's (``PATH``, ``JAVA_HOME``,
  ``TZ``, ``LANG``, ``HOME``): a container gets the NodeManager's values of the variables of
  ``yarn.nodemanager.env-whitelist`` (``JAVA_HOME``, ``PATH``, ``HADOOP_CONF_DIR``...) that
  its launch context does not set, and nothing of the process that ran the tests.

    with MiniYarn() as yarn:
        env = {**os.environ, **yarn.environment()}      # HADOOP_CONF_DIR, YARN_CONF_DIR
        # spark-submit --master yarn --deploy-mode cluster, --conf each of yarn.spark_conf()
        yarn.wait_finished(app_id)["finalStatus"]        # "SUCCEEDED"
        yarn.launch_scripts(app_id)                      # [launch_container.sh texts]
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import psutil

from js_etl.demo.server import stop_process, wait_for

HADOOP_VERSION = "3.5.0"  # pyspark 4.2.0's Hadoop (its jars/hadoop-client-api-3.5.0.jar)
ARTIFACT = f"org.apache.hadoop:hadoop-minicluster:{HADOOP_VERSION}"
_HERE = Path(__file__).resolve().parent
LAUNCHER_SOURCE = _HERE / "yarn" / "MiniYarnLauncher.java"
LAUNCHER_CLASS = "io.jsetl.yarn.MiniYarnLauncher"
LOG4J_PROPERTIES = _HERE / "yarn" / "log4j.properties"
DEFAULT_JARS_DIR = _HERE.parent / ".jars" / f"yarn-minicluster-{HADOOP_VERSION}"
# The launcher JVM runs a ResourceManager and a NodeManager that only schedule: a small heap,
# C1 only and the serial GC, as the other JVMs of the tests.
LAUNCHER_JVM_OPTIONS = ("-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                        "-Djava.net.preferIPv4Stack=true")
FINAL_STATES = ("FINISHED", "FAILED", "KILLED")

_MARKER = "RESOLVED"
_CLASSPATH = "classpath.txt"
_POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>js-etl</groupId><artifactId>yarn-minicluster</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-minicluster</artifactId>
      <version>{HADOOP_VERSION}</version></dependency>
    <!-- Hadoop's test utilities, which the MiniYARNCluster calls (GenericTestUtils.getTestDir),
         assert with JUnit 5, a test-scope dependency of Hadoop's: its version of it. -->
    <dependency><groupId>org.junit.jupiter</groupId><artifactId>junit-jupiter-api</artifactId>
      <version>5.13.3</version></dependency>
  </dependencies>
</project>
"""


def jars_dir() -> Path:
    """``$JS_ETL_YARN_JARS``, else ``.jars/yarn-minicluster-<version>`` of the checkout."""
    folder = os.environ.get("JS_ETL_YARN_JARS")
    return Path(folder) if folder else DEFAULT_JARS_DIR


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One resolver or compiler at a time per folder (two suites may start side by side)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(args: list[str], what: str, cwd: Path | None = None) -> None:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what}: {args[0]} exited {done.returncode}: "
                           f"{(done.stdout + done.stderr).strip()[-2000:]}")


def resolve(folder: Path | None = None) -> list[str]:
    """The jars of :data:`ARTIFACT` and its runtime dependencies: resolved with ``mvn`` the first
    time (a few seconds once Maven's local repository has them), read from ``folder`` after."""
    folder = folder or jars_dir()
    marker, listing = folder / _MARKER, folder / _CLASSPATH
    if not marker.exists() and not listing.exists():
        own = sorted(str(p) for p in folder.glob("*.jar"))
        if own:  # a folder of jars put there by hand: nothing to resolve
            return own
    key = f"{ARTIFACT} {hashlib.sha256(_POM.encode()).hexdigest()[:16]}"

    def current() -> list[str] | None:
        if not marker.exists() or marker.read_text().strip() != key or not listing.exists():
            return None
        jars = listing.read_text().strip().split(os.pathsep)
        return jars if all(Path(j).exists() for j in jars) else None

    jars = current()
    if jars is not None:
        return jars
    with _locked(folder):
        jars = current()  # another process may have resolved while we waited
        if jars is not None:
            return jars
        mvn = shutil.which("mvn")
        if not mvn:
            raise RuntimeError(f"Maven (mvn) is needed once to resolve {ARTIFACT} into {folder} "
                               "for the MiniYARNCluster; install it, or set JS_ETL_YARN_JARS to "
                               "a folder holding its jars")
        marker.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(prefix="js-etl-yarn-pom-") as tmp:
            Path(tmp, "pom.xml").write_text(_POM)
            out = Path(tmp, _CLASSPATH)
            _run([mvn, "-q", "-B", "-Dstyle.color=never", "dependency:build-classpath",
                  "-Dmdep.includeScope=runtime", f"-Dmdep.outputFile={out}"],
                 f"resolving {ARTIFACT}", cwd=Path(tmp))
            shutil.copy2(out, listing)
        marker.write_text(key + "\n")
        return listing.read_text().strip().split(os.pathsep)


def launcher_classes(classpath: list[str], folder: Path | None = None) -> Path:
    """The compiled launcher (a class folder), compiled again when its source changed."""
    folder = folder or jars_dir()
    classes = folder / "launcher"
    stamp = classes / "SOURCE.sha256"
    digest = hashlib.sha256(LAUNCHER_SOURCE.read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text().strip() == digest:
        return classes
    with _locked(folder):
        if stamp.exists() and stamp.read_text().strip() == digest:
            return classes
        javac = shutil.which("javac")
        if not javac:
            raise RuntimeError("javac (a JDK 17) is needed to compile the MiniYARNCluster "
                               f"launcher {LAUNCHER_SOURCE}")
        shutil.rmtree(classes, ignore_errors=True)
        _run([javac, "--release", "17", "-nowarn", "-d", str(classes),
              "-cp", os.pathsep.join(classpath), str(LAUNCHER_SOURCE)],
             f"compiling {LAUNCHER_SOURCE.name}")
        stamp.write_text(digest + "\n")
    return classes


def classpath() -> str:
    """The launcher JVM's class path (resolving and compiling first when needed)."""
    jars = resolve()
    return os.pathsep.join([str(launcher_classes(jars)), *jars])


def java_home() -> str:
    """``$JAVA_HOME``, else the JDK of the ``java`` on PATH. The NodeManager passes it on to
    the containers, whose commands start ``$JAVA_HOME/bin/java`` (Spark's do)."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = shutil.which("java")
    if not java:
        raise RuntimeError("java (a JDK 17) is needed for the MiniYARNCluster")
    return str(Path(java).resolve().parent.parent)


class MiniYarn:
    """One MiniYARNCluster process (a ResourceManager and a NodeManager), its files under
    ``base_dir`` (a temporary directory, removed by :meth:`cleanup`, when not given).

    ``memory_mb``/``vcores``: what the node offers (nothing checks what containers use);
    ``delete_delay_s``: how long the NodeManager keeps a finished application's files."""

    def __init__(self, base_dir: str | os.PathLike[str] | None = None, *,
                 memory_mb: int = 4096, vcores: int = 4, delete_delay_s: int = 3600) -> None:
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="js-etl-yarn-")).resolve()
        self.memory_mb, self.vcores, self.delete_delay_s = memory_mb, vcores, delete_delay_s
        self.log = self.base_dir / "launcher.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready: dict[str, str] | None = None
        # The REST API is on the loopback: no proxy of the environment in between.
        self._http = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @property
    def conf_dir(self) -> Path:
        """``yarn-site.xml`` and ``core-site.xml``: a ``HADOOP_CONF_DIR`` for spark-submit."""
        return self.base_dir / "conf"

    @property
    def staging_dir(self) -> Path:
        return self.base_dir / "staging"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def ready(self) -> dict[str, str]:
        """What the launcher wrote once started: the addresses, the NodeManager's dirs."""
        if self._ready is None:
            raise RuntimeError("the MiniYARNCluster is not started")
        return self._ready

    @property
    def rm_web(self) -> str:
        """The ResourceManager's web address, ``http://127.0.0.1:<port>`` (REST under /ws/v1)."""
        port = self.ready["rm_webapp_address"].rsplit(":", 1)[1]
        return f"http://127.0.0.1:{port}"

    def environment(self) -> dict[str, str]:
        """What spark-submit (or any YARN client) needs to find this YARN."""
        return {"HADOOP_CONF_DIR": str(self.conf_dir), "YARN_CONF_DIR": str(self.conf_dir)}

    def spark_conf(self) -> dict[str, str]:
        """Spark settings this YARN wants: the staging directory under ours (Spark's default
        is the submitting user's home on the default filesystem, here ``~/.sparkStaging``);
        the driver and executors in the containers on the loopback too (a hostname that
        resolves to 127.0.0.1 makes Spark pick another interface's address)."""
        return {"spark.yarn.stagingDir": str(self.staging_dir),
                "spark.yarn.appMasterEnv.SPARK_LOCAL_IP": "127.0.0.1",
                "spark.executorEnv.SPARK_LOCAL_IP": "127.0.0.1"}

    def start(self, timeout: float = 180.0) -> Self:
        cp = classpath()
        for sub in ("conf", "staging", "tmp", "data"):
            (self.base_dir / sub).mkdir(parents=True, exist_ok=True)
        (self.base_dir / "ready.json").unlink(missing_ok=True)
        home = java_home()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "JAVA_HOME": home,
               "TZ": "UTC", "LANG": os.environ.get("LANG", "C.UTF-8"),
               "HOME": os.environ.get("HOME", str(self.base_dir))}
        cmd = [str(Path(home, "bin", "java")), *LAUNCHER_JVM_OPTIONS,
               f"-Dtest.build.data={self.base_dir / 'data'}",
               f"-Djava.io.tmpdir={self.base_dir / 'tmp'}",
               f"-Dlog4j.configuration=file:{LOG4J_PROPERTIES}",
               "-cp", cp, LAUNCHER_CLASS, str(self.base_dir), str(self.conf_dir),
               str(self.memory_mb), str(self.vcores), str(self.delete_delay_s)]
        with self.log.open("ab") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, cwd=self.base_dir, env=env,
                                          start_new_session=True)
        try:
            wait_for(self._started, timeout, "the MiniYARNCluster to start", interval=0.2)
        except TimeoutError as e:
            self.stop()
            raise RuntimeError(f"{e}; the launcher's log ends:\n{self.log_tail()}") from None
        except BaseException:
            self.stop()
            raise
        return self

    def _started(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise RuntimeError(f"the MiniYARNCluster launcher exited {self._proc.returncode}; "
                               f"its log ends:\n{self.log_tail()}")
        ready = self.base_dir / "ready.json"
        if not ready.exists():
            return False
        self._ready = json.loads(ready.read_text())
        try:
            info = self.rest("/ws/v1/cluster/info")["clusterInfo"]
            metrics = self.rest("/ws/v1/cluster/metrics")["clusterMetrics"]
        except (OSError, ValueError, KeyError):
            return False
        return bool(info.get("state") == "STARTED" and metrics.get("activeNodes") == 1)

    def rest(self, path: str) -> Any:
        """The JSON answer of the ResourceManager's REST API at ``path`` (``/ws/v1/...``)."""
        request = urllib.request.Request(self.rm_web + path,
                                         headers={"Accept": "application/json"})
        with self._http.open(request, timeout=10) as answer:
            return json.load(answer)

    def apps(self) -> list[dict[str, Any]]:
        """Every application the ResourceManager knows."""
        return list((self.rest("/ws/v1/cluster/apps").get("apps") or {}).get("app") or [])

    def app(self, app_id: str) -> dict[str, Any]:
        """The REST JSON of one application (``state``, ``finalStatus``, ``diagnostics``...)."""
        return dict(self.rest(f"/ws/v1/cluster/apps/{app_id}")["app"])

    def wait_finished(self, app_id: str, timeout: float = 300.0) -> dict[str, Any]:
        """Until the application is FINISHED, FAILED or KILLED; its REST JSON then."""
        def finished() -> dict[str, Any] | None:
            app = self.app(app_id)
            return app if app.get("state") in FINAL_STATES else None

        app: dict[str, Any] = wait_for(finished, timeout, f"{app_id} to finish", interval=0.5)
        return app

    def _nm_dirs(self) -> list[Path]:
        dirs = f"{self.ready['nm_local_dirs']},{self.ready['nm_log_dirs']}"
        return [Path(d) for d in dirs.split(",") if d]

    def launch_script_paths(self, app_id: str) -> list[Path]:
        """Every ``launch_container.sh`` the NodeManager kept of ``app_id``'s containers: its
        private copy (``nmPrivate/<app>/<container>/``) and the one in the container's log
        directory (the container's work directory's copy is deleted when it ends)."""
        return sorted(script for top in self._nm_dirs()
                      for script in top.rglob("launch_container.sh") if app_id in script.parts)

    def launch_scripts(self, app_id: str) -> list[str]:
        """The text of each of :meth:`launch_script_paths`: in Hadoop 3 a container's whole
        launch environment (``export`` lines) and its command; there is no separate
        environment file. A list of texts, so that ``any(secret in s for s in ...)`` reads
        what the containers got."""
        return [path.read_text(errors="replace") for path in self.launch_script_paths(app_id)]

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the launcher and every container process it started, each by its pid: the
        launcher is frozen first (SIGSTOP: it launches no container meanwhile), its descendants
        (the containers' shells, JVMs and Python workers) listed, then the launcher SIGKILLed
        and reaped, then the containers. Nothing of the cluster needs saving, what the tests
        read is on disk; a graceful stop (SIGTERM: the launcher's shutdown hook stops the
        cluster) waits on the NodeManager's shutdown timers (docs/design/packaging.md)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGSTOP)
        try:
            left = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            left = []
        stop_process(proc, timeout, kill=True)
        for child in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        wait_for(lambda: all(_gone(p) for p in left), timeout, "the containers to exit")

    def cleanup(self) -> None:
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _gone(process: psutil.Process) -> bool:
    """Exited; a zombie counts (an orphaned container is reaped by whoever adopted it)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
