"""Shared fixtures: a real nats-server per test module's needs, one SparkSession per session.

Each test gets its own stream/consumer/table names (``names`` fixture), so tests never see each
other's data even though they share one server and one Spark.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from js_etl.demo.server import LocalNatsServer
from js_etl.jetstream import ConnectionOptions, JetStreamSession
from tools.object_store import LocalS3Server

os.environ["TZ"] = "UTC"  # collect() returns naive datetimes in the process's local zone
# Delta's jars from the folder `make setup` resolved: the suite runs offline. The tests of
# Spark's own resolution (--packages, the default) take it out of their children's environment.
os.environ.setdefault("JS_ETL_JARS_DIR",
                      str(Path(__file__).resolve().parents[1] / ".jars" / "delta"))
# The JVMs the tests start (this process's SparkSession and every spark-submit and `js-etl drain`
# child: all inherit this) compile with C1 only and collect with the serial GC. They live seconds
# to minutes on a 2-core box, where C2's compiler threads cost more CPU than they save: one
# `js-etl drain` of 300 JSON messages took 38-43 CPU-s of the box with the defaults, 23-27 with
# these (busy CPU of the whole, otherwise quiet, box around the child: psutil.cpu_times; three
# runs each). Only speed changes, not what the JVM computes.
# The Spark-cluster test's executors keep the defaults: they get the README's command unchanged.
# pytest_configure (below) adds a class-data-sharing archive for those JVMs to load classes from.
_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", _JVM_OPTIONS)
_ARCHIVE_BUILD = pytest.StashKey["subprocess.Popen[bytes]"]()

# Helpers and the `stream` fixture of tests/support/streams.py (on pythonpath: pyproject).
pytest_plugins = ["streams"]

_counter = itertools.count(1)

# `JS_ETL_TEST_SPARK=connect`: the `spark` fixture is a Spark Connect client of a local Spark
# Connect server instead: the one SPARK_REMOTE names, else one it starts. The file
# tests/test_spark_connect.py runs test files again that way, in a pytest of their own: a Connect
# session switches pyspark into Connect mode for its whole process.
SPARK_MODE = os.environ.get("JS_ETL_TEST_SPARK", "classic")

# `make test` runs the suite on pytest-xdist workers (--dist worksteal; Makefile TEST_WORKERS):
# each worker is its own process with its own nats-server, SparkSession, Airflow home and (when
# a test there needs them) 3-node nats-server and Spark standalone clusters. A worker that runs
# out of tests takes half of what another has not started. The files whose tests take longest
# are put first, so no long test is left to start last: in a clean-clone run of 2026-11-25
# (--dist loadgroup, collection order) one worker ran test_cli.py's two spark-submit tests
# (59 s) at the end while the other sat idle, its tests summing to 747 s against 806 s; with
# this order the two workers' sums differed by 6 s (657 and 663). The list is by each file's
# durations in a clean-clone run (2026-11-29), by the file's longest test, longest first (the
# Spark Connect leg and the pyspark-range packages test are single tests of minutes).
_LONG_FIRST = ("test_spark_connect.py", "airflow/test_airflow_packages.py",
               "cluster/test_spark_cluster.py", "airflow/test_airflow_yarn.py",
               "streaming/test_stream_job.py", "drain/test_fault_schedules.py",
               "jetstream/test_nats_py_range.py", "test_readme.py", "tools/test_bench.py",
               "airflow/test_airflow_operator.py", "drain/test_object_storage.py",
               "drain/test_exactly_once.py", "airflow/test_airflow_queues.py",
               "backfill/test_backfill.py", "drain/test_columnar.py", "drain/test_faults.py",
               "tools/test_wheel.py", "drain/test_object_storage_faults.py")


def pytest_configure(config: pytest.Config) -> None:
    """In the pytest process that starts the others (xdist's workers inherit its environment),
    before any JVM: the tests' JVMs load Spark's and Delta's classes from one class-data-sharing
    archive (tests/support/jvm_classes.py: ~8 CPU-s less for each JVM started), built in the
    background when missing. Not for a run of tests/unit alone (no JVM there), nor where
    SPARK_SUBMIT_OPTS was set outside the tests."""
    import jvm_classes

    tests = Path(__file__).resolve().parent
    unit_only = config.args and all(
        Path(arg.split("::")[0]).resolve().is_relative_to(tests / "unit") for arg in config.args)
    if (hasattr(config, "workerinput") or unit_only
            or os.environ["SPARK_SUBMIT_OPTS"] != _JVM_OPTIONS):
        return
    archive = jvm_classes.archive_for(_JVM_OPTIONS)
    if archive is None:
        return
    if not archive.exists():
        config.stash[_ARCHIVE_BUILD] = jvm_classes.start_build(archive, _JVM_OPTIONS)
    os.environ["SPARK_SUBMIT_OPTS"] = f"{_JVM_OPTIONS} -XX:SharedArchiveFile={archive}"


def pytest_unconfigure(config: pytest.Config) -> None:
    import jvm_classes

    builder = config.stash.get(_ARCHIVE_BUILD, None)
    if builder is not None:
        jvm_classes.stop_build(builder)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).resolve().parent
    if SPARK_MODE == "connect":
        # Over Spark Connect only what runs on the session runs again, and (marker
        # connect_leg) what runs `js-etl drain` processes, given a server SPARK_REMOTE names for
        # them; the rest (NATS only: no session, or marker nats_side;
        # the classic session's JVM API: marker classic_spark) was tested once already.
        kept = [item for item in items if ("spark" in getattr(item, "fixturenames", ())
                                           or (item.get_closest_marker("connect_leg")
                                               and os.environ.get("SPARK_REMOTE")))
                and item.get_closest_marker("classic_spark") is None
                and item.get_closest_marker("nats_side") is None]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept

    def rank(item: pytest.Item) -> int:
        path = Path(item.path).resolve().relative_to(tests).as_posix()
        return _LONG_FIRST.index(path) if path in _LONG_FIRST else len(_LONG_FIRST)

    items.sort(key=rank)  # stable: each file's tests stay together, in their order


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNatsServer]:
    """One real ``nats-server -js`` on a free 127.0.0.1 port with a temporary store."""
    server = LocalNatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3Server]:
    """One real S3-compatible store (SeaweedFS, tools/object_store.py) on free 127.0.0.1 ports,
    started by the first test that asks for it."""
    server = LocalS3Server(tmp_path_factory.mktemp("s3"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server: LocalS3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket of its own; the test's process reaches the store through the AWS_*
    variables js-etl reads (a ``js-etl drain`` it starts inherits them). Returns
    ``s3://<bucket>``."""
    bucket = f"js-etl-{os.getpid()}-{next(_counter)}"
    s3_server.create_bucket(bucket)
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    return f"s3://{bucket}"


@pytest.fixture
def nats_options(nats_server: LocalNatsServer) -> ConnectionOptions:
    return ConnectionOptions(servers=(nats_server.url,), name="js-etl-tests", connect_timeout=2)


@pytest.fixture
def js(nats_options: ConnectionOptions) -> Iterator[JetStreamSession]:
    with JetStreamSession(nats_options) as session:
        yield session


@dataclass(frozen=True)
class Names:
    stream: str
    consumer: str
    subject: str  # a wildcard covering this test's subjects: "<prefix>.>"
    prefix: str


@pytest.fixture
def names() -> Names:
    n = next(_counter)
    prefix = f"t{n}"
    return Names(stream=f"S{n}", consumer=f"c{n}", subject=f"{prefix}.>", prefix=prefix)


# Spark's per-task generated projections (UnsafeProjection, SafeProjection: Delta's snapshot and
# log jobs build them for its wide action schema in every task) interpreted instead of generated:
# the session's JVM spent 53 % of its CPU samples in code generation — 20 % in
# CodeFormatter's comment-stripping regexes — which runs before Spark's code cache is consulted,
# so again in every task (JFR over tests/drain/test_exactly_once.py).
# That file alone: 181.8 CPU-s of the box with code generation, 149.1 without it (149.5 and
# 161.8 with whole-stage code generation off too: no better; one pytest process). The suite is
# CPU-bound (the box 92 % busy over a two-worker run). Only speed
# changes: Spark evaluates the same expressions either way (its own suites run both modes), and
# whole-stage code generation stays on. Every spark-submit and `js-etl drain` the tests start
# (the CLI, Airflow, cluster, demo and JVM tests) keeps Spark's default.
_SESSION_CONF = {"spark.sql.codegen.factoryMode": "NO_CODEGEN"}


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest) -> Iterator[object]:
    """The one SparkSession for the whole test session: 2 cores, and a failed task is retried
    once (local[2,2]), as a cluster would; UI off, UTC, Delta; per-task projections interpreted
    (_SESSION_CONF). With ``JS_ETL_TEST_SPARK=connect``, a client of the Spark Connect server
    ``SPARK_REMOTE`` names, else of :func:`spark_connect_server` (the same settings)."""
    if SPARK_MODE == "connect":
        from pyspark.sql import SparkSession

        given = os.environ.get("SPARK_REMOTE")  # a server the caller started
        url = given or request.getfixturevalue("spark_connect_server").url
        # As a user points js-etl's commands at a server: they run in this process too.
        os.environ["SPARK_REMOTE"] = url
        session = SparkSession.builder.remote(url).getOrCreate()
        try:
            yield session
        finally:
            session.stop()
            if not given:
                del os.environ["SPARK_REMOTE"]
        return
    from js_etl.spark.session import local_session

    session = local_session("local[2,2]", "js-etl-tests", log_level="ERROR", conf=_SESSION_CONF)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real Spark Connect server (tools/spark_connect.py) with the suite's session settings,
    started by the first test that asks for it; its clients run in processes of their own."""
    from tools.spark_connect import LocalSparkConnectServer

    with LocalSparkConnectServer(tmp_path_factory.mktemp("spark-connect"),
                                 conf=_SESSION_CONF) as server:
        yield server


# The real NATS CLI, for the tests that run every `nats …` command js-etl or the README prints.
NATS_CLI_MODULE = "github.com/nats-io/natscli/nats"
NATS_CLI_VERSION = "v0.5.1"


@pytest.fixture(scope="session")
def nats_cli() -> str:
    """Path of the ``nats`` CLI (v0.5.1), built once per checkout into ``.tools/bin`` with
    ``go install`` (the Go module proxy is reachable from CI); skipped, saying why, without Go."""
    import shutil
    import subprocess
    from pathlib import Path

    bin_dir = Path(__file__).resolve().parents[1] / ".tools" / "bin"
    cli = bin_dir / "nats"
    stamp = bin_dir / f".nats-{NATS_CLI_VERSION}"
    if cli.exists() and stamp.exists():
        return str(cli)
    go = shutil.which("go") or next(
        (str(p) for p in (Path("/usr/local/go/bin/go"), Path.home() / "go" / "bin" / "go")
         if p.exists()), None)
    if go is None:
        pytest.skip("the nats CLI tests need Go to build natscli "
                    f"{NATS_CLI_VERSION} (go install {NATS_CLI_MODULE}); go is not installed")
    bin_dir.mkdir(parents=True, exist_ok=True)
    built = subprocess.run([go, "install", f"{NATS_CLI_MODULE}@{NATS_CLI_VERSION}"],
                           env={**os.environ, "GOBIN": str(bin_dir)}, capture_output=True,
                           text=True, timeout=1800)
    if built.returncode != 0:
        pytest.fail(f"building the nats CLI failed: {built.stderr[-2000:]}")
    stamp.touch()
    return str(cli)
