"""A local Spark Connect server for the tests and the bench: pyspark's own ``SparkConnectServer``
(its jar ships in pyspark 4.2's ``jars/``) started by ``spark-submit``, by default on
``local[2,2]`` (a failed task is retried once, as on a cluster), with Delta's jars,
extension and catalog and js-etl's local settings, its gRPC port on 127.0.0.1 and chosen free; it
is stopped by its pid.

The server's Python workers run this interpreter, so they import js-etl and its dependencies
from this venv: a user ships them to a server the same way, as the server's environment.

    with LocalSparkConnectServer(tmp) as server:
        spark = SparkSession.builder.remote(server.url).getOrCreate()
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Self

from js_etl.demo.server import free_port, stop_process, wait_for
from js_etl.spark.jars import delta_artifacts
from js_etl.spark.session import DELTA_CONF, local_jvm_options
from tools.spark_cluster import SPARK_SUBMIT

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


class LocalSparkConnectServer:
    def __init__(self, data_dir: Path, conf: dict[str, str] | None = None,
                 environment: dict[str, str] | None = None, *, master: str = "local[2,2]",
                 columnar: bool = False) -> None:
        self.data_dir = data_dir
        self.master = master
        self.columnar = columnar  # the JVM js-etl drain starts for the columnar writer
        self.extra_conf = conf or {}  # Spark settings of the server's session, beside ours
        self.environment = environment or {}  # extra variables of the server and its workers
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def conf(self) -> dict[str, str]:
        return {
            **delta_artifacts().conf(), **DELTA_CONF,
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": "4", "spark.databricks.delta.snapshotPartitions": "2",
            "spark.driver.extraJavaOptions": local_jvm_options(columnar=self.columnar),
            "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
            "spark.python.daemon.module": "js_etl.drain.worker_daemon",
            **self.extra_conf,
        }

    def start(self, timeout: float = 180.0) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [str(SPARK_SUBMIT), "--master", self.master, "--class", SERVER_CLASS,
               "--name", "js-etl Spark Connect server",
               *(arg for key, value in self.conf().items() for arg in ("--conf", f"{key}={value}")),
               "spark-internal"]
        env = {**os.environ, **self.environment, "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable}
        env.pop("SPARK_REMOTE", None)
        env.pop("SPARK_CONNECT_MODE_ENABLED", None)
        log = open(self.data_dir / "connect-server.log", "ab")
        try:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                          cwd=self.data_dir, start_new_session=True)
        finally:
            log.close()
        try:
            wait_for(self._serving, timeout, f"Spark Connect server on port {self.port}", 0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def _serving(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            log = (self.data_dir / "connect-server.log").read_text(errors="replace")
            raise RuntimeError(f"the Spark Connect server exited ({self._proc.returncode}):\n"
                               f"{log[-3000:]}")
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        stop_process(self._proc, 30)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
