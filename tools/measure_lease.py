"""What the consumer lease costs and how soon a dead holder's entry goes (docs/design/
consumer-lease.md): a local nats-server and a 3-node cluster, started and stopped here.

    .venv/bin/python tools/measure_lease.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from js_etl.demo.server import LocalNatsServer
from js_etl.durable.lease import ConsumerLease
from js_etl.jetstream import ConnectionOptions, JetStreamSession
from js_etl.jetstream.kv import KeyValue

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from nats_cluster import NatsCluster  # a test helper, started as the tests start it


def lease_costs(options: ConnectionOptions, label: str, replicas: int) -> None:
    bucket = f"measure-{label}"
    started = time.perf_counter()
    lease = ConsumerLease(options, "S", "c", "first", target="/t", bucket=bucket,
                          replicas=replicas).acquire()
    created = time.perf_counter() - started
    checks = []
    for _ in range(50):
        started = time.perf_counter()
        lease.check()
        checks.append(time.perf_counter() - started)
    lease.release()
    started = time.perf_counter()
    ConsumerLease(options, "S", "c", "second", target="/t", bucket=bucket).acquire().release()
    again = time.perf_counter() - started
    checks.sort()
    print(f"{label}: acquire {created * 1e3:.1f} ms creating the bucket, {again * 1e3:.1f} ms "
          f"with it; check (a renewal) median {statistics.median(checks) * 1e3:.2f} ms, "
          f"p90 {checks[44] * 1e3:.2f} ms")


def expiry(options: ConnectionOptions, ttl: float = 2.0) -> None:
    with JetStreamSession(options) as js:
        kv = KeyValue(js.conn, "measure-expiry")
        js.run(kv.ensure(ttl=ttl, replicas=1))
        for _ in range(3):
            js.run(kv.update("k", b"x", 0))
            written = time.monotonic()
            while js.run(kv.get("k")) is not None:
                time.sleep(0.01)
            print(f"an entry of a {ttl:g} s bucket gone {time.monotonic() - written:.2f} s "
                  "after its write")


def main() -> None:
    with tempfile.TemporaryDirectory() as store:
        server = LocalNatsServer(Path(store))
        server.start()
        try:
            options = ConnectionOptions(servers=(server.url,), connect_timeout=2)
            lease_costs(options, "R1", 1)
            expiry(options)
        finally:
            server.stop()
    cluster = NatsCluster()
    cluster.start()
    try:
        lease_costs(cluster.options(), "R3", 3)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
