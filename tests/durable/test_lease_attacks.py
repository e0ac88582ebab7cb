"""Attacks on the consumer lease itself (js_etl.durable.lease), against a real nats-server: each
test states the guarantee it tries to break (a review whose only job was to break it wrote them;
four broke it before the fixes they pin)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from streams import started_together, wait_until

from js_etl.demo.server import LocalNatsServer
from js_etl.durable.lease import ConsumerLease, lease_holder, lease_key
from js_etl.durable.owner import LockOwner
from js_etl.errors import ConfigError, RunRefusedError
from js_etl.jetstream import ConnectionOptions, JetStreamSession
from js_etl.jetstream.kv import KeyValue

REPO = Path(__file__).resolve().parents[2]


def kv_cli(nats_cli: str, url: str, *args: str) -> None:
    """The real NATS CLI, as an operator would create a bucket."""
    subprocess.run([nats_cli, "-s", url, *args], check=True, capture_output=True, text=True,
                   timeout=30)


def write_record(js: JetStreamSession, bucket: str, names: Any, owner: LockOwner) -> int:
    kv = KeyValue(js.conn, bucket)
    key = lease_key(names.stream, names.consumer)
    entry = js.run(kv.get(key))
    return js.run(kv.update(key, owner.to_json(), entry.revision if entry else 0))


def on_other_host(run_id: str) -> LockOwner:
    """A run on another machine (its SIGKILLed driver left this record): only the lease's expiry
    can free the consumer."""
    me = LockOwner.me(run_id, "/tables/elsewhere")
    return replace(me, process=replace(me.process, host="other-host", pid=4242))


def raw_last(js: JetStreamSession, bucket: str, names: Any) -> dict[str, Any] | None:
    """The bucket stream's last message on the key's subject, as the server has it."""
    try:
        answer = js.run(js.conn.request(
            f"STREAM.MSG.GET.KV_{bucket}",
            {"last_by_subj": f"$KV.{bucket}.{lease_key(names.stream, names.consumer)}"}))
    except Exception as e:
        if "10037" in repr(e) or "no message" in str(e).lower():
            return None
        raise
    message = answer["message"]
    headers = base64.b64decode(message["hdrs"]).decode() if message.get("hdrs") else ""
    return {"seq": message["seq"], "headers": headers,
            "data": base64.b64decode(message.get("data") or "")}


# --- 1. buckets that cannot hold leases -----------------------------------------------------------
@pytest.mark.parametrize("made_with, problem", [
    (("--history", "1"), "has no max age (nats kv add without --ttl): a dead run's lease would "
                         "never expire"),
    (("--storage", "memory", "--ttl", "60s"), "keeps its entries in memory storage: a server "
                                              "restart would forget the leases of live runs"),
])
def test_a_bucket_that_cannot_hold_leases_is_refused_with_the_fix(js, nats_server, nats_options,
                                                                 names, nats_cli, made_with,
                                                                 problem):
    """`nats kv add <bucket>` without --ttl: a run SIGKILLed on another host would hold the
    consumer for ever (its entry never expires); with --storage memory a server restart forgets
    the lease of a run mid-commit and a second run takes the consumer (both broke the guarantee
    before the bucket was checked)."""
    bucket = f"bad-{names.consumer}"
    kv_cli(nats_cli, nats_server.url, "kv", "add", bucket, *made_with)
    with pytest.raises(ConfigError) as refused:
        ConsumerLease(nats_options, names.stream, names.consumer, "run", target="/t/a",
                      bucket=bucket).acquire()
    assert str(refused.value) == (
        f"the lease bucket {bucket!r} {problem}: delete it (nats kv del {bucket} -f) and let "
        f"js-etl create it, or create it with nats kv add {bucket} --ttl 60s --replicas 1")


# --- 2. a bucket created with per-key TTLs / limit markers (`nats kv add --marker-ttl`) ----------
def test_an_expired_lease_in_a_bucket_with_limit_markers_frees_the_consumer(
        js, nats_server, nats_options, names, nats_cli):
    """`nats kv add --ttl 2s --marker-ttl 1h`: when the server expires an entry (max_age) it
    leaves a subject delete marker (headers Nats-Marker-Reason: MaxAge, no KV-Operation). KV
    clients read it as a deleted key; js-etl must too, or the expired lease of a dead run keeps
    holding the consumer until the marker itself expires."""
    bucket = f"marker-{names.consumer}"
    kv_cli(nats_cli, nats_server.url, "kv", "add", bucket, "--ttl", "2s", "--marker-ttl", "1h")
    write_record(js, bucket, names, on_other_host("sigkilled-elsewhere"))

    # Wait for state: the server expired the dead run's entry (its record is gone).
    def expired() -> bool:
        last = raw_last(js, bucket, names)
        return last is None or b"sigkilled-elsewhere" not in last["data"]

    wait_until(expired, timeout=30, what="the dead run's entry expired")
    print("what the server holds for the key now:", raw_last(js, bucket, names))
    taken = ConsumerLease(nats_options, names.stream, names.consumer, "successor",
                          target="/t/b", bucket=bucket).acquire()  # must not be refused
    try:
        assert lease_holder(js, bucket, names.stream, names.consumer).run_id == "successor"
    finally:
        taken.release()


# --- 3. a renewal applied by the server whose answer came late -----------------------------------
def test_a_renewal_the_server_applied_but_answered_late_does_not_lose_the_lease(tmp_path, names):
    """A slow server (GC, fsync stall, an overloaded box; on a cluster, a leader change after the
    proposal committed) applies a renewal but answers after the client's 5 s timeout. Nobody else
    touched the lease: check() must not say it was lost (exit 73, "another run took it"), and the
    run must still release it at the end."""
    server = LocalNatsServer(tmp_path / "nats")
    server.start()
    options = ConnectionOptions(servers=(server.url,), name="breakit", connect_timeout=2)
    stopped = False
    try:
        held = ConsumerLease(options, names.stream, names.consumer, "slow-server-run",
                             target="/t/a", bucket="js-etl-leases").acquire()
        nc = held._session.conn.nc  # the lease's own connection
        sent_before = nc.stats["out_msgs"]
        outcome: dict[str, Any] = {}

        def check() -> None:
            try:
                held.check()
                outcome["ok"] = True
            except Exception as e:
                outcome["error"] = e

        os.kill(server.pid, signal.SIGSTOP)
        stopped = True
        t = threading.Thread(target=check)
        t.start()
        # Wait for state: the first renewal timed out and a second one was sent.
        wait_until(lambda: nc.stats["out_msgs"] >= sent_before + 2, timeout=60,
                   what="two renewals sent to the stopped server")
        os.kill(server.pid, signal.SIGCONT)
        stopped = False
        t.join(120)
        with JetStreamSession(options) as js:
            holder = lease_holder(js, "js-etl-leases", names.stream, names.consumer)
            print("holder after the late answer:", holder and holder.run_id, outcome)
            assert holder is not None and holder.run_id == "slow-server-run"  # nobody took it
            held.release()
            after = lease_holder(js, "js-etl-leases", names.stream, names.consumer)
        assert "error" not in outcome, f"check() failed though nobody took the lease: " \
                                       f"{outcome['error']!r}"
        assert after is None, f"release left the lease held by {after and after.run_id}"
    finally:
        if stopped:
            os.kill(server.pid, signal.SIGCONT)
        server.cleanup()


# --- 4. a live holder on this host that /proc does not show --------------------------------------
HIDDEN_SUCCESSOR = textwrap.dedent("""
    import json, sys
    from js_etl.durable.lease import ConsumerLease
    from js_etl.errors import ConfigError, RunRefusedError
    from js_etl.jetstream import ConnectionOptions
    url, stream, consumer, bucket = sys.argv[1:5]
    options = ConnectionOptions(servers=(url,), name="hidden", connect_timeout=2)
    try:
        lease = ConsumerLease(options, stream, consumer, "second-user-run", target="/t/b",
                              bucket=bucket).acquire()
    except RunRefusedError as e:
        print(json.dumps({"refused": str(e)}))
    else:
        print(json.dumps({"took_over_from": lease.previous.run_id if lease.previous else None}))
        lease._stop.set()  # exit holding it (as a run still going would), no release
""")


def test_a_live_holder_this_user_cannot_see_in_proc_is_not_taken_over(js, nats_server,
                                                                       nats_options, names):
    """/proc mounted with hidepid (a common hardening of shared hosts): a run started by another
    user cannot see this user's processes. Same host, boot and PID namespace, so _dead() trusts
    /proc: the live holder's pid "does not run" -> "certainly dead" -> taken over at once.

    The second user is modelled as this uid without capabilities and with another gid, in its
    own mount namespace whose /proc is mounted hidepid=invisible: the kernel's ptrace-access
    rule then hides the holder from it exactly as it hides another uid's processes."""
    if os.geteuid() != 0 or not Path("/usr/bin/unshare").exists():
        pytest.skip("needs root to mount a hidepid /proc in a private mount namespace")
    bucket = f"hidepid-{names.consumer}"
    holder = ConsumerLease(nats_options, names.stream, names.consumer, "first-user-run",
                           target="/t/a", bucket=bucket).acquire()
    try:
        script = (f"mount -t proc -o hidepid=invisible proc /proc && exec setpriv --regid=65534 "
                  "--clear-groups --securebits +noroot,+noroot_locked,+no_setuid_fixup,"
                  "+no_setuid_fixup_locked --bounding-set -all --inh-caps -all --ambient-caps "
                  f"-all {sys.executable} -c \"$0\" \"$@\"")
        done = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script, HIDDEN_SUCCESSOR,
             nats_server.url, names.stream, names.consumer, bucket],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        print(done.stdout, done.stderr[-2000:])
        if done.returncode != 0 and "mount" in done.stderr:
            pytest.skip(f"cannot mount a hidepid /proc here: {done.stderr[-300:]}")
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
        still = lease_holder(js, bucket, names.stream, names.consumer)
        assert "refused" in outcome, (
            f"a live run's lease was taken over by a run on the same host: {outcome}; the lease "
            f"now names {still and still.run_id}")
    finally:
        try:
            holder.check()  # lost, if it was taken
        except RunRefusedError as e:
            print("the live holder:", e)
        holder.release()


# --- controls and attacks the lease withstood ----------------------------------------------------
def test_names_that_escape_alike_get_different_leases(js, nats_options, names):
    """Stream and consumer names whose escaped forms could meet (a naive escape, a separator in
    a name) must never share a lease; the same pair must."""
    bucket = f"names-{names.consumer}"
    pairs = [("A", "B_C"), ("A_B", "C"), ("A=2E", "B"), ("A", "=2EB"), ("A=3D", "B"),
             ("A=", "3DB"), ("Æ", "x"), ("=C3=86", "x"), ("a-b", "c"), ("a", "-bc")]
    leases = [ConsumerLease(nats_options, s, c, f"run-{i}", target=f"/t/{i}", bucket=bucket)
              for i, (s, c) in enumerate(pairs)]
    held: list[ConsumerLease] = []
    try:
        for lease in leases:
            held.append(lease.acquire())  # all distinct consumers: none refused
        with pytest.raises(RunRefusedError):
            ConsumerLease(nats_options, "A_B", "C", "again", target="/t/x",
                          bucket=bucket).acquire()
    finally:
        for lease in held:
            lease.release()


def test_a_holder_survives_a_sigkilled_nats_restart_and_a_successor_is_refused(tmp_path, names):
    server = LocalNatsServer(tmp_path / "nats")
    server.start()
    options = ConnectionOptions(servers=(server.url,), name="breakit", connect_timeout=2)
    try:
        held = ConsumerLease(options, names.stream, names.consumer, "holder", target="/t/a",
                             bucket="js-etl-leases").acquire()
        held.check()
        server.restart(kill=True)
        with pytest.raises(RunRefusedError, match="run holder "):
            ConsumerLease(options, names.stream, names.consumer, "successor", target="/t/b",
                          bucket="js-etl-leases").acquire()
        held.check()  # still ours: renewed across the restart
        held.release()
        with JetStreamSession(options) as js:
            assert lease_holder(js, "js-etl-leases", names.stream, names.consumer) is None
    finally:
        server.cleanup()


def test_of_successors_racing_for_a_dead_holders_lease_exactly_one_wins(js, nats_options, names):
    bucket = f"race-{names.consumer}"
    with ConsumerLease(nats_options, names.stream, names.consumer, "seed", target="/t/s",
                       bucket=bucket):
        pass
    me = LockOwner.me("dead-run", "/t/a")
    dead = replace(me, process=replace(me.process, pid_start=(me.process.pid_start or 0) - 1))
    write_record(js, bucket, names, dead)
    runs = [ConsumerLease(nats_options, names.stream, names.consumer, f"s{i}", target=f"/t/{i}",
                          bucket=bucket) for i in range(4)]
    outcomes = started_together([run.acquire for run in runs])
    winners = [o for o in outcomes.values() if isinstance(o, ConsumerLease)]
    try:
        assert len(winners) == 1, outcomes
        assert winners[0].previous is not None and winners[0].previous.run_id == "dead-run"
    finally:
        for w in winners:
            w.release()


def test_a_bucket_with_history_keeps_one_holder_and_frees_on_release_and_expiry(
        js, nats_server, nats_options, names, nats_cli):
    """`nats kv add --history 5 --ttl 2s`: several revisions per key must not confuse create,
    renewal, release or expiry."""
    bucket = f"hist-{names.consumer}"
    kv_cli(nats_cli, nats_server.url, "kv", "add", bucket, "--history", "5", "--ttl", "2s")
    first = ConsumerLease(nats_options, names.stream, names.consumer, "first", target="/t/a",
                          bucket=bucket).acquire()
    for _ in range(3):
        first.check()
    with pytest.raises(RunRefusedError, match="run first "):
        ConsumerLease(nats_options, names.stream, names.consumer, "second", target="/t/b",
                      bucket=bucket).acquire()
    first.release()
    second = ConsumerLease(nats_options, names.stream, names.consumer, "second", target="/t/b",
                           bucket=bucket).acquire()
    second.check()
    second._stop.set()  # as if SIGKILLed on another host: no renewals, no release
    second._beat.join()
    write_record(js, bucket, names, on_other_host("second-elsewhere"))
    wait_until(lambda: lease_holder(js, bucket, names.stream, names.consumer) is None,
               timeout=30, what="the abandoned lease expired")
    third = ConsumerLease(nats_options, names.stream, names.consumer, "third", target="/t/c",
                          bucket=bucket).acquire()
    third.release()
    second._session.close()


def test_a_run_whose_release_could_not_reach_nats_is_taken_over_by_this_processs_next_run(
        js, nats_server, names):
    """The release is lost (NATS unreachable at the end): the next run must not be blocked
    longer than the lease's expiry; from this very process, not at all."""
    from partition import Partition

    relay = Partition(int(nats_server.url.rsplit(":", 1)[1]))
    options = ConnectionOptions(servers=(relay.url,), name="breakit", connect_timeout=2)
    try:
        held = ConsumerLease(options, names.stream, names.consumer, "ending", target="/t/a",
                             bucket="js-etl-leases").acquire()
        relay.blocked.set()
        held.release()  # times out, warns, returns
        relay.drop()  # the delete never reaches the server
        assert lease_holder(js, "js-etl-leases", names.stream, names.consumer).run_id == "ending"
        direct = ConnectionOptions(servers=(nats_server.url,), name="breakit", connect_timeout=2)
        with ConsumerLease(direct, names.stream, names.consumer, "next", target="/t/b",
                           bucket="js-etl-leases") as taken:
            assert taken.previous is not None and taken.previous.run_id == "ending"
    finally:
        relay.close()
