"""Test-only fault injection, so the fault matrix can break a run at exact points.

``JS_ETL_FAULT=<point>`` in the driver's environment arms one point. Production runs never set
it; an unknown name is refused so a typo cannot silently test nothing.

* ``kill_after_fetch`` — the driver SIGKILLs itself after the round's fetch has run;
* ``kill_after_commit`` — after the round's Delta commits, before any ack;
* ``kill_mid_ack`` — after acking half of the round's committed rows;
* ``fail_fetch_task`` — the first attempt of every fetch task raises after its first delivered pull
  (Spark retries it; its messages are never committed nor acked);
* ``fail_write_task`` — the first attempt of each write task raises mid-write;
* ``stall_before_ack`` — the driver waits ack_wait + 1 s between a round's commit and its acks
  (a slow write phase: the server has queued the round's messages for redelivery by then);
* ``late_fetch_tasks`` — every fetch task but the first two starts ack_wait + 1 s late (waves of
  partitions beyond the cores, retries, scheduling delays);
* ``lose_checkpoint`` — the Spark writer's round checkpoint blocks are dropped right after the
  fetch, as when the executor holding them dies (Spark then fails with
  CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND; the columnar writer's round has no checkpoint);
* ``slow_task_start`` — every fetch task starts 1.5 × the round's base fetch window late (a
  loaded cluster that cannot start tasks within a short ack_wait's window);
* ``hold_after_fetch`` — the driver stops after the first round's fetch has run, writes
  ``$JS_ETL_FAULT_GATE/held`` and waits until the test creates ``$JS_ETL_FAULT_GATE/release``
  (a test acts on a run in the middle of a round — a signal, a second run — whatever the timing);
* ``hold_mid_fetch`` — a fetch task, once a pull delivered to it, writes the round's deadline
  (epoch seconds) to ``$JS_ETL_FAULT_GATE/held`` and waits for ``$JS_ETL_FAULT_GATE/release``
  (a test kills the driver while the round's fetch runs: over Spark Connect the task outlives
  the client);
* ``kill_before_batch_write``, ``kill_between_tables``, ``kill_after_batch_write`` — a
  ``js-etl stream`` run SIGKILLs itself in micro-batch ``$JS_ETL_FAULT_BATCH`` (default 0) before
  its appends, between the dead letters' and the rows' append, or after both (before Spark
  commits the batch to the checkpoint);
* ``hold_mid_merge`` — the backfill's MERGE reads its rows through one task that writes
  ``$JS_ETL_FAULT_GATE/held`` and waits for ``$JS_ETL_FAULT_GATE/release`` (a test kills the
  driver, or a Spark Connect client, while its MERGE runs).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from js_etl.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

ENV = "JS_ETL_FAULT"
POINTS = frozenset({"kill_after_fetch", "kill_after_commit", "kill_mid_ack", "fail_fetch_task",
                    "fail_write_task", "stall_before_ack", "late_fetch_tasks",
                    "slow_task_start", "lose_checkpoint", "hold_after_fetch",
                    "hold_mid_fetch", "hold_mid_merge", "kill_before_batch_write",
                    "kill_between_tables", "kill_after_batch_write"})
GATE_ENV = "JS_ETL_FAULT_GATE"
BATCH_ENV = "JS_ETL_FAULT_BATCH"


class InjectedFault(RuntimeError):
    """Raised on purpose by a fault point."""


def armed() -> str | None:
    point = os.environ.get(ENV) or None
    if point is not None and point not in POINTS:
        raise ConfigError(f"{ENV}={point!r} is not a fault point; use one of {sorted(POINTS)}")
    return point


def kill_here(point: str) -> None:
    """SIGKILL this process if ``point`` is armed: no cleanup, no finally blocks."""
    if armed() == point:
        os.kill(os.getpid(), signal.SIGKILL)


def kill_at_batch(point: str, batch_id: int) -> None:
    """:func:`kill_here` in micro-batch ``$JS_ETL_FAULT_BATCH`` only."""
    if int(os.environ.get(BATCH_ENV) or 0) == batch_id:
        kill_here(point)


def stall_here(point: str, seconds: float) -> None:
    """Sleep ``seconds`` if ``point`` is armed (the slow phase a fault test needs)."""
    if armed() == point:
        time.sleep(seconds)


def hold_here(point: str) -> None:
    """If ``point`` is armed, say so in the gate folder and wait until the test releases the run.
    Once released, the gate stays open: later rounds pass it at once."""
    if armed() == point:
        hold_task(str(_gate(point)))


def held_in_a_task(point: str, df: DataFrame) -> DataFrame:
    """``df``, read through one task held at the gate (:func:`hold_here`'s files) if ``point`` is
    armed: the gate's folder travels with the task, which may run on another machine."""
    if armed() != point:
        return df
    gate = str(_gate(point))

    def held(batches: Iterator[object]) -> Iterator[object]:
        hold_task(gate)
        yield from batches

    return df.coalesce(1).mapInArrow(held, df.schema)


def task_gate(point: str) -> str | None:
    """The gate folder of ``point`` for a task to hold at (:func:`hold_task`), if it is armed."""
    return str(_gate(point)) if armed() == point else None


def hold_task(gate: str | None, note: str = "") -> None:
    """Unless ``gate`` is None or already released, write ``note`` to its ``held`` file and wait
    for its ``release`` — on the driver (:func:`hold_here`) or in a task, whose gate the driver
    armed (:func:`task_gate`, :func:`held_in_a_task`)."""
    if gate is None:
        return
    held, release = Path(gate) / "held", Path(gate) / "release"
    if release.exists():
        return
    written = Path(gate) / f"held.{uuid.uuid4().hex}"  # one per task: several may hold
    written.write_text(note)
    written.replace(held)  # whole, for a test that reads it at once
    while not release.exists():
        time.sleep(0.05)


def _gate(point: str) -> Path:
    if not os.environ.get(GATE_ENV):
        raise ConfigError(f"{ENV}={point} needs {GATE_ENV}=<folder> for its held/release files")
    return Path(os.environ[GATE_ENV])


def start_late(fault: str | None, seconds: float) -> None:
    """On an executor: a fetch task starts ``seconds`` late (``slow_task_start``: every one;
    ``late_fetch_tasks``: those of partition 2 or later)."""
    if fault == "slow_task_start":
        time.sleep(seconds)
    if fault != "late_fetch_tasks":
        return
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None and context.partitionId() >= 2:
        time.sleep(seconds)


def fail_first_attempt(point: str, fault: str | None) -> None:
    """On an executor: raise if ``point`` is the plan's fault and this is a task's 1st attempt."""
    if fault != point:
        return
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None and context.attemptNumber() == 0:
        raise InjectedFault(f"{point}: injected failure of task {context.partitionId()}, "
                            "attempt 0")


def failing_write_stage(batches: Iterator[object]) -> Iterator[object]:
    """Identity ``mapInArrow`` stage whose first attempt fails after its first batch."""
    for i, batch in enumerate(batches):
        if i == 1:
            fail_first_attempt("fail_write_task", "fail_write_task")
        yield batch
    fail_first_attempt("fail_write_task", "fail_write_task")
