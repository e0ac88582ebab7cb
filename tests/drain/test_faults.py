"""The fault matrix: every case breaks a run for real, then a clean recovery run must leave
the table holding every good message exactly once (by seq), the dead-letter table exactly the
poison ones, and the consumer with nothing pending or ack-pending.

SIGKILL cases kill a real ``js-etl drain`` process at a fault point (``JS_ETL_FAULT``, see
js_etl/faults.py); task failures and server restarts run in-process on the shared Spark.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from drains import (
    assert_exactly_once,
    assert_no_process_left,
    config_for,
    drain_process,
    events,
    setup_stream,
)
from streams import AfterEachRound, ack, nak, run_until, wait_until

from js_etl.demo.server import LocalNatsServer
from js_etl.drain.lock import TableLock
from js_etl.drain.run import run_drain
from js_etl.errors import RunRefusedError, TransientError
from js_etl.jetstream import (
    ConnectionOptions,
    JetStreamSession,
    PriorityGroupRequest,
    PriorityPolicy,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("fault", ["kill_after_fetch", "kill_after_commit", "kill_mid_ack"])
def test_driver_sigkilled_then_recovery_run(fault, spark, js, names, nats_server, tmp_path):
    messages, good, bad = events(names, 600, poison_every=97)
    setup_stream(js, names, messages)
    table = tmp_path / "table"
    marker = uuid.uuid4().hex

    proc = drain_process(names, nats_server.url, table, fault, marker)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == -9, (
        f"expected SIGKILL at {fault}, got {proc.returncode}: {err[-800:]}")
    assert_no_process_left(marker)
    before = js.consumer_info(names.stream, names.consumer)
    assert before.num_ack_pending > 0  # the dead run left deliveries behind

    report = run_drain(spark, config_for(names, nats_server.url, table))

    if fault == "kill_after_fetch":
        # Fetched, never committed: NAKed back at once, and counted once.
        assert report.released_at_start == before.num_ack_pending
    else:
        assert report.reacked_at_start > 0  # committed, never (fully) acked: acked by the fence
    assert report.released_at_end == 0  # nothing else was left to release
    assert_exactly_once(spark, js, names, table, good, bad)


def test_a_driver_killed_while_a_fetch_task_holds_deliveries_then_recovery_run(
        spark, js, names, nats_server, tmp_path):
    """The driver is SIGKILLed while a round's fetch task holds deliveries (fault point
    ``hold_mid_fetch``). On a classic session the task dies with the driver's JVM; over Spark
    Connect the client dies and the task runs on in the server, released here at once: it pulls
    nothing after the round's deadline (the fetch's own rule), and once that has passed the next
    run takes every message exactly once — whatever the orphaned task wrote is never committed."""
    messages, good, bad = events(names, 400, poison_every=50)
    setup_stream(js, names, messages, ack_wait=3)
    table, gate, marker = tmp_path / "table", tmp_path / "gate", uuid.uuid4().hex
    gate.mkdir()
    proc = drain_process(names, nats_server.url, table, "hold_mid_fetch", marker, gate=gate)

    def held_or_exited() -> str | int | None:  # the held round's deadline, or the exit code
        if (gate / "held").exists():
            return (gate / "held").read_text()
        return proc.poll()

    note = wait_until(held_or_exited, lambda v: v is not None, timeout=180,
                      what="a fetch task held mid-round")
    assert isinstance(note, str), f"exited {note}: " + proc.communicate()[1][-800:]
    proc.kill()
    proc.communicate()
    assert_no_process_left(marker)
    (gate / "release").touch()  # an orphaned task (over Spark Connect) goes on
    # The state every task of the dead round is past: its deadline plus one pull's timeout.
    wait_until(time.time, lambda now: now > float(note) + 1.0, timeout=60,
               what="the dead round's deadline")

    run_drain(spark, config_for(names, nats_server.url, table))

    assert_exactly_once(spark, js, names, table, good, bad)


@pytest.mark.classic_spark  # drops the checkpoint's blocks through the SparkContext
def test_an_executor_lost_after_the_checkpoint_is_transient_and_the_next_run_completes(
        spark, js, names, nats_server, tmp_path):
    """The round's checkpoint blocks vanish (the executor holding them died): the run fails with
    the transient exit 75 and says why, and the next run takes every message exactly once.
    (Spark's writer: the columnar writer's round has no checkpoint to lose.)"""
    messages, good, bad = events(names, 300, poison_every=50)
    setup_stream(js, names, messages)
    table = tmp_path / "table"
    marker = uuid.uuid4().hex

    proc = drain_process(names, nats_server.url, table, "lose_checkpoint", marker,
                         "target.writer=spark")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 75, f"expected exit 75, got {proc.returncode}: {err[-800:]}"
    assert "an executor was lost during the run (CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND)" in err
    assert_no_process_left(marker)

    run_drain(spark, config_for(names, nats_server.url, table))
    assert_exactly_once(spark, js, names, table, good, bad)


@pytest.mark.parametrize("fault", ["fail_fetch_task", "fail_write_task"])
def test_failed_task_attempt_is_retried_and_never_acked(fault, spark, js, names, nats_server,
                                                        tmp_path, monkeypatch):
    messages, good, bad = events(names, 800, poison_every=101)
    setup_stream(js, names, messages)
    table = tmp_path / "table"
    config = config_for(names, nats_server.url, table)

    monkeypatch.setenv("JS_ETL_FAULT", fault)
    # Every task's first attempt pulls and dies, in every round; Spark's retry finds the
    # messages still delivered and pulls nothing: the run ends transiently after two such rounds
    # (not "nothing_fetched", exit 0), having committed and acked nothing.
    with pytest.raises(TransientError, match="the tasks fail after they pull"):
        run_drain(spark, config)
    monkeypatch.delenv("JS_ETL_FAULT")
    assert js.consumer_info(names.stream, names.consumer).ack_floor.stream_seq == 0
    run_drain(spark, config)

    assert_exactly_once(spark, js, names, table, good, bad)


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_nats_server_restarted_mid_run(kill, spark, names, tmp_path):
    """SIGKILL gives the server no chance to store acks it had applied: the recovery run then
    fetches committed messages again, and must ack them without writing them twice."""
    table = tmp_path / "table"
    with LocalNatsServer(tmp_path / "nats") as server:
        options = ConnectionOptions(servers=(server.url,), connect_timeout=2)
        messages, good, bad = events(names, 500, poison_every=50)
        with JetStreamSession(options) as js:
            setup_stream(js, names, messages, max_ack_pending=120)
        config = config_for(names, server.url, table)
        restarts = []

        def restart_after_first_round(report: Any) -> None:
            if not restarts:
                server.restart(kill=kill)  # same port, same store directory
                restarts.append(report.rounds)

        try:
            run_drain(spark, config, progress=AfterEachRound(restart_after_first_round))
        except Exception:  # a run may fail over the restart; the recovery run must fix it
            pass
        assert restarts == [1]
        run_drain(spark, config)
        with JetStreamSession(options) as js:
            assert_exactly_once(spark, js, names, table, good, bad)


def test_deliveries_no_round_holds_are_released_between_rounds(spark, js, names, nats_server,
                                                              tmp_path):
    """Deliveries no live round holds keep their ack-pending slots until ack_wait (300 s here):
    a SIGKILLed server that lost the acks of a committed round leaves such deliveries to a
    running drain, whenever its last state flush came before the kill (the test above hits it
    only on some timings: seen 190 rounds of 2 messages). Made deterministic here: after the
    first round another client takes 100 deliveries and never acks them. The next round must
    release them, not run in the 20 slots left."""
    messages, good, bad = events(names, 400, poison_every=50)
    setup_stream(js, names, messages, max_ack_pending=120)
    table = tmp_path / "table"
    taken: list[int] = []

    def take_deliveries(report: Any) -> None:
        if not taken:
            result = js.pull(js.puller(names.stream, names.consumer), 100)
            taken.extend(m.metadata.stream_seq for m in result.messages)

    report = run_drain(spark, config_for(names, nats_server.url, table),
                       progress=AfterEachRound(take_deliveries))

    assert len(taken) == 100
    assert report.released_at_end == 100
    # 400 messages in rounds of up to 120 deliveries: the 100 come back in round 2 with 20
    # more. Without the release, rounds of at most 20 until an empty one: at least 15.
    assert report.rounds <= 6, report
    assert report.stopped_because == "drained"
    assert_exactly_once(spark, js, names, table, good, bad)


def test_ack_wait_shorter_than_a_round(spark, js, names, nats_server, tmp_path, monkeypatch):
    messages, good, bad = events(names, 400, poison_every=77)
    setup_stream(js, names, messages, ack_wait=1, max_ack_pending=100)
    table = tmp_path / "table"
    config = config_for(names, nats_server.url, table, "fetch.pull_timeout=0.3")
    # Every round waits ack_wait + 1 s between its commit and its acks (the fault point), so
    # its messages are due for redelivery before they are acked, however fast the machine.
    # (This test used to read that from the rounds' timings; faster rounds made it false.)
    monkeypatch.setenv("JS_ETL_FAULT", "stall_before_ack")

    report = run_drain(spark, config)
    monkeypatch.delenv("JS_ETL_FAULT")
    assert report.rounds >= 4  # max_ack_pending 100: no round holds more
    run_drain(spark, config)

    assert_exactly_once(spark, js, names, table, good, bad)


def test_poison_and_oversize_messages_never_stall_the_drain(spark, js, names, nats_server,
                                                            tmp_path):
    messages, good, bad = events(names, 300, poison_every=13)
    big_seq = 150
    messages[big_seq - 1] = (f"{names.prefix}.e", json.dumps({"id": 149, "pad": "x" * 4000})
                             .encode())
    setup_stream(js, names, messages)
    # A message that keeps failing elsewhere: delivered 3 times before the drain sees it.
    stuck_seq = good[0]
    other = js.puller(names.stream, names.consumer)
    for _ in range(3):
        result = js.pull(other, 1)
        assert result.messages[0].metadata.stream_seq == stuck_seq
        nak(js, [result.messages[0].reply])
        # The server applies a NAK after reading it (measured): pull again only once it has,
        # or the next pull may be served seq 2 first.
        deadline = time.monotonic() + 5
        while js.consumer_info(names.stream, names.consumer).num_ack_pending and \
                time.monotonic() < deadline:
            time.sleep(0.01)
    terms: list[dict[str, Any]] = []

    async def watch_terms() -> None:
        async def on_term(msg: Any) -> None:
            terms.append(json.loads(msg.data))
        await js.conn.nc.subscribe(
            f"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{names.stream}.{names.consumer}",
            cb=on_term)
    js.run(watch_terms())
    table = tmp_path / "table"

    report = run_drain(spark, config_for(names, nats_server.url, table,
                                         "fetch.max_bytes=2048", "source.max_deliver=2"))

    poison = sorted([*bad, stuck_seq])
    good_only = [s for s in good if s != stuck_seq]
    assert_exactly_once(spark, js, names, table, good_only, poison)
    assert report.dead_letters == len(poison)
    run_until(js, lambda: {t["stream_seq"] for t in terms} >= set(poison))
    terminated = {t["stream_seq"]: t.get("reason", "") for t in terms}
    assert set(terminated) == set(poison)  # dead letters are +TERMed, with their reason
    assert "poison: delivered 4 times" in terminated[stuck_seq]
    assert "malformed JSON" in terminated[bad[0]]


def test_second_run_while_one_is_live_is_refused(spark, js, names, nats_server, tmp_path):
    messages, good, bad = events(names, 50)
    setup_stream(js, names, messages)
    table = tmp_path / "table"
    config = config_for(names, nats_server.url, table)
    # A live run: this very process holds the lock.
    with TableLock(spark, str(table), names.consumer, "live-run", ttl=600):
        with pytest.raises(RunRefusedError, match="another run holds this consumer"):
            run_drain(spark, config)
        assert js.consumer_info(names.stream, names.consumer).num_ack_pending == 0
    run_drain(spark, config)
    assert_exactly_once(spark, js, names, table, good, bad)


def held_run(names: Any, url: str, table: Path, gate: Path) -> subprocess.Popen[str]:
    """A ``js-etl drain`` held after its first round's fetch (fault ``hold_after_fetch``): it
    holds the lock and its fetched messages until the test creates ``gate/release``."""
    gate.mkdir()
    run = drain_process(names, url, table, "hold_after_fetch", uuid.uuid4().hex, gate=gate)
    deadline = time.monotonic() + 180
    while not (gate / "held").exists():  # wait for state: the run is mid-round
        if run.poll() is not None or time.monotonic() > deadline:
            run.kill()
            raise AssertionError("the run never reached its first round's fetch: "
                                 + run.communicate()[1][-800:])
        time.sleep(0.05)
    return run


def test_a_second_run_into_another_table_is_refused_mid_round(spark, js, names, nats_server,
                                                              tmp_path):
    """The consumer is held in NATS, not in the table: a second `js-etl drain` of the same
    consumer into another table (a changed target.path, a copied DAG) is refused with 73 and
    one line naming the holder, before it fetches or NAKs anything."""
    messages, good, bad = events(names, 300)
    setup_stream(js, names, messages, max_ack_pending=150)  # two rounds
    table, other, gate = tmp_path / "table", tmp_path / "other", tmp_path / "gate"
    first = held_run(names, nats_server.url, table, gate)
    try:
        held = js.consumer_info(names.stream, names.consumer).num_ack_pending
        assert held > 0  # the first run's round is fetched and not yet committed
        second = drain_process(names, nats_server.url, other, None, uuid.uuid4().hex)
        _, second_err = second.communicate(timeout=180)
        # Its fence did not release the first run's round.
        assert js.consumer_info(names.stream, names.consumer).num_ack_pending == held
    finally:
        (gate / "release").touch()
    _, first_err = first.communicate(timeout=300)

    assert second.returncode == 73, second_err[-800:]
    reason = second_err.strip().splitlines()[-1]
    assert reason.startswith("js-etl: RunRefusedError: another run holds this consumer")
    assert f"writing {table}" in reason and "since " in reason
    assert not other.exists()  # nothing written, not even a table
    assert first.returncode == 0, first_err[-800:]  # the refused run took nothing from it
    run_drain(spark, config_for(names, nats_server.url, table))
    assert_exactly_once(spark, js, names, table, good, bad)


def test_pinned_client_group_run_takes_and_releases_the_pin(spark, js, names, nats_server,
                                                            tmp_path):
    messages, good, bad = events(names, 400)
    setup_stream(js, names, messages, priority_groups=("etl",), max_ack_pending=100,
                 priority_policy=PriorityPolicy.PINNED_CLIENT, priority_timeout=30)
    table = tmp_path / "table"
    config = config_for(names, nats_server.url, table, "source.priority_group=etl",
                        "fetch.batch=50")

    report = run_drain(spark, config)

    # Round 1 takes the pin on one partition; later rounds pull on both with its id.
    assert report.messages_written == 400 and report.rounds >= 4
    assert js.consumer_info(names.stream, names.consumer).pinned_id("etl") is None  # unpinned
    assert_exactly_once(spark, js, names, table, good, bad)


def test_pinned_by_another_client_is_refused(spark, js, names, nats_server, tmp_path):
    messages, _, _ = events(names, 20)
    setup_stream(js, names, messages, priority_groups=("etl",),
                 priority_policy=PriorityPolicy.PINNED_CLIENT, priority_timeout=30)
    foreign = js.puller(names.stream, names.consumer, priority_group=PriorityGroupRequest("etl"))
    taken = js.pull(foreign, 1)
    assert foreign.pin_id and taken.messages
    ack(js, [taken.messages[0].reply])

    with pytest.raises(RunRefusedError, match="pinned by another client"):
        run_drain(spark, config_for(names, nats_server.url, tmp_path / "t",
                                    "source.priority_group=etl"))


def test_overflow_helper_drains_only_above_min_pending(spark, js, names, nats_server, tmp_path):
    messages, good, bad = events(names, 120)
    setup_stream(js, names, messages, priority_groups=("spill",),
                 priority_policy=PriorityPolicy.OVERFLOW)
    table = tmp_path / "table"

    quiet = run_drain(spark, config_for(names, nats_server.url, table,
                                        "source.priority_group=spill",
                                        "source.min_pending=1000"))
    assert quiet.messages_written == 0 and quiet.stopped_because == "below_min_pending"
    assert js.consumer_info(names.stream, names.consumer).num_pending == 120

    busy = run_drain(spark, config_for(names, nats_server.url, table,
                                       "source.priority_group=spill", "source.min_pending=50"))
    assert busy.messages_written >= 70  # served while the backlog stayed >= 50
    run_drain(spark, config_for(names, nats_server.url, table, "source.priority_group=spill"))
    assert_exactly_once(spark, js, names, table, good, bad)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_finishes_the_round_releases_and_exits_75(sig, spark, js, names,
                                                                    nats_server, tmp_path):
    messages, good, bad = events(names, 300, poison_every=97)
    setup_stream(js, names, messages, max_ack_pending=100)  # three rounds
    table, gate = tmp_path / "table", tmp_path / "gate"
    proc = held_run(names, nats_server.url, table, gate)
    proc.send_signal(sig)  # mid-round: its fetch is done, its commit not yet
    (gate / "release").touch()
    out, err = proc.communicate(timeout=180)

    assert proc.returncode == 75, err[-800:]
    assert err.strip().splitlines()[-1].startswith(
        f"js-etl: Terminated: {sig.name} received")
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["stopped_because"] == "terminated" and report["rounds"] == 1  # that round
    assert not (table / "_js_etl" / f"{names.consumer}.lock").exists()  # released
    info = js.consumer_info(names.stream, names.consumer)
    assert info.num_pending > 0  # it stopped early ...
    assert info.num_ack_pending == 0  # ... with everything it fetched committed and acked
    run_drain(spark, config_for(names, nats_server.url, table))
    assert_exactly_once(spark, js, names, table, good, bad)
