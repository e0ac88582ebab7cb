"""The operator with a Spark Connect server (a real one, tools/spark_connect.py): the job runs
on the Airflow worker as the server's client, a Python process without spark-submit or a JVM,
and its report, failure reason and exit code reach the task as under spark-submit."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from airflow_support import (
    TOKEN,
    command_lines_holding,
    failures,
    load_dag,
    task_states,
    time_out_when_held,
    timed_out_drain_dag,
    write_dag,
    xcom,
)

from js_etl.demo.publish import publish, wait_for_messages
from js_etl.jobs import drain as drain_job

pytestmark = pytest.mark.filterwarnings("ignore::starlette.exceptions.StarletteDeprecationWarning")


def connect_config(tmp_path: Path, names, table: Path, remote: str) -> Path:
    config = tmp_path / "job.yaml"
    config.write_text(
        f"source: {{stream: {names.stream}, consumer: {names.consumer}, create_consumer: true}}\n"
        "fetch: {partitions: 2, batch: 100, pull_timeout: 2}\n"
        f"target: {{path: '{table}'}}\n"
        f"spark: {{remote: '{remote}'}}\n")
    return config


def drain_dag(names, config: Path):
    return load_dag(write_dag(f"connect_{names.stream}", f"""
        with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                 catchup=False) as dag:
            JetStreamToDeltaOperator(task_id="drain", config_path={str(config)!r},
                                     nats_conn_id="nats_test", on_failure_callback=record_failure)
        """))


def test_a_connect_server_nobody_serves_fails_the_task_with_the_jobs_reason(tjs, names,
                                                                             tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    tjs.run(publish(tjs.conn, [(f"{names.prefix}.e", b'{"id": 1}')]))
    tjs.run(wait_for_messages(tjs.conn, names.stream, 1))
    config = connect_config(tmp_path, names, tmp_path / "table", f"sc://127.0.0.1:{port}")

    dag_run = drain_dag(names, config).test()

    assert task_states(dag_run) == {"drain": "failed"}
    (failure,) = failures(f"connect_{names.stream}").values()
    assert failure["type"] == "AirflowException"  # transient (exit 75): retried, if retries
    assert failure["message"].startswith("js-etl: TransientError: ")
    assert f"127.0.0.1:{port}" in failure["message"]


def test_a_stream_task_with_a_connect_server_fails_before_anything_starts(tjs, names, tmp_path):
    config = connect_config(tmp_path, names, tmp_path / "table", "sc://127.0.0.1:15002")
    dag = load_dag(write_dag(f"connect_stream_{names.stream}", f"""
        with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                 catchup=False) as dag:
            JetStreamToDeltaOperator(task_id="stream", job="stream", config_path={str(config)!r},
                                     overrides={{"streaming.checkpoint": {str(tmp_path / "cp")!r}}},
                                     nats_conn_id="nats_test", on_failure_callback=record_failure)
        """))

    dag_run = dag.test()

    assert task_states(dag_run) == {"stream": "failed"}
    (failure,) = failures(f"connect_stream_{names.stream}").values()
    assert failure["type"] == "AirflowFailException"  # terminal: not retried
    assert "js-etl stream does not run over Spark Connect" in failure["message"]


def test_a_worker_without_the_client_modules_fails_a_connect_task_at_once(tjs, names, tmp_path,
                                                                         monkeypatch):
    """A worker that cannot import what the client needs (an Airflow host without js-etl's job
    extra; here a module no one installed): the task says what is missing, before any process
    starts."""
    from js_etl.airflow import operators

    monkeypatch.setattr(operators, "CONNECT_CLIENT_MODULES", ("pyspark", "js_etl_not_installed"))
    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    tjs.run(publish(tjs.conn, [(f"{names.prefix}.e", b'{"id": 1}')]))
    tjs.run(wait_for_messages(tjs.conn, names.stream, 1))
    config = connect_config(tmp_path, names, tmp_path / "table", "sc://127.0.0.1:15002")

    dag_run = drain_dag(names, config).test()

    assert task_states(dag_run) == {"drain": "failed"}
    (failure,) = failures(f"connect_{names.stream}").values()
    assert failure["type"] == "AirflowFailException"
    assert "js_etl_not_installed cannot be imported" in failure["message"]


def test_a_drain_task_runs_as_a_connect_client_and_a_timeout_stops_it_after_its_round(
        spark_connect_server, tjs, names, tmp_path, monkeypatch):
    """A first task times out (Airflow raises execution_timeout in execute, and calls on_kill
    only after execute has raised) while its client holds after its first fetch: the client is
    told to stop there and then, finishes its round and exits, nothing lost or written twice.
    The next task drains the rest and what came since: its job is this Python running the job
    script as the server's client, never spark-submit, the token on no command line, its report
    in XCom."""
    from deltalake import DeltaTable

    from js_etl.airflow import operators

    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    tjs.run(publish(tjs.conn, [(f"{names.prefix}.e", b'{"id": %d}' % i) for i in range(60)]))
    tjs.run(wait_for_messages(tjs.conn, names.stream, 60))
    table, gate = tmp_path / "table", tmp_path / "gate"
    gate.mkdir()
    config = connect_config(tmp_path, names, table, spark_connect_server.url)
    told = threading.Event()  # the real on_kill, recorded
    on_kill = operators._ConnectClientJob.on_kill

    def recorded(job):
        told.set()
        on_kill(job)

    monkeypatch.setattr(operators._ConnectClientJob, "on_kill", recorded)
    dag = timed_out_drain_dag(f"connect_timeout_{names.stream}", config, gate)
    held_then_told: list[bool] = []

    def time_out_then_release() -> None:
        if time_out_when_held(gate):
            held_then_told.append(told.wait(60))
            (gate / "release").touch()

    watcher = threading.Thread(target=time_out_then_release)
    watcher.start()
    dag_run = dag.test()
    watcher.join()

    assert held_then_told == [True]
    assert task_states(dag_run) == {"drain": "failed"}
    (failure,) = failures(f"connect_timeout_{names.stream}").values()
    assert failure["type"] == "AirflowTaskTimeout"
    seqs = DeltaTable(str(table)).to_pyarrow_table(columns=["seq"]).column("seq").to_pylist()
    assert seqs and len(seqs) == len(set(seqs))  # the held round was committed, once

    monkeypatch.undo()
    tjs.run(publish(tjs.conn, [(f"{names.prefix}.e", b'{"id": %d}' % i) for i in range(60, 80)]))
    tjs.run(wait_for_messages(tjs.conn, names.stream, 80))
    with command_lines_holding(str(config)) as seen:
        dag_run = drain_dag(names, config).test()

    assert task_states(dag_run) == {"drain": "success"}, failures(f"connect_{names.stream}")
    report = xcom(dag_run, "drain")
    assert (report["messages_written"], report["pending_after"]) == (80 - len(seqs), 0)
    seqs = DeltaTable(str(table)).to_pyarrow_table(columns=["seq"]).column("seq").to_pylist()
    assert sorted(seqs) == list(range(1, 81))
    assert any(drain_job.__file__ in line for line in seen), seen
    assert not [line for line in seen if "SparkSubmit" in line or "spark-submit" in line]
    assert not [line for line in seen if TOKEN in line]
