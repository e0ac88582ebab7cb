"""A drain's two writers behind one interface (:class:`~js_etl.drain.writers.base.Writer`):
Spark's (:mod:`~js_etl.drain.writers.spark`), which writes anything Delta and Spark take, and the
columnar one (:mod:`~js_etl.drain.writers.columnar`), whose fetch tasks write the table's files
themselves, chosen where it writes what Spark's would."""

from __future__ import annotations

import logging

from js_etl.drain.writers.base import Commit, WriteContext, Writer
from js_etl.drain.writers.columnar import open_columnar
from js_etl.drain.writers.spark import SparkWriter
from js_etl.errors import ConfigError

__all__ = ["Commit", "WriteContext", "Writer", "choose_writer"]

log = logging.getLogger("js_etl.drain")


def choose_writer(context: WriteContext) -> tuple[Writer, str | None]:
    """The columnar writer where it writes what Spark's writer would, else Spark's; and why not
    the columnar one (None when it is chosen). ``target.writer`` may insist on either."""
    spark_writer = SparkWriter(context)
    wanted = context.config.target.writer
    chosen = ("target.writer is spark" if wanted == "spark"
              else open_columnar(context, spark_writer))
    if not isinstance(chosen, str):
        return chosen, None
    if wanted == "columnar":
        raise ConfigError(f"target.writer is columnar, but {chosen}: set target.writer to auto "
                          "or spark")
    log.info("writing with Spark, not the columnar writer: %s", chosen)
    return spark_writer, chosen
