"""The consumer's run lease (js_etl.durable.lease) against a real nats-server: one holder however
the runs are timed, a dead holder's lease taken over or expired, a lost lease never renewed."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
from streams import started_together

from js_etl.durable.lease import ConsumerLease, lease_holder, lease_key
from js_etl.durable.owner import LockOwner
from js_etl.errors import RunRefusedError
from js_etl.jetstream.kv import KeyValue


def lease(nats_options: Any, names: Any, run_id: str, bucket: str = "js-etl-leases",
          target: str = "/tables/a") -> ConsumerLease:
    return ConsumerLease(nats_options, names.stream, names.consumer, run_id, target=target,
                         bucket=bucket)


def write_record(js: Any, bucket: str, names: Any, owner: LockOwner) -> int:
    """Put ``owner`` in the consumer's lease entry, whatever was there (as another run would)."""
    kv = KeyValue(js.conn, bucket)
    entry = js.run(kv.get(lease_key(names.stream, names.consumer)))
    return js.run(kv.update(lease_key(names.stream, names.consumer), owner.to_json(),
                            entry.revision if entry else 0))


def elsewhere(run_id: str) -> LockOwner:
    """A live-looking run on another host: only its lease's expiry can free the consumer."""
    me = LockOwner.me(run_id, "/tables/elsewhere")
    return replace(me, process=replace(me.process, host="other-host", pid=4242))


def test_of_runs_started_together_exactly_one_holds_the_consumer(nats_options, names):
    runs = [lease(nats_options, names, f"run-{i}", target=f"/tables/{i}") for i in range(4)]
    outcomes = started_together([run.acquire for run in runs])
    held = [i for i, o in outcomes.items() if isinstance(o, ConsumerLease)]
    try:
        assert len(held) == 1, outcomes
        refusals = [str(o) for o in outcomes.values() if isinstance(o, RunRefusedError)]
        assert len(refusals) == 3
        winner = runs[held[0]]
        for text in refusals:  # one line naming the holder: run, pid, host, target, since
            assert "another run holds this consumer" in text and "\n" not in text
            assert f"run {winner.me.run_id} " in text and f"writing /tables/{held[0]}" in text
            assert "since 20" in text
    finally:
        for o in outcomes.values():
            if isinstance(o, ConsumerLease):
                o.release()


def test_a_released_lease_frees_the_consumer_at_once(js, nats_options, names):
    with lease(nats_options, names, "first") as first:
        first.check()
        assert lease_holder(js, "js-etl-leases", names.stream, names.consumer).run_id == "first"
    assert lease_holder(js, "js-etl-leases", names.stream, names.consumer) is None
    with lease(nats_options, names, "second") as second:
        assert second.previous is None


def test_a_holder_that_died_on_this_machine_is_taken_over_at_once(js, nats_options, names):
    with lease(nats_options, names, "seed"):
        pass  # the bucket exists
    me = LockOwner.me("dead-run", "/tables/a")
    # Our own pid stands for "a live process now holds the pid": its start time differs.
    dead = replace(me, pin_id="pin-1",
                   process=replace(me.process, pid_start=(me.process.pid_start or 0) - 1))
    write_record(js, "js-etl-leases", names, dead)

    with lease(nats_options, names, "new-run") as taken:
        assert taken.previous is not None and taken.previous.run_id == "dead-run"
        assert taken.previous.pin_id == "pin-1"  # for the pin's take-over
        holder = lease_holder(js, "js-etl-leases", names.stream, names.consumer)
        assert holder is not None and holder.run_id == "new-run"


def test_a_holder_on_another_host_holds_until_its_lease_expires(js, nats_options, names):
    bucket = f"short-{names.consumer}"
    js.run(KeyValue(js.conn, bucket).ensure(ttl=1.5, replicas=1))
    write_record(js, bucket, names, elsewhere("far-run"))

    with pytest.raises(RunRefusedError, match="run far-run .*on other-host"):
        lease(nats_options, names, "new-run", bucket).acquire()
    # Wait for state: the server expires the entry (bucket max_age), nobody deletes it.
    deadline = time.monotonic() + 60
    while lease_holder(js, bucket, names.stream, names.consumer) is not None:
        assert time.monotonic() < deadline, "the dead holder's lease never expired"
        time.sleep(0.1)
    with lease(nats_options, names, "new-run", bucket) as taken:
        assert taken.ttl == 1.5 and taken.previous is None


def test_renewals_keep_a_long_run_holding_its_lease(js, nats_options, names):
    bucket = f"short-{names.consumer}"
    js.run(KeyValue(js.conn, bucket).ensure(ttl=1.0, replicas=1))
    with lease(nats_options, names, "long-run", bucket) as held:
        first = lease_holder(js, bucket, names.stream, names.consumer)
        assert first is not None
        # Wait for state: renewals went on for several TTLs, so the entry would have expired
        # many times over without them.
        deadline = time.monotonic() + 60
        while lease_holder(js, bucket, names.stream, names.consumer).heartbeat < (
                first.heartbeat + 3.0):
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.05)
        with pytest.raises(RunRefusedError, match="another run holds this consumer"):
            lease(nats_options, names, "second-run", bucket).acquire()
        held.check()


def test_a_run_whose_lease_was_taken_stops_renewing_and_fails_its_check(js, nats_options, names):
    with lease(nats_options, names, "slow-run") as slow:
        # As a successor would after this run's lease expired: a new record in its place.
        write_record(js, "js-etl-leases", names, elsewhere("successor"))
        with pytest.raises(RunRefusedError, match="lost its lease"):
            slow.check()
        with pytest.raises(RunRefusedError, match="lost its lease"):
            slow.check()  # lost stays lost
    # The loser did not delete the successor's lease on its way out.
    assert lease_holder(js, "js-etl-leases", names.stream, names.consumer).run_id == "successor"


def test_lease_keys_keep_distinct_names_distinct():
    assert lease_key("ORDERS", "drain_1") == "ORDERS.drain_1"
    assert lease_key("a=b", "c") != lease_key("a", "b=c")
    assert lease_key("ÆØ", "x y") == "=C3=86=C3=98.x=20y"


def test_a_lease_an_earlier_run_of_this_process_left_behind_is_taken_over(js, nats_options,
                                                                           names):
    """A run whose release could not reach NATS leaves its entry; the same process's next run
    (a retry in a notebook, an operator's loop) must not wait for its expiry."""
    with lease(nats_options, names, "seed"):
        pass
    write_record(js, "js-etl-leases", names, LockOwner.me("ended-run", "/tables/a"))
    with lease(nats_options, names, "retry") as taken:
        assert taken.previous is not None and taken.previous.run_id == "ended-run"
        with pytest.raises(RunRefusedError, match="run retry "):  # a live one is not
            lease(nats_options, names, "third").acquire()
