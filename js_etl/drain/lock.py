"""One run at a time per consumer and table: a lock file kept with the Delta table.

The consumer itself is held in NATS (:mod:`js_etl.durable.lease`), whatever the table; this lock
keeps out a second writer of the same consumer name into one table from elsewhere (another NATS
account or server). A run takes ``<table>/_js_etl/<consumer>.lock`` before its fence and holds it
to the end. Delta ignores ``_``-prefixed folders, so the lock lives beside the data it protects.

Creation is atomic: ``O_CREAT|O_EXCL`` on local paths, a PUT with ``If-None-Match: *`` on an
object store (s3://, s3a://), Hadoop ``create(overwrite=false)`` elsewhere (atomic on HDFS and
ABFS).

When is a lock stale, so that a new run may take it over?

* Its heartbeat is older than ``ttl``. A background thread rewrites the heartbeat every
  ``ttl / 10`` seconds for the whole run, so a long round never looks dead.
* Or, at once, when the owner certainly died (:mod:`js_etl.durable.owner`).

A run that lost its lock (its heartbeat stalled past ``ttl`` — a suspended VM, a stopped
process — and another run took over) must not commit or ack: :meth:`TableLock.check` runs before
every commit and every ack block and raises :class:`RunRefusedError` then.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from js_etl.delta.rules import object_store_url
from js_etl.delta.store import TableFiles
from js_etl.durable.owner import LockOwner
from js_etl.errors import ConfigError, RunRefusedError, TerminalError
from js_etl.spark.session import hadoop_path, is_connect, java_class

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("js_etl.lock")

LOCK_TTL = 60.0  # seconds without a heartbeat after which a lock is stale


class TableLock:
    """``with TableLock(spark, location, consumer, run_id) as lock: …``"""

    def __init__(self, spark: SparkSession, location: str, consumer: str, run_id: str, *,
                 ttl: float = LOCK_TTL) -> None:
        self._files = _files_for(spark, f"{location.rstrip('/')}/_js_etl/{consumer}.lock")
        self.run_id = run_id
        self.ttl = ttl
        self._owner: LockOwner | None = None
        self._lost: str | None = None  # why we no longer own the lock
        self._writing = threading.Lock()  # the heartbeat thread and record() both rewrite it
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def acquire(self) -> TableLock:
        me = LockOwner.me(self.run_id)
        created, holder = self._create(me)
        if not created:
            if holder is None or not self._stale(holder):
                raise RunRefusedError(
                    "another run holds this consumer: " + _describe(holder)
                    + f"; lock {self._files.path} (delete it only if that run is certainly "
                    "dead)")
            # Take over a dead run's lock: remove exactly what we read, then race for a new one.
            if LockOwner.from_json(self._files.read()) == holder:
                self._files.delete()
            if not self._create(me)[0]:
                raise RunRefusedError(f"another run took over the stale lock {self._files.path} "
                                      "at the same moment")
        self._owner = me
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeats, name="js-etl-lock-heartbeat",
                                      daemon=True)
        self._beat.start()
        return self

    def _create(self, me: LockOwner) -> tuple[bool, LockOwner | None]:
        """Create the lock as ``me``: ``(True, me)``, or ``(False, the holder read)``.

        On an object store the create may land while its answer is lost: a reset, or a 5xx
        that the client retries into a 412 (the key exists — ours). So whatever the create said
        (refused, or raised), the lock is read back: where it names this run's id, unique to
        the run, the create landed and the lock is ours. A create that raised and left no lock
        of ours raises its error."""
        try:
            if self._files.create_exclusive(me.to_json()):
                return True, me
            error: Exception | None = None
        except Exception as e:  # the store's client: whether the PUT landed is unknown
            error = e
        holder = LockOwner.from_json(self._files.read())
        if holder is not None and holder.run_id == me.run_id:
            log.warning("the lock %s is this run's own: its create landed, the answer was "
                        "lost (%s)", self._files.path,
                        str(error).splitlines()[0] if error else "a retry found it there")
            return True, holder
        if error is not None:
            raise error
        return False, holder

    def _stale(self, holder: LockOwner) -> bool:
        if holder.process.alive_here() is False:
            return True
        return time.time() - holder.heartbeat > self.ttl

    def _heartbeats(self) -> None:
        while not self._stop.wait(self.ttl / 10):
            try:
                self._rewrite()
            except Exception as e:  # a storage hiccup: try again next beat
                log.warning("lock heartbeat failed (next try in %.0fs): %s", self.ttl / 10, e)

    def _rewrite(self) -> None:
        """Write our owner record with a fresh heartbeat, unless someone else owns the lock."""
        with self._writing:
            if self._owner is None or self._lost:
                return
            holder = LockOwner.from_json(self._files.read())
            if holder is None or holder.run_id != self._owner.run_id:
                self._lost = f"the lock now holds {_describe(holder)}"
                return
            owner = replace(self._owner, heartbeat=time.time())
            self._files.replace(owner.to_json())
            self._owner = owner

    def check(self) -> None:
        """Raise RunRefusedError unless this run still owns the lock (before commits and acks)."""
        with self._writing:  # never read our own half-written heartbeat
            if self._owner is None:
                return
            holder = LockOwner.from_json(self._files.read())
            if holder is None or holder.run_id != self._owner.run_id:
                self._lost = self._lost or f"the lock now holds {_describe(holder)}"
        if self._lost:
            raise RunRefusedError(f"this run lost its lock {self._files.path} ({self._lost}): "
                                  "stopping before it commits or acks anything more")

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        with self._writing:
            if self._owner is not None and not self._lost:
                holder = LockOwner.from_json(self._files.read())
                if holder is not None and holder.run_id == self._owner.run_id:
                    self._files.delete()
            self._owner = None

    def __enter__(self) -> TableLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _describe(owner: LockOwner | None) -> str:
    return "an unreadable lock" if owner is None else owner.describe()


def _files_for(spark: SparkSession, path: str) -> Any:
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        return _TableFile(parsed.path if parsed.scheme else path)
    if object_store_url(path):
        return _TableFile(path)
    if is_connect(spark):
        raise ConfigError(f"over Spark Connect the drain keeps its lock and reads its tables "
                          f"from the client, which has no Hadoop for {path}: use a local path "
                          "the client and the server share, or an s3:// URL")
    return _HadoopFile(spark, path)


class _TableFile:
    """The lock's file on the local disk (``O_EXCL``) or in an object store (a PUT with
    ``If-None-Match: *``), through :class:`~js_etl.delta.store.TableFiles`."""

    def __init__(self, path: str) -> None:
        self.path = path
        folder, self._name = path.rsplit("/", 1)
        self._files = TableFiles(folder)

    def create_exclusive(self, data: bytes) -> bool:
        try:
            return self._files.create(self._name, data)
        except OSError as e:  # under a regular file, in /proc, no permission: fix the path
            raise TerminalError(f"cannot create the run's lock {self.path} ({e.strerror}): "
                                "the target must be a writable directory") from None

    def read(self) -> bytes | None:
        return self._files.read(self._name)

    def replace(self, data: bytes) -> None:
        self._files.replace(self._name, data)

    def delete(self) -> None:
        self._files.remove(self._name)


class _HadoopFile:
    """The same operations through Spark's Hadoop FileSystem (s3a://, abfss://, hdfs://)."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        self._io_utils = java_class(spark, "org.apache.commons.io.IOUtils")
        self._path, self._fs = hadoop_path(spark, path)
        self.path = path

    def create_exclusive(self, data: bytes) -> bool:
        try:
            out = self._fs.create(self._path, False)
        except Exception as e:  # FileAlreadyExistsException arrives as a Py4JJavaError
            if "AlreadyExists" in str(e) or "already exists" in str(e):
                return False
            raise
        out.write(bytearray(data))
        out.close()
        return True

    def read(self) -> bytes | None:
        if not self._fs.exists(self._path):
            return None
        stream = self._fs.open(self._path)
        try:
            return bytes(self._io_utils.toByteArray(stream))
        finally:
            stream.close()

    def replace(self, data: bytes) -> None:
        out = self._fs.create(self._path, True)
        out.write(bytearray(data))
        out.close()

    def delete(self) -> None:
        self._fs.delete(self._path, False)
