"""Randomized fault schedules against js-etl's exactly-once promise.

A :class:`Schedule` is drawn from ``random.Random(seed)``: the consumer's settings (short
``ack_wait``, ``max_ack_pending``, maybe a server-side ``max_deliver``), the drain's fetch shape
(1–12 partitions on ``local[2]``), column mapping on or off, poison payloads, and a few steps —
drain runs, each maybe broken (a ``JS_ETL_FAULT`` kill point, a SIGKILL at a random moment after
the run took its lock, a NATS restart mid-run, another writer committing mid-run), and between
runs a NATS restart, another writer's commits (maybe an OPTIMIZE) or more messages.

:func:`run_schedule` plays it against a real nats-server of its own and real ``js-etl drain``
processes (so SIGKILL is real), then runs clean drains until one reports ``drained`` and checks
with an independent reader (the ``deltalake`` package) that every published message is in the
table or in the dead-letter table exactly once, and that the consumer has nothing pending or
ack-pending. Whatever a run's fate, the check is the same: it never depends on where a run died.

    .venv/bin/python tests/support/schedules.py soak --schedules 30     # what `make soak` runs
    .venv/bin/python tests/support/schedules.py show 1234               # print one seed's schedule
    JS_ETL_SCHEDULE_SEED=1234 .venv/bin/python -m pytest \
        tests/drain/test_fault_schedules.py                          # replay

deltalake runs in a child process (``delta-read`` / ``delta-write`` below): its process can
abort at interpreter exit after a read (rc 134, see reference §12), which must not take pytest
or the soak runner down with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BIN = Path(sys.executable).parent
if str(REPO) not in sys.path:  # run as a script: import the project from this worktree
    sys.path.insert(0, str(REPO))

STREAM, CONSUMER, SUBJECT = "SCHED", "etl", "sched.e"
OTHER_STREAM = "OTHER"  # the other writer's rows: same table, another stream name
SCHEMA = "id BIGINT"
FAULT_POINTS = ("kill_after_fetch", "kill_after_commit", "kill_mid_ack")
POISON = (b"{not json", b"\xff\xfe{\"id\": 1}")  # malformed JSON; not UTF-8
COLUMN_MAPPING = "spark.conf.spark.databricks.delta.properties.defaults.columnMapping.mode=name"
SPARK_CHATTER = re.compile(r" WARN |Setting default log level|setLogLevel|log4j2-defaults|"
                           r"incubator modules")
# A drain that writes nothing (no round line, no report) for this long is a hang (reported, then
# killed). Progress, not total time: a loaded machine makes a long drain slower, not hung (the
# soak once killed a drain mid-way at a 300 s wall-clock limit, on a box at load 11).
DRAIN_STALL = 300.0
FINAL_DRAINS = 2  # clean drains allowed to reach "drained" after the schedule
SETTLE_SECONDS = 10.0  # for the server to apply the last acks before the consumer is judged


# --------------------------------------------------------------------------------------------
# Drawing a schedule
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Drain:
    """A ``js-etl drain`` run, maybe broken: ``disruption`` is one of

    * ``none``;
    * ``fault:<point>`` — ``JS_ETL_FAULT=<point>``: the driver SIGKILLs itself there;
    * ``sigkill`` — SIGKILL of the driver ``delay`` seconds after it took the lock;
    * ``nats_restart`` — the NATS server restarts ``delay`` seconds after the lock;
    * ``foreign_commits`` — another writer commits ``commits`` times, ``delay`` s after the lock.
    """

    disruption: str = "none"
    delay: float = 0.0
    commits: int = 0
    max_messages: int | None = None  # run.max_messages: a budget that leaves a backlog

    def describe(self) -> str:
        name = "drain" + (f" (run.max_messages={self.max_messages})" if self.max_messages else "")
        if self.disruption == "none":
            return name
        if self.disruption.startswith("fault:"):
            return f"{name}, JS_ETL_FAULT={self.disruption[6:]}"
        if self.disruption == "foreign_commits":
            return f"{name}, another writer commits {self.commits}x {self.delay:g}s after the lock"
        return f"{name}, {self.disruption} {self.delay:g}s after the lock"


@dataclass(frozen=True)
class RestartNats:
    def describe(self) -> str:
        return "restart nats-server (SIGTERM, same port and store)"


@dataclass(frozen=True)
class ForeignCommits:
    commits: int
    optimize: bool = False

    def describe(self) -> str:
        return f"another writer: {self.commits} commits" + (" + OPTIMIZE" if self.optimize else "")


@dataclass(frozen=True)
class Publish:
    messages: int

    def describe(self) -> str:
        return f"publish {self.messages} more messages"


Step = Drain | RestartNats | ForeignCommits | Publish


@dataclass(frozen=True)
class Schedule:
    seed: int
    messages: int  # published before the first step
    poison: tuple[int, ...]  # stream sequences whose payload is undecodable
    ack_wait: float
    pull_timeout: float  # fetch.pull_timeout, at most ack_wait / 3 (the product's minimum)
    partitions: int
    batch: int
    max_ack_pending: int
    server_max_deliver: int | None  # a consumer created with it: the first run must refuse it
    column_mapping: bool
    steps: tuple[Step, ...]

    @classmethod
    def draw(cls, seed: int) -> Schedule:
        rng = random.Random(seed)
        ack_wait = rng.choice([2.0, 2.5, 3.0, 4.0, 5.0, 6.0])
        pull_timeout = max(0.1, math.floor(ack_wait / rng.uniform(3.2, 6.0) * 100) / 100)
        column_mapping = rng.random() < 0.5
        messages = rng.randint(200, 3000)
        steps: list[Step] = []
        for i in range(rng.choice([1, 2, 2, 3])):
            if i > 0:  # between runs
                if rng.random() < 0.25:
                    steps.append(RestartNats())
                if rng.random() < 0.4:
                    # OPTIMIZE through deltalake, which cannot rewrite column-mapped tables yet.
                    steps.append(ForeignCommits(rng.randint(0, 120),
                                                optimize=not column_mapping
                                                and rng.random() < 0.5))
                if rng.random() < 0.5:
                    steps.append(Publish(rng.randint(1, 1000)))
            kind = rng.choice(["none", "fault", "fault", "sigkill", "sigkill", "nats_restart",
                               "foreign_commits"])
            budget = rng.randint(50, messages // 2) if rng.random() < 0.4 else None
            if kind == "fault":
                steps.append(Drain(f"fault:{rng.choice(FAULT_POINTS)}", max_messages=budget))
            elif kind == "none":
                steps.append(Drain(max_messages=budget))
            else:
                steps.append(Drain(kind, delay=round(rng.uniform(0.0, 8.0), 1),
                                   commits=rng.randint(1, 120) if kind == "foreign_commits" else 0,
                                   max_messages=budget))
        if rng.random() < 0.3:
            steps.append(ForeignCommits(rng.randint(0, 120),
                                        optimize=not column_mapping and rng.random() < 0.5))
        total = messages + sum(s.messages for s in steps if isinstance(s, Publish))
        rate = rng.choice([0.0, 0.002, 0.02, 0.1])
        poison = tuple(sorted(rng.sample(range(1, total + 1), int(total * rate))))
        return cls(
            seed=seed, messages=messages, poison=poison, ack_wait=ack_wait,
            pull_timeout=pull_timeout, partitions=rng.randint(1, 12),
            batch=rng.choice([20, 100, 500, 1000, 4000]),
            max_ack_pending=rng.choice([100, 500, 1000, 10_000]),
            server_max_deliver=rng.randint(2, 5) if rng.random() < 0.2 else None,
            column_mapping=column_mapping, steps=tuple(steps))

    @property
    def published(self) -> int:
        return self.messages + sum(s.messages for s in self.steps if isinstance(s, Publish))

    def describe(self) -> str:
        lines = [
            f"schedule seed={self.seed}: {self.published} messages ({len(self.poison)} poison), "
            f"consumer ack_wait={self.ack_wait:g}s max_ack_pending={self.max_ack_pending} "
            f"max_deliver={self.server_max_deliver or -1}; fetch.partitions={self.partitions} "
            f"fetch.batch={self.batch} fetch.pull_timeout={self.pull_timeout:g}; column mapping "
            f"{'on' if self.column_mapping else 'off'}",
            f"  publish {self.messages} messages",
            *(f"  {step.describe()}" for step in self.steps),
            f"  clean drains until one reports drained (at most {FINAL_DRAINS})",
        ]
        return "\n".join(lines)

    def conditions(self) -> dict[str, Any]:
        """The drawn conditions as flat JSON, for grouping soak results."""
        out = asdict(self)
        out["poison"] = len(self.poison)
        out["steps"] = [s.describe() for s in self.steps]
        return out


def payload(seq: int, poison: set[int]) -> bytes:
    if seq in poison:
        return POISON[seq % len(POISON)]
    return json.dumps({"id": seq}).encode()  # the payload names its seq: content is checked too


# --------------------------------------------------------------------------------------------
# Running it
# --------------------------------------------------------------------------------------------

@dataclass
class RunRecord:
    """One ``js-etl drain`` process and what became of it."""

    label: str
    expected: frozenset[int]  # acceptable exit codes (-9: SIGKILLed)
    rc: int | None = None
    seconds: float = 0.0
    report: dict[str, Any] | None = None
    stderr_tail: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    run_id: str | None = None  # from its lock file (or its report)

    def describe(self) -> str:
        verdict = "" if self.rc in self.expected else f"  <-- expected {sorted(self.expected)}"
        lines = [f"{self.label}: run {self.run_id or '?'}, exit {self.rc} after "
                 f"{self.seconds:.1f}s{verdict}"]
        lines += [f"    note: {n}" for n in self.notes]
        if self.report is not None:
            lines.append(f"    report: {json.dumps(self.report, separators=(',', ':'))}")
        lines += [f"    stderr: {line}" for line in self.stderr_tail]
        return "\n".join(lines)


@dataclass
class Outcome:
    schedule: Schedule
    runs: list[RunRecord] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (kind, detail)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, kind: str, detail: str) -> None:
        self.problems.append((kind, detail))

    def kinds(self) -> list[str]:
        return sorted({k for k, _ in self.problems})

    def report(self) -> str:
        head = "PASSED" if self.ok else f"FAILED ({', '.join(self.kinds())})"
        lines = [f"fault schedule seed={self.schedule.seed} {head} in {self.seconds:.0f}s",
                 f"replay: JS_ETL_SCHEDULE_SEED={self.schedule.seed} .venv/bin/python -m pytest "
                 "tests/drain/test_fault_schedules.py", self.schedule.describe(), "runs:"]
        lines += [run.describe() for run in self.runs]
        lines += [f"event: {e}" for e in self.events]
        lines += [f"PROBLEM {kind}: {detail}" for kind, detail in self.problems]
        return "\n".join(lines)


class _Player:
    """Plays one schedule in ``workdir``; owns the nats-server and every process it starts.
    The tables are in ``workdir``, or under ``s3_root`` (an s3:// URL, reached with the
    ``store`` variables, which every drain and deltalake child gets)."""

    def __init__(self, schedule: Schedule, workdir: Path, s3_root: str | None = None,
                 store: dict[str, str] | None = None) -> None:
        from js_etl.demo.server import LocalNatsServer

        self.s = schedule
        self.workdir = workdir
        self.table = f"{s3_root}/table" if s3_root else str(workdir / "table")
        self.dead_letters = f"{self.table}_dead_letters"
        self.store = store or {}
        self.lock = f"{self.table}/_js_etl/{CONSUMER}.lock"
        self.server = LocalNatsServer(workdir / "nats")
        self.out = Outcome(schedule)
        self.published = 0
        self.poison = set(schedule.poison)
        self.drains = 0
        self.drained = False  # a clean drain reported "drained"

    # --- NATS -------------------------------------------------------------------------------
    def session(self) -> Any:
        """A fresh connection per use: the server restarts under us."""
        from js_etl.jetstream import ConnectionOptions, JetStreamSession

        return JetStreamSession(ConnectionOptions(servers=(self.server.url,), connect_timeout=5,
                                                  name="fault-schedules"))

    def create_stream_and_consumer(self) -> None:
        from js_etl.jetstream import ConsumerConfig

        with self.session() as js:
            js.run(js.admin.add_stream(STREAM, ["sched.>"]))
            js.run(js.admin.create_consumer(STREAM, ConsumerConfig(
                durable_name=CONSUMER, ack_wait=self.s.ack_wait,
                max_ack_pending=self.s.max_ack_pending,
                max_deliver=self.s.server_max_deliver)))

    def publish(self, count: int) -> None:
        from js_etl.demo.publish import publish, wait_for_messages

        first = self.published + 1
        messages = [(SUBJECT, payload(seq, self.poison)) for seq in range(first, first + count)]
        with self.session() as js:
            js.run(publish(js.conn, messages))
            js.run(wait_for_messages(js.conn, STREAM, first + count - 1))
            state = js.stream_info(STREAM).state
        if (state.last_seq, state.messages) != (first + count - 1, first + count - 1):
            raise AssertionError(f"harness: stream holds seqs {state.first_seq}..{state.last_seq} "
                                 f"({state.messages} messages), expected 1..{first + count - 1}")
        self.published += count

    def consumer_info(self) -> Any:
        with self.session() as js:
            return js.consumer_info(STREAM, CONSUMER)

    def allow_redelivery_for_ever(self) -> None:
        """``nats consumer edit --max-deliver=-1``: a CONSUMER.CREATE update, same config."""
        with self.session() as js:
            info = js.consumer_info(STREAM, CONSUMER)
            js.run(js.admin.create_consumer(STREAM, replace(info.config, max_deliver=-1),
                                            action="update"))
            after = js.consumer_info(STREAM, CONSUMER).config.max_deliver
        self.out.events.append(f"consumer edited: max_deliver {info.config.max_deliver} -> "
                               f"{after}")

    # --- the other writer -------------------------------------------------------------------
    def foreign_commits(self, commits: int, optimize: bool) -> str:
        if not self.is_table(self.table):
            return f"another writer: skipped {commits} commits (no table yet)"
        if commits == 0 and not optimize:
            return "another writer: 0 commits"
        answer = delta_child("delta-write", self.table, str(commits),
                             "optimize" if optimize else "-", env=self.store)
        return (f"another writer: {commits} commits" + (" + OPTIMIZE" if optimize else "")
                + f", table now at version {answer['version']}")

    # --- drains -----------------------------------------------------------------------------
    def drain(self, step: Drain, label: str, expected: set[int]) -> RunRecord:
        self.drains += 1
        record = RunRecord(label, frozenset(expected))
        marker = uuid.uuid4().hex
        env = {**os.environ, "TZ": "UTC", "JS_ETL_TEST_MARKER": marker,
               "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **self.store}
        env.pop("JS_ETL_FAULT", None)
        if step.disruption.startswith("fault:"):
            env["JS_ETL_FAULT"] = step.disruption[6:]
        settings = [f"nats.servers={self.server.url}", f"source.stream={STREAM}",
                    f"source.consumer={CONSUMER}", f"target.path={self.table}",
                    "decode.format=json", f"decode.schema={SCHEMA}", "spark.master=local[2]",
                    f"fetch.partitions={self.s.partitions}", f"fetch.batch={self.s.batch}",
                    f"fetch.pull_timeout={self.s.pull_timeout:g}"]
        if self.s.column_mapping:
            settings.append(COLUMN_MAPPING)
        if step.max_messages:
            settings.append(f"run.max_messages={step.max_messages}")
        args = [str(BIN / "js-etl"), "drain"]
        for item in settings:
            args += ["--set", item]
        logs = self.workdir / f"run{self.drains}"
        lock_before = self.read_lock()
        started = time.monotonic()
        with open(f"{logs}.out", "w") as stdout, open(f"{logs}.err", "w") as stderr:
            proc = subprocess.Popen(args, env=env, cwd=REPO, stdout=stdout, stderr=stderr,
                                    stdin=subprocess.DEVNULL, text=True)
        watcher = _LockWatcher(proc, self.read_lock, lock_before)
        watcher.start()
        action: Any = None
        if step.disruption == "sigkill":
            action = lambda: proc.send_signal(signal.SIGKILL)  # noqa: E731  (no-op once reaped)
        elif step.disruption == "nats_restart":
            action = self.server.restart
        elif step.disruption == "foreign_commits":
            def action() -> str:  # once the run's first commit created the table
                while not self.is_table(self.table) and proc.poll() is None:
                    time.sleep(0.05)
                return self.foreign_commits(step.commits, False)
        disruptor = None
        if action is not None:
            disruptor = threading.Thread(target=watcher.act_after_lock,
                                         args=(step.delay, action, step.disruption, record),
                                         daemon=True)
            disruptor.start()
        try:
            record.rc = _wait_while_writing(proc, (Path(f"{logs}.out"), Path(f"{logs}.err")),
                                            DRAIN_STALL)
            if record.rc is None:
                proc.kill()
                record.rc = proc.wait()
                self.out.problem("hung", f"{label} wrote nothing for {DRAIN_STALL:g}s: killed")
        except BaseException:  # interrupted (Ctrl-C): leave no drain, JVM or worker behind
            proc.kill()
            proc.wait()
            _kill_leftovers(marker, wait=5)
            raise
        record.seconds = time.monotonic() - started
        watcher.stop()
        if disruptor is not None:
            disruptor.join()
        if watcher.error:
            self.out.problem("harness", f"{label}: {watcher.error}")
        if step.disruption.startswith("fault:") and record.rc == 0:
            record.notes.append(f"fault point {step.disruption[6:]} not reached")
        stdout_text = Path(f"{logs}.out").read_text(errors="replace").strip().splitlines()
        stderr_text = Path(f"{logs}.err").read_text(errors="replace").strip().splitlines()
        record.report = _last_json(stdout_text)
        record.run_id = (record.report or {}).get("run_id") or watcher.run_id
        record.stderr_tail = [line[:400] for line in stderr_text
                              if line.strip() and not SPARK_CHATTER.search(line)][-3:]
        if (record.rc == 0 and record.report and record.report.get("rounds")
                and not watcher.saw_lock):
            self.out.problem("harness", f"{label} ran {record.report['rounds']} rounds but its "
                             f"lock {self.lock} never appeared: mid-run faults cannot be timed")
        left = _kill_leftovers(marker)
        if left:
            self.out.problem("processes left", f"{label}: pids {left} (of a run that ended "
                             f"with {record.rc}) still alive 30s later; killed")
        if record.rc not in expected:
            self.out.problem("exit code", f"{label} exited {record.rc}, expected "
                             f"{sorted(expected)}: {(record.stderr_tail or [''])[-1][:300]}")
        self.out.runs.append(record)
        return record

    # --- the whole schedule -----------------------------------------------------------------
    def play(self) -> None:
        self.create_stream_and_consumer()
        self.publish(self.s.messages)
        probe_pending = self.s.server_max_deliver is not None
        for n, step in enumerate(self.s.steps, 1):
            if isinstance(step, RestartNats):
                self.server.restart()
                self.out.events.append(f"step {n}: nats-server restarted")
            elif isinstance(step, ForeignCommits):
                self.out.events.append(f"step {n}: "
                                       + self.foreign_commits(step.commits, step.optimize))
            elif isinstance(step, Publish):
                self.publish(step.messages)
                self.out.events.append(f"step {n}: published {step.messages}, stream now "
                                       f"1..{self.published}")
            elif probe_pending:
                probe_pending = False
                self.probe_max_deliver(step, n)
            else:
                self.drain(step, f"step {n}: {step.describe()}", _expected(step))
        for i in range(1, FINAL_DRAINS + 1):
            record = self.drain(Drain(), f"clean drain {i}", {0})
            if record.rc == 0 and (record.report or {}).get("stopped_because") == "drained":
                self.drained = True
                return
            if record.rc not in (0, 75):
                break  # not a transient failure: another clean drain would only repeat it
        self.out.problem("never drained", f"no clean drain (of at most {FINAL_DRAINS}, retried "
                         "only after exit 0 or 75) reported stopped_because=drained")

    def probe_max_deliver(self, step: Drain, n: int) -> None:
        """With a server-side max_deliver a crash can make the server drop messages: the run
        must refuse the consumer (exit 2) before fetching anything."""
        before = self.consumer_info().delivered.stream_seq
        record = self.drain(step, f"step {n}: {step.describe()} [consumer max_deliver="
                            f"{self.s.server_max_deliver}: must refuse]", {2})
        after = self.consumer_info().delivered.stream_seq
        if after != before:
            self.out.problem("fetched despite max_deliver",
                             f"run on a consumer with max_deliver={self.s.server_max_deliver} "
                             f"(exit {record.rc}) moved delivered.stream_seq {before} -> {after}")
        self.allow_redelivery_for_ever()

    # --- the check --------------------------------------------------------------------------
    def check(self) -> None:
        table = (read_rows(self.table, ("seq", "id"), self.store)
                 if self.is_table(self.table) else [])
        dead = (read_rows(self.dead_letters, ("seq", "error"), self.store)
                if self.is_table(self.dead_letters) else [])
        info = self.settled_consumer()
        for kind, detail in diff(self.published, self.poison, table, dead,
                                 (info.num_pending, info.num_ack_pending)):
            self.out.problem(kind, detail)
        duplicated = sorted(s for s, c in Counter(r[0] for r in table).items() if c > 1)
        if duplicated:
            self.out.events.append(self.explain_duplicates(duplicated))

    def explain_duplicates(self, duplicated: list[int]) -> str:
        """Which runs wrote the duplicated rows (live rows only), and a few seqs in detail."""
        if self.table.startswith("s3://"):
            return "duplicated seqs (their commits are traced for local tables only): " + \
                _ranges(duplicated)
        holders = rows_by_commit(Path(self.table), set(duplicated))
        names = {r.run_id: r.label for r in self.out.runs if r.run_id}
        per_run = Counter(names.get(h.run, f"run {h.run}") if h.run else h.commit
                          for hs in holders.values() for h in hs if not h.compacted)
        lines = ["live rows of the duplicated seqs, by the commit's run (or writer): "
                 + "; ".join(f"{label}: {n}" for label, n in per_run.most_common())]
        for seq in duplicated[:8]:
            lines.append(f"  seq {seq}: " + " | ".join(
                f"v{h.version} {h.commit} (delivery {h.delivery}, consumer seq "
                f"{h.consumer_seq}{', file since compacted' if h.compacted else ''})"
                for h in holders.get(seq, [])))
        return "\n".join(lines)

    # --- the tables, wherever they are ------------------------------------------------------
    def files(self, location: str) -> Any:
        from js_etl.delta.store import TableFiles

        return TableFiles(location, self.store or None)

    def is_table(self, location: str) -> bool:
        """A Delta table with at least one commit (Spark creates ``_delta_log`` before its
        first commit file, and a run killed in between leaves it empty)."""
        return any(name.endswith(".json") for name in self.files(location).names("_delta_log"))

    def read_lock(self) -> bytes | None:
        return self.files(self.table).read(f"_js_etl/{CONSUMER}.lock")

    def settled_consumer(self) -> Any:
        """Consumer info once pending and ack-pending are 0, or as it is after SETTLE_SECONDS
        (the server applies acks asynchronously: wait for the state, bounded). No wait when no
        clean drain finished: nothing is settling then."""
        deadline = time.monotonic() + (SETTLE_SECONDS if self.drained else 0)
        info = self.consumer_info()
        while (info.num_pending or info.num_ack_pending) and time.monotonic() < deadline:
            time.sleep(0.1)
            info = self.consumer_info()
        return info


def _expected(step: Drain) -> set[int]:
    if step.disruption.startswith("fault:") or step.disruption == "sigkill":
        return {-9, 0}  # 0: it ended before the kill point / moment
    if step.disruption == "nats_restart":
        return {0, 75}  # a transient failure is a fair answer to a restart mid-run
    return {0}


class _LockWatcher:
    """Notices when a drain process took the table lock: the lock file appears with content
    other than what it held before the run (a SIGKILLed run leaves its lock behind)."""

    def __init__(self, proc: subprocess.Popen[str], read_lock: Any, before: bytes | None
                 ) -> None:
        self.proc, self.read_lock, self.before = proc, read_lock, before
        self.saw_lock = False
        self.run_id: str | None = None  # the lock holder's run id, when the lock says it
        self.error = ""
        self._stop = threading.Event()
        self._taken = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.is_set() and self.proc.poll() is None:
            content = self.read_lock()
            if content and content != self.before:
                self.saw_lock = True
                try:
                    self.run_id = str(json.loads(content)["run_id"])
                except (ValueError, KeyError, TypeError):
                    pass  # another lock format: the run id comes from the report then
                self._taken.set()
                return
            time.sleep(0.02)
        self._stop.set()

    def act_after_lock(self, delay: float, action: Any, what: str, record: RunRecord) -> None:
        """Wait for the lock (or the end of the run), then ``delay`` s — the random moment of the
        fault — then act if the run is still alive."""
        while not self._taken.wait(0.05):
            if self._stop.is_set() or self.proc.poll() is not None:
                record.notes.append(f"{what} not applied: the run ended before taking the lock")
                return
        locked = time.monotonic()
        if self._stop.wait(delay) or self.proc.poll() is not None:
            record.notes.append(f"{what} not applied: the run ended within {delay:g}s of "
                                "taking the lock")
            return
        at = time.monotonic() - locked
        try:
            result = action()
        except Exception as e:  # the harness must report, not die in a thread
            self.error = f"{what} failed: {type(e).__name__}: {e}"
            return
        record.notes.append(f"{what} applied {at:.1f}s after the lock"
                            + (f" ({result})" if isinstance(result, str) else ""))


def run_schedule(schedule: Schedule, workdir: Path, s3_root: str | None = None,
                 store: dict[str, str] | None = None) -> Outcome:
    """Play ``schedule`` in ``workdir`` (empty or new) and check the guarantee; the tables under
    ``s3_root`` (an empty s3:// prefix) where given, reached with the ``store`` variables."""
    workdir.mkdir(parents=True, exist_ok=True)
    player = _Player(schedule, workdir, s3_root, store)
    started = time.monotonic()
    player.server.start()
    try:
        player.play()
        player.check()
    except Exception as e:  # a harness error is reported with everything gathered so far
        import traceback

        player.out.problem("harness", "".join(traceback.format_exception(e))[-3000:])
    finally:
        player.server.stop()
        player.out.seconds = time.monotonic() - started
    return player.out


# --------------------------------------------------------------------------------------------
# Checking
# --------------------------------------------------------------------------------------------

def diff(published: int, poison: set[int], table: list[tuple[int, Any]],
         dead: list[tuple[int, Any]], consumer: tuple[int, int]) -> list[tuple[str, str]]:
    """Every way the final state breaks exactly-once, as (kind, detail).

    ``table``: (seq, id) of our stream's rows; ``dead``: (seq, error) of our dead letters;
    ``consumer``: (num_pending, num_ack_pending).
    """
    problems = []
    good = set(range(1, published + 1)) - poison
    rows, dead_rows = Counter(s for s, _ in table), Counter(s for s, _ in dead)
    missing = sorted((good | poison) - set(rows) - set(dead_rows))
    held = sum(consumer)  # what the consumer could still deliver
    if len(missing) > held:
        problems.append(("loss", f"{len(missing)} published seqs in neither table, only {held} "
                         f"still pending or ack-pending: {_ranges(missing)}"))
    elif missing:
        problems.append(("not landed", f"{len(missing)} published seqs in neither table, still "
                         f"pending or ack-pending on the consumer: {_ranges(missing)}"))
    twice = {s: c for s, c in sorted(rows.items()) if c > 1}
    if twice:
        problems.append(("duplicates", f"{len(twice)} seqs in the table more than once "
                         f"({sum(twice.values()) - len(twice)} extra rows): {_counts(twice)}"))
    twice_dead = {s: c for s, c in sorted(dead_rows.items()) if c > 1}
    if twice_dead:
        problems.append(("duplicate dead letters", f"{len(twice_dead)} seqs dead-lettered more "
                         f"than once: {_counts(twice_dead)}"))
    both = sorted(set(rows) & set(dead_rows))
    if both:
        problems.append(("in both tables", f"{len(both)} seqs: {_ranges(both)}"))
    parked = sorted((set(dead_rows) & good) - set(rows))
    if parked:
        reasons = Counter(str(e) for s, e in dead if s in set(parked))
        problems.append(("good message dead-lettered", f"{len(parked)} seqs {_ranges(parked)}; "
                         f"reasons {dict(reasons.most_common(3))}"))
    poison_rows = sorted(set(rows) & poison)
    if poison_rows:
        problems.append(("poison in table", f"{len(poison_rows)} seqs {_ranges(poison_rows)}"))
    unknown = sorted((set(rows) | set(dead_rows)) - good - poison)
    if unknown:
        problems.append(("never published", f"{len(unknown)} seqs {_ranges(unknown)}"))
    wrong = sorted({s for s, i in table if s in good and i != s})
    if wrong:
        problems.append(("wrong payload", f"{len(wrong)} rows whose id is not their seq: "
                         f"{_ranges(wrong)}"))
    if consumer != (0, 0):
        problems.append(("consumer not clean", f"num_pending={consumer[0]} "
                         f"num_ack_pending={consumer[1]} at the end"))
    return problems


def _ranges(seqs: list[int], limit: int = 12) -> str:
    spans: list[list[int]] = []
    for s in seqs:
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:limit])
    return text + (f", ... ({len(spans) - limit} more spans)" if len(spans) > limit else "")


def _counts(counts: dict[int, int], limit: int = 15) -> str:
    items = list(counts.items())
    text = ", ".join(f"{s}x{c}" for s, c in items[:limit])
    return text + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


def read_rows(location: str, columns: tuple[str, str], store: dict[str, str] | None = None
              ) -> list[tuple[int, Any]]:
    """(seq, column) of our stream's rows, read by deltalake (DataFusion SQL: deltalake's
    pyarrow reader returns nulls on column-mapped tables, measured with 1.6.6)."""
    answer = delta_child("delta-read", location, *columns, env=store)
    return [tuple(row) for row in answer["rows"]]  # type: ignore[misc]


@dataclass(frozen=True)
class Holder:
    """One row of a seq and the commit that added it."""

    version: int
    commit: str  # "WRITE run <id> round <n>", "OPTIMIZE delta-rs...", ...
    run: str | None  # js-etl's run id from the commit's userMetadata
    delivery: int
    consumer_seq: int
    compacted: bool  # its file was removed since (OPTIMIZE rewrote it)


def rows_by_commit(path: Path, seqs: set[int]) -> dict[int, list[Holder]]:
    """Which commits added a row of ``seqs`` (our stream) to the table, live or since compacted:
    the Delta log replayed by hand, its files read with pyarrow (physical column names)."""
    import pyarrow.parquet as pq

    added: dict[str, int] = {}  # every file ever added -> its version
    removed: set[str] = set()
    commits: dict[int, tuple[str, str | None]] = {}
    physical: dict[str, str] = {}
    for log in sorted((path / "_delta_log").glob("*.json")):
        version = int(log.stem)
        for line in log.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                added[action["add"]["path"]] = version
            elif "remove" in action:
                removed.add(action["remove"]["path"])
            elif "metaData" in action:
                schema = json.loads(action["metaData"]["schemaString"])
                physical = {f["name"]: f.get("metadata", {}).get(
                    "delta.columnMapping.physicalName", f["name"]) for f in schema["fields"]}
            elif "commitInfo" in action:
                info = action["commitInfo"]
                meta = str(info.get("userMetadata") or "")
                tag = json.loads(meta).get("js_etl", {}) if meta.startswith("{") else {}
                label = (f"run {tag.get('run')} round {tag.get('round')}" if tag
                         else str(info.get("engineInfo", ""))[:30])
                commits[version] = (f"{info.get('operation')} {label}", tag.get("run"))
    holders: dict[int, list[Holder]] = {}
    names = [physical.get(c, c) for c in ("stream", "seq", "num_delivered", "consumer_seq")]
    for file, version in sorted(added.items(), key=lambda item: item[1]):
        commit, run = commits.get(version, ("?", None))
        for row in pq.read_table(path / unquote(file), columns=names).to_pylist():
            stream, seq, delivered, cseq = (row[n] for n in names)
            if stream == STREAM and seq in seqs:
                holders.setdefault(seq, []).append(
                    Holder(version, commit, run, delivered, cseq, file in removed))
    return holders


# --------------------------------------------------------------------------------------------
# deltalake in a child process
# --------------------------------------------------------------------------------------------

def delta_child(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python schedules.py <args>`` (with ``env`` added to this process's environment)
    and return its JSON answer. Tolerates rc 134 (the abort of deltalake's process at exit)
    only once the answer is complete."""
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    lines = proc.stdout.strip().splitlines()
    answer = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    if proc.returncode not in (0, 134) or answer is None or not answer.get("complete"):
        raise RuntimeError(f"deltalake child {args} failed with {proc.returncode}: "
                           f"{proc.stderr[-1500:]}")
    return answer


def _delta_read(path: str, *columns: str) -> dict[str, Any]:
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    sql = (f"SELECT {', '.join(columns)} FROM t WHERE stream = '{STREAM}'")
    table = pa.table(QueryBuilder().register("t", DeltaTable(path)).execute(sql).read_all())
    return {"rows": list(zip(*(table.column(c).to_pylist() for c in columns), strict=True))}


def _delta_write(path: str, commits: str, optimize: str) -> dict[str, Any]:
    """Another writer: ``commits`` appends of a few rows of another stream (same schema)."""
    import datetime as dt

    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    schema = pa.schema(DeltaTable(path).schema().to_arrow())
    schema = pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema])  # no field ids
    now = dt.datetime.now(dt.UTC)
    for i in range(int(commits)):
        n = 1 + i % 5
        columns = {}
        for f in schema:
            if f.name == "stream":
                columns[f.name] = [OTHER_STREAM] * n
            elif pa.types.is_integer(f.type):
                columns[f.name] = list(range(1, n + 1))  # the same seqs as ours, another stream
            elif pa.types.is_string(f.type):
                columns[f.name] = ["other.e"] * n
            elif pa.types.is_timestamp(f.type):
                columns[f.name] = [now] * n
            else:
                columns[f.name] = [None] * n
        write_deltalake(path, pa.table(columns, schema=schema), mode="append")
    if optimize == "optimize":
        DeltaTable(path).optimize.compact()
    return {"version": DeltaTable(path).version()}


# --------------------------------------------------------------------------------------------
# The soak runner
# --------------------------------------------------------------------------------------------

def soak(count: int, seeds: list[int], keep: Path, *, s3: bool = False) -> int:
    """Run ``count`` random schedules (or ``seeds``); print each seed's verdict and a summary.
    Reports of failing schedules go to ``keep``/<seed>.txt, one JSON line per seed to
    ``keep``/results.jsonl. ``s3``: the tables in a bucket per seed of one S3 store
    (tools/object_store.py) the soak starts and stops."""
    import contextlib

    from tools.object_store import LocalS3Server

    seeds = seeds or [random.SystemRandom().randrange(1, 2**31) for _ in range(count)]
    keep.mkdir(parents=True, exist_ok=True)
    print(f"{len(seeds)} fault schedules{' on S3' if s3 else ''}; reports in {keep}", flush=True)
    passed = failed = 0
    store = LocalS3Server().start() if s3 else None
    with contextlib.ExitStack() as stack:
        if store is not None:
            stack.callback(store.cleanup)
        for seed in seeds:
            passed, failed = _soak_one(seed, keep, store, passed, failed)
    print(f"{passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


def _soak_one(seed: int, keep: Path, store: Any, passed: int, failed: int) -> tuple[int, int]:
    """One seed of :func:`soak`; the running counts of passed and failed seeds."""
    import shutil
    import tempfile

    print(f"seed {seed}: ", end="", flush=True)  # an interrupted soak still names its seed
    schedule = Schedule.draw(seed)
    workdir = Path(tempfile.mkdtemp(prefix=f"sched-{seed}-"))
    s3_root = env = None
    if store is not None:
        store.create_bucket(f"sched-{seed}")
        s3_root, env = f"s3://sched-{seed}/schedule", store.environment()
    try:
        outcome = run_schedule(schedule, workdir, s3_root, env)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    verdict = "PASS" if outcome.ok else f"FAIL {', '.join(outcome.kinds())}"
    print(f"{verdict} ({outcome.seconds:.0f}s, {len(outcome.runs)} runs)", flush=True)
    if not outcome.ok:
        (keep / f"{seed}.txt").write_text(outcome.report() + "\n")
    with open(keep / "results.jsonl", "a") as f:
        f.write(json.dumps({
            "seed": seed, "ok": outcome.ok, "seconds": round(outcome.seconds, 1),
            "s3": store is not None, "problems": outcome.problems,
            "conditions": schedule.conditions(),
            "runs": [{"label": r.label, "rc": r.rc, "expected": sorted(r.expected),
                      "notes": r.notes, "seconds": round(r.seconds, 1)}
                     for r in outcome.runs]}) + "\n")
    return passed + outcome.ok, failed + (not outcome.ok)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="schedules.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("soak", help="run many random schedules")
    run.add_argument("--schedules", type=int, default=10)
    run.add_argument("--seed", type=int, action="append", default=[],
                     help="run this seed instead of random ones (repeatable)")
    run.add_argument("--s3", action="store_true",
                     help="the tables in an S3 store (SeaweedFS) the soak starts")
    run.add_argument("--keep", type=Path,
                     default=Path(os.environ.get("TMPDIR", "/tmp")) / "js-etl-soak"
                     / time.strftime("%Y%m%d-%H%M%S"))
    show = commands.add_parser("show", help="print the schedules of seeds")
    show.add_argument("seeds", type=int, nargs="+")
    for name in ("delta-read", "delta-write"):  # internal: deltalake in a child process
        commands.add_parser(name).add_argument("args", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "soak":
        return soak(args.schedules, args.seed, args.keep, s3=args.s3)
    if args.command == "show":
        print("\n".join(Schedule.draw(s).describe() for s in args.seeds))
        return 0
    answer = (_delta_read if args.command == "delta-read" else _delta_write)(*args.args)
    print(json.dumps({**answer, "complete": True}), flush=True)
    os._exit(0)  # skip the interpreter teardown that deltalake can abort in


def _last_json(lines: list[str]) -> dict[str, Any] | None:
    if lines and lines[-1].startswith("{"):
        try:
            return json.loads(lines[-1])  # type: ignore[no-any-return]
        except ValueError:
            return None
    return None


def _wait_while_writing(proc: subprocess.Popen[str], logs: tuple[Path, ...],
                        stall: float) -> int | None:
    """The exit code of ``proc``, or None once its logs have not grown for ``stall`` seconds."""
    size, quiet_since = -1, time.monotonic()
    while True:
        try:
            return proc.wait(1.0)
        except subprocess.TimeoutExpired:
            pass
        now_size = sum(p.stat().st_size for p in logs if p.exists())
        if now_size != size:
            size, quiet_since = now_size, time.monotonic()
        elif time.monotonic() - quiet_since > stall:
            return None


def _kill_leftovers(marker: str, wait: float = 30.0) -> list[int]:
    """Processes of a finished run (its JVM, Python workers) must exit on their own; kill by
    pid whatever is still alive after ``wait`` seconds and return those pids."""
    import psutil

    deadline = time.monotonic() + wait
    while True:
        left = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.environ().get("JS_ETL_TEST_MARKER") == marker:
                    left.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    return [p.pid for p in left]


if __name__ == "__main__":
    sys.exit(main())
