"""A Spark standalone cluster of real processes: dev tooling shared by ``js-etl bench --cluster``
and tests/cluster (like :mod:`js_etl.demo.server` for nats-server; no pytest here).

A master and ``workers`` one-core workers, each a JVM started with pyspark's own
``bin/spark-class`` (``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), all on
127.0.0.1 with free ports (master, master web UI, worker, worker web UI), each worker with its own
work dir; stopped by pid, a worker together with the executors it launched (its child
processes). "Ready" is state, not time: the master's JSON (``http://127.0.0.1:<webui>/json``)
lists the wanted number of ALIVE workers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Self

import psutil
import pyspark

from js_etl.demo.server import free_port, wait_for

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
SPARK_SUBMIT = SPARK_HOME / "bin" / "spark-submit"


def loopback_env(log_dir: Path | None = None) -> dict[str, str]:
    """The environment of every process of the cluster (and of spark-submit): loopback only,
    UTC, small daemon heaps (they only schedule), the JVMs' logs under ``log_dir``."""
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOCAL_HOSTNAME": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m", "TZ": "UTC"}
    if log_dir is not None:
        env["SPARK_LOG_DIR"] = str(log_dir)
    # The master's REST submission server listens on a fixed port (6066) unless disabled: two
    # copies of the suite side by side would collide on it, and nothing here submits that way.
    env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"
    # A SPARK_CONF_DIR of the caller's would bring its own defaults (e.g. an event log dir).
    env.pop("SPARK_CONF_DIR", None)
    return env


class _Daemon:
    """One master or worker JVM: started by ``spark-class`` (which execs java), stopped by pid
    with its child processes (a worker's executors and their Python workers)."""

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.args, self.log, self.env = name, args, log, env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.proc.pid

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([str(SPARK_CLASS), *self.args], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)

    def descendants(self) -> list[psutil.Process]:
        if self.proc is None or self.proc.poll() is not None:
            return []
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, *, kill: bool = False, timeout: float = 30.0) -> None:
        """SIGTERM (``kill``: SIGKILL at once, as a crash would) to the JVM and its children,
        each by pid; SIGKILL what is left after ``timeout``; reaped."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_tree(proc, kill=kill, timeout=timeout)


def stop_tree(proc: subprocess.Popen[Any], *, kill: bool = False, timeout: float = 30.0) -> None:
    """Stop a process we started and every descendant of it, each by its pid: SIGTERM (or
    SIGKILL), then SIGKILL whatever is left after ``timeout``; all reaped."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    sig = signal.SIGKILL if kill else signal.SIGTERM
    if proc.poll() is None:
        proc.send_signal(sig)
    for child in children:
        try:
            child.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if not _wait_gone(children, timeout):
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        _wait_gone(children, timeout)


def gone(process: psutil.Process) -> bool:
    """Exited. A zombie counts: an orphaned executor is reaped by whoever adopted it, not us."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(processes: list[psutil.Process], timeout: float) -> bool:
    try:
        wait_for(lambda: all(gone(p) for p in processes), timeout, "processes to exit")
    except TimeoutError:
        return False
    return True


class SparkCluster:
    """A standalone master and ``workers`` workers of ``cores`` cores and ``memory`` each.

    >>> with SparkCluster(tmp) as cluster:
    ...     cluster.master_url      # spark://127.0.0.1:<port>
    """

    def __init__(self, base_dir: Path, workers: int = 2, cores: int = 1,
                 memory: str = "1g", *, jvm_options: str | None = None) -> None:
        """``jvm_options``: JVM options of the master, the workers and the executors they
        launch (``JAVA_TOOL_OPTIONS``, which every JVM reads and a child inherits), leaving
        the command that submits to the cluster as it is."""
        self.base_dir = Path(base_dir)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.cores, self.memory = cores, memory
        self.port, self.webui_port = free_port(), free_port()
        self.env = loopback_env(self.base_dir / "logs")
        if jvm_options:
            self.env["JAVA_TOOL_OPTIONS"] = jvm_options
        self.master = _Daemon("master", [
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(self.webui_port)],
            self.base_dir / "master.log", self.env)
        self.workers = [self._worker(i) for i in range(workers)]

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _worker(self, i: int) -> _Daemon:
        work = self.base_dir / f"worker{i}"
        work.mkdir(exist_ok=True)
        # Fresh ports on every start: a restarted worker must not wait for its old port.
        return _Daemon(f"worker{i}", [
            "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
            "--port", str(free_port()), "--webui-port", str(free_port()),
            "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work),
            self.master_url], work / "worker.log", self.env)

    def state(self) -> dict[str, Any] | None:
        """The master's JSON (workers, apps), or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json",
                                        timeout=5) as answer:
                return dict(json.load(answer))
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def alive_workers(self) -> list[dict[str, Any]]:
        state = self.state() or {}
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def wait_alive(self, count: int | None = None, timeout: float = 120.0) -> None:
        """Until the master lists ``count`` (default: all) ALIVE workers."""
        want = len(self.workers) if count is None else count
        wait_for(lambda: len(self.alive_workers()) == want, timeout,
                 f"{want} ALIVE workers at {self.master_url}\n{self.logs()}")

    def start(self, timeout: float = 120.0) -> Self:
        self.master.start()
        wait_for(lambda: self.state() is not None, timeout,
                 f"the master's web UI on {self.webui_port}\n{self.logs()}")
        for worker in self.workers:
            worker.start()
        self.wait_alive(timeout=timeout)
        return self

    def executors(self, worker: int) -> list[psutil.Process]:
        """The executor JVMs a worker launched (its ``CoarseGrainedExecutorBackend`` children)."""
        return [p for p in self.workers[worker].descendants()
                if "CoarseGrainedExecutorBackend" in " ".join(_cmdline(p))]

    def kill_worker(self, worker: int) -> None:
        """SIGKILL a worker's JVM and the executors (and their Python workers) it runs, each by
        pid, as a machine dying would; the master then drops it."""
        self.workers[worker].stop(kill=True)

    def restart_worker(self, worker: int, timeout: float = 120.0) -> None:
        """A killed worker back: a new worker process (new ports), until all are ALIVE again."""
        self.workers[worker].stop(kill=True)
        self.workers[worker] = self._worker(worker)
        self.workers[worker].start()
        self.wait_alive(timeout=timeout)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.master.stop()
        # The executors' unpacked archives and jars: hundreds of MB per application.
        for i in range(len(self.workers)):
            for app in (self.base_dir / f"worker{i}").glob("app-*"):
                shutil.rmtree(app, ignore_errors=True)

    def logs(self, tail: int = 3000) -> str:
        text = []
        for log in [self.master.log, *(w.log for w in self.workers)]:
            if log.exists():
                text.append(f"--- {log.name}\n{log.read_text(errors='replace')[-tail:]}")
        return "\n".join(text)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []

