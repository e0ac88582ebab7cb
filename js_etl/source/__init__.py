"""``spark.read.format("nats_jetstream")``: a batch Spark data source over a stream's sequence
range (:mod:`~js_etl.source.datasource`), the same source for ``spark.readStream``
(:mod:`~js_etl.source.stream`), their options (:mod:`~js_etl.source.options`), and the range
reader they share with the backfill (:mod:`~js_etl.source.read_range`). Reads never read or ack
a durable consumer (a stream's ``commit_consumer`` is only moved). Importing this package does
not import pyspark; :func:`register` does."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register"]


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("nats_jetstream")`` and ``spark.readStream``'s available in
    ``spark``."""
    from js_etl.source.datasource import register as register_source

    register_source(spark)
