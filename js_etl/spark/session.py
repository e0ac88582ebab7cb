"""Starting Spark for js-etl: the one place a SparkSession is configured and started.

Library code configures a builder and returns it (:func:`configure_delta`,
:func:`local_builder`); it never starts a session as a side effect (the Delta Python API's own
habit). The entry points that do need a session — the CLI and spark-submit jobs
(:func:`job_session`), the demo, the bench and the tests (:func:`local_session`) — start it here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from js_etl.errors import TerminalError
from js_etl.spark.jars import delta_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from js_etl.config import SparkConfig


DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def configure_delta(builder: SparkSession.Builder, *, jars: list[str] | None = None
                    ) -> SparkSession.Builder:
    """Add Delta (jars, extension, catalog) to a session builder.

    ``jars=[]`` adds no jars and leaves ``spark.jars`` alone: under spark-submit it holds the
    ``--jars`` list, and setting it to ``""`` here wiped it, so executors on a cluster got no
    Delta classes (issue 18; tests/cluster/test_spark_submit_jars.py).
    """
    jar_list = jars if jars is not None else delta_jars()
    if jar_list:
        builder = builder.config("spark.jars", ",".join(jar_list))
    for key, value in DELTA_CONF.items():
        builder = builder.config(key, value)
    return builder


def local_builder(master: str = "local[2]", app_name: str = "js-etl",
                  conf: Mapping[str, str] | None = None) -> SparkSession.Builder:
    """A builder for js-etl on local Spark: Delta, UTC, no UI, workers on this interpreter."""
    from pyspark.sql import SparkSession

    # Workers must run this venv's Python, or they import a different (or no) js_etl.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               # Delta rebuilds table state with 50 tasks by default: seconds wasted on 2 cores.
               .config("spark.databricks.delta.snapshotPartitions", "2")
               .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
               .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return configure_delta(builder)


def local_session(master: str = "local[2]", app_name: str = "js-etl",
                  conf: Mapping[str, str] | None = None, *,
                  log_level: str | None = None) -> SparkSession:
    """Start (or reuse) local Spark from :func:`local_builder`; ``log_level`` (e.g. ``"ERROR"``)
    quiets Spark's own logging for tools whose output is meant to be read (demo, bench, tests).

    >>> spark = local_session("local[2]", "my-notebook", log_level="ERROR")
    """
    spark = local_builder(master, app_name, conf).getOrCreate()
    if log_level is not None:
        spark.sparkContext.setLogLevel(log_level)
    return spark


def job_session(spark_config: SparkConfig, *, spark_submit: bool) -> SparkSession:
    """The session of a ``js-etl drain|backfill`` run: local Spark from the config's ``spark.*``
    section, or, under spark-submit, the session spark-submit prepared."""
    from pyspark.sql import SparkSession

    if not spark_submit:
        return local_session(spark_config.master, spark_config.app_name, spark_config.conf)
    builder = SparkSession.builder.appName(spark_config.app_name)
    for key, value in spark_config.conf.items():
        builder = builder.config(key, value)
    # Under spark-submit the JVM is already running: Delta's jars must come with --jars
    # (see README); configure_delta only adds the extension and catalog settings then.
    spark = configure_delta(builder, jars=[]).getOrCreate()
    _require_delta(spark)
    return spark


def _require_delta(spark: SparkSession) -> None:
    from delta.tables import DeltaTable



    try:  # without the jars, py4j hands back a JavaPackage and calling it raises TypeError
        DeltaTable.isDeltaTable(spark, "file:///nonexistent-js-etl-probe")
    except TypeError:
        raise TerminalError("Delta classes are not on the driver's classpath: pass Delta's jars "
                            "to spark-submit, e.g. --jars $(js-etl jars) — see README "
                            "'Running a drain'") from None


def spark_jvm(spark: SparkSession) -> Any:
    """The driver's py4j view of the JVM: Delta's and Hadoop's Java API where PySpark has none
    (DeltaLog snapshots, Hadoop FileSystem reads). Classic Spark only; Spark Connect has none."""
    view = spark._jvm
    if view is None:
        raise TerminalError("this SparkSession has no JVM (Spark Connect?): js-etl needs a "
                            "classic Spark driver")
    return view


def hadoop_path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """``path`` as a Hadoop ``Path`` and the ``FileSystem`` that serves it, so the driver reads
    and writes any store Spark can (file:, hdfs://, s3a://, abfss://) without a Spark job."""
    hpath = spark_jvm(spark).org.apache.hadoop.fs.Path(path)
    return hpath, hpath.getFileSystem(spark._jsc.hadoopConfiguration())
