"""Fixtures of the clustered tests: one 3-node JetStream cluster per test session, and one Spark
standalone cluster (a master, two 1-core workers; tools/spark_cluster.py) with js-etl packed
for its executors (tools/shipping.py). test_bench_cluster.py's real run starts its own
cluster through ``js-etl bench --cluster``, as users do.

Every test here is marked ``cluster`` (``make test-cluster`` runs only them; ``make test`` runs
them with the rest). The 13 JetStream-cluster tests took 143 s on the shared 2-core box; the
JetStream cluster takes about 2.3 s to start (3 processes, a meta leader elected; measured with
``tests/support/nats_cluster.py``). The Spark-cluster test (test_spark_cluster.py: two
spark-submit runs, a worker killed between them) took 245 s beside a soak (load ~6): 26 s to
start the Spark cluster and pack the executors' environment (cached: ~3 s for the wheel), 210 s
for the test, 9 s to stop and delete the executors' unpacked environments.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from nats_cluster import NatsCluster

from js_etl.jetstream import JetStreamSession
from tools.shipping import build_wheel, packed_env
from tools.spark_cluster import SparkCluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    """Three real ``nats-server`` nodes, clustered, each with its own store, stopped by pid."""
    cluster = NatsCluster(tmp_path_factory.mktemp("nats-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cjs(nats_cluster: NatsCluster) -> Iterator[JetStreamSession]:
    """A session connected to the cluster (any node; it may move on a node's death)."""
    with JetStreamSession(nats_cluster.options()) as session:
        yield session


# The cluster's JVMs (master, workers, executors) compile with C1 only and collect with the
# serial GC, as the other JVMs of the tests do (tests/conftest.py), without the class-data
# archive, which is built for the driver's class path. The submit command is the README's.
CLUSTER_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A Spark standalone master and two 1-core, 1 GiB workers (tools/spark_cluster.py),
    loopback only, stopped by pid with their executors."""
    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1,
                           memory="1g", jvm_options=CLUSTER_JVM_OPTIONS)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def executor_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """js-etl's wheel packed with the executors' dependencies (tools/shipping.py), for
    ``--archives <it>#environment``; cached in .cache/executor-env by the wheel's contents."""
    return packed_env(build_wheel(tmp_path_factory.mktemp("wheel")))
