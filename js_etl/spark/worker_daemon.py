"""Spark's Python daemon, with what js-etl's tasks import already imported when it forks a worker.

Local Spark runs each Python task in a worker that the daemon (:mod:`pyspark.daemon`) forks. A
fresh worker of a drain imported pyarrow's Parquet, dataset and JSON modules, pandas (pyarrow's
sequence conversion imports it), nats-py, PyYAML and js-etl's fetch, decode and config modules
itself (~0.55 CPU-s a worker, py-spy). Every ``js-etl drain`` process starts its own daemon and
forks its workers, so a scheduled run paid that once per worker. Imported here once, before any
fork, the workers inherit them: a fresh ``js-etl drain`` of 20,000 x 256 B on ``local[2]`` took
11.05-11.44 CPU-seconds instead of 11.56-12.56 (3 runs each on the 2-core dev box, the box's
busy CPU less nats-server's). ``gc.freeze()``, as the gc module advises before forking, keeps
those objects out of the workers' garbage collections, which would otherwise touch (and so copy)
their pages in every worker.

:func:`js_etl.spark.session.local_builder` names this module in ``spark.python.daemon.module``:
local Spark only, whose workers run this interpreter and import js-etl anyway (the tasks'
functions are pickled by reference to it). A user's own ``spark.python.daemon.module`` wins.
"""

import gc

import pandas  # noqa: F401
import pyarrow.dataset
import pyarrow.json
import pyarrow.parquet  # noqa: F401
import pyspark.daemon
import pyspark.worker

import js_etl.config
import js_etl.spark.columnar
import js_etl.spark.source_decode  # noqa: F401

if __name__ == "__main__":
    gc.freeze()
    pyspark.daemon.manager()
