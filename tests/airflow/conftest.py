"""Real Airflow for the Airflow tests: a private AIRFLOW_HOME with SQLite, migrated once.

Airflow reads its configuration when it is first imported, so the environment is set here, at
conftest import, before any test module of this folder imports ``airflow``. The NATS server
of these tests requires a token, so every test that connects also proves the secret travels
from the Airflow connection to where it is used (hook, trigger, spark-submit child).
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

if "airflow" in sys.modules:  # pragma: no cover - a guard for whoever reorders imports
    raise RuntimeError("airflow was imported before tests/airflow/conftest.py set AIRFLOW_HOME")

AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="js-etl-airflow-"))
DAGS_FOLDER = AIRFLOW_HOME / "dags"
DAGS_FOLDER.mkdir()
atexit.register(shutil.rmtree, AIRFLOW_HOME, True)
os.environ.update({
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME / 'airflow.db'}",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
    # The OpenLineage provider (dev extra) emits every task's lineage events into this file;
    # it reads the transport once, when its plugin is first loaded.
    "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({
        "type": "file", "log_file_path": str(AIRFLOW_HOME / "openlineage.jsonl"),
        "append": True}),
    "AIRFLOW__OPENLINEAGE__NAMESPACE": "js-etl-tests",
})

from airflow_support import TOKEN, set_connection  # noqa: E402

from js_etl.demo.server import LocalNatsServer, free_port  # noqa: E402
from js_etl.jetstream import ConnectionOptions, JetStreamSession, Secret  # noqa: E402


def _migrate(database: Path) -> None:
    env = {**os.environ, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{database}"}
    result = subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
                            check=False, capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


@pytest.fixture(scope="session", autouse=True)
def airflow_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``airflow db migrate`` once per test run: the first pytest-xdist worker to get here
    migrates a database into the run's shared temporary folder, under a lock, and every worker
    copies it (a migration costs each worker's Airflow import anew); the home folder is removed
    at exit."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # this run's workers share it; none alone
    if run is None:
        _migrate(AIRFLOW_HOME / "airflow.db")
    else:
        shared = tmp_path_factory.getbasetemp().parent / f"airflow-db-{run}"
        shared.mkdir(exist_ok=True)
        template = shared / "airflow.db"
        with open(shared / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not template.exists():
                _migrate(shared / "migrating.db")
                os.replace(shared / "migrating.db", template)
        shutil.copyfile(template, AIRFLOW_HOME / "airflow.db")
    import airflow  # noqa: F401 - configures logging: root at INFO, on the stream of the moment

    # py4j logs "Closing down clientserver connection" at INFO from __del__ at interpreter
    # exit, when that stream (pytest's capture) is long closed: keep it at its usual level.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    yield AIRFLOW_HOME


@pytest.fixture(scope="session")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNatsServer]:
    """A real nats-server -js that only accepts TOKEN; connections ``nats_test`` (right token),
    ``nats_bad_token`` and ``nats_closed`` (a port nobody listens on) point at it."""
    server = LocalNatsServer(tmp_path_factory.mktemp("nats-token"),
                             config_text=f'authorization {{ token: "{TOKEN}" }}\n')
    server.start()
    extra = {"connect_timeout": 2, "name": "airflow-tests"}
    set_connection("nats_test", conn_type="nats", host="127.0.0.1", port=server.port,
                   extra={**extra, "token": TOKEN})
    set_connection("nats_bad_token", conn_type="nats", host="127.0.0.1", port=server.port,
                   extra={**extra, "token": "not-the-token"})
    set_connection("nats_closed", conn_type="nats", host="127.0.0.1", port=free_port(),
                   extra={"connect_timeout": 1})
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def tjs(token_server: LocalNatsServer) -> Iterator[JetStreamSession]:
    """A JetStream session on the token server, for setting up streams and publishing."""
    options = ConnectionOptions(servers=(token_server.url,), token=Secret(TOKEN),
                                connect_timeout=2)
    with JetStreamSession(options) as session:
        yield session
