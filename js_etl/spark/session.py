"""Spark session configuration for Delta. Library code configures a builder and returns it; it
never starts a session as a side effect (the Delta Python API's own habit)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from js_etl.spark.jars import delta_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def configure_delta(builder: SparkSession.Builder, *, jars: list[str] | None = None
                    ) -> SparkSession.Builder:
    """Add Delta (jars, extension, catalog) to a session builder."""
    jar_list = jars if jars is not None else delta_jars()
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
