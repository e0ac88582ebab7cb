"""The bounded drain: lease ▸ lock ▸ fence ▸ plan ▸ [fetch ▸ commit ▸ ack]* ▸ release ▸ report.

Exactly-once rests on these mechanisms, each holding whatever the timing:

* **A round's fetch runs exactly once** (each writer says how: :mod:`js_etl.drain.writers`), and
  ``spark.speculation`` is refused: two attempts of one fetch task would both pull.
* **Acks from the tables**: a round's acks are built from what the tables hold for its
  sequences, read back from their snapshots after the commit — never from the fetch. Dead
  letters get ``+TERM`` with their reason, table rows ``+ACK``.
* **Confirmed acks, NAKs and TERMs** before the next fetch (:mod:`js_etl.drain.acks`): no pull
  can be served a redelivery of something this run committed, or be hit by a late NAK.
* **One deadline per round**, an absolute time set by the driver
  (:class:`~js_etl.drain.fetch.FetchPlan`): a task that starts late pulls nothing after it.
  Every delivery of a round is received before ``deadline + pull_timeout`` ≤ round start + ⅔
  ack_wait, so no message of a round is redelivered within that round, given clocks within
  ack_wait/3 of each other. A round that fetched nothing while messages are pending doubles the
  next round's window, up to 16x; a second delivery inside a longer window is still caught by
  the next two mechanisms.
* **Dedupe by seq** of the round's rows, keeping the latest delivery, before anything is counted
  or written.
* **Never write a seq twice**: the round's sequences are checked against both tables; what a
  table already holds (its ack was lost) is acked, not written again.
* **Round numbers from Delta's application transaction**, checked after every commit.
* **The lease and the lock**: one run per consumer, whatever its table
  (:mod:`js_etl.durable.lease`), and per consumer and table (:mod:`js_etl.drain.lock`); both are
  checked before the fence's releases, every fetch, commit and ack block.
* **The fence** (:mod:`js_etl.drain.fence`) finishes what a dead run left before the first round.

A server-side ``max_deliver`` is refused (:func:`js_etl.durable.policy.drain_consumer_problems`):
the server drops a message after that many deliveries, and a run that dies after its fetch spends
a delivery without committing, so a crash could lose a message for good. js-etl parks poison
itself instead (``source.max_deliver``), in the dead-letter table, after its commit.

The measurements behind these mechanisms are in ``docs/design/``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from js_etl import faults
from js_etl.config import JobConfig
from js_etl.decode.spark import Decoder, with_partition_columns
from js_etl.delta.rules import schema_problem
from js_etl.delta.table import create_empty, job_tables, refuse_lossy_commits
from js_etl.drain.acks import Holds, RunAcks
from js_etl.drain.fence import fence
from js_etl.drain.fetch import FetchPlan
from js_etl.drain.lock import TableLock
from js_etl.drain.rounds import (
    RoundSize,
    budget_left,
    budget_spent,
    fetch_seconds,
    plan_round,
    why_nothing_fetched,
)
from js_etl.drain.writers import Commit, WriteContext, Writer, choose_writer
from js_etl.durable.cursor import refuse_marked
from js_etl.durable.lease import ConsumerLease
from js_etl.durable.pin import GroupPin
from js_etl.durable.policy import DEFAULT_ACK_WAIT, drainable_consumer
from js_etl.errors import ConfigError, TransientError
from js_etl.jetstream import (
    ConnectionOptions,
    ConsumerInfo,
    JetStreamSession,
    PriorityGroupRequest,
    PriorityPolicy,
    StreamInfo,
    ack_prefix,
)
from js_etl.report import LogProgress, Progress, RunReport, StopReason
from js_etl.schema import RAW_DDL
from js_etl.spark.failures import failure_reason, is_transient
from js_etl.spark.session import configure_s3a, core_setting, is_connect

if TYPE_CHECKING:
    from typing import Any

    from pyspark.sql import DataFrame, SparkSession

# Empty rounds in a row, each followed by a release of what its failed task attempts pulled,
# after which the run ends transiently rather than spend more deliveries of the same messages:
# one such round is a task that failed once (its messages come back in the next round); two in
# a row are tasks that keep failing after they pull (a store refusing every upload). Each
# costs a delivery of every message the tasks pulled, which source.max_deliver counts.
FAILED_PULLS = 2

log = logging.getLogger("js_etl.drain")

# How long a run rides out NATS not answering (leader elections of a clustered stream or
# consumer) before it ends with the transient exit code.
RECOVERY_SECONDS = 60.0


def refuse_speculation(spark: SparkSession) -> None:
    # As Spark reads a boolean (trimmed, any case: " TRUE" turns speculation on).
    if core_setting(spark, "spark.speculation", "false").strip().lower() == "true":
        raise ConfigError("spark.speculation=true runs a fetch task twice and both attempts "
                          "pull from the consumer: run the drain with "
                          "--conf spark.speculation=false")


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
        self.tables = job_tables(config)
        self.target, self.dead_letters = self.tables
        self.ack_prefix = ack_prefix(self.source.stream, self.source.consumer)
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.progress = progress or LogProgress(log)
        self.stop = stop or threading.Event()  # set (e.g. on SIGTERM): stop after this round
        self.fault = faults.armed()
        self.pin = GroupPin(self.source.stream, self.source.consumer, self.source.priority_group)
        self._ack_wait = DEFAULT_ACK_WAIT  # the consumer's, from the last round's plan
        # An overflow group's consumer serves other live clients too: their deliveries are
        # theirs to ack, not released between this run's rounds.
        self._shared = False
        self._window = 1  # how many times fetch_seconds the next round may pull for
        self._fetch_end = 0.0  # wall time after which no task of the last round pulls
        self._recovery_deadline: float | None = None  # see _recovering
        self.writer: Writer | None = None  # chosen before the first round
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
        configure_s3a(self.spark)
        refuse_lossy_commits(self.spark, self.tables)
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
                    acks = RunAcks(js, Holds(lease, lock), self.ack_prefix, self.fault)
                    try:
                        self._run(js, acks, info, started)
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
        first, empty, so that every run of the job, the first one too, locks in one place (and
        Delta does not refuse to create the table in a directory the lock made non-empty)."""
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

    def _run(self, js: JetStreamSession, acks: RunAcks, info: ConsumerInfo,
             started: float) -> None:
        report, run = self.report, self.config.run
        with self.report.phase("fence"):
            self._fence(js, info, acks)
        next_round = 0  # read from the tables before the first round: an empty run needs none
        retook_pin = False
        empty_rounds = 0
        failed_pulls = 0  # empty rounds in a row whose tasks left deliveries behind
        while True:
            stop = budget_spent(run, report, stopping=self.stop.is_set(),
                                elapsed=time.monotonic() - started)
            if stop:
                report.stopped_because = stop
                break
            with self.report.phase("plan"):
                info = self._consumer_info(js)
            refuse_marked(info)  # a query claimed it since: it would move it past this run
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
                # left (docs/design/failover.md). Released now, sound under the lease as the
                # fence's release is (docs/design/fence.md); a committed one comes back and is
                # found in the table and acked, never written twice. (On an overflow group's
                # consumer other clients' deliveries are theirs: released only after a round
                # that fetched nothing, as before.)
                report.released_at_end += acks.release(info)
                info = js.consumer_info(self.source.stream, self.source.consumer)
                # (On a shared consumer what is ack-pending may be other clients'.)
                failed_pulls = failed_pulls + 1 if empty_rounds and not self._shared else 0
                if failed_pulls >= FAILED_PULLS:
                    raise TransientError(
                        f"{failed_pulls} rounds in a row fetched nothing while their fetch tasks "
                        f"left {acks.released} deliveries behind: the tasks fail after they pull "
                        "(Spark retried them, and a retry finds the messages still delivered; "
                        "see the executors' log); nothing of them was acked, a later run takes "
                        "them up again")
            if not next_round:
                next_round = self._first_round()
            size = plan_round(self.config, info,
                              messages_left=budget_left(run.max_messages,
                                                        report.messages_written
                                                        + report.dead_letters),
                              bytes_left=budget_left(run.max_bytes, report.bytes),
                              released=acks.released,
                              columnar=self.writer is not None and self.writer.name == "columnar")
            acks.released = 0
            if size is None:
                raise TransientError(
                    f"consumer {self.source.stream}/{self.source.consumer} has all "
                    f"{info.config.max_ack_pending} ack-pending slots taken by deliveries this "
                    f"run did not make; they return after ack_wait "
                    f"({info.config.ack_wait or 0:g}s): retry then")
            if self.pin.pinned and self.pin.pin_id is None:
                # Only a delivery takes the pin (a pull answered only with a 409 does not), so
                # the first round pulls on one partition; later rounds share its pin id.
                size = replace(size, partitions=1)
            acks.holds.check()  # a run that lost the consumer pulls nothing more
            try:
                fetched = self._fetch(size, info, next_round)
            except Exception as e:
                if not is_transient(e):
                    raise
                self._wait_out_failed_fetch(js, e)
                continue  # the next round releases what the failed one left delivered
            faults.kill_here("kill_after_fetch")
            faults.hold_here("hold_after_fetch")
            try:
                done = self._commit_and_ack(acks, fetched, next_round)
            except BaseException:
                self._release_after_failure(js, acks)
                raise
            finally:
                assert self.writer is not None
                self.writer.discard(fetched)
            if self.pin.pinned and self.pin.changed(js, done) and not retook_pin:
                retook_pin = True  # our pin timed out between rounds: take it again, once
                continue
            if not done:
                empty_rounds += 1
                self._window = min(2 * self._window, 16)
                continue
            empty_rounds = failed_pulls = 0
            self._window = 1
            next_round += 1
            acks.holds.lease.record(pin_id=self.pin.pin_id)
            self.progress.round_done(report)
        with self.report.phase("release"):
            # Everything this run committed is acked (confirmed); whatever else it holds (a
            # failed task attempt's deliveries) goes back now rather than after ack_wait.
            info = js.consumer_info(self.source.stream, self.source.consumer)
            report.released_at_end += acks.release(info)
            info = js.consumer_info(self.source.stream, self.source.consumer)
        report.pending_after = info.num_pending
        report.ack_pending_after = info.num_ack_pending

    def _first_round(self) -> int:
        """Refuse tables js-etl cannot fence and ack from, before anything is fetched; choose the
        writer; the number of this run's first round."""
        for table in self.tables:
            table.check_usable(self.spark)
        if self.target.exists(self.spark):
            rows, partition_names = self._empty_rows()
            problem = schema_problem(str(self.target), self.target.shape(self.spark),
                                     rows.schema, partition_names,
                                     merge_schema=self.config.decode.merge_schema)
            if problem:
                raise ConfigError(problem)
        self.writer, self.report.writer_note = choose_writer(WriteContext(
            self.spark, self.config, self.target, self.dead_letters, self.decoder, self.run_id,
            self.ack_prefix, self.fault))
        self.report.writer = self.writer.name
        return 1 + max(table.job_round(self.spark, self.config.job_id)[0] for table in self.tables)

    def _fence(self, js: JetStreamSession, info: ConsumerInfo, acks: RunAcks) -> None:
        previous = acks.holds.lease.previous
        self.pin.take_over(js, info, previous.pin_id if previous else None)
        fenced = fence(self.spark, js, info, acks, self.tables, self.config.job_id, previous)
        self.report.reacked_at_start = fenced.reacked
        self.report.released_at_start = fenced.released

    def _release_after_failure(self, js: JetStreamSession, acks: RunAcks) -> None:
        """A round failed after its fetch: NAK what it holds now, so its messages come back at
        once rather than after ack_wait (a retry would otherwise find them still delivered). A
        committed one comes back and is found in the table and acked, never written twice.
        Best effort: the round's own error is the one to report."""
        try:
            info = js.consumer_info(self.source.stream, self.source.consumer)
            self.report.released_at_end += acks.release(info)
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
        log.warning("NATS or the object store did not answer (%s); retrying for up to %.0fs "
                    "more", failure_reason(error)[0][:300], self._recovery_deadline - now)

    def _wait_out_failed_fetch(self, js: JetStreamSession, error: BaseException) -> None:
        """After a round's fetch job failed on a NATS outage (a consumer leader lost mid-pull):
        wait until none of its tasks runs or can still pull (the round's deadline), and for the
        consumer to answer again. Nothing of the round was committed; what its tasks received
        stays delivered, and the next round releases it."""
        self._recovering(error)
        if is_connect(self.spark):  # no status tracker: wait out the round's last pull
            time.sleep(max(0.0, self._fetch_end - time.time()))
        else:
            tracker = self.spark.sparkContext.statusTracker()
            while tracker.getActiveJobsIds() and time.time() < self._fetch_end:
                time.sleep(0.2)
        self._consumer_info(js)

    # --- rounds -----------------------------------------------------------------------------
    def _fetch(self, size: RoundSize, info: ConsumerInfo, round_no: int) -> Any:
        """The round's fetch, run once by the writer."""
        assert self.writer is not None
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
                           if self.fault == "slow_task_start" else ack_wait + 1),
            fault_gate=faults.task_gate("hold_mid_fetch"))
        self._fetch_end = plan.deadline + plan.pull_timeout  # no task pulls after it
        with self.report.phase("fetch"):
            return self.writer.fetch(plan, size.partitions, round_no)

    def _priority_group(self) -> PriorityGroupRequest | None:
        group = self.source.priority_group
        return PriorityGroupRequest(group, self.source.min_pending, self.source.min_ack_pending,
                                    id=self.pin.pin_id) if group else None

    def _commit_and_ack(self, acks: RunAcks, fetched: Any, round_no: int) -> bool:
        """Write the round, then ack what the tables hold for its sequences. Returns False when
        the round fetched nothing."""
        assert self.writer is not None
        report = self.report
        with report.phase("write"):
            commit = self.writer.commit(fetched, round_no, acks.holds.check)
        if commit is None:
            return False
        self._count_commit(commit)
        faults.kill_here("kill_after_commit")
        faults.stall_here("stall_before_ack", self._ack_wait + 1)
        with report.phase("ack"):
            rows, dead_letters = self.writer.acks(commit)
            # What this round wrote; what a table held already was only acked.
            report.messages_written += acks.ack(rows) - commit.already_held[0]
            report.dead_letters += acks.ack(dead_letters, dead=True) - commit.already_held[1]
        self._count_round(acks, commit)
        return True

    def _count_commit(self, commit: Commit) -> None:
        report = self.report
        report.duplicates_dropped += commit.duplicates
        report.already_committed += sum(commit.already_held)
        if commit.dead_letter_version is not None:
            report.dead_letter_versions.append(commit.dead_letter_version)
        if commit.row_version is not None:
            report.delta_versions.append(commit.row_version)

    def _count_round(self, acks: RunAcks, commit: Commit) -> None:
        report, stats = self.report, commit.stats
        report.rounds += 1
        acks.fetched(stats.n)
        report.bytes += stats.bytes
        report.first_seq = min(x for x in (report.first_seq, stats.first) if x is not None)
        report.last_seq = max(x for x in (report.last_seq, stats.last) if x is not None)


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
