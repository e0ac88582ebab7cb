"""A bounded backfill of a stream's sequence range into the job's tables: the range resolved
(:mod:`~js_etl.source.read_range`), read without any durable consumer, and MERGEd so that only
the ``(stream, seq)`` a table lacks is inserted (:mod:`~js_etl.delta.merge`). Importing this
package does not import pyspark."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from js_etl.backfill.run import Backfill, BackfillReport, run_backfill

__all__ = ["Backfill", "BackfillReport", "run_backfill"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from js_etl.backfill import run

        return getattr(run, name)
    raise AttributeError(name)
