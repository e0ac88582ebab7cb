"""js-etl: NATS JetStream into Delta Lake, exactly once, with Spark and Airflow.

The public API; importing it imports neither pyspark nor Airflow (each name loads on first use):

* :func:`run_drain` — drain a durable consumer into the job's tables;
* :func:`run_backfill` and :class:`RangeRequest` — re-read a stream's range into them;
* :func:`run_stream` — the job's Structured Streaming query (Trigger.AvailableNow) into them;
* :func:`register` — ``spark.read.format("nats_jetstream")`` (and ``spark.readStream``'s) in a
  SparkSession;
* :func:`load_config`, :class:`JobConfig` — a job's settings; :class:`RunReport` — what a run did.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from js_etl.backfill.run import run_backfill
    from js_etl.config import JobConfig, load_config
    from js_etl.drain.run import run_drain
    from js_etl.report import RunReport
    from js_etl.source import register
    from js_etl.source.read_range import RangeRequest
    from js_etl.streaming.run import run_stream

__all__ = ["JobConfig", "RangeRequest", "RunReport", "load_config", "register", "run_backfill",
           "run_drain", "run_stream"]

_HOMES = {"run_drain": "js_etl.drain.run", "run_backfill": "js_etl.backfill.run",
          "run_stream": "js_etl.streaming.run",
          "RangeRequest": "js_etl.source.read_range", "register": "js_etl.source",
          "load_config": "js_etl.config", "JobConfig": "js_etl.config",
          "RunReport": "js_etl.report"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'js_etl' has no attribute {name!r}")
    return getattr(import_module(_HOMES[name]), name)
