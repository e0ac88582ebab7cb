"""What can be told about a stream job before Spark starts (NATS only, no pyspark): the
checkpoint is set, the table paths are writable, the credentials' files readable, the stream
(and the consumer that follows the query) there, that consumer one no drain reads from
(:mod:`js_etl.durable.cursor`). ``js-etl stream`` runs it before its session
starts, the Airflow operator before spark-submit."""

from __future__ import annotations

from collections.abc import Mapping

from js_etl.config import JobConfig
from js_etl.delta.rules import check_target_paths
from js_etl.durable.cursor import check_cursor
from js_etl.durable.policy import source_stream_info
from js_etl.errors import ConfigError
from js_etl.jetstream import JetStreamSession


def check_stream(config: JobConfig, environ: Mapping[str, str] | None = None) -> None:
    """Every check of the module docstring, with the secrets of ``environ`` (default: this
    process's)."""
    checkpoint_of(config)
    check_target_paths(config)
    options = config.nats.connection_options(environ)
    options.check_files()
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
