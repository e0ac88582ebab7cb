"""Randomized fault schedules: real drains broken at random points must still leave every
published message in the table or the dead-letter table exactly once, and the consumer clean.

``make test`` runs one on S3 here and one over Spark Connect (tests/test_spark_connect.py);
``make soak SCHEDULES=N`` runs N random ones (tests/support/schedules.py). Replay a seed:

    JS_ETL_SCHEDULE_SEED=<seed>[,<seed>...] \
        .venv/bin/python -m pytest tests/drain/test_fault_schedules.py
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from schedules import (
    FAULT_POINTS,
    Drain,
    ForeignCommits,
    Publish,
    RestartNats,
    Schedule,
    diff,
    run_schedule,
)

# No schedule of its own on the classic session in ``make test`` (which must stay under 25
# minutes on a 2-core box): the Spark Connect leg (tests/test_spark_connect.py) replays one
# through this test, and ``make soak`` draws random ones. Two left the suite for time, each of
# their pieces having its own test:
# 6302: column mapping on, ack_wait 2.5s, 12 partitions on local[2], 275 messages (27 poison);
#       the NATS server restarts mid-run, then 22 commits by another writer
#       (test_faults.py::test_nats_server_restarted_mid_run, and in test_exactly_once.py
#       test_rounds_and_fence_survive_a_hundred_commits_of_another_writer and
#       test_column_mapping_and_optimize_vacuum_before_the_fence);
# 13462: SIGKILL after a round's commit, before its acks; then 105 foreign commits and an
#       OPTIMIZE (test_faults.py::test_driver_sigkilled_then_recovery_run[kill_after_commit] and
#       the two of test_exactly_once.py above).
# Replay them with JS_ETL_SCHEDULE_SEED=6302,13462.
NO_SEED = pytest.param(None, marks=pytest.mark.skip(
    reason="no fixed seed in make test: the Spark Connect leg replays one, make soak draws "
           "them; JS_ETL_SCHEDULE_SEED=<seed> replays one"))


def _seeds() -> list[Any]:
    replay = os.environ.get("JS_ETL_SCHEDULE_SEED", "").strip()
    return [int(s) for s in replay.split(",") if s.strip()] if replay else [NO_SEED]


@pytest.mark.slow
@pytest.mark.connect_leg
@pytest.mark.parametrize("seed", _seeds())
def test_fault_schedule_keeps_every_message_exactly_once(seed, tmp_path):
    outcome = run_schedule(Schedule.draw(seed), tmp_path)
    if not outcome.ok:
        pytest.fail(outcome.report(), pytrace=False)


# The same schedules with the tables in an S3 bucket (a real SeaweedFS: tools/object_store.py):
# 11: column mapping off (the columnar writer), 2,107 messages (210 poison), 4 partitions,
# SIGKILL 1.5 s after the lock. Two left the suite for time; replay them with
# JS_ETL_S3_SCHEDULE_SEED: 128 (column mapping on: Spark's writer through S3A and js-etl's log
# store, SIGKILL in the middle of a round's acks — the table is then as after a kill after the
# commit, test_object_storage.py's on that writer) and 2 (the same kill, then a NATS restart
# mid-run, in rounds of 80).
# `make soak S3=1` draws random ones there.
FIXED_S3_SEEDS = (11,)


def _s3_seeds() -> list[int]:
    replay = os.environ.get("JS_ETL_S3_SCHEDULE_SEED", "").strip()
    return [int(s) for s in replay.split(",") if s.strip()] if replay else list(FIXED_S3_SEEDS)


@pytest.mark.slow
@pytest.mark.parametrize("seed", _s3_seeds())
def test_fault_schedule_on_s3_keeps_every_message_exactly_once(seed, tmp_path, s3, s3_server):
    outcome = run_schedule(Schedule.draw(seed), tmp_path, f"{s3}/schedule",
                           s3_server.environment())
    if not outcome.ok:
        pytest.fail(outcome.report(), pytrace=False)


def test_schedules_are_reproducible_and_within_the_products_limits():
    for seed in range(300):
        schedule = Schedule.draw(seed)
        assert schedule == Schedule.draw(seed)
        assert 3 * schedule.pull_timeout <= schedule.ack_wait  # the product refuses less
        assert 1 <= schedule.partitions <= 12
        assert 200 <= schedule.messages <= schedule.published
        assert set(schedule.poison) <= set(range(1, schedule.published + 1))
        drains = [s for s in schedule.steps if isinstance(s, Drain)]
        assert 1 <= len(drains) <= 3
        for step in schedule.steps:
            assert isinstance(step, Drain | RestartNats | ForeignCommits | Publish)
            if isinstance(step, ForeignCommits) and step.optimize:
                assert not schedule.column_mapping  # deltalake cannot OPTIMIZE those
    drawn = [Schedule.draw(seed) for seed in range(300)]
    disruptions = {s.disruption for d in drawn for s in d.steps if isinstance(s, Drain)}
    assert disruptions == {"none", "sigkill", "nats_restart", "foreign_commits",
                           *(f"fault:{p}" for p in FAULT_POINTS)}
    assert {d.column_mapping for d in drawn} == {True, False}
    assert any(d.server_max_deliver for d in drawn) and any(d.poison for d in drawn)


def test_the_check_names_every_way_exactly_once_can_break():
    # 6 published, seq 6 poison; 2 written twice, 3 lost, 4 dead-lettered although good,
    # 5 carries another message's payload, 6 dead-lettered twice.
    table = [(1, 1), (2, 2), (2, 2), (5, 4)]
    dead = [(4, "poison: delivered 3 times"), (6, "malformed JSON"), (6, "malformed JSON")]
    kinds = {kind for kind, _ in diff(6, {6}, table, dead, (0, 0))}
    assert kinds == {"loss", "duplicates", "good message dead-lettered", "wrong payload",
                     "duplicate dead letters"}
    # Seq 3 still pending on the consumer: not lost (yet), but the consumer is not clean.
    kinds = {kind for kind, _ in diff(3, set(), [(1, 1), (2, 2)], [], (1, 0))}
    assert kinds == {"not landed", "consumer not clean"}
    both = diff(2, {2}, [(1, 1), (2, 2)], [(2, "malformed JSON")], (0, 0))
    assert {kind for kind, _ in both} == {"in both tables", "poison in table"}
    assert diff(3, {3}, [(1, 1), (2, 2)], [(3, "malformed JSON")], (0, 0)) == []
