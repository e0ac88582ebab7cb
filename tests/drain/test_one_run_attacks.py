"""Attacks on "one consumer, one run" through real drains (real nats-server, Spark, Delta),
written by a review whose only job was to break it. A second run is started *inside* the first
run's commit (a wrapper around the first run's own method), so the interleaving is exact without
waiting for time."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from drains import config_for, events, setup_stream
from streams import AfterEachRound

from js_etl.delta.table import DeltaTarget
from js_etl.drain.run import run_drain
from js_etl.durable.lease import lease_key
from js_etl.durable.owner import LockOwner
from js_etl.errors import RunRefusedError
from js_etl.jetstream.kv import KeyValue


def seqs(spark: Any, path: Path) -> list[int]:
    if not (path / "_delta_log").exists():
        return []
    return sorted(r.seq for r in spark.read.format("delta").load(str(path)).select("seq")
                  .collect())


def in_both(spark: Any, a: Path, b: Path) -> list[int]:
    return sorted(set(seqs(spark, a)) & set(seqs(spark, b)))


def during_commit_of(monkeypatch: pytest.MonkeyPatch, table: Path, action: Any) -> dict:
    """Run ``action()`` once, inside the first commit into ``table`` — after the run's lease
    check passed, before the commit itself (as a commit that takes that long would)."""
    state: dict[str, Any] = {}
    originals = {name: getattr(DeltaTarget, name) for name in ("append", "commit_files")}

    def wrap(name: str) -> Any:
        def wrapped(self: DeltaTarget, *args: Any, **kw: Any) -> Any:
            if str(self) == str(table) and "done" not in state:
                state["done"] = True
                state["result"] = action()
            return originals[name](self, *args, **kw)
        return wrapped

    for name in originals:
        monkeypatch.setattr(DeltaTarget, name, wrap(name))
    return state


def second_run(spark: Any, config: Any) -> Any:
    try:
        return run_drain(spark, config)
    except RunRefusedError as e:
        return e


# --- 5. a run whose lease was taken keeps fetching ----------------------------------------------
def test_a_run_that_lost_its_lease_fetches_nothing_more(spark, js, names, nats_server, tmp_path):
    """"Two runs of one consumer never both fetch": once a successor holds the lease, the old run
    must not pull again. Here the lease is taken after round 1; the old run then fetches round 2
    (no check guarded a fetch), failed its commit check, and could not release what it fetched
    (the release is guarded by the same check): those deliveries sat ack-pending on the
    successor's consumer until ack_wait (300 s here)."""
    messages, _, _ = events(names, 300)
    setup_stream(js, names, messages, max_ack_pending=100)
    config = config_for(names, nats_server.url, tmp_path / "table")
    me = LockOwner.me("successor", str(tmp_path / "elsewhere"))
    successor = replace(me, process=replace(me.process, host="other-host"))
    kv = KeyValue(js.conn, config.source.lease_bucket)
    key = lease_key(names.stream, names.consumer)
    at_takeover: dict[str, Any] = {}

    def take_over(report: Any) -> None:
        if at_takeover:
            return
        entry = js.run(kv.get(key))
        js.run(kv.update(key, successor.to_json(), entry.revision))
        at_takeover["info"] = js.consumer_info(names.stream, names.consumer)

    with pytest.raises(RunRefusedError, match="lost its lease"):
        run_drain(spark, config, progress=AfterEachRound(take_over))

    before = at_takeover["info"]
    after = js.consumer_info(names.stream, names.consumer)
    print("at takeover: delivered", before.delivered.stream_seq, "ack_pending",
          before.num_ack_pending, "| after the old run ended: delivered",
          after.delivered.stream_seq, "ack_pending", after.num_ack_pending)
    assert after.delivered.stream_seq == before.delivered.stream_seq, (
        "the run fetched after its lease was taken over")
    assert after.num_ack_pending == 0, "the old run left deliveries ack-pending"


# --- control: the same interleaving with one bucket, nothing else wrong --------------------------
def test_control_a_second_run_started_inside_a_commit_is_refused(spark, js, names, nats_server,
                                                                  tmp_path, monkeypatch):
    """The interleaving of tests 6-8 with the lease working as designed: the second run, started
    while the first is inside its commit, is refused and nothing lands twice."""
    messages, _, _ = events(names, 200)
    setup_stream(js, names, messages, max_ack_pending=100)
    a, b = tmp_path / "a", tmp_path / "b"
    config_a = config_for(names, nats_server.url, a)
    config_b = config_for(names, nats_server.url, b)

    started = during_commit_of(monkeypatch, a, lambda: second_run(spark, config_b))
    outcome_a = second_run(spark, config_a)

    assert isinstance(started["result"], RunRefusedError), started
    assert "another run holds this consumer" in str(started["result"])
    assert outcome_a.messages_written == 200
    assert seqs(spark, a) == list(range(1, 201)) and not b.exists()


# --- 9. a crashed run's committed, unacked round, then a run into another table -----------------
def test_a_round_a_crashed_run_committed_is_not_written_again_into_another_table(
        spark, js, names, nats_server, tmp_path):
    """Run A (a real `js-etl drain`) is SIGKILLed after its round's Delta commit, before its acks
    (fault kill_after_commit). The next run of the consumer writes another table (a changed
    target.path, a copied DAG): it takes A's lease over at once (A's pid is dead). Its fence
    knew only its own tables, NAKed A's committed round and wrote it again; it now finishes A's
    last round in A's table (the lease record names it)."""
    import uuid

    from drains import assert_no_process_left, drain_process

    messages, _, _ = events(names, 200)
    setup_stream(js, names, messages, max_ack_pending=100)
    a, b = tmp_path / "a", tmp_path / "b"
    marker = uuid.uuid4().hex
    crashed = drain_process(names, nats_server.url, a, "kill_after_commit", marker)
    _, err = crashed.communicate(timeout=300)
    assert crashed.returncode == -9, err[-800:]
    assert_no_process_left(marker)
    committed = seqs(spark, a)
    assert committed, "the crashed run committed nothing"

    report = second_run(spark, config_for(names, nats_server.url, b))
    print("A committed", len(committed), "then died; B:", report)
    both = in_both(spark, a, b)
    assert not both, f"{len(both)} sequences are in both tables: {both[:5]}...{both[-5:]}"
    assert report.reacked_at_start == len(committed)  # A's round acked where it lies
    assert sorted(seqs(spark, a) + seqs(spark, b)) == list(range(1, 201))  # none lost
    info = js.consumer_info(names.stream, names.consumer)
    assert (info.num_pending, info.num_ack_pending) == (0, 0)
