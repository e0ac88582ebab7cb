"""Who holds a run's lease or lock: a process as its machine knows it, and the run's record.

A holder is certainly dead, and its hold may be taken over at once, when it was taken on this
very machine, boot and PID namespace (``/proc/sys/kernel/random/boot_id``, ``/proc/self/ns/pid``)
and its pid no longer runs the process that took it (its start time, ``/proc/<pid>/stat`` field
22, differs: a reused pid is not the owner). Two containers share a hostname but not a PID
namespace; a rebooted host keeps its hostname but not its boot id: in those cases only the
hold's expiry can tell.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _process_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class ProcessId:
    """A process as this machine knows it: enough to tell, on the same boot and PID namespace,
    that a lease's or lock's owner has died (module docstring)."""

    host: str
    pid: int
    boot_id: str | None = None
    pid_namespace: str | None = None
    pid_start: int | None = None  # the process's start time (clock ticks since boot)

    @classmethod
    def me(cls) -> ProcessId:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, _read_text("/proc/sys/kernel/random/boot_id"),
                   _pid_namespace(), _process_start(pid))

    def alive_here(self) -> bool | None:
        """True/False when this process ran in this machine's boot and PID namespace; None
        when we cannot tell (another host or container, or a platform without /proc)."""
        here = ProcessId.me()
        if None in (self.boot_id, self.pid_namespace, self.pid_start) or (
                (self.host, self.boot_id, self.pid_namespace)
                != (here.host, here.boot_id, here.pid_namespace)):
            return None
        start = _process_start(self.pid)
        if start is None:  # gone, or hidden from us (another user's, /proc with hidepid)
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return None
            return None
        return start == self.pid_start


@dataclass(frozen=True, slots=True)
class LockOwner:
    """Who holds a consumer's lease or a table's lock. Stored as one flat JSON object (the
    process's fields beside the run's), as every js-etl version has written it."""

    run_id: str
    process: ProcessId
    started: float
    heartbeat: float
    pin_id: str | None = None  # the priority-group pin this run holds, for a successor to UNPIN
    target: str | None = None  # the table the run writes
    # The run's tables as [path, catalog name] pairs, rows' table first, then the dead letters':
    # a successor's fence finishes a dead run's last round in them (js_etl.drain.run).
    tables: list[list[str | None]] | None = None

    @classmethod
    def me(cls, run_id: str, target: str | None = None,
           tables: list[list[str | None]] | None = None) -> LockOwner:
        now = time.time()
        return cls(run_id, ProcessId.me(), now, now, target=target, tables=tables)

    def describe(self) -> str:
        """``run R (pid P on H, writing T, since S, last heartbeat Ns ago)``."""
        since = datetime.fromtimestamp(self.started, UTC).isoformat(timespec="seconds")
        writing = f", writing {self.target}" if self.target else ""
        return (f"run {self.run_id} (pid {self.process.pid} on {self.process.host}{writing}, "
                f"since {since}, last heartbeat {time.time() - self.heartbeat:.0f}s ago)")

    def to_json(self) -> bytes:
        record = asdict(self)
        record.update(record.pop("process"))
        return json.dumps(record, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | None) -> LockOwner | None:
        """The owner a lock file names, or None for an unreadable one."""
        try:
            record = json.loads(data or b"")
            process = ProcessId(**{f.name: record.pop(f.name) for f in fields(ProcessId)
                                   if f.name in record})
            return cls(process=process, **record)
        except (ValueError, TypeError, AttributeError):
            return None
