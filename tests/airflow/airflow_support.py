"""Helpers of the Airflow tests: connections as env JSON, DAG files for dag.test(), results.

Imported after ``conftest.py`` has pointed Airflow at its private home (it never imports
``airflow`` at module level itself).
"""

from __future__ import annotations

import json
import os
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DAGS_FOLDER = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
TOKEN = "tok-9f3c1e7a-not-in-any-log"
LINEAGE_FILE = Path(os.environ["AIRFLOW_HOME"]) / "openlineage.jsonl"
REPO = Path(__file__).resolve().parents[2]


def set_connection(conn_id: str, **fields: Any) -> None:
    """Define an Airflow connection the way users do in containers: AIRFLOW_CONN_<ID> JSON."""
    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(fields)


def write_dag(dag_id: str, body: str) -> Path:
    """Write a DAG file into the dags folder (dag.test() needs the DAG serialized from a file
    of its bundle) and return its path. ``body`` is dedented and appended to common imports."""
    path = DAGS_FOLDER / f"{dag_id}.py"
    header = textwrap.dedent(f'''
        from __future__ import annotations

        import json
        from datetime import datetime, timezone
        from pathlib import Path

        from airflow.sdk import DAG

        from js_etl.airflow import (JetStreamBacklogSensor, JetStreamToDeltaOperator,
                                    delta_asset)

        DAG_ID = {dag_id!r}
        FAILURES = Path({str(DAGS_FOLDER)!r}) / (DAG_ID + ".failures.jsonl")


        def record_failure(context):
            """Keep each task's failure (type and message) where the test can read it."""
            error = context["exception"]
            with FAILURES.open("a") as f:
                f.write(json.dumps({{"task_id": context["ti"].task_id,
                                    "type": type(error).__name__,
                                    "message": str(error),
                                    "chained": error.__cause__ is not None
                                    or (error.__context__ is not None
                                        and not error.__suppress_context__)}}) + "\\n")
        ''')
    path.write_text(header + textwrap.dedent(body))
    return path


def load_dag(path: Path) -> Any:
    """The one DAG of a file, parsed the way the scheduler parses it."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=path)
    assert bag.import_errors == {}, bag.import_errors
    (dag,) = bag.dags.values()
    return dag


def failures(dag_id: str) -> dict[str, dict[str, str]]:
    path = DAGS_FOLDER / f"{dag_id}.failures.jsonl"
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["task_id"]: row for row in rows}


def task_states(dag_run: Any) -> dict[str, str]:
    from airflow.utils.session import create_session

    with create_session() as session:
        return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances(session=session)}


def xcom(dag_run: Any, task_id: str, key: str = "return_value") -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id,
                                                 task_ids=task_id, key=key)).first()
        return None if row is None else XComModel.deserialize_value(row)


def lineage_events(job_name: str, event_type: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The OpenLineage events of one job (``<dag_id>.<task_id>``) and type from the file
    transport, waiting until at least one is there (the listener may emit from a child)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        found = []
        if LINEAGE_FILE.exists():
            for line in LINEAGE_FILE.read_text().splitlines():
                if not line.strip():
                    continue
                event = json.loads(line)
                if (event.get("job", {}).get("name") == job_name
                        and event.get("eventType") == event_type):
                    found.append(event)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


_ON_AIRFLOW_HOST = r"""
import json, sys
from pathlib import Path
import no_spark
no_spark.install()
from airflow_support import load_dag, task_states
dag_run = load_dag(Path(sys.argv[1])).test()
Path(sys.argv[2]).write_text(json.dumps({"states": task_states(dag_run),
                                         "run_id": dag_run.run_id, "dag_id": dag_run.dag_id}))
"""


def dag_test_on_airflow_host(path: Path) -> tuple[dict[str, str], Any]:
    """``dag.test()`` of the DAG file at ``path`` in a Python like an Airflow host's, where
    pyspark, delta-spark, deltalake, obstore, pyarrow, pandas and numpy cannot be imported
    (tests/support/no_spark.py): its task states and a handle for :func:`xcom` (with the
    run's ``log``)."""
    import subprocess
    import sys
    from types import SimpleNamespace

    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(here), str(here.parent / "support"), str(REPO)])}
    # The result in a file: on stdout, Airflow's log lines (some from other threads) could run
    # into it (seen once: the line was not found).
    result_file = path.with_suffix(".result.json")
    done = subprocess.run([sys.executable, "-c", _ON_AIRFLOW_HOST, str(path), str(result_file)],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert result_file.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(result_file.read_text())
    return result["states"], SimpleNamespace(run_id=result["run_id"], dag_id=result["dag_id"],
                                             log=done.stdout + done.stderr)


def command_lines_with(text: str) -> list[str]:
    """The command lines of the processes running now that hold ``text``."""
    import psutil

    lines = (" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))
    return [line for line in lines if text in line]


@contextmanager
def command_lines_holding(text: str) -> Iterator[set[str]]:
    """Every process command line holding ``text`` while the block runs (polled by a thread)."""
    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.update(command_lines_with(text))
            stop.wait(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()


def timed_out_drain_dag(dag_id: str, config: Path, gate: Path) -> Any:
    """A DAG whose one drain task, with an ``execution_timeout`` (an hour: a test fires it, see
    :func:`time_out_when_held`), holds after its first fetch until ``gate/release`` exists."""
    return load_dag(write_dag(dag_id, f"""
        from datetime import timedelta

        with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                 catchup=False) as dag:
            JetStreamToDeltaOperator(
                task_id="drain", config_path={str(config)!r}, nats_conn_id="nats_test",
                execution_timeout=timedelta(hours=1), on_failure_callback=record_failure,
                env_vars={{"JS_ETL_FAULT": "hold_after_fetch", "JS_ETL_FAULT_GATE": {str(gate)!r}}})
        """))


def time_out_when_held(gate: Path) -> bool:
    """Once the job holds at ``gate``, what the task's timeout alarm does when it fires: raise
    AirflowTaskTimeout in ``execute`` (run from a thread while ``dag.test()`` runs the task in
    this process). False, with the gate opened, for a job that never got there."""
    import signal

    for _ in range(6000):  # a bound for a job that fails before its first fetch
        if (gate / "held").exists():
            os.kill(os.getpid(), signal.SIGALRM)
            return True
        time.sleep(0.05)
    (gate / "release").touch()
    return False
