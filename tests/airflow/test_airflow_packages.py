"""Delta the Spark way: with no jars folder (``JS_ETL_JARS_DIR`` unset, as for an installed
js-etl), ``js-etl drain`` and the operator's spark-submit get Delta by ``--packages`` from Maven
Central, on a machine without Maven, into a fresh Ivy cache, whatever ``~/.m2`` holds.

The two ends of the supported pyspark range run here: ``js-etl drain`` in a platform-like
environment (pyspark 4.2.1 with js-etl's ``job`` extra, no delta-spark: Delta's Python API comes
from Delta's jar), the operator on this venv's pyspark 4.2.0 (the rest of the suite's)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from airflow_support import TOKEN, load_dag, task_states, write_dag, xcom

from js_etl.demo.publish import publish, wait_for_messages
from tools.shipping import platform_env

pytestmark = pytest.mark.filterwarnings("ignore::starlette.exceptions.StarletteDeprecationWarning")

PLATFORM_PYSPARK = "4.2.1"  # the newest of the range js-etl[spark] states (pyspark>=4.2.0,<4.3)


def without_maven(path: str, tmp: Path) -> str:
    """``path`` with every folder holding ``mvn`` replaced by a copy of its links but Maven's."""
    folders = []
    for i, folder in enumerate(path.split(os.pathsep)):
        if Path(folder, "mvn").exists():
            copy = tmp / f"bin{i}"
            copy.mkdir()
            for tool in Path(folder).iterdir():
                if not tool.name.startswith("mvn"):
                    (copy / tool.name).symlink_to(tool)
            folder = str(copy)
        folders.append(folder)
    return os.pathsep.join(folders)


def test_delta_comes_by_packages_without_maven_on_both_ends_of_the_pyspark_range(
        tjs, token_server, names, tmp_path, monkeypatch):
    ivy, home = tmp_path / "ivy", tmp_path / "home"
    # A POM without its jar, as an interrupted `mvn` leaves it: Spark's default Ivy chain reads
    # ~/.m2 first and fails on such; js-etl's Ivy settings go to Maven Central.
    pom_dir = home / ".m2" / "repository" / "io" / "delta" / "delta-spark_4.2_2.13" / "4.4.0"
    pom_dir.mkdir(parents=True)
    (pom_dir / "delta-spark_4.2_2.13-4.4.0.pom").write_text("<project/>")
    monkeypatch.delenv("JS_ETL_JARS_DIR")
    monkeypatch.setenv("PATH", without_maven(os.environ["PATH"], tmp_path))
    monkeypatch.setenv("HOME", str(home))
    assert shutil.which("mvn") is None

    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    tjs.run(publish(tjs.conn, [(f"{names.prefix}.e", b'{"id": %d}' % i) for i in range(50)]))
    tjs.run(wait_for_messages(tjs.conn, names.stream, 50))
    table = tmp_path / "table"
    config = tmp_path / "job.yaml"
    config.write_text(
        f"nats: {{servers: ['{token_server.url}'], token_env: NATS_TOKEN}}\n"
        f"source: {{stream: {names.stream}, consumer: {names.consumer}, create_consumer: true}}\n"
        "fetch: {partitions: 2, batch: 100, pull_timeout: 2}\n"
        f"target: {{path: '{table}'}}\n"
        f"spark: {{master: 'local[2]', conf: {{spark.jars.ivy: '{ivy}',"
        " spark.sql.shuffle.partitions: 2, spark.databricks.delta.snapshotPartitions: 2}}\n")

    # The platform end: its own pyspark, js-etl[job], `js-etl drain` starting local Spark.
    python = platform_env(tmp_path / "platform", PLATFORM_PYSPARK)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME")}
    env.update(NATS_TOKEN=TOKEN, SPARK_SUBMIT_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    drained = subprocess.run([str(python), "-m", "js_etl.cli", "drain", "--config", str(config)],
                             capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert drained.returncode == 0, drained.stdout[-3000:] + drained.stderr[-3000:]
    report = json.loads(drained.stdout.strip().splitlines()[-1])
    assert report["messages_written"] == 50
    assert list((ivy / "jars").glob("io.delta_delta-spark_4.2_2.13-4.4.0.jar"))

    # The operator's end: this venv's pyspark, spark-submit with --packages from the same cache.
    tjs.run(publish(tjs.conn, [(f"{names.prefix}.e", b'{"id": %d}' % i)
                               for i in range(50, 80)]))
    tjs.run(wait_for_messages(tjs.conn, names.stream, 80))
    dag = load_dag(write_dag(f"packages_{names.stream}", f"""
        with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                 catchup=False) as dag:
            JetStreamToDeltaOperator(
                task_id="drain", config_path={str(config)!r}, nats_conn_id="nats_test",
                master="local[2]", conf={{"spark.jars.ivy": {str(ivy)!r}}})
        """))
    dag_run = dag.test()
    assert task_states(dag_run) == {"drain": "success"}
    assert xcom(dag_run, "drain")["messages_written"] == 30

    from deltalake import DeltaTable  # an independent reader of what both runs committed

    seqs = DeltaTable(str(table)).to_pyarrow_table(columns=["seq"]).column("seq").to_pylist()
    assert sorted(seqs) == list(range(1, 81))
