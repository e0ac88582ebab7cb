"""The run report: one JSON object per run, for logs, ``--report-file``, Airflow XCom and tests."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any


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
    released_at_end: int = 0  # this run's uncommitted deliveries (failed tasks) NAKed back
    duplicates_dropped: int = 0  # second copies of a seq fetched within one round (not written)
    already_committed: int = 0  # fetched again though a table held them: acked, not rewritten
    stopped_because: str = ""
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
