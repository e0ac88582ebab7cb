"""One run at a time per durable consumer, whatever table it writes: a lease kept in NATS.

Two runs on one consumer split its messages between them, and a run's fence releases (NAKs)
the deliveries it believes a dead run left: with the other run alive, both commit some messages
and the same sequences land in two tables. A lock in the table's directory cannot see a run
that writes another table, so the exclusion lives beside the consumer: an entry keyed by stream
and consumer in a key-value bucket (``source.lease_bucket``, default ``js-etl-leases``), holding the
holder's record (:class:`~js_etl.durable.owner.LockOwner`: run, host, pid, target, since when).

What it relies on:

* **Create-only, revision-checked writes** (``Nats-Expected-Last-Subject-Sequence``): of two
  runs that start together exactly one creates the entry; a renewal names the revision it last
  wrote, so a run whose lease was taken over (or expired) fails its next renewal.
* **An expiry a dead run cannot outlive**: the bucket's ``max_age`` (``TTL``), counted by the
  server from the entry's last write. A live run renews every ``TTL / 10``; a SIGKILLed one's
  entry is gone ``TTL`` after its last renewal. A holder that certainly died (:func:`_dead`) is
  taken over at once, by a write naming its revision.
* **A renewal before every fence, commit and ack block** (:meth:`ConsumerLease.check`): the
  server has just confirmed the lease, so it holds for a whole ``TTL`` from the check. What
  remains is a run stalled for longer than ``TTL`` between a check and the step it guards
  (a suspended VM): then a successor may run meanwhile, as with any lease.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from js_etl.durable.owner import LockOwner, ProcessId
from js_etl.errors import ConfigError, RunRefusedError, TransientError
from js_etl.jetstream.errors import (
    AuthorizationError,
    StreamNotFoundError,
    WrongLastSequenceError,
)
from js_etl.jetstream.kv import KeyValue, KvEntry, key_token
from js_etl.jetstream.options import ConnectionOptions
from js_etl.jetstream.sync import JetStreamSession

log = logging.getLogger("js_etl.lease")

# The runs of this process that hold a lease now: a record naming this process and another run
# is a run of this process that ended without releasing its lease (NATS was unreachable then).
_HELD: set[str] = set()

TTL = 60.0  # seconds: a new bucket's max_age, the lease's expiry
ANSWER_SECONDS = 30.0  # how long taking the lease waits for the bucket to answer at all


def lease_key(stream: str, consumer: str) -> str:
    return f"{key_token(stream)}.{key_token(consumer)}"


def lease_holder(js: JetStreamSession, bucket: str, stream: str, consumer: str
                 ) -> LockOwner | None:
    """Who holds the consumer's lease now (None: nobody, or no bucket yet), without taking it."""
    try:
        entry = js.run(KeyValue(js.conn, bucket).get(lease_key(stream, consumer)))
    except StreamNotFoundError:
        return None
    return _holder(entry)


def refuse_if_held(js: JetStreamSession, bucket: str, stream: str, consumer: str) -> None:
    """Raise the refusal a run would meet now (a run is refused before its JVM starts); the
    lease itself is taken by the run (:class:`ConsumerLease`)."""
    holder = lease_holder(js, bucket, stream, consumer)
    if holder is not None and not _dead(holder):
        raise _refusal(holder, stream, consumer, bucket, None)


def _refusal(holder: LockOwner, stream: str, consumer: str, bucket: str,
             ttl: float | None) -> RunRefusedError:
    expiry = f"{ttl:g}s" if ttl else "the bucket's max age"
    return RunRefusedError(
        f"another run holds this consumer ({stream}/{consumer}): {holder.describe()}; its "
        f"lease ({bucket} {lease_key(stream, consumer)}) expires {expiry} after its last "
        "heartbeat")


def _holder(entry: KvEntry | None) -> LockOwner | None:
    if entry is None or entry.deleted:
        return None
    # An unreadable record still holds the consumer: it names a run js-etl cannot describe.
    return LockOwner.from_json(entry.value) or LockOwner("?", ProcessId("?", 0), 0.0, 0.0)


def bucket_problem(max_age: float, storage: str | None) -> str | None:
    """Why a bucket cannot hold leases: entries that never expire hold a dead run's consumer for
    ever; memory storage forgets every live lease when the server restarts."""
    if max_age <= 0:
        return "has no max age (nats kv add without --ttl): a dead run's lease would never expire"
    if storage != "file":
        return (f"keeps its entries in {storage} storage: a server restart would forget the "
                "leases of live runs")
    return None


def _until_answered(call: Callable[[], None], seconds: float) -> None:
    """``call()``, asked again while NATS does not answer (a transient error other than a
    refusal), for up to ``seconds``."""
    give_up = time.monotonic() + seconds
    while True:
        try:
            return call()
        except TransientError as e:
            if isinstance(e, RunRefusedError) or time.monotonic() > give_up:
                raise
            time.sleep(min(0.5, seconds / 20))


def _dead(holder: LockOwner) -> bool:
    """The holder certainly died: on this machine (:meth:`ProcessId.alive_here`), or it is an
    earlier run of this very process that no longer holds it."""
    if holder.process == ProcessId.me():
        return holder.run_id not in _HELD
    return holder.process.alive_here() is False


class ConsumerLease:
    """``with ConsumerLease(options, "ORDERS", "drain", run_id, target=...) as lease: …``

    Refuses (:class:`RunRefusedError`, exit 73) while another live run holds the consumer. Its
    own connection: renewals go on while the run's session is busy in a long Spark phase.
    """

    def __init__(self, options: ConnectionOptions, stream: str, consumer: str, run_id: str, *,
                 target: str, bucket: str, replicas: int = 1,
                 tables: list[list[str | None]] | None = None) -> None:
        self.options = options
        self.stream, self.consumer = stream, consumer
        self.key = lease_key(stream, consumer)
        self.bucket = bucket
        self.replicas = replicas
        self.me = LockOwner.me(run_id, target, tables)
        self.ttl = TTL
        self.previous: LockOwner | None = None  # a dead holder this run took over from
        self._revision = 0
        self._lost: str | None = None
        self._session: JetStreamSession | None = None
        self._using = threading.Lock()  # the session is used by one thread at a time
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> ConsumerLease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> ConsumerLease:
        _HELD.add(self.me.run_id)  # before its record can exist (see _dead)
        try:
            self._session = JetStreamSession(self.options)
            try:
                # A bucket created a moment ago on a cluster, or one electing a leader, does
                # not answer yet.
                _until_answered(self._take, ANSWER_SECONDS)
            except BaseException:
                self._session.close()
                self._session = None
                raise
        except BaseException:
            _HELD.discard(self.me.run_id)
            raise
        self._stop.clear()
        self._beat = threading.Thread(target=self._renewals, name="js-etl-lease", daemon=True)
        self._beat.start()
        return self


    def _take(self) -> None:
        js = self._session
        assert js is not None
        kv = KeyValue(js.conn, self.bucket)
        try:
            bucket = js.run(kv.ensure(ttl=TTL, replicas=self.replicas))
        except AuthorizationError as e:
            raise AuthorizationError(
                f"cannot use the lease bucket {self.bucket!r} ({e.description}): allow this user "
                f"$JS.API.STREAM.*.KV_{self.bucket} and $KV.{self.bucket}.>, or create it "
                f"(nats kv add {self.bucket} --ttl {TTL:g}s) and allow $KV.{self.bucket}.>",
                code=e.code, err_code=e.err_code) from None
        problem = bucket_problem(bucket.max_age, bucket.storage)
        if problem:
            raise ConfigError(
                f"the lease bucket {self.bucket!r} {problem}: delete it (nats kv del "
                f"{self.bucket} -f) and let js-etl create it, or create it with nats kv add "
                f"{self.bucket} --ttl {TTL:g}s --replicas {self.replicas}")
        self.ttl = bucket.max_age
        me = replace(self.me, heartbeat=time.time())
        try:
            self._revision = js.run(kv.create(self.key, me.to_json()))
            return
        except WrongLastSequenceError:
            pass
        entry = js.run(kv.get(self.key))
        holder = _holder(entry)
        if entry is None or holder is None:  # gone since: it expired or was released
            self._revision = js.run(kv.create(self.key, me.to_json()))
            return
        if holder.run_id == me.run_id and holder.process == me.process:
            self._revision = entry.revision  # our own create, whose answer was lost
            return
        if not _dead(holder):
            raise _refusal(holder, self.stream, self.consumer, self.bucket, self.ttl)
        try:  # the holder is certainly dead: take its lease over, exactly that revision
            self._revision = js.run(kv.update(self.key, me.to_json(), entry.revision))
        except WrongLastSequenceError:
            raise RunRefusedError(f"another run took over the lease of consumer {self.stream}/"
                                  f"{self.consumer} at the same moment") from None
        self.previous = holder
        log.warning("took over the lease of %s/%s from a dead run: %s", self.stream,
                    self.consumer, holder.describe())

    def _renew(self, **changes: object) -> None:
        """Rewrite our record with a fresh heartbeat, naming the revision we last wrote."""
        with self._using:
            if self._lost:
                raise RunRefusedError(self._lost)
            js = self._session
            assert js is not None, "the lease is not held"
            record = replace(self.me, heartbeat=time.time(), **changes)  # type: ignore[arg-type]
            kv = KeyValue(js.conn, self.bucket)
            try:
                try:
                    self._revision = js.run(kv.update(self.key, record.to_json(),
                                                      self._revision))
                except WrongLastSequenceError:
                    # Ours still when an earlier renewal was applied but answered too late (a
                    # timeout, a leader change after the write): write again on its revision.
                    entry = js.run(kv.get(self.key))
                    holder = _holder(entry)
                    if entry is None or holder is None or (holder.run_id, holder.process) != (
                            self.me.run_id, self.me.process):
                        raise
                    self._revision = js.run(kv.update(self.key, record.to_json(),
                                                      entry.revision))
            except WrongLastSequenceError:
                self._lost = (f"this run lost its lease on consumer {self.stream}/"
                              f"{self.consumer} (it expired or another run took it): stopping "
                              "before it commits or acks anything more")
                raise RunRefusedError(self._lost) from None
            self.me = record

    def _renewals(self) -> None:
        while not self._stop.wait(self.ttl / 10):
            try:
                self._renew()
            except RunRefusedError:
                return  # check() says so before the next commit or ack
            except Exception as e:  # an outage or a leader election: try again next beat
                log.warning("lease renewal failed (next try in %.0fs): %s", self.ttl / 10, e)

    def check(self) -> None:
        """Renew now, or raise: :class:`RunRefusedError` if the lease was lost, a transient
        error if NATS cannot confirm it within half the TTL (before fences, commits, acks)."""
        _until_answered(self._renew, self.ttl / 2)

    def record(self, *, pin_id: str | None) -> None:
        """Record the pin id once the run holds one (a successor UNPINs it)."""
        if pin_id and pin_id != self.me.pin_id:
            self._renew(pin_id=pin_id)

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        js, self._session = self._session, None
        if js is None:
            return
        try:
            if not self._lost:
                js.run(KeyValue(js.conn, self.bucket).delete(self.key, self._revision))
        except Exception as e:  # it expires on its own; do not mask the run's outcome
            log.warning("could not release the lease of %s/%s (it expires in %.0fs): %s",
                        self.stream, self.consumer, self.ttl, e)
        finally:
            js.close()
            _HELD.discard(self.me.run_id)

