"""One run at a time per consumer and table: a lock file kept with the Delta table.

Two runs on one durable consumer would split its messages between them, and a run's fence
releases (NAKs) deliveries it believes a dead run left — deadly if that run is alive. So a run
takes ``<table>/_js_etl/<consumer>.lock`` before its fence and holds it to the end. Delta ignores
``_``-prefixed folders, so the lock lives beside the data it protects.

Creation is atomic: ``O_CREAT|O_EXCL`` on local paths; Hadoop ``create(overwrite=false)``
elsewhere (atomic on HDFS and ABFS; on S3 only with conditional writes enabled — see README).
A lock is *stale* when its heartbeat is older than ``ttl``, or at once when it was taken on this
host by a process that no longer exists (a SIGKILLed run). A stale lock is taken over.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from js_etl.errors import RunRefusedError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True, slots=True)
class LockOwner:
    run_id: str
    host: str
    pid: int
    started: float
    heartbeat: float
    pin_id: str | None = None  # the priority-group pin this run holds, for a successor to UNPIN

    def alive_here(self) -> bool | None:
        """True/False when the owner ran on this host; None when we cannot tell."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class TableLock:
    """``with TableLock(spark, location, consumer, run_id, ttl=…) as lock: …``"""

    def __init__(self, spark: SparkSession, location: str, consumer: str, run_id: str, *,
                 ttl: float) -> None:
        self._files = _files_for(spark, f"{location.rstrip('/')}/_js_etl/{consumer}.lock")
        self.run_id = run_id
        self.ttl = ttl
        self.previous: LockOwner | None = None  # a dead owner we took over from
        self._owner: LockOwner | None = None

    def acquire(self) -> TableLock:
        now = time.time()
        me = LockOwner(self.run_id, socket.gethostname(), os.getpid(), now, now)
        if self._files.create_exclusive(_encode(me)):
            self._owner = me
            return self
        holder = _decode(self._files.read())
        if holder is None or not self._stale(holder):
            raise RunRefusedError(
                "another run holds this consumer: " + _describe(holder)
                + f"; lock {self._files.path} (delete it only if that run is certainly dead)")
        # Take over a dead run's lock: remove exactly what we read, then race for a fresh one.
        if self._files.read() == _encode(holder):
            self._files.delete()
        if not self._files.create_exclusive(_encode(me)):
            raise RunRefusedError(f"another run took over the stale lock {self._files.path} "
                                  "at the same moment")
        self.previous = holder
        self._owner = me
        return self

    def _stale(self, holder: LockOwner) -> bool:
        alive = holder.alive_here()
        if alive is not None:
            return not alive
        return time.time() - holder.heartbeat > self.ttl

    def heartbeat(self, *, pin_id: str | None = None) -> None:
        """Refresh the heartbeat (each round); record the pin id once the run holds one."""
        if self._owner is None:
            return
        owner = LockOwner(**{**asdict(self._owner), "heartbeat": time.time(),
                             "pin_id": pin_id or self._owner.pin_id})
        self._files.replace(_encode(owner))
        self._owner = owner

    def release(self) -> None:
        if self._owner is not None and _decode(self._files.read()) == self._owner:
            self._files.delete()
        self._owner = None

    def __enter__(self) -> TableLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _describe(owner: LockOwner | None) -> str:
    if owner is None:
        return "an unreadable lock"
    age = time.time() - owner.heartbeat
    return (f"run {owner.run_id} (pid {owner.pid} on {owner.host}, last heartbeat "
            f"{age:.0f}s ago)")


def _encode(owner: LockOwner) -> bytes:
    return json.dumps(asdict(owner), sort_keys=True).encode()


def _decode(data: bytes | None) -> LockOwner | None:
    try:
        return LockOwner(**json.loads(data or b""))
    except (ValueError, TypeError):
        return None


def _files_for(spark: SparkSession, path: str) -> Any:
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        return _LocalFile(Path(parsed.path if parsed.scheme else path))
    return _HadoopFile(spark, path)


class _LocalFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def create_exclusive(self, data: bytes) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True

    def read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def replace(self, data: bytes) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)


class _HadoopFile:
    """The same operations through Spark's Hadoop FileSystem (s3a://, abfss://, hdfs://)."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        jvm = spark._jvm  # type: ignore[attr-defined]
        self._jvm = jvm
        self._path = jvm.org.apache.hadoop.fs.Path(path)
        self._fs = self._path.getFileSystem(spark._jsc.hadoopConfiguration())  # type: ignore
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
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def replace(self, data: bytes) -> None:
        out = self._fs.create(self._path, True)
        out.write(bytearray(data))
        out.close()

    def delete(self) -> None:
        self._fs.delete(self._path, False)
