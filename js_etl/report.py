"""What a run tells: its report (one JSON object per run, for logs, ``--report-file``, Airflow
XCom and tests), why it stopped (a closed set), and its progress while it runs.

A run reports each committed round to one :class:`Progress`: :class:`LogProgress` (a log line,
what Airflow's task log and ``spark-submit`` output show) or :class:`TerminalProgress` (one
line rewritten in place, for a person at a terminal). :func:`progress_for` picks between them.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TextIO


class StopReason(StrEnum):
    """Why a run ended (the report's ``stopped_because``); docs/running.md's report table lists
    each. A drain says ``drained`` only when the consumer has nothing pending and nothing
    ack-pending; every other early end names its cause."""

    DRAINED = "drained"  # nothing pending, nothing ack-pending
    TARGET_REACHED = "target_reached"  # all up to the stream's last seq at the start is done
    MAX_MESSAGES = "max_messages"  # run.max_messages spent
    MAX_BYTES = "max_bytes"  # run.max_bytes spent
    MAX_ROUNDS = "max_rounds"  # run.max_rounds spent
    MAX_SECONDS = "max_seconds"  # run.max_seconds spent
    BELOW_MIN_PENDING = "below_min_pending"  # overflow group: served only above min_pending
    NOTHING_FETCHED = "nothing_fetched"  # rounds in a row fetched nothing though messages wait
    TERMINATED = "terminated"  # SIGTERM: the round in progress finished, then the run stopped
    RANGE_DONE = "range_done"  # backfill: the whole range was read
    NOTHING_IN_RANGE = "nothing_in_range"  # backfill: nothing matched; nothing written
    # the Airflow operator's check before spark-submit: nothing pending, nothing ack-pending;
    # no run was started
    NOTHING_PENDING = "nothing_pending"


@dataclass
class RunReport:
    """What a run did. Built up during the run, then frozen into JSON by :meth:`to_json`."""

    job: str
    run_id: str
    stream: str
    consumer: str
    target: str
    dead_letter_target: str
    started_at: str
    messages_written: int = 0
    bytes: int = 0  # payload bytes of messages written and dead-lettered
    dead_letters: int = 0
    rounds: int = 0
    delta_versions: list[int] = field(default_factory=list)
    dead_letter_versions: list[int] = field(default_factory=list)
    first_seq: int | None = None
    last_seq: int | None = None
    target_seq: int = 0  # the stream's last sequence when the run started
    pending_before: int = 0
    pending_after: int | None = None
    ack_pending_after: int | None = None
    reacked_at_start: int = 0  # rows of an earlier, unfinished round acked by the fence
    released_at_start: int = 0  # deliveries of a dead run the fence NAKed back (ack-pending seen)
    # deliveries no live round held (a failed task attempt's, acks a restarted server lost),
    # NAKed back between rounds and at the end
    released_at_end: int = 0
    duplicates_dropped: int = 0  # second copies of a seq fetched within one round (not written)
    already_committed: int = 0  # fetched again though a table held them: acked, not rewritten
    # "columnar" (js_etl.drain.writers.columnar) or "spark", chosen before a drain's first
    # round; "stream" for js-etl stream (its foreachBatch appends); "none" when no round ran
    writer: str = "none"
    writer_note: str | None = None  # why the Spark writer, when the columnar one was not chosen
    stopped_because: StopReason | None = None
    seconds: float = 0.0
    phase_seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall time of the ``with`` block to ``phase_seconds[name]`` (failures count)."""
        started = time.monotonic()
        try:
            yield
        finally:
            seconds = time.monotonic() - started
            self.phase_seconds[name] = round(self.phase_seconds.get(name, 0.0) + seconds, 3)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"), sort_keys=False)


class Progress(Protocol):
    """Where a run reports each committed round (and its end)."""

    def round_done(self, report: RunReport) -> None: ...

    def finished(self, report: RunReport) -> None: ...


class LogProgress:
    """One log line per round: what ``spark-submit`` output and Airflow's task log show."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or logging.getLogger("js_etl")

    def round_done(self, report: RunReport) -> None:
        self.log.info("round %d: %d messages written, %d dead letters so far, seq %s..%s, "
                      "versions %s", report.rounds, report.messages_written,
                      report.dead_letters, report.first_seq, report.last_seq,
                      report.delta_versions[-1:])

    def finished(self, report: RunReport) -> None:
        self.log.info("stopped because %s after %d round(s): %d messages, %d dead letters",
                      report.stopped_because, report.rounds, report.messages_written,
                      report.dead_letters)


class TerminalProgress:
    """One line rewritten in place (``\\r``): messages done against the consumer's backlog when
    the run started, the rate so far, the time left at that rate, the round. For a person at a
    terminal; logs and Airflow get :class:`LogProgress`."""

    WIDTH = 30

    def __init__(self, out: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.clock = clock
        self.started = clock()

    def round_done(self, report: RunReport) -> None:
        done = report.messages_written + report.dead_letters
        # pending_before is the backlog when the run started: the bar's whole.
        whole = max(report.pending_before, done, 1)
        filled = round(self.WIDTH * done / whole)
        rate = done / max(self.clock() - self.started, 1e-9)
        left = f", {_duration((whole - done) / rate)} left" if rate and done < whole else ""
        self.out.write(f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done:,}/{whole:,} "
                       f"messages, {rate:,.0f}/s{left}, round {report.rounds}\x1b[K")
        self.out.flush()

    def finished(self, report: RunReport) -> None:
        if report.rounds:
            self.out.write("\n")
            self.out.flush()


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def progress_for(out: TextIO) -> Progress:
    """A bar on a terminal, log lines anywhere else (a pipe, a file, Airflow's task log)."""
    return TerminalProgress(out) if out.isatty() else LogProgress()


def summary_table(report: Mapping[str, Any]) -> str:
    """A run report (its JSON form) as a small two-column table for a human: the end of an
    Airflow task log, where the one-line JSON is cut off by the log viewer."""
    phases = report.get("phase_seconds") or {}
    first, last = report.get("first_seq"), report.get("last_seq")
    versions = report.get("delta_versions") or []
    rows = [
        ("stopped because", report.get("stopped_because")),
        ("messages written", report.get("messages_written")),
        ("dead letters", report.get("dead_letters")),
        ("rounds", report.get("rounds")),
        ("Delta versions", f"{versions[0]}..{versions[-1]} ({len(versions)})" if versions
         else "none"),
        ("seq range", f"{first}..{last}" if first is not None else "none"),
        ("pending after", report.get("pending_after")),
        ("ack-pending after", report.get("ack_pending_after")),
        ("seconds", report.get("seconds")),
        *((f"  {name}", seconds) for name, seconds in phases.items()),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows if value is not None)
