"""The bounded drain: lease ▸ lock ▸ fence ▸ plan ▸ [fetch ▸ commit ▸ ack]* ▸ release ▸ report.

The hazard that shapes this module: a Spark RDD is recomputed whenever its blocks are missing,
and fetching from a durable consumer is a side effect — a recomputed partition fetches
*different* messages. So:

1. A round's fetch runs exactly once, as an eager ``localCheckpoint``. That cuts the lineage:
   if a checkpointed block is ever lost, Spark fails the job instead of silently re-fetching.
   A failed task attempt's messages are simply not in the checkpoint; nobody acks them. The
   payload is decoded in the same pass, so the checkpoint holds the decoded rows.
   ``spark.speculation`` is refused: two attempts of one fetch task would both fetch, and
   different jobs could read different attempts' blocks.
   The columnar writer's tasks write their rows and dead letters to files themselves, so its
   fetch runs as one collect of their small output instead, never read again
   (:mod:`js_etl.spark.columnar`); what follows holds for both.
2. Table rows and dead-letter rows are written from that checkpoint (or those files), one Delta
   transaction per table, tagged with the job and round (see :mod:`js_etl.spark.delta`).
3. Acks are built from what the tables hold for the round's sequences, read back from their
   current snapshots (:func:`js_etl.spark.delta.range_keys`) — never from the checkpoint,
   the task output or a fetch. Dead letters get ``+TERM`` with their reason, table rows
   ``+ACK``. Every ack block is *confirmed applied* before anything else happens
   (:mod:`js_etl.jetstream.ack`): a flush only proves the server read them.

Exactly-once rests on these mechanisms, each holding whatever the timing:

* **Confirmed acks, NAKs and TERMs** before the next fetch: no pull can be served a redelivery
  of something this run committed, or be hit by a late NAK.
* **One deadline per round**, an absolute time set by the driver (:class:`FetchPlan`): a task
  that starts late (waves of partitions beyond the cores, retries) pulls nothing after it. Every
  delivery of a round is received before ``deadline + pull_timeout`` ≤ round start + ⅔ ack_wait
  (``min_ack_wait``), so no message of a round is redelivered within that round, given clocks
  within ack_wait/3 of each other.
  A round that fetched nothing while messages are pending (its tasks may all have started after
  the window: a loaded machine, a short ack_wait) doubles the next round's window, up to 16x;
  a second delivery inside a longer window is still caught by the next two mechanisms.
* **Dedupe by seq** of the round's rows (second line of defence against redeliveries inside a
  round, e.g. after a server restart lost its delivery state), keeping the latest delivery,
  before anything is counted or written: stats, dead letters and rows see the same copy.
* **Never write a seq twice**: the round's sequences are checked against both tables (their
  snapshots, files skipped by their ``seq`` statistics); what a table already holds (its ack
  was lost: a server killed before it stored the ack, a dead run) is acked, not written again.
* **Round numbers from Delta's application transaction**, checked after every append.
* **The lease and the lock**: one run per consumer, whatever its table (a lease in NATS,
  :mod:`js_etl.durable.lease`), and per consumer and table (:mod:`js_etl.spark.lock`); both are
  checked before the fence's acks and NAKs, every commit and every ack block.

Failure handling (the fence, the PIP-84 "epoch" idea applied to runs): holding the lease, a run
first acks every row the tables hold in the consumer's unacked window (ack floor, last
delivered] (a run died between its commit and its acks), then NAKs whatever else is still
delivered-but-unacked (a dead run's or a failed task's deliveries), so those come back now
instead of after ``ack_wait``, and in order. What we rely on, measured on nats-server 2.15:
acks are keyed by stream sequence (any delivery's subject acks the message); a NAK is applied
only if its delivery-sequence token lies in the consumer's window (ack floor, last delivered]
and the stream sequence is pending — so NAKs use the last delivered consumer sequence, and a
NAK for a message that is not pending is ignored.

A server-side ``max_deliver`` is refused (:func:`js_etl.durable.policy.drain_consumer_problems`):
the server drops a message after that many deliveries and moves the ack floor past it, and a run
that dies after its fetch (or a NAK of the fence) spends a delivery without committing — so a
crash could lose a message for good. js-etl parks poison itself instead
(``source.max_deliver``), in the dead-letter table, after its commit.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cached_property, partial
from typing import TYPE_CHECKING

from js_etl import faults
from js_etl.config import JobConfig
from js_etl.durable.lease import ConsumerLease
from js_etl.durable.owner import LockOwner
from js_etl.durable.pin import GroupPin
from js_etl.durable.policy import DEFAULT_ACK_WAIT, drainable_consumer
from js_etl.errors import ConfigError, TerminalError, TransientError
from js_etl.jetstream import (
    ConnectionOptions,
    ConsumerInfo,
    JetStreamSession,
    PriorityGroupRequest,
    PriorityPolicy,
    StreamInfo,
    ack_prefix,
    ack_subject,
)
from js_etl.jetstream.ack import ACK, AckBlock, ack_block, nak_body, term_body
from js_etl.report import LogProgress, Progress, RunReport, StopReason
from js_etl.schema import PAYLOAD_BYTES, RAW_DDL, ROUND_DDL, round_arrow
from js_etl.spark import columnar
from js_etl.spark.columnar import ColumnarPlan, RoundOutput, WrittenFile, fetch_decode_write
from js_etl.spark.decode import Decoder, with_partition_columns
from js_etl.spark.delta import (
    CommitTag,
    DeltaTarget,
    create_empty,
    job_tables,
    keys_of,
    no_keys,
    range_keys,
    same_table,
    schema_problem,
)
from js_etl.spark.failures import is_transient
from js_etl.spark.fetch import FetchPlan, fetch_partition
from js_etl.spark.lock import TableLock
from js_etl.spark.rounds import (
    RoundSize,
    RoundStats,
    budget_left,
    budget_spent,
    fetch_seconds,
    plan_round,
    why_nothing_fetched,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("js_etl.drain")

MAX_RELEASE = 1_000_000  # widest (ack floor, delivered] window the fence NAKs sequence by sequence
# How long a run rides out NATS not answering (leader elections of a clustered stream or
# consumer) before it ends with the transient exit code.
RECOVERY_SECONDS = 60.0


def refuse_speculation(spark: SparkSession) -> None:
    # The SparkContext's own setting, the one its scheduler reads, as Spark reads a boolean
    # (trimmed, any case: " TRUE" turns speculation on; a break-it review): three py4j calls,
    # where getConf(), a copy of the whole conf, is ~150 (a bench leg's py4j calls, issue 14).
    if str(spark.sparkContext._jsc.sc().conf().get("spark.speculation", "false")
           ).strip().lower() == "true":
        raise ConfigError("spark.speculation=true runs a fetch task twice and both attempts "
                          "pull from the consumer: run the drain with "
                          "--conf spark.speculation=false")


@dataclass(frozen=True, slots=True)
class _Holds:
    """What a run holds, each checked before the fence's releases, every commit and ack block."""

    lease: ConsumerLease
    lock: TableLock

    def check(self) -> None:
        self.lease.check()
        self.lock.check()


class Drain:
    """One run of a drain. Use :func:`run_drain`."""

    def __init__(self, spark: SparkSession, config: JobConfig, options: ConnectionOptions,
                 *, run_id: str | None = None,
                 progress: Progress | None = None,
                 stop: threading.Event | None = None) -> None:
        self.spark = spark
        self.config = config
        self.options = options
        self.source = config.source
        self.target, self.dead_letters = self.tables = job_tables(config)
        self.ack_prefix = ack_prefix(self.source.stream, self.source.consumer)
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.progress = progress or LogProgress(log)
        self.stop = stop or threading.Event()  # set (e.g. on SIGTERM): stop after this round
        self.fault = faults.armed()
        self.pin = GroupPin(self.source.stream, self.source.consumer, self.source.priority_group)
        self.park_after = config.source.max_deliver
        self._ack_wait = DEFAULT_ACK_WAIT  # the consumer's, from the last round's plan
        self._released = 0  # deliveries NAKed since the last round (see plan_round)
        # Deliveries this run NAKed that no round has fetched again since: still ack-pending
        # to the server, so a later release must not count them a second time.
        self._outstanding = 0
        # An overflow group's consumer serves other live clients too: their deliveries are
        # theirs to ack, not released between this run's rounds.
        self._shared = False
        self._window = 1  # how many times fetch_seconds the next round may pull for
        self._fetch_end = 0.0  # wall time after which no task of the last round pulls
        self._recovery_deadline: float | None = None  # see _recovering
        self.columnar: ColumnarPlan | None = None  # the writer, chosen before the first round
        # The round's dead-letter files are committed as they are (not to be removed).
        self._dead_letters_committed = False
        refuse_speculation(spark)
        # Checks decode.schema: a bad schema fails before any pull.
        self.decoder = Decoder(config.decode.format, config.decode.schema,
                               keep_raw=config.decode.keep_raw,
                               unknown_fields=config.decode.unknown_fields)
        self.report = RunReport(
            job=config.job_id, run_id=self.run_id, stream=self.source.stream,
            consumer=self.source.consumer, target=str(self.target),
            dead_letter_target=str(self.dead_letters),
            started_at=datetime.now(UTC).isoformat(timespec="seconds"))

    def run(self) -> RunReport:
        started = time.monotonic()
        with self.report.phase("connect"):
            js = JetStreamSession(self.options)
        with js:
            # The consumer first, before its settings are read or changed: a second run on it
            # is refused here, whatever table it writes.
            stream = js.stream_info(self.source.stream)
            lease = ConsumerLease(self.options, self.source.stream, self.source.consumer,
                                  self.run_id, target=str(self.target),
                                  bucket=self.source.lease_bucket, replicas=stream.num_replicas,
                                  tables=[[t.path, t.table] for t in self.tables])
            with lease:
                with self.report.phase("plan"):
                    info = self._plan(js, stream)
                lock = TableLock(self.spark, self._lock_location(), self.source.consumer,
                                 self.run_id)
                with lock:
                    try:
                        self._run(js, _Holds(lease, lock), info, started)
                    finally:
                        self.pin.release(js)
        self.report.seconds = round(time.monotonic() - started, 3)
        self.progress.finished(self.report)
        return self.report

    def _plan(self, js: JetStreamSession, stream: StreamInfo) -> ConsumerInfo:
        info, policy = drainable_consumer(js, self.config)
        self.pin.pinned = policy is PriorityPolicy.PINNED_CLIENT
        self._shared = policy is PriorityPolicy.OVERFLOW
        self.report.target_seq = stream.state.last_seq
        self.report.pending_before = info.num_pending
        return info

    def _lock_location(self) -> str:
        """The target table's directory. A catalog table that does not exist yet is created
        first, empty, so that every run of the job, the first one too, locks in one place (its
        first run used to lock in the table's future directory, and Delta then refused to
        create the table in a directory that was not empty: a break-it review)."""
        if self.target.table and not self.target.exists(self.spark):
            try:
                create_empty(self.target, *self._empty_rows())
            except Exception:
                if not self.target.exists(self.spark):  # else another first run created it
                    raise
        return self.target.location(self.spark)

    def _empty_rows(self) -> tuple[DataFrame, list[str]]:
        """No rows, with the columns and the partition columns the drain writes."""
        empty = self.decoder.flag(self.spark.createDataFrame([], RAW_DDL))
        return with_partition_columns(self.decoder.rows(empty),
                                      list(self.config.target.partition_by))

    def _run(self, js: JetStreamSession, holds: _Holds, info: ConsumerInfo,
             started: float) -> None:
        report, run = self.report, self.config.run
        with self.report.phase("fence"):
            self._fence(js, info, holds)
        next_round = 0  # read from the tables before the first round: an empty run needs none
        retook_pin = False
        empty_rounds = 0
        while True:
            stop = budget_spent(run, report, stopping=self.stop.is_set(),
                                elapsed=time.monotonic() - started)
            if stop:
                report.stopped_because = stop
                break
            with self.report.phase("plan"):
                info = self._consumer_info(js)
            if info.num_pending == 0 and info.num_ack_pending == 0:
                report.stopped_because = StopReason.DRAINED
                break
            if (report.rounds and info.delivered.stream_seq >= report.target_seq
                    and info.num_ack_pending == 0):
                # Nothing up to the target is left, not even a redelivery (a dead run's
                # deliveries move the delivered pointer past the target before we read them).
                report.stopped_because = StopReason.TARGET_REACHED
                break
            if empty_rounds:
                stop = why_nothing_fetched(self.config, info, empty_rounds)
                if stop:
                    report.stopped_because = stop
                    break
            if info.num_ack_pending and (empty_rounds or not self._shared):
                # Between rounds no round holds a delivery (each confirmed its acks before
                # this point), so what the server counts as ack-pending is held by no live
                # round: a failed task attempt's deliveries, or committed ones whose acks a
                # restarted server lost (SIGKILLed before it stored them). Left alone they keep
                # their ack-pending slots until ack_wait, and every round shrinks to the slots
                # left: seen, after such a restart, 190 rounds of 2 messages for 370 messages
                # (max_ack_pending 120, ack_wait 300 s; tests/spark/test_faults.py). Released
                # now, sound under the lease as the fence's release is; a committed one comes
                # back and is found in the table and acked, never written twice. (On an
                # overflow group's consumer other clients' deliveries are theirs: released only
                # after a round that fetched nothing, as before.)
                report.released_at_end += self._nak_unacked(js, holds, info, exclude=set())
                info = js.consumer_info(self.source.stream, self.source.consumer)
            if not next_round:
                next_round = self._first_round()
            size = plan_round(self.config, info,
                              messages_left=budget_left(run.max_messages,
                                                        report.messages_written
                                                        + report.dead_letters),
                              bytes_left=budget_left(run.max_bytes, report.bytes),
                              released=self._released, columnar=self.columnar is not None)
            self._released = 0
            if size is None:
                raise TransientError(
                    f"consumer {self.source.stream}/{self.source.consumer} has all "
                    f"{info.config.max_ack_pending} ack-pending slots taken by deliveries this "
                    f"run did not make; they return after ack_wait "
                    f"({info.config.ack_wait or 0:g}s): retry then")
            if self.pin.pinned and self.pin.pin_id is None:
                # Only a delivery takes the pin (measured: a 409-only pull does not), so the
                # first round pulls on one partition; later rounds share its pin id.
                size = replace(size, partitions=1)
            holds.check()  # a run that lost the consumer pulls nothing more
            try:
                fetched, blocks = self._fetch(size, info, next_round)
            except Exception as e:
                if not is_transient(e):
                    raise
                self._wait_out_failed_fetch(js, e)
                continue  # the next round releases what the failed one left delivered
            faults.kill_here("kill_after_fetch")
            faults.hold_here("hold_after_fetch")
            try:
                done = self._commit_and_ack(js, holds, fetched, next_round)
            except BaseException:
                self._release_after_failure(js, holds)
                raise
            finally:
                self._release_blocks(blocks)
            if self.pin.pinned and self.pin.changed(js, done) and not retook_pin:
                retook_pin = True  # our pin timed out between rounds: take it again, once
                continue
            if not done:
                empty_rounds += 1
                self._window = min(2 * self._window, 16)
                continue
            empty_rounds = 0
            self._window = 1
            next_round += 1
            holds.lease.record(pin_id=self.pin.pin_id)
            self.progress.round_done(report)
        with self.report.phase("release"):
            # Everything this run committed is acked (confirmed); whatever else it holds (a
            # failed task attempt's deliveries) goes back now rather than after ack_wait.
            info = js.consumer_info(self.source.stream, self.source.consumer)
            report.released_at_end += self._nak_unacked(js, holds, info, exclude=set())
            info = js.consumer_info(self.source.stream, self.source.consumer)
        report.pending_after = info.num_pending
        report.ack_pending_after = info.num_ack_pending

    def _first_round(self) -> int:
        """Refuse tables js-etl cannot fence and ack from, before anything is fetched; the
        number of this run's first round."""
        for table in self.tables:
            table.check_usable(self.spark)
        if self.target.exists(self.spark):
            rows, partition_names = self._empty_rows()
            problem = schema_problem(str(self.target), self.target.shape(self.spark),
                                     rows.schema, partition_names,
                                     merge_schema=self.config.decode.merge_schema)
            if problem:
                raise ConfigError(problem)
        self._choose_writer()
        return 1 + max(table.job_round(self.spark, self.config.job_id)[0] for table in self.tables)

    def _choose_writer(self) -> None:
        """The columnar writer where it writes what the Spark writer would (see
        :mod:`js_etl.spark.columnar`), else the Spark writer; the report says which, and why."""
        wanted = self.config.target.writer
        problem = ("target.writer is spark" if wanted == "spark"
                   else columnar.config_problem(self.spark, self.config))
        if problem is None:
            # A catalog table exists by now (_lock_location): a path is the table's location.
            location = self.target.location(self.spark)
            rows, names = columnar.row_schema(self.config)
            problem = self._columnar_table_problem(self.target, location, rows, names,
                                                   exists=self.target.exists(self.spark))
        if problem is None:
            self.columnar = columnar.columnar_plan(location, self.config, self.run_id,
                                                   self._dead_letters_as_files())
            self.report.writer = "columnar"
        elif wanted == "columnar":
            raise ConfigError(f"target.writer is columnar, but {problem}: set target.writer to "
                              "auto or spark")
        else:
            log.info("writing with Spark, not the columnar writer: %s", problem)
            self.report.writer_note = problem

    def _columnar_table_problem(self, table: DeltaTarget, location: str, rows: StructType,
                                names: list[str], *, exists: bool) -> str | None:
        """Why the columnar writer cannot commit ``rows`` (partitioned by ``names``) into
        ``table`` at ``location`` as files, or None; a missing table (``exists`` False) is
        created first."""
        problem = columnar.location_problem(location)
        if problem is None:
            if not exists:
                self._create_for_columnar(table, location, rows, names)
            problem = columnar.table_problem(table.shape(self.spark), rows, names)
        return problem

    @cached_property
    def _session_conf_keys(self) -> list[str]:
        """The names of the session's settings, read once a run in one answer from the JVM:
        PySpark's ``conf.getAll`` asks for each setting twice, ~150 py4j calls a run (counted in
        a bench leg, issue 14). A name holding a line break reads as two here; what uses them
        looks for a prefix, and a false match only makes Spark create the table."""
        return str(self.spark.conf._jconf.getAll().keySet().mkString("\n")).split("\n")

    def _create_for_columnar(self, table: DeltaTarget, location: str, rows: StructType,
                             names: list[str]) -> None:
        """Create a missing table the columnar writer is to write, by deltalake
        (:func:`columnar.create_table`) or, where only Spark creates it as Spark would, by
        Spark."""
        try:
            if columnar.needs_spark_to_create(rows, self._session_conf_keys):
                create_empty(table, self.spark.createDataFrame([], rows), names)
            else:
                directory = columnar.local_directory(location)
                assert directory is not None  # location_problem accepted it
                columnar.create_table(directory, rows, names)
        except Exception:
            if not table.exists(self.spark):  # else another first run created it
                raise

    def _dead_letters_as_files(self) -> str | None:
        """The dead-letter table's directory where the columnar writer's dead-letter files can
        be committed as they are: a table the columnar writer's rules for its own accept
        (:func:`columnar.table_problem`: the protocol, no rule on rows, exactly the dead-letter
        columns, no partitions); a missing one is created now, as for the rows' table. Else None,
        and Spark appends them: a catalog table still to create, session defaults for new tables
        (Spark creates it at the first dead letter, as its writer does), or a table with other
        rules."""
        table, rows = self.dead_letters, columnar.dead_letter_schema()
        exists = table.exists(self.spark)
        if not exists and (table.table
                           or columnar.needs_spark_to_create(rows, self._session_conf_keys)):
            return None
        location = table.location(self.spark)
        if self._columnar_table_problem(table, location, rows, [], exists=exists):
            return None
        return columnar.local_directory(location)

    def _release_after_failure(self, js: JetStreamSession, holds: _Holds) -> None:
        """A round failed after its fetch: NAK what it holds now, so its messages come back at
        once rather than after ack_wait (a retry would otherwise find them still delivered). A
        committed one comes back and is found in the table and acked, never written twice.
        Best effort: the round's own error is the one to report."""
        try:
            info = js.consumer_info(self.source.stream, self.source.consumer)
            self.report.released_at_end += self._nak_unacked(js, holds, info, exclude=set())
        except Exception as e:
            log.warning("could not release the failed round's deliveries (they return after "
                        "ack_wait): %s", str(e).splitlines()[0][:200])

    # --- riding out a NATS failover -----------------------------------------------------------
    def _consumer_info(self, js: JetStreamSession) -> ConsumerInfo:
        """The consumer's info; while no leader answers (an election: a 503, a timeout), asked
        again within the run's recovery time. A consumer confirmed missing is terminal."""
        while True:
            try:
                return js.consumer_info(self.source.stream, self.source.consumer)
            except TransientError as e:
                self._recovering(e)
                time.sleep(0.5)

    def _recovering(self, error: BaseException) -> None:
        """Raise ``error`` once the run has spent :data:`RECOVERY_SECONDS` riding out
        failovers; until then, say what it waits for."""
        now = time.monotonic()
        if self._recovery_deadline is None:
            self._recovery_deadline = now + RECOVERY_SECONDS
        if now > self._recovery_deadline:
            raise error
        log.warning("NATS did not answer (%s); retrying for up to %.0fs more",
                    str(error).splitlines()[0][:200], self._recovery_deadline - now)

    def _wait_out_failed_fetch(self, js: JetStreamSession, error: BaseException) -> None:
        """After a round's fetch job failed on a NATS outage (a consumer leader lost mid-pull):
        wait until none of its tasks runs or can still pull (the round's deadline), and for the
        consumer to answer again. Nothing of the round was committed; what its tasks received
        stays delivered, and the next round releases it."""
        self._recovering(error)
        tracker = self.spark.sparkContext.statusTracker()
        while tracker.getActiveJobsIds() and time.time() < self._fetch_end:
            time.sleep(0.2)
        self._consumer_info(js)

    # --- fence ------------------------------------------------------------------------------
    def _fence(self, js: JetStreamSession, info: ConsumerInfo, holds: _Holds) -> None:
        """Finish what earlier runs left (see module docstring).

        Its cost follows what a dead run can have left, not the consumer's history. Every round
        confirms its acks before the next fetch, so only each table's *last* round of this job
        can hold rows the server never saw acked: those rows — the round's commit tag names its
        seq range — are re-acked, not every row above the ack floor. The whole window was read
        and re-acked before, so one stuck delivery below a long history made every fence re-ack
        all of it (issue 18: 190,000-293,000 rows, 45-56 s a run on its cluster); on R3 each
        ack, even of an acked message, is a Raft proposal. Measured on the loopback R3 cluster of
        tests/support/nats_cluster.py (60,000 rows of history in 6 rounds, one stuck delivery):
        fence 1.39 s before, 1.55 s after — time there is Spark/Delta overhead, not acks — while
        the acks sent fell from 60,000 to one round's. A committed row outside that range that
        is still pending (its ack lost with a server's state) is released with the rest and, when
        redelivered, found in the table by the round's "never write a seq twice" check and acked
        there.
        """
        previous = holds.lease.previous
        self.pin.take_over(js, info, previous.pin_id if previous else None)
        if info.num_ack_pending == 0:
            return  # nothing delivered and unacked: nothing to finish, no Spark job
        floor, delivered = info.ack_floor.stream_seq, info.delivered.stream_seq
        reacked = 0
        for table, dead in self._fenced_tables(previous):
            seqs = table.last_round_seqs(self.spark, self.config.job_id)
            if seqs is None:
                continue  # this job never committed here
            first, last = max(floor + 1, seqs[0]), min(delivered, seqs[1])
            if first > last:
                continue  # its last round is all at or below the ack floor: acked
            keys = range_keys(self.spark, table, self.source.stream, first, last,
                              with_error=dead)
            if keys is not None:
                reacked += self._ack(js, holds, keys, dead=dead)
        # Rows above the floor may have been acked already; at most num_ack_pending were not.
        self.report.reacked_at_start = min(reacked, info.num_ack_pending)
        if reacked:
            # Those acks are confirmed applied: what is still pending, and the floor, are now
            # the server's to say. A NAK of an acked message is ignored (module docstring).
            info = js.consumer_info(self.source.stream, self.source.consumer)
        self.report.released_at_start = self._nak_unacked(js, holds, info, exclude=set())

    def _fenced_tables(self, previous: LockOwner | None) -> list[tuple[DeltaTarget, bool]]:
        """This run's tables, and the tables of the dead run whose lease it took over where
        those are others (a changed target.path): that run's last round may be committed there
        and unacked, and releasing it would land its sequences in a second table. Each with
        whether it holds dead letters."""
        tables = [(self.target, False), (self.dead_letters, True)]
        if previous is None or not previous.tables:
            return tables
        for (path, name), dead in zip(previous.tables, (False, True), strict=False):
            other = DeltaTarget(path, name)
            if not any(same_table(other, mine) for mine in self.tables) and other.exists(
                    self.spark):
                log.warning("fencing the last round of the dead run %s in its table %s",
                            previous.run_id, other)
                tables.append((other, dead))
        return tables

    def _nak_unacked(self, js: JetStreamSession, holds: _Holds, info: ConsumerInfo, *,
                     exclude: set[int]) -> int:
        """NAK every delivered-but-unacked message except ``exclude`` (only sound while this run
        holds the lease: no live run owns those deliveries). Returns how many were unacked and
        not released by this run before."""
        floor, delivered = info.ack_floor.stream_seq, info.delivered.stream_seq
        if info.num_ack_pending == 0 or delivered <= floor:
            return 0
        if delivered - floor > MAX_RELEASE:
            log.warning("not releasing %d unacked deliveries one by one (window %d..%d too "
                        "wide); they return after ack_wait", info.num_ack_pending, floor,
                        delivered)
            return 0
        dseq = info.delivered.consumer_seq  # inside the server's NAK window (module docstring)
        subjects = (ack_subject(self.ack_prefix, 1, seq, dseq)
                    for seq in range(floor + 1, delivered + 1) if seq not in exclude)
        holds.check()
        js.run(js.acker.send(AckBlock.of(subjects, nak_body())))
        # What the server counted as delivered-but-unacked, less what we just acked ourselves.
        self._released = max(info.num_ack_pending - len(exclude), 0)
        fresh = max(self._released - self._outstanding, 0)
        self._outstanding = self._released
        return fresh

    # --- rounds -----------------------------------------------------------------------------
    def _fetch(self, size: RoundSize, info: ConsumerInfo, round_no: int
               ) -> tuple[DataFrame | RoundOutput, set[int]]:
        """The round's fetch, run once: checkpointed rows (and the ids of the blocks to free
        after the round), or the columnar writer's collected task output."""
        ack_wait = self._ack_wait = info.config.ack_wait or DEFAULT_ACK_WAIT
        plan = FetchPlan(
            options=self.options, stream=self.source.stream, consumer=self.source.consumer,
            ack_prefix=self.ack_prefix, batch=size.batch, max_bytes=size.max_bytes,
            partition_messages=size.partition_messages, partition_bytes=size.partition_bytes,
            held_bytes=size.held_bytes,
            extra_messages=size.extra_messages,
            stop_after_seq=self.report.target_seq or 2**63 - 1,
            pull_timeout=self.config.fetch.pull_timeout,
            deadline=time.time() + fetch_seconds(self.config, ack_wait) * self._window,
            priority_group=self._priority_group(), fault=self.fault,
            fault_seconds=(1.5 * fetch_seconds(self.config, ack_wait)
                           if self.fault == "slow_task_start" else ack_wait + 1))
        self._fetch_end = plan.deadline + plan.pull_timeout  # no task pulls after it
        with self.report.phase("fetch"):
            if self.columnar:  # decoded and written to files by the fetch tasks themselves
                indexes = self.spark.sparkContext.parallelize(range(size.partitions),
                                                              size.partitions)
                return RoundOutput.of(indexes.mapPartitions(
                    partial(fetch_decode_write, plan, self.columnar, round_no)).collect()), set()
            tasks = self.spark.range(size.partitions, numPartitions=size.partitions)
            fetched, blocks = self._checkpoint(self.decoder.flag(
                tasks.mapInArrow(partial(fetch_partition, plan), RAW_DDL),
                park_after=self.park_after))
            if self.fault == "lose_checkpoint":
                self._release_blocks(blocks)  # as if the executor holding them had died
            return fetched, blocks

    def _priority_group(self) -> PriorityGroupRequest | None:
        group = self.source.priority_group
        return PriorityGroupRequest(group, self.source.min_pending, self.source.min_ack_pending,
                                    id=self.pin.pin_id) if group else None

    def _checkpoint(self, df: DataFrame) -> tuple[DataFrame, set[int]]:
        """Evaluate ``df`` once, eagerly, into local checkpoint blocks (module docstring);
        returns it and the ids of its blocks' RDDs, to free them after the round."""
        before = self._persistent_rdds()
        # For a fetch: the one and only evaluation of this round's pulls. Decoding in the same
        # pass saves caching a second copy of the round (profiled: ~20% of a round at 4 KiB).
        checkpointed = df.localCheckpoint(eager=True)
        return checkpointed, self._persistent_rdds() - before

    def _persistent_rdds(self) -> set[int]:
        return set(self.spark.sparkContext._jsc.getPersistentRDDs().keys())

    def _release_blocks(self, rdd_ids: set[int]) -> None:
        """Free the round's checkpoint blocks now: ``DataFrame.unpersist`` does not reach a
        local checkpoint, and waiting for the JVM's GC lets memory grow with the backlog."""
        rdds = self.spark.sparkContext._jsc.getPersistentRDDs()
        for rdd_id in rdd_ids:
            if rdd_id in rdds:
                rdds[rdd_id].unpersist(False)

    def _stats(self, fetched: DataFrame) -> tuple[RoundStats, pa.ChunkedArray]:
        """What the round holds, and its seqs."""
        from pyspark.sql import functions as F

        keys = fetched.select("seq", F.col("error").isNotNull().alias("dead"),
                              F.col(PAYLOAD_BYTES).alias("bytes")).toArrow()
        return RoundStats.of(keys), keys.column("seq")

    def _commit_and_ack(self, js: JetStreamSession, holds: _Holds,
                        fetched: DataFrame | RoundOutput, round_no: int) -> bool:
        """Write the round, then ack what the tables hold for its sequences. Returns False when
        the round fetched nothing."""
        if not isinstance(fetched, RoundOutput):
            return self._commit_spark(js, holds, fetched, [], round_no)
        self._dead_letters_committed = False
        try:
            if not fetched.keys.num_rows:
                return False
            if self._commit_columnar(js, holds, fetched, round_no):
                return True
            # A seq twice, or one a table holds: Spark's path, which has the rules for both.
            return self._commit_spark(js, holds, self._as_spark_round(fetched),
                                      list(fetched.files), round_no)
        finally:
            # Copied into the dead-letter table by Spark's append by now; or the round failed,
            # and their messages, never acked, come back.
            if not self._dead_letters_committed:
                assert self.columnar is not None
                self._remove(fetched.dead_letters, self.columnar.dead_letter_files)

    def _commit_spark(self, js: JetStreamSession, holds: _Holds, fetched: DataFrame,
                      files: list[WrittenFile], round_no: int) -> bool:
        """The round through Spark: its rows from the checkpoint, or — a columnar round the
        columnar commit could not take — read back from the files its tasks wrote."""
        import pyarrow as pa

        report = self.report
        blocks: set[int] = set()
        try:
            with self.report.phase("write"):
                stats, seqs = self._stats(fetched)
                if not stats.n:
                    return False
                if stats.distinct < stats.n:
                    fetched, blocks = self._dedupe(fetched)
                    report.duplicates_dropped += stats.n - stats.distinct
                    stats, seqs = self._stats(fetched)
                first, last = stats.first, stats.last
                # Sequences a table already holds (committed by an earlier round or run whose
                # acks were lost) are acked below, never written twice.
                held = [set(keys_of(range_keys(self.spark, table, self.source.stream, first,
                                               last), seqs).column("seq").to_pylist())
                        for table in self.tables]
                known = sorted(set().union(*held))
                written = stats
                if known:
                    log.warning("round %d: %d messages are already in the tables (their acks "
                                "were lost); acking them instead of writing them again",
                                round_no, len(known))
                    report.already_committed += len(known)
                    fetched = fetched.join(self.spark.createDataFrame(
                        pa.table({"seq": pa.array(known, pa.int64())})), "seq", "left_anti")
                    written, _ = self._stats(fetched)
                tag = CommitTag(self.config.job_id, self.run_id, round_no, self.ack_prefix,
                                first, last)
                if written.dead:
                    holds.check()
                    report.dead_letter_versions.append(self.dead_letters.append(
                        self.spark, self.decoder.dead_letters(fetched), tag, partition_by=[],
                        merge_schema=False))
                if written.n > written.dead:
                    rows, partition_names = with_partition_columns(
                        self._good_rows(fetched, files), list(self.config.target.partition_by))
                    if self.fault == "fail_write_task":
                        rows = rows.mapInArrow(faults.failing_write_stage, rows.schema)
                    holds.check()
                    report.delta_versions.append(self.target.append(
                        self.spark, rows, tag, partition_by=partition_names,
                        merge_schema=self.config.decode.merge_schema))
                # Read into the append, or rows the table held already: no commit names them
                # (a break-it review found a round of only those leaving its files behind).
                self._remove(files)
            faults.kill_here("kill_after_commit")
            faults.stall_here("stall_before_ack", self._ack_wait + 1)
            with self.report.phase("ack"):
                for table in self.tables:
                    is_dead = table is self.dead_letters
                    keys = keys_of(range_keys(self.spark, table, self.source.stream, first, last,
                                              with_error=is_dead), seqs, with_error=is_dead)
                    # What this round wrote; what a table held already was only acked.
                    new_rows = self._ack(js, holds, keys, dead=is_dead) - len(held[is_dead])
                    if is_dead:
                        report.dead_letters += new_rows
                    else:
                        report.messages_written += new_rows
        finally:
            self._release_blocks(blocks)
        self._count_round(stats)
        return True

    def _count_round(self, stats: RoundStats) -> None:
        report = self.report
        report.rounds += 1
        # A pull is served the NAKed deliveries before anything new (nats-server getNextMsg).
        self._outstanding = max(self._outstanding - stats.n, 0)
        report.bytes += stats.bytes
        report.first_seq = min(x for x in (report.first_seq, stats.first) if x is not None)
        report.last_seq = max(x for x in (report.last_seq, stats.last) if x is not None)

    # --- the columnar round (js_etl.spark.columnar) ------------------------------------------
    def _commit_columnar(self, js: JetStreamSession, holds: _Holds, fetched: RoundOutput,
                         round_no: int) -> bool:
        """Commit the files as they are and ack, when the round holds each seq once and neither
        table holds any of them; else False, with nothing written. The same steps and checks
        as :meth:`_commit_spark` otherwise: dead letters appended
        (:meth:`_append_dead_letters`), the round's files committed in one transaction
        (:meth:`DeltaTarget.commit_files`), acks from what the tables hold for the round's
        seqs afterwards, read from their snapshots."""
        import pyarrow.compute as pc

        assert self.columnar is not None
        stream, directory, keys = self.source.stream, self.columnar.directory, fetched.keys
        with self.report.phase("write"):
            stats = RoundStats.of(keys)
            first, last = stats.first, stats.last
            if stats.distinct < stats.n:
                return False
            held = columnar.table_keys(directory, stream, first, last)
            if held is not None and pc.any(pc.is_in(held.column("seq"),
                                                    keys.column("seq"))).as_py():
                return False
            if range_keys(self.spark, self.dead_letters, stream, first, last) is not None:
                return False  # rare: Spark's path compares the dead letters it holds
            tag = CommitTag(self.config.job_id, self.run_id, round_no, self.ack_prefix, first,
                            last)
            self._check_files(fetched, stats)  # before anything is committed
            if stats.dead:
                holds.check()
                self.report.dead_letter_versions.append(self._append_dead_letters(fetched, tag))
            if stats.n > stats.dead:
                holds.check()
                self.report.delta_versions.append(
                    self.target.commit_files(self.spark, directory, list(fetched.files), tag))
        faults.kill_here("kill_after_commit")
        faults.stall_here("stall_before_ack", self._ack_wait + 1)
        with self.report.phase("ack"):
            rows = columnar.table_keys(directory, stream, first, last)
            if rows is not None and held is not None:  # others' rows in the range: not ours
                rows = rows.filter(pc.is_in(rows.column("seq"), keys.column("seq")))
            self.report.messages_written += self._ack(js, holds, rows if rows is not None
                                                      else no_keys())
            # No dead letter held the range before this round: all it holds now is ours, and
            # none when the round wrote none (the lease keeps other runs of the job out), so
            # that read is skipped (a table's read: a py4j path lookup and a log replay).
            dead = range_keys(self.spark, self.dead_letters, stream, first, last,
                              with_error=True) if stats.dead else None
            self.report.dead_letters += self._ack(js, holds, dead if dead is not None
                                                  else no_keys(with_error=True), dead=True)
        self._count_round(stats)
        return True

    def _append_dead_letters(self, fetched: RoundOutput, tag: CommitTag) -> int:
        """A columnar round's dead letters into their table: their files committed as they are
        where the plan wrote them into the table's directory (no Spark job: Spark's append was
        4 jobs, 1.1-1.3 s of a warm one-round run of 800 messages with 8 dead letters and 3.7 s
        of one in a new process, cProfile), else read and appended by Spark."""
        assert self.columnar is not None
        directory = self.columnar.dead_letter_directory
        if directory is None:
            return self.dead_letters.append(
                self.spark, self.decoder.dead_letters(self._read_dead_letters(fetched)), tag,
                partition_by=[], merge_schema=False)
        version = self.dead_letters.commit_files(self.spark, directory,
                                                 list(fetched.dead_letters), tag)
        self._dead_letters_committed = True  # commit_files returned: the snapshot names them
        return version

    def _as_spark_round(self, fetched: RoundOutput) -> DataFrame:
        """A columnar round as the Spark path's checkpoint rows: the good deliveries' keys (the
        rows themselves are in the files) and the dead letters."""
        import pyarrow as pa
        import pyarrow.compute as pc

        keys = fetched.keys
        good = keys.filter(pc.invert(keys.column("dead")))
        n = good.num_rows
        schema = round_arrow()
        given = {"seq": good.column("seq"), "consumer_seq": good.column("consumer_seq"),
                 "num_delivered": good.column("num_delivered"),
                 PAYLOAD_BYTES: good.column("bytes")}
        rows = pa.table([given.get(f.name, pa.nulls(n, f.type)) for f in schema], schema=schema)
        return self.spark.createDataFrame(rows, ROUND_DDL).unionByName(
            self._read_dead_letters(fetched))

    def _check_files(self, fetched: RoundOutput, stats: RoundStats) -> None:
        """Stop before anything is committed if the files and the keys disagree (it cannot
        happen: a task's files and its keys come together)."""
        for kind, files, expected in (("rows", fetched.files, stats.n - stats.dead),
                                      ("dead letters", fetched.dead_letters, stats.dead)):
            written = sum(f.rows for f in files)
            if written != expected:
                raise TerminalError(
                    f"the round's files hold {written} {kind}, its keys say {expected}: "
                    "nothing of this round is committed or acked")

    def _read_files(self, files: Iterable[WrittenFile], schema: StructType | None = None,
                    directory: str | None = None) -> DataFrame:
        """Files the round's tasks wrote, read by Spark (their paths relative to ``directory``,
        else the table's)."""
        assert self.columnar is not None
        # Spark reads a path as a glob pattern: a table directory named t[1] matched nothing.
        directory = re.sub(r"([\\\[\]{}*?])", r"\\\1", directory or self.columnar.directory)
        reader = self.spark.read if schema is None else self.spark.read.schema(schema)
        return reader.parquet(*[f"file://{directory}/{f.path}" for f in files])

    def _read_dead_letters(self, fetched: RoundOutput) -> DataFrame:
        """The round's dead letters as ROUND_DDL rows (the payload's bytes as decode.flag
        counts them)."""
        from pyspark.sql import functions as F

        assert self.columnar is not None
        if not fetched.dead_letters:
            return self.spark.createDataFrame([], ROUND_DDL)
        return self._read_files(fetched.dead_letters, columnar.dead_letter_schema(),
                                self.columnar.dead_letter_files
                                ).withColumn(PAYLOAD_BYTES, F.length("data"))

    def _good_rows(self, fetched: DataFrame, files: list[WrittenFile]) -> DataFrame:
        """The round's table rows: decoded from the checkpoint, or — columnar — read back from
        the files the tasks wrote, only the deliveries ``fetched`` still holds (after the dedupe
        and the anti-join of what the tables hold already)."""
        if not files:
            return self.decoder.rows(fetched)
        from pyspark.sql import functions as F

        keep = fetched.where(F.col("error").isNull()).select("seq", "consumer_seq")
        return self._read_files(files).join(keep, ["seq", "consumer_seq"], "left_semi")

    def _remove(self, files: Iterable[WrittenFile], directory: str | None = None) -> None:
        """Delete task files (their paths relative to ``directory``, else the table's)."""
        for f in files:
            assert self.columnar is not None
            try:
                os.remove(os.path.join(directory or self.columnar.directory, f.path))
            except FileNotFoundError:
                pass

    def _dedupe(self, fetched: DataFrame) -> tuple[DataFrame, set[int]]:
        """One row per seq, the latest delivery (highest consumer_seq), checkpointed so every
        later job sees the same copy."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        latest = Window.partitionBy("seq").orderBy(F.col("consumer_seq").desc())
        log.warning("a round fetched some messages twice; keeping the latest delivery of each")
        return self._checkpoint(fetched.withColumn("_js_etl_n", F.row_number().over(latest))
                                .where(F.col("_js_etl_n") == 1).drop("_js_etl_n"))

    def _ack(self, js: JetStreamSession, holds: _Holds, keys: pa.Table, *,
             dead: bool = False) -> int:
        """+ACK committed table rows; +TERM dead letters with their reason. Each block is
        confirmed applied, and sent only while this run still holds the lease and the lock."""
        import pyarrow.compute as pc

        def send(rows: pa.Table, body: bytes) -> None:
            delivered, seq, consumer_seq = (rows.column(c).combine_chunks()
                                            for c in ("num_delivered", "seq", "consumer_seq"))
            holds.check()
            js.run(js.acker.send(ack_block(self.ack_prefix, delivered, seq, consumer_seq, body)))

        if not dead:
            half = keys.num_rows // 2 if self.fault == "kill_mid_ack" else keys.num_rows
            send(keys.slice(0, half), ACK)
            faults.kill_here("kill_mid_ack")
            send(keys.slice(half), ACK)
            return keys.num_rows
        errors = pc.fill_null(keys.column("error"), "dead letter")
        for reason in pc.unique(errors).to_pylist():
            send(keys.filter(pc.equal(errors, reason)), term_body(f"js-etl dead letter: {reason}"))
        return keys.num_rows


def run_drain(spark: SparkSession, config: JobConfig, *, run_id: str | None = None,
              options: ConnectionOptions | None = None,
              progress: Progress | None = None,
              stop: threading.Event | None = None) -> RunReport:
    """Drain ``config.source`` into ``config.target`` on ``spark`` and return the report.

    >>> report = run_drain(spark, load_config("conf/example.yaml"))
    >>> report.messages_written, report.stopped_because
    (12000, 'drained')
    """
    return Drain(spark, config, options or config.nats.connection_options(),
                 run_id=run_id, progress=progress, stop=stop).run()
