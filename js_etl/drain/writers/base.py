"""The interface between the run loop and a writer: the loop plans a round, asks the writer to
fetch it once and commit it, then acks what the writer reads back from the tables. The loop
never knows how a writer fetches or commits."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from js_etl.delta.table import CommitTag

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from js_etl.config import JobConfig
    from js_etl.decode.spark import Decoder
    from js_etl.delta.table import DeltaTarget
    from js_etl.drain.fetch import FetchPlan
    from js_etl.drain.rounds import RoundStats


@dataclass(frozen=True, slots=True)
class WriteContext:
    """What a run's writer writes into, and how it tags its commits."""

    spark: SparkSession
    config: JobConfig
    target: DeltaTarget
    dead_letters: DeltaTarget
    decoder: Decoder
    run_id: str
    ack_prefix: str
    fault: str | None  # test-only fault point (js_etl.faults)

    @property
    def stream(self) -> str:
        return self.config.source.stream

    def tag(self, round_no: int, stats: RoundStats) -> CommitTag:
        return CommitTag(self.config.job_id, self.run_id, round_no, self.ack_prefix,
                         stats.first, stats.last)


@dataclass(frozen=True, slots=True)
class Commit:
    """A committed round: what it fetched, what it committed, and what to ack it by."""

    stats: RoundStats  # the round's deliveries, one per seq
    seqs: pa.Array | pa.ChunkedArray  # the round's sequences
    row_version: int | None  # the commits of its rows and dead letters; None: nothing there
    dead_letter_version: int | None
    # Of the round's seqs, how many the tables held before it (rows, dead letters): committed
    # by an earlier round or run whose acks were lost; acked, not written again.
    already_held: tuple[int, int] = (0, 0)
    duplicates: int = 0  # second deliveries of a seq, dropped before anything was written


class Writer(ABC):
    """Fetches a round exactly once and commits it into the job's two tables."""

    name: ClassVar[str]

    def __init__(self, context: WriteContext) -> None:
        self.context = context

    @abstractmethod
    def fetch(self, plan: FetchPlan, partitions: int, round_no: int) -> Any:
        """Run the round's fetch, exactly once; what it returns is the round's until
        :meth:`discard`."""

    @abstractmethod
    def commit(self, fetched: Any, round_no: int, check: Callable[[], None]) -> Commit | None:
        """Write the round as round ``round_no`` of the job, one tagged commit per table, calling
        ``check`` (does the run still hold the consumer and the table?) before each; None when
        the round fetched nothing."""

    @abstractmethod
    def acks(self, commit: Commit) -> tuple[pa.Table, pa.Table]:
        """The keys to ack, read back from the tables' snapshots, never from the fetch: the
        rows the target holds for the round's seqs (``+ACK``), and the dead letters, with their
        reason (``+TERM``)."""

    def discard(self, fetched: Any) -> None:  # noqa: B027 - most writers hold nothing
        """Free what the round holds, committed or not (it runs after a failure too)."""
