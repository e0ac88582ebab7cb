"""The Spark side of js-etl: the drain's rounds, the backfill, and the ``nats_jetstream`` data
source. Importing this package does not import pyspark; :func:`register` does."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register"]


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("nats_jetstream")`` available in ``spark`` (see
    :mod:`js_etl.spark.source`)."""
    from js_etl.spark.source import register as register_source

    register_source(spark)
