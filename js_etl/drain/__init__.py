"""The bounded drain of a durable consumer into Delta: the run loop
(:mod:`~js_etl.drain.run`), the fence (:mod:`~js_etl.drain.fence`), confirmed acks and releases
(:mod:`~js_etl.drain.acks`), round sizes (:mod:`~js_etl.drain.rounds`), the executor fetch
(:mod:`~js_etl.drain.fetch`), the table lock (:mod:`~js_etl.drain.lock`) and the two writers
behind one interface (:mod:`~js_etl.drain.writers`). Importing this package does not import
pyspark."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from js_etl.drain.run import run_drain

__all__ = ["run_drain"]


def __getattr__(name: str) -> Any:
    if name == "run_drain":
        from js_etl.drain.run import run_drain

        return run_drain
    raise AttributeError(name)
