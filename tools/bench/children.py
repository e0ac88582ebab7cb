"""The process harness of the bench: spawned leg processes that report ready and wait for one
start signal (so set-up is never timed), and the RSS/CPU sampler over the whole process tree."""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tools.bench.settings import SAMPLE_SECONDS, MiB


@dataclass
class _Seen:
    category: str
    first_cpu: float
    last_cpu: float


class RssSampler:
    """Samples RSS (and CPU time) of this process and all its descendants on a thread.

    Categories: ``driver`` (the process running the drain, ``driver_pid``), ``jvm``, ``workers``
    (other Python processes, or only ``worker_pids`` and their children), ``server``
    (nats-server), ``bench`` (this process when it is not the driver), ``other``, and ``store``
    (the object store's process, ``store_pid``: SeaweedFS, when tables are on S3). Peaks are per
    category; ``total`` is driver + JVM + workers at the same instant. The store's CPU is kept
    apart from ``ours``: it serves the tables of every leg, it is no leg's own work.
    """

    def __init__(self, interval: float = SAMPLE_SECONDS) -> None:
        import psutil

        self._psutil = psutil
        self.root = psutil.Process()
        self.interval = interval
        self.driver_pid: int | None = os.getpid()
        self.worker_pids: set[int] | None = None
        self.store_pid: int | None = None
        self._lock = threading.Lock()
        self._peaks: dict[str, int] = {}
        self._seen: dict[tuple[int, float], _Seen] = {}
        self._since = time.monotonic()
        self._wall_since = time.time()
        self._box0 = psutil.cpu_times()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def _category(self, proc: Any) -> str:
        if proc.pid == self.driver_pid:
            return "driver"
        if proc.pid == self.root.pid:
            return "bench"
        if proc.pid == self.store_pid:
            return "store"
        name = proc.name()
        if name.startswith("java"):
            return "jvm"
        if name.startswith("nats-server"):
            return "server"
        if "python" in name:
            if self.worker_pids is not None:  # only the leg's own processes and their children
                mine = proc.pid in self.worker_pids or any(
                    parent.pid in self.worker_pids for parent in proc.parents())
                return "workers" if mine else "other"
            cmdline = " ".join(proc.cmdline())
            return "other" if "resource_tracker" in cmdline else "workers"
        return "other"

    def sample(self) -> None:
        psutil = self._psutil
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        sums: dict[str, int] = {}
        with self._lock:
            for proc in procs:
                try:
                    with proc.oneshot():
                        key = (proc.pid, proc.create_time())
                        rss = proc.memory_info().rss
                        cpu = sum(proc.cpu_times()[:2])
                        seen = self._seen.get(key)
                        if seen is None:
                            born_before = proc.create_time() < self._wall_since
                            seen = self._seen[key] = _Seen(self._category(proc),
                                                           cpu if born_before else 0.0, cpu)
                        seen.last_cpu = cpu
                except psutil.Error:
                    continue
                sums[seen.category] = sums.get(seen.category, 0) + rss
            sums["total"] = sum(sums.get(c, 0) for c in ("driver", "jvm", "workers"))
            for category, value in sums.items():
                self._peaks[category] = max(self._peaks.get(category, 0), value)

    def reset(self, driver_pid: int | None, worker_pids: Sequence[int] | None = None) -> None:
        """Start a new measurement window (peaks and CPU from now on). ``worker_pids``: count
        only these processes (and their children) as workers, e.g. a baseline's processes while
        Spark's idle Python workers are still around; None: every other Python descendant."""
        with self._lock:
            self.driver_pid = driver_pid
            self.worker_pids = set(worker_pids) if worker_pids is not None else None
            self._peaks = {}
            self._seen = {}
            self._since = time.monotonic()
            self._wall_since = time.time()
            self._box0 = self._psutil.cpu_times()
        self.sample()

    def snapshot(self) -> dict[str, Any]:
        """Peaks (MiB) and CPU seconds of the window so far."""
        self.sample()
        with self._lock:
            peaks = {k: round(v / MiB, 1) for k, v in self._peaks.items()}
            by_kind: dict[str, float] = {}
            for seen in self._seen.values():
                by_kind[seen.category] = (by_kind.get(seen.category, 0.0)
                                          + seen.last_cpu - seen.first_cpu)
            store = by_kind.pop("store", 0.0)
            ours = sum(by_kind.values())
            box1 = self._psutil.cpu_times()
            busy = _busy(box1) - _busy(self._box0)
            wall = time.monotonic() - self._since
        cpus = self._psutil.cpu_count() or 1
        return {
            "peak_rss_mib": {k: peaks.get(k, 0.0) for k in
                             ("driver", "jvm", "workers", "total", "server", "store")},
            "cpu_seconds": {"ours": round(ours, 2), "server": round(by_kind.get("server", 0.0), 2),
                            "store": round(store, 2),
                            "box_busy": round(busy, 2), "box_available": round(wall * cpus, 2),
                            "others": round(max(busy - ours - store, 0.0), 2),
                            "by_kind": {kind: round(cpu, 2) for kind, cpu in sorted(
                                by_kind.items())}},
        }


def _busy(times: Any) -> float:
    idle = times.idle + getattr(times, "iowait", 0.0)
    return sum(times) - idle - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


# --- child processes -----------------------------------------------------------------------
def _spawn() -> Any:
    return multiprocessing.get_context("spawn")


def run_children(target: Callable[..., None], arg_lists: Sequence[tuple[Any, ...]], *,
                 timeout: float, before_go: Callable[[list[Any], list[int]], None] | None = None,
                 on_event: Callable[[str, int, Any], None] | None = None) -> list[dict[str, Any]]:
    """Start one spawned process per argument tuple; each calls ``target(index, *args, events,
    go)``, puts ``("ready", index, info)`` once set up, waits for ``go``, then puts
    ``("done", index, result)`` (or ``("error", index, text)`` at any point). ``before_go``
    gets the ready infos and the pids. Returns the results in index order; raises RuntimeError
    if a process fails. Every process is joined, and stopped by its own handle if it hangs."""
    ctx = _spawn()
    events = ctx.Queue()
    go = ctx.Event()
    procs = [ctx.Process(target=target, args=(i, *args, events, go), daemon=True,
                         name=f"js-etl-bench-{i}") for i, args in enumerate(arg_lists)]
    results: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    finished = False

    def next_event() -> tuple[str, int, Any]:
        while True:
            try:
                kind, index, value = events.get(timeout=0.5)
            except queue.Empty:
                for i, proc in enumerate(procs):
                    if proc.exitcode is not None and i not in results:
                        raise RuntimeError(f"bench process {i} exited with {proc.exitcode} "
                                           "before reporting") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bench processes did not finish in {timeout:.0f}s"
                                       ) from None
                continue
            if kind == "error":
                raise RuntimeError(f"bench process {index}: {value}")
            if on_event is not None:
                on_event(kind, index, value)
            return kind, index, value

    try:
        for proc in procs:
            proc.start()
        infos: dict[int, Any] = {}
        while len(infos) < len(procs):
            kind, index, value = next_event()
            if kind == "ready":
                infos[index] = value
        if before_go is not None:
            before_go([infos[i] for i in range(len(procs))], [p.pid or 0 for p in procs])
        go.set()
        while len(results) < len(procs):
            kind, index, value = next_event()
            if kind == "done":
                results[index] = value
        finished = True
        return [results[i] for i in range(len(procs))]
    finally:
        for proc in procs:
            proc.join(timeout=30 if finished else 0.1)
            if proc.is_alive():
                proc.terminate()
                proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        events.close()
        events.join_thread()


