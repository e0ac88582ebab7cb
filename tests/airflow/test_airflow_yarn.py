"""The operator in cluster deploy mode on a real YARN (Hadoop's MiniYARNCluster, tools/yarn.py),
as docs/airflow.md's "Cluster deploy mode" shows it: the driver runs in a YARN container, the
NATS token reaches it as a file, the run report comes back through report_dir into XCom, and the
token is on no command line — neither in the process table while the task runs nor in the
launch context of any of the application's containers."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from airflow_support import (
    REPO,
    TOKEN,
    command_lines_holding,
    load_dag,
    task_states,
    write_dag,
    xcom,
)

from js_etl.demo.publish import publish, wait_for_messages
from tools.yarn import MiniYarn

pytestmark = pytest.mark.filterwarnings("ignore::starlette.exceptions.StarletteDeprecationWarning")

SPARK_HOME = Path(pyspark.__file__).parent


def page_example() -> str:
    """The operator of docs/airflow.md's "Cluster deploy mode", as written."""
    page = (REPO / "docs" / "airflow.md").read_text()
    section = page.split("\n### Cluster deploy mode\n", 1)[1].split("\n## ", 1)[0]
    (example,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return example


@pytest.fixture(scope="module")
def mini_yarn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniYarn]:
    with MiniYarn(tmp_path_factory.mktemp("yarn")) as yarn:
        yield yarn


def test_a_dag_drains_in_cluster_deploy_mode_on_yarn(mini_yarn, tjs, token_server, names,
                                                     tmp_path, monkeypatch):
    # The Airflow worker's environment: where its YARN is.
    for key, value in mini_yarn.environment().items():
        monkeypatch.setenv(key, value)
    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    tjs.run(publish(tjs.conn, [(f"{names.prefix}.e", b'{"id": %d}' % i) for i in range(40)]))
    tjs.run(wait_for_messages(tjs.conn, names.stream, 40))
    table, reports = tmp_path / "table", tmp_path / "reports"
    reports.mkdir()
    config = tmp_path / "job.yaml"
    config.write_text(
        f"source: {{stream: {names.stream}, consumer: {names.consumer}, create_consumer: true}}\n"
        "fetch: {partitions: 2, batch: 100, pull_timeout: 2}\n"
        f"target: {{path: '{table}'}}\n")
    # What the page leaves to the cluster's own configuration (spark-defaults.conf): where
    # this YARN stages and its addresses, Spark's jars on every node, the test's sizes.
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    defaults = {**mini_yarn.spark_conf(),
                "spark.yarn.jars": f"local:{SPARK_HOME}/jars/*",
                "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
                "spark.driver.memory": "768m", "spark.executor.memory": "512m",
                "spark.executor.instances": "1", "spark.executor.cores": "2",
                "spark.sql.shuffle.partitions": "2",
                "spark.databricks.delta.snapshotPartitions": "2"}
    (conf_dir / "spark-defaults.conf").write_text(
        "".join(f"{k} {v}\n" for k, v in defaults.items()))
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    # The page's operator as written, but for this machine's paths (no packed environment:
    # this Python is on every node) and its default NATS connection.
    monkeypatch.setenv("AIRFLOW_CONN_NATS_DEFAULT", json.dumps(
        {"conn_type": "nats", "host": "127.0.0.1", "port": token_server.port,
         "extra": {"token": TOKEN, "connect_timeout": 2}}))
    example = (page_example().replace("/opt/airflow/jobs/orders.yaml", str(config))
               .replace("s3://my-bucket/js-etl/reports", f"file://{reports}")
               .replace("./environment/bin/python", sys.executable))
    dag = load_dag(write_dag(f"yarn_{names.stream}", f"""
        with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                 catchup=False) as dag:
{textwrap.indent(example, " " * 12)}
        """))
    with command_lines_holding(TOKEN) as seen:
        dag_run = dag.test()

    assert task_states(dag_run) == {"drain": "success"}
    report = xcom(dag_run, "drain")
    assert (report["messages_written"], report["stopped_because"]) == (40, "drained")
    assert not list(reports.iterdir())  # read back, then removed
    (app,) = [a for a in mini_yarn.apps() if a["name"].endswith(f"yarn_{names.stream}.drain")]
    assert app["finalStatus"] == "SUCCEEDED"
    scripts = mini_yarn.launch_scripts(app["id"])
    assert any("org.apache.spark.deploy.yarn.ApplicationMaster" in s for s in scripts)
    # The page's conf and the cluster's spark-defaults.conf both reached the driver's container.
    assert any(f'PYSPARK_PYTHON="{sys.executable}"' in s and "SPARK_LOCAL_IP" in s
               and "deploy.yarn.ApplicationMaster" in s for s in scripts)
    assert not [s for s in scripts if TOKEN in s]
    assert seen == set()

    from deltalake import DeltaTable  # an independent reader of what the driver committed

    seqs = DeltaTable(str(table)).to_pyarrow_table(columns=["seq"]).column("seq").to_pylist()
    assert sorted(seqs) == list(range(1, 41))
