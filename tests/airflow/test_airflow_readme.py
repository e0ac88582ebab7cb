"""The "Trying it locally" walkthrough of docs/airflow.md: its Python snippets, run as written
(bash heredocs, `$P` = the port of a real nats-server that is not on 4222)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from airflow_support import REPO

from js_etl.demo.server import LocalNatsServer
from js_etl.jetstream import ConnectionOptions, JetStreamSession


def _walkthrough_snippets() -> list[str]:
    page = (REPO / "docs" / "airflow.md").read_text()
    section = page.split("\n## Trying it locally", 1)[1].split("\n## ", 1)[0]
    assert "/tmp/js-etl-airflow/" not in section.replace("W=/tmp/js-etl-airflow ", "")
    return re.findall(r"python - <<'PY'[^\n]*\n(.*?)\nPY\n", section, flags=re.S)


def test_walkthrough_publish_snippets_work_on_another_port(tmp_path):
    snippets = _walkthrough_snippets()
    assert len(snippets) == 2  # create + publish 5,000; publish 1,000 more
    server = LocalNatsServer(tmp_path / "nats")
    server.start()
    try:
        assert server.port != 4222
        env = {**os.environ, "P": str(server.port)}
        for snippet in snippets:
            result = subprocess.run([sys.executable, "-c", snippet], env=env, cwd=REPO,
                                    capture_output=True, text=True, timeout=120, check=False)
            assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip() == "1000 published"
        with JetStreamSession(ConnectionOptions(servers=(server.url,))) as js:
            assert js.stream_info("DEMO").state.messages == 6000
    finally:
        server.stop()


def test_the_readmes_dag_parses_into_one_drain_task():
    """The README's Airflow example, as written, in a DAG file the way the scheduler parses it."""
    from airflow_support import DAGS_FOLDER, load_dag

    from js_etl.airflow import JetStreamToDeltaOperator

    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Airflow\n", 1)[1].split("\n## ", 1)[0]
    (dag_source,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    path = DAGS_FOLDER / "readme_orders_to_delta.py"
    path.write_text(dag_source)
    dag = load_dag(path)
    (task,) = dag.tasks
    assert dag.dag_id == "orders_to_delta" and isinstance(task, JetStreamToDeltaOperator)
    assert (task.config_path, task.overrides, task.retries) == (
        "/opt/etl/conf/orders.yaml", {"run.max_seconds": "45m"}, 3)


def test_the_streaming_dags_parse_into_one_stream_task():
    """The Airflow example of the README's Structured Streaming section and of
    docs/streaming.md, as written, in a DAG file the way the scheduler parses it
    (tests/airflow/test_airflow_operator.py runs a stream task end to end)."""
    from airflow_support import DAGS_FOLDER, load_dag

    from js_etl.airflow import JetStreamToDeltaOperator

    readme = (REPO / "README.md").read_text()
    pages = {"readme": readme.split("\n## Structured Streaming\n", 1)[1].split("\n## ", 1)[0],
             "docs": (REPO / "docs" / "streaming.md").read_text()}
    for name, page in pages.items():
        (dag_source,) = [b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S)
                         if "airflow" in b]
        path = DAGS_FOLDER / f"streaming_{name}_orders_stream.py"
        path.write_text(dag_source)
        dag = load_dag(path)
        (task,) = dag.tasks
        assert dag.dag_id == "orders_stream" and isinstance(task, JetStreamToDeltaOperator)
        assert (task.job, task.config_path) == ("stream", "/opt/etl/conf/orders_stream.yaml")
