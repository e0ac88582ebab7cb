"""What can be told about a stream job before Spark starts (NATS only, no pyspark): no Spark
Connect server is named (:data:`NOT_OVER_CONNECT`), the checkpoint is set, the table paths are
writable, the credentials' files readable, the stream (and the consumer that follows the query)
there, that consumer one no drain reads from (:mod:`js_etl.durable.cursor`). ``js-etl stream``
runs it before its session starts, the Airflow operator before spark-submit."""

from __future__ import annotations

import os
from collections.abc import Mapping

from js_etl.config import JobConfig
from js_etl.delta.rules import check_target_paths
from js_etl.durable.cursor import check_cursor
from js_etl.durable.policy import source_stream_info
from js_etl.errors import ConfigError
from js_etl.jetstream import JetStreamSession

# Connect runs a foreachBatch function on the server, pickled: the job's writer holds what the
# run reports and a lock, so Connect refuses to pickle it, after the query was set up.
NOT_OVER_CONNECT = (
    "js-etl stream does not run over Spark Connect (SPARK_REMOTE or spark.remote): its batches "
    "are written by a function of the job's own process (foreachBatch), which Connect would run "
    "on the server; run it on local Spark or with spark-submit, or read the stream with "
    "spark.readStream.format('nats_jetstream') in a query of your own")


def check_stream(config: JobConfig, environ: Mapping[str, str] | None = None) -> None:
    """Every check of the module docstring, with the variables and secrets of ``environ``
    (default: this process's)."""
    if config.spark.remote_in(os.environ if environ is None else environ):
        raise ConfigError(NOT_OVER_CONNECT)
    checkpoint_of(config)
    check_target_paths(config)
    options = config.nats.connection_options(environ)
    options.check()
    with JetStreamSession(options) as js:
        source_stream_info(js, config.source.stream)
        if config.streaming.commit_consumer:
            source = config.source
            check_cursor(js, source.stream, source.consumer, source.lease_bucket)


def checkpoint_of(config: JobConfig) -> str:
    """The query's checkpoint location, which the job cannot run without."""
    if config.streaming.checkpoint is None:
        raise ConfigError("streaming.checkpoint is required for js-etl stream: the query's "
                          "checkpoint location (a directory every run of this job reaches)")
    return config.streaming.checkpoint
