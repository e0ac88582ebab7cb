"""The fence's cost follows what a dead run can have left, not the consumer's history (issue 18).

A delivery stuck below a long committed history (here: seq 1 held by another client, unacked,
while runs whose own release is switched off commit everything above it) gives the next run a
window (ack floor, last delivered] as wide as that history. The fence used to read and re-ack
every committed row of the window — on R3 each ack, even of an acked message, is a Raft
proposal — and took 45-56 s per run on the issue's cluster. It now re-acks only the job's last
round (its commit tag names the seq range). Counted, not timed: rows the fence acked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nats_cluster import add_replicated_stream, wait_consumer_current, wait_for
from streams import publish_and_wait

from js_etl.config import load_config
from js_etl.drain import run as drain_module
from js_etl.drain.acks import RunAcks
from js_etl.drain.fence import Fenced
from js_etl.drain.run import run_drain
from js_etl.jetstream import ConsumerConfig, JetStreamSession

HISTORY = 1_000
# Rounds of at most 2 x 150 messages, so the history has several (message counts: the columnar
# writer's byte budget counts only the dead letters it holds).
SMALL_ROUNDS = ("fetch.max_bytes=4KiB", "fetch.partition_max_messages=150")


def _config(names: Any, urls: tuple[str, ...], table: Path, *extra: str) -> Any:
    return load_config(None, [f"nats.servers={','.join(urls)}", f"source.stream={names.stream}",
                              f"source.consumer={names.consumer}", f"target.path={table}",
                              "decode.format=json", "decode.schema=id BIGINT",
                              "fetch.partitions=2", "fetch.batch=100", "fetch.pull_timeout=2",
                              *extra], environ={})


def test_fence_reacks_only_the_last_round_below_a_stuck_delivery(
        spark: Any, nats_cluster: Any, cjs: JetStreamSession, names: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    add_replicated_stream(cjs, names.stream, [names.subject], replicas=3)
    cjs.run(cjs.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_wait=600, max_ack_pending=100_000)))
    wait_consumer_current(cjs, names.stream, names.consumer)
    subject = f"{names.prefix}.e"
    publish_and_wait(cjs, names, [(subject, json.dumps({"id": 0}).encode())])
    # The stream's leader has it; the consumer's leader may not have applied it yet, and a
    # no_wait pull then finds nothing (seen once in a full suite run on a clean clone).
    wait_for(lambda: cjs.consumer_info(names.stream, names.consumer).num_pending == 1, 60,
             "the consumer to see seq 1")
    held = cjs.pull(cjs.puller(names.stream, names.consumer), 1, timeout=10)
    assert [m.metadata.stream_seq for m in held.messages] == [1]  # never acked: the stuck one
    publish_and_wait(cjs, names, [(subject, json.dumps({"id": i}).encode())
                                  for i in range(1, HISTORY + 1)])

    table = tmp_path / "table"
    # History: runs that neither fence nor release, so seq 1 stays delivered and unacked.
    with monkeypatch.context() as m:
        m.setattr(drain_module, "fence", lambda *a, **k: Fenced(0, 0))
        m.setattr(RunAcks, "release", lambda *a, **k: 0)
        first = run_drain(spark, _config(names, nats_cluster.urls, table,
                                         f"run.max_messages={HISTORY}", *SMALL_ROUNDS))
    assert first.messages_written == HISTORY and first.rounds >= 3
    info = cjs.consumer_info(names.stream, names.consumer)
    assert (info.ack_floor.stream_seq, info.num_ack_pending) == (0, 1)  # the wide window

    acked_by_fence: list[int] = []
    real_fence = drain_module.fence

    def counting_fence(spark: Any, js: Any, info: Any, acks: RunAcks, *args: Any) -> Fenced:
        real_ack = acks.ack

        def ack(*a: Any, **k: Any) -> int:
            n = real_ack(*a, **k)
            acked_by_fence.append(n)
            return n
        acks.ack = ack  # type: ignore[method-assign]
        try:
            return real_fence(spark, js, info, acks, *args)
        finally:
            del acks.ack

    monkeypatch.setattr(drain_module, "fence", counting_fence)
    report = run_drain(spark, _config(names, nats_cluster.urls, table))

    # The last round of the history (re-acked: the fence cannot know it was acked), not all of it.
    assert 0 < sum(acked_by_fence) <= HISTORY // 2, (acked_by_fence, first.rounds)
    assert report.released_at_start == 1  # the stuck delivery, NAKed: it comes back now
    assert report.messages_written == 1
    rows = spark.read.format("delta").load(str(table)).where(f"stream = '{names.stream}'")
    seqs = sorted(r.seq for r in rows.select("seq").collect())
    assert seqs == list(range(1, HISTORY + 2))
    info = cjs.consumer_info(names.stream, names.consumer)
    assert (info.num_pending, info.num_ack_pending) == (0, 0)
