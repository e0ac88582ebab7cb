"""JetStreamToDeltaOperator: construction rules, the spark-submit command it builds, and real DAG
runs (dag.test()) that drain a real stream through spark-submit into a real Delta table."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from airflow_support import (
    DAGS_FOLDER,
    REPO,
    TOKEN,
    command_lines_with,
    dag_test_on_airflow_host,
    failures,
    lineage_events,
    load_dag,
    task_states,
    time_out_when_held,
    timed_out_drain_dag,
    write_dag,
    xcom,
)
from streams import wait_until

import js_etl.jobs.backfill
from js_etl.demo.publish import publish, wait_for_messages

# dag.test() runs tasks through Airflow's in-process execution API, whose FastAPI TestClient
# import warns about starlette/httpx: Airflow's own dependency, nothing these tests can change.
pytestmark = pytest.mark.filterwarnings("ignore::starlette.exceptions.StarletteDeprecationWarning")


def write_config(tmp_path: Path, names, table: Path) -> Path:
    config = tmp_path / "job.yaml"
    config.write_text(
        f"source: {{stream: {names.stream}, consumer: {names.consumer}, create_consumer: true}}\n"
        "fetch: {partitions: 2, batch: 100, pull_timeout: 2}\n"
        f"target: {{path: '{table}'}}\n"
        # Spark's 200 shuffle and Delta's 50 snapshot partitions cost seconds on tiny tables.
        "spark: {conf: {spark.sql.shuffle.partitions: 2,"
        " spark.databricks.delta.snapshotPartitions: 2}}\n")
    return config


def test_operator_checks_its_modes_and_names_its_outlet_without_reading_the_config(tmp_path):
    from datetime import UTC, datetime

    from airflow.sdk import DAG, AssetAlias, TaskGroup

    from js_etl.airflow import JetStreamToDeltaOperator
    from js_etl.airflow.assets import task_alias

    # Built as a DAG file builds it: no file is read, so one that does not exist will do.
    config = tmp_path / "not-there.yaml"
    with pytest.raises(ValueError,
                       match="job must be one of 'drain', 'backfill', 'stream', got 'drian'"):
        JetStreamToDeltaOperator(task_id="t", config_path=config, job="drian")

    with DAG("orders", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC)):
        op = JetStreamToDeltaOperator(task_id="t", config_path=config)
        # Invalid, but that is for the run to find (before Spark starts, without retries).
        bad = JetStreamToDeltaOperator(task_id="bad", config_path=config,
                                       overrides={"fetch.batch": -3})
        templated = JetStreamToDeltaOperator(task_id="templated",
                                             config_path="{{ params.dir }}/job.yaml",
                                             overrides={"target.path": "{{ params.target }}"})
        given = JetStreamToDeltaOperator(task_id="given", config_path=config,
                                         outlets=[AssetAlias("tables")])
        with TaskGroup("lake"):
            grouped = JetStreamToDeltaOperator(task_id="t", config_path=config)
    # An alias named after the task: the run attaches the table it wrote, when it wrote any.
    assert op.outlets == [AssetAlias("js_etl:orders.t")] == [task_alias("orders", "t")]
    assert bad.outlets == [task_alias("orders", "bad")]
    assert templated.outlets == [task_alias("orders", "templated")]
    assert grouped.outlets == [task_alias("orders", "lake.t")]
    assert given.outlets == [AssetAlias("tables")]
    # Outside a DAG there is no task to name an alias after (pass outlets= to such a task).
    assert JetStreamToDeltaOperator(task_id="t", config_path=config).outlets == []


def test_every_per_run_argument_is_templated(tmp_path, names):
    from js_etl.airflow import JetStreamToDeltaOperator

    config = write_config(tmp_path, names, tmp_path / "table")
    op = JetStreamToDeltaOperator(
        task_id="t", config_path="{{ params.dir }}/job.yaml",
        overrides={"run.max_messages": "{{ params.n }}"}, job_args=["--from-seq", "{{ params.n }}"],
        env_vars={"X": "{{ params.n }}"}, conf={"spark.x": "{{ params.n }}"},
        master="{{ params.master }}", application="{{ params.dir }}/job.py",
        jars=["{{ params.dir }}/a.jar"], nats_conn_id="nats_{{ params.env }}",
        spark_conn_id="spark_{{ params.env }}")
    params = {"dir": str(tmp_path), "n": "7", "master": "local[1]", "env": "prod"}
    op.render_template_fields({"params": params})
    assert (op.config_path, op.overrides, op.job_args, op.env_vars, op.conf) == (
        str(config), {"run.max_messages": "7"}, ["--from-seq", "7"], {"X": "7"}, {"spark.x": "7"})
    assert (op.master, op.application, op.jars, op.nats_conn_id, op.spark_conn_id) == (
        "local[1]", f"{tmp_path}/job.py", [f"{tmp_path}/a.jar"], "nats_prod", "spark_prod")


def test_backfill_runs_its_own_script_with_the_range_flags_last(tmp_path, names):
    from airflow.sdk.exceptions import AirflowFailException

    from js_etl.airflow import JetStreamToDeltaOperator

    config = write_config(tmp_path, names, tmp_path / "table")
    op = JetStreamToDeltaOperator(task_id="t", config_path=config, job="backfill",
                                  overrides={"run.max_messages": 10, "fetch.batch": 50},
                                  job_args=["--from-seq", 5, "--to-seq", "9"])
    assert op._job_arguments(str(config), ["run.max_messages=10", "fetch.batch=50"], "/r.json") == [
        "--config", str(config), "--set", "run.max_messages=10", "--set", "fetch.batch=50",
        "--report-file", "/r.json", "--from-seq", "5", "--to-seq", "9"]
    # By default the packaged job script of the installed js_etl (a wheel install has it too).
    assert Path(op._application()) == Path(js_etl.jobs.backfill.__file__).resolve()
    elsewhere = JetStreamToDeltaOperator(task_id="t", config_path=config, job="backfill",
                                         application=str(tmp_path / "missing.py"))
    with pytest.raises(AirflowFailException, match="missing.py not found: the 'backfill' job"):
        elsewhere._application()

    # A connection that does not exist cannot appear on retry: fail the task at once.
    unknown = JetStreamToDeltaOperator(task_id="t", config_path=config,
                                       nats_conn_id="nats_never_defined")
    with pytest.raises(AirflowFailException, match="nats_never_defined"):
        unknown.execute({})


@pytest.mark.parametrize("master", ["local[2]", "yarn"])
def test_secrets_reach_spark_submit_by_environment_never_on_the_command_line(token_server,
                                                                            tmp_path, names,
                                                                            master,
                                                                            monkeypatch):
    from js_etl.airflow import JetStreamHook, JetStreamToDeltaOperator

    # An Airflow worker's environment, not this worker's: a SparkSession made earlier in this
    # process (js_etl.spark.session) sets PYSPARK_PYTHON, which the operator would leave alone.
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    config = write_config(tmp_path, names, tmp_path / "table")
    op = JetStreamToDeltaOperator(task_id="t", config_path=config, nats_conn_id="nats_test",
                                  master=master, env_vars={"EXTRA": "1"}, jars=["/a.jar"])
    job_env = JetStreamHook("nats_test").job_environment()
    hook = op._submit_hook(job_env, {"EXTRA": "1"}, name="n")
    command = hook._build_spark_submit_command("jobs/drain_to_delta.py")

    assert command[:3] == [str(Path(sys.executable).with_name("spark-submit")), "--master",
                           master]
    assert "--jars" in command and "/a.jar" in command
    assert not any(TOKEN in part for part in command)
    assert not any("JS_ETL" in part for part in command)
    assert hook._env["JS_ETL_NATS_TOKEN"] == TOKEN  # Popen's environment of spark-submit
    assert hook._env["JS_ETL__NATS__TOKEN_ENV"] == "JS_ETL_NATS_TOKEN"
    assert hook._env["EXTRA"] == "1"
    if master == "yarn":  # the provider's own env_vars path; ours never takes it
        assert "spark.yarn.appMasterEnv.EXTRA=1" in command
        assert "PYSPARK_PYTHON" not in hook._env
    else:
        assert hook._env["PYSPARK_PYTHON"] == sys.executable


def count_config_reads(monkeypatch, tally: Path) -> None:
    """Each load_config of the provider's tasks adds a line to ``tally``: a file, since the
    OpenLineage listener asks for lineage in forked processes."""
    import js_etl.airflow.job_config as job_config

    load_config = job_config.load_config

    def counted(path, *args, **kwargs):
        with tally.open("a") as f:
            f.write(f"{path}\n")
        return load_config(path, *args, **kwargs)

    monkeypatch.setattr(job_config, "load_config", counted)


def test_dag_drains_a_real_stream_into_delta_and_returns_the_report(tjs, names, tmp_path,
                                                                    spark, capfd, monkeypatch):
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    reads = tmp_path / "config-reads.txt"
    count_config_reads(monkeypatch, reads)
    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    published = [(f"{names.prefix}.e", f'{{"id": {i}}}'.encode()) for i in range(1, 251)]
    tjs.run(publish(tjs.conn, published))
    tjs.run(wait_for_messages(tjs.conn, names.stream, len(published)))
    table = tmp_path / "table"
    config = write_config(tmp_path, names, table)
    dag_id = f"drain_{names.stream}"
    dag = load_dag(write_dag(dag_id, f"""
        with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                 catchup=False, max_active_runs=1) as dag:
            JetStreamToDeltaOperator(task_id="drain", config_path={str(config)!r},
                                     overrides={{"run.max_seconds": "2m"}},
                                     nats_conn_id="nats_test",
                                     openlineage_inject_parent_job_info=True,
                                     on_failure_callback=record_failure)
        """))

    started = time.monotonic()
    dag_run = dag.test()
    seconds = time.monotonic() - started
    with capfd.disabled():
        print(f"\ndag.test() end to end (spark-submit drain of {len(published)} messages): "
              f"{seconds:.1f}s")

    assert task_states(dag_run) == {"drain": "success"}, failures(dag_id)
    report = xcom(dag_run, "drain")
    assert report["messages_written"] == len(published)
    assert (report["first_seq"], report["last_seq"], report["dead_letters"]) == (1, 250, 0)
    assert report["target"] == str(table) and report["pending_after"] == 0
    # The "Run report" extra link: the task instance's XCom tab in the UI.
    assert xcom(dag_run, "drain", "_link_RunReportLink").endswith(
        f"/dags/{dag_id}/runs/{quote(dag_run.run_id, safe='')}/tasks/drain/xcom")
    rows = spark.read.format("delta").load(str(table)).select("seq", "data").orderBy("seq")
    assert [(r.seq, bytes(r.data)) for r in rows.collect()] == [
        (i, data) for i, (_, data) in enumerate(published, start=1)]

    with create_session() as session:
        events = session.query(AssetEvent).join(AssetEvent.asset).filter(
            AssetModel.uri == f"file://{table}").all()
        assert [e.extra.get("messages_written") for e in events] == [250]
        assert events[0].extra["delta_versions"] == report["delta_versions"]
    output = capfd.readouterr().out
    assert TOKEN not in output  # neither logged nor echoed by spark-submit
    # Spark at WARN by default: none of the per-stage/per-task INFO lines of the run.
    spark_info = [line for line in output.splitlines()
                  if re.search(r" INFO (DAGScheduler|TaskSetManager|Executor|TaskSchedulerImpl):",
                               line)]
    with capfd.disabled():
        print(f"\nSpark INFO lines in the task output: "
              f"{sum(' INFO ' in line for line in output.splitlines())}")
    assert spark_info == []
    # The Spark job was handed this task as its OpenLineage parent (as SparkSubmitOperator does).
    assert f"spark.openlineage.parentJobName={dag_id}.drain" in output
    assert "spark.openlineage.parentJobNamespace=js-etl-tests" in output

    # The OpenLineage events of the task (file transport): at completion the stream in, the
    # table out, and the messages written as the output's row count. The start has no datasets:
    # the listener asks for them before execute has read the config.
    (start,) = lineage_events(f"{dag_id}.drain", "START")
    (complete,) = lineage_events(f"{dag_id}.drain", "COMPLETE")
    with capfd.disabled():
        print("\nOpenLineage COMPLETE event:", json.dumps(complete, indent=1))
    port = tjs.conn.options.servers[0].rsplit(":", 1)[1]
    (source,) = complete["inputs"]
    assert (source["namespace"], source["name"]) == (f"nats://127.0.0.1:{port}", names.stream)
    facet = source["facets"]["natsJetStreamConsumer"]
    assert (facet["consumer"], facet["filterSubjects"]) == (names.consumer, [])
    target, dead_letters = complete["outputs"]
    assert (target["namespace"], target["name"]) == ("file", str(table))
    assert target["outputFacets"]["outputStatistics"]["rowCount"] == 250
    # The table's columns, as the drain wrote them (read back with deltalake).
    from deltalake import DeltaTable

    written = [f.name for f in DeltaTable(str(table)).schema().fields]
    assert [f["name"] for f in target["facets"]["schema"]["fields"]] == written
    assert (dead_letters["namespace"], dead_letters["name"]) == ("file", f"{table}_dead_letters")
    assert dead_letters["outputFacets"]["outputStatistics"]["rowCount"] == report[
        "dead_letters"]
    assert [f["name"] for f in dead_letters["facets"]["schema"]["fields"]] == [
        "seq", "stream", "subject", "consumer_seq", "num_delivered", "published_at", "headers",
        "data", "error"]
    assert (start["inputs"], start["outputs"]) == ([], [])
    assert TOKEN not in json.dumps([start, complete])

    # Parsed, run, its asset event and both lineage events: the config was read once, by execute.
    assert reads.read_text().splitlines() == [str(config)]


def test_a_stream_task_runs_the_stream_job_and_returns_its_report(tjs, names, tmp_path):
    """``job="stream"``: spark-submit of the packaged stream job, an AvailableNow query from
    the checkpoint the overrides name; its report in XCom, the table read back by deltalake."""
    from deltalake import DeltaTable

    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    tjs.run(publish(tjs.conn, [(f"{names.prefix}.e", b"%d" % i) for i in range(120)]))
    tjs.run(wait_for_messages(tjs.conn, names.stream, 120))
    table = tmp_path / "table"
    config = write_config(tmp_path, names, table)
    dag_id = f"stream_{names.stream}"
    dag = load_dag(write_dag(dag_id, f"""
        with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                 catchup=False, default_args={{"on_failure_callback": record_failure}}) as dag:
            JetStreamToDeltaOperator(task_id="stream", job="stream", config_path={str(config)!r},
                                     overrides={{"streaming.checkpoint": {str(tmp_path / "cp")!r},
                                                "streaming.max_messages_per_batch": 50}},
                                     nats_conn_id="nats_test")
        """))

    dag_run = dag.test()

    assert task_states(dag_run) == {"stream": "success"}, failures(dag_id)
    report = xcom(dag_run, "stream")
    assert report["messages_written"] == 120 and report["checkpoint"] == str(tmp_path / "cp")
    assert [b["last_seq"] for b in report["batches"]] == [50, 100, 120]
    assert sorted(DeltaTable(str(table)).to_pyarrow_table(columns=["seq"])
                  .column("seq").to_pylist()) == list(range(1, 121))


def test_a_timed_out_task_kills_its_spark_submit(names, tmp_path, tjs):
    """The task's execution_timeout, raised in execute while spark-submit runs: the operator
    kills spark-submit as the provider's on_kill does (Airflow calls on_kill only after execute
    has raised, too late to reach it), and the job's driver, cut off from its JVM, ends at its
    next call into it."""
    import threading

    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    tjs.run(publish(tjs.conn, [(f"{names.prefix}.e", b'{"id": %d}' % i) for i in range(20)]))
    tjs.run(wait_for_messages(tjs.conn, names.stream, 20))
    gate = tmp_path / "gate"
    gate.mkdir()
    config = write_config(tmp_path, names, tmp_path / "table")
    dag_id = f"timeout_{names.stream}"
    dag = timed_out_drain_dag(dag_id, config, gate)

    watcher = threading.Thread(target=time_out_when_held, args=(gate,))
    watcher.start()
    dag_run = dag.test()
    watcher.join()

    assert task_states(dag_run) == {"drain": "failed"}
    assert failures(dag_id)["drain"]["type"] == "AirflowTaskTimeout"
    assert not [line for line in command_lines_with(str(config)) if "SparkSubmit" in line]
    (gate / "release").touch()
    wait_until(lambda: command_lines_with(str(config)), lambda left: not left, timeout=120,
               what="the held driver's end once it calls its dead JVM")


def test_failed_job_fails_the_task_with_the_jobs_own_reason(names, tmp_path, tjs):
    config = write_config(tmp_path, names, tmp_path / "table")
    dag_id = f"drain_fails_{names.stream}"
    dag = load_dag(write_dag(dag_id, f"""
        with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                 catchup=False, default_args={{"on_failure_callback": record_failure}}) as dag:
            JetStreamToDeltaOperator(task_id="unreachable", config_path={str(config)!r},
                                     nats_conn_id="nats_closed")
            JetStreamToDeltaOperator(task_id="bad_config", config_path={str(config)!r},
                                     overrides=["{{{{ 'fetch.batch=-3' }}}}"],
                                     nats_conn_id="nats_test", outlets=[])
            # A schema only Spark can judge (COLLATE): the job fails after spark-submit started.
            JetStreamToDeltaOperator(task_id="spark_refuses", config_path={str(config)!r},
                                     overrides={{"decode.format": "json",
                                                "decode.schema": "s STRING COLLATE NO_SUCH"}},
                                     nats_conn_id="nats_test", outlets=[])
        """))
    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    dag_run = dag.test()

    assert task_states(dag_run) == {"unreachable": "failed", "bad_config": "failed",
                                    "spark_refuses": "failed"}
    failed = failures(dag_id)
    # The check before spark-submit could not reach NATS, and said so as the job would have:
    # transient, so the task fails with a plain AirflowException that Airflow's retries apply to.
    assert failed["unreachable"]["type"] == "AirflowException"
    assert failed["unreachable"]["message"].startswith(
        "js-etl: NatsUnavailableError: cannot connect to NATS at nats://127.0.0.1:")
    # A config error is terminal and found before Spark starts: no retries.
    assert failed["bad_config"]["type"] == "AirflowFailException"
    assert "fetch.batch: expected a positive integer, got -3" in failed["bad_config"]["message"]
    # After spark-submit: the job's own line, once; not the provider's error, which repeats the
    # command and its output (already in the task log), chained beneath it.
    refused = failed["spark_refuses"]
    assert refused["message"].startswith("js-etl: ") and "NO_SUCH" in refused["message"]
    assert "Cannot execute" not in refused["message"] and not refused["chained"]
    assert not failed["unreachable"]["chained"]
    assert xcom(dag_run, "unreachable") is None
    # The lineage of a failure is that of the config the run loaded, if it got that far.
    (unreachable,) = lineage_events(f"{dag_id}.unreachable", "FAIL")
    assert [d["name"] for d in unreachable["inputs"] + unreachable["outputs"]] == [
        names.stream, str(tmp_path / "table"), f"{tmp_path / 'table'}_dead_letters"]
    (bad_config,) = lineage_events(f"{dag_id}.bad_config", "FAIL")
    assert (bad_config["inputs"], bad_config["outputs"]) == ([], [])


def test_a_drain_is_checked_before_spark_submit_and_not_submitted_when_empty(tjs, names,
                                                                          tmp_path):
    """What the job would find after its JVM started, the task finds before spark-submit, which
    here cannot start at all: a missing stream fails the task without retries; a consumer with
    nothing pending returns a report instead, unless skip_when_empty=False; one with messages
    pending is submitted. All on an Airflow host without Spark, Delta or Arrow libraries."""
    from dataclasses import replace

    from js_etl.config import load_config
    from js_etl.durable.policy import desired_consumer
    from js_etl.jetstream.api import DeliverPolicy

    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    tjs.run(publish(tjs.conn, [(f"{names.prefix}.e", b"%d" % i) for i in range(3)]))
    tjs.run(wait_for_messages(tjs.conn, names.stream, 3))
    config = write_config(tmp_path, names, tmp_path / "table")
    desired = desired_consumer(load_config(str(config), [], environ={}))
    tjs.run(tjs.admin.create_consumer(names.stream, desired))
    tjs.run(tjs.admin.create_consumer(names.stream, replace(
        desired, durable_name=f"{names.consumer}_new", deliver_policy=DeliverPolicy.NEW)))
    dag_id = f"drain_checked_{names.stream}"
    dag = write_dag(dag_id, f"""
        def drain(task_id, **kwargs):
            return JetStreamToDeltaOperator(
                task_id=task_id, config_path={str(config)!r}, nats_conn_id="nats_test",
                spark_binary="/nonexistent/spark-submit", **kwargs)

        with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                 catchup=False, default_args={{"on_failure_callback": record_failure}}) as dag:
            drain("empty", overrides={{"source.consumer": "{names.consumer}_new"}})
            drain("empty_anyway", overrides={{"source.consumer": "{names.consumer}_new"}},
                  skip_when_empty=False)
            drain("missing", overrides={{"source.stream": "NOPE_{names.stream}"}})
            drain("bad_config", overrides={{"fetch.batch": 0}})
            drain("pending")
        """)
    states, dag_run = dag_test_on_airflow_host(dag)

    assert states == {"empty": "success", "empty_anyway": "failed", "missing": "failed",
                      "bad_config": "failed", "pending": "failed"}
    report = xcom(dag_run, "empty")
    assert (report["stopped_because"], report["messages_written"], report["writer"],
            report["consumer"]) == ("nothing_pending", 0, "none", f"{names.consumer}_new")
    failed = failures(dag_id)
    assert failed["missing"]["type"] == "AirflowFailException"
    assert failed["missing"]["message"].startswith(
        f"js-etl: StreamNotFoundError: stream 'NOPE_{names.stream}' not found: check "
        "source.stream")
    assert failed["bad_config"]["type"] == "AirflowFailException"
    # A task that failed before it read its config has no lineage, and OpenLineage says nothing.
    assert not [line for line in dag_run.log.splitlines()
                if "openlineage" in line.lower() and "warn" in line.lower()]
    for submitted in ("empty_anyway", "pending"):  # spark-submit was tried
        assert "/nonexistent/spark-submit" in failed[submitted]["message"], failed[submitted]


def test_example_backfill_dag_backfills_a_range_and_names_the_table_it_wrote(
        tjs, names, tmp_path, spark, monkeypatch):
    """The real dags/backfill_to_delta.py (copied into the test bundle), triggered with params."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    from js_etl.airflow import delta_asset

    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    tjs.run(publish(tjs.conn, [(f"{names.prefix}.e", b"%d" % i) for i in range(1, 61)]))
    tjs.run(wait_for_messages(tjs.conn, names.stream, 60))
    monkeypatch.setenv("JS_ETL_DAG_CONFIG", str(write_config(tmp_path, names, tmp_path / "t")))
    example = REPO / "dags" / "backfill_to_delta.py"
    copy = DAGS_FOLDER / "example_backfill_to_delta.py"
    # Its NATS connection is nats_default: here, the token server's.
    source = example.read_text().replace('nats_conn_id="nats_default"', 'nats_conn_id="nats_test"')
    assert source.count('nats_conn_id="nats_test"') == 1
    copy.write_text(source)
    dag = load_dag(copy)
    backfill_table = tmp_path / "backfill"

    dag_run = dag.test(run_conf={"from_seq": 11, "to_seq": 40,
                                 "target_path": str(backfill_table)})

    assert task_states(dag_run) == {"backfill_plan": "success", "backfill": "success"}
    assert xcom(dag_run, "backfill_plan", "job_args") == ["--from-seq", "11", "--to-seq", "40"]
    report = xcom(dag_run, "backfill")
    assert report["messages_written"] == 30
    rows = spark.read.format("delta").load(str(backfill_table)).select("seq").orderBy("seq")
    assert [r.seq for r in rows.collect()] == list(range(11, 41))
    with create_session() as session:  # the alias resolved to the table actually written
        events = session.query(AssetEvent).join(AssetEvent.asset).filter_by(
            uri=delta_asset(backfill_table).uri).all()
        assert [e.extra.get("messages_written") for e in events] == [30]


def test_an_empty_drain_emits_no_asset_event_unless_asked_to(tjs, names, tmp_path):
    """Two drains of empty consumers in one real DAG run: the default leaves the table without
    an asset event (a DAG scheduled on it does not run for nothing), the flag emits one. The
    consumers exist, so both tasks take the skip path: its report goes where a job's would."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    from js_etl.config import load_config
    from js_etl.durable.policy import desired_consumer

    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    quiet, loud = tmp_path / "quiet", tmp_path / "loud"
    (tmp_path / "q").mkdir()
    (tmp_path / "l").mkdir()
    quiet_config = write_config(tmp_path / "q", names, quiet)
    loud_names = type(names)(stream=names.stream, consumer=names.consumer + "_loud",
                             subject=names.subject, prefix=names.prefix)
    loud_config = write_config(tmp_path / "l", loud_names, loud)
    for config in (quiet_config, loud_config):
        tjs.run(tjs.admin.create_consumer(
            names.stream, desired_consumer(load_config(str(config), [], environ={}))))
    dag_id = f"drain_empty_{names.stream}"
    dag = load_dag(write_dag(dag_id, f"""
        with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                 catchup=False, default_args={{"on_failure_callback": record_failure}}) as dag:
            JetStreamToDeltaOperator(task_id="quiet", config_path={str(quiet_config)!r},
                                     nats_conn_id="nats_test")
            JetStreamToDeltaOperator(task_id="loud", config_path={str(loud_config)!r},
                                     nats_conn_id="nats_test", emit_empty_asset_event=True)
        """))
    dag_run = dag.test()

    assert task_states(dag_run) == {"quiet": "success", "loud": "success"}, failures(dag_id)
    for task in ("quiet", "loud"):
        report = xcom(dag_run, task)
        assert (report["stopped_because"], report["messages_written"]) == ("nothing_pending", 0)
    with create_session() as session:
        def events(table):
            return [e.extra.get("messages_written") for e in session.query(AssetEvent).join(
                AssetEvent.asset).filter(AssetModel.uri == f"file://{table}").all()]

        assert events(quiet) == []
        assert events(loud) == [0]


def test_spark_log_level_defaults_to_warn_and_can_be_turned_back(tmp_path, names):
    from js_etl.airflow import JetStreamToDeltaOperator

    config = write_config(tmp_path, names, tmp_path / "table")

    def spark_conf(**kwargs):
        op = JetStreamToDeltaOperator(task_id="t", config_path=config, **kwargs)
        hook = op._submit_hook({}, {}, name="n", conf=op._spark_conf({}))
        command = hook._build_spark_submit_command("job.py")
        return [command[i + 1] for i, part in enumerate(command) if part == "--conf"]

    assert "spark.log.level=WARN" in spark_conf()
    assert "spark.log.level=INFO" in spark_conf(spark_log_level="info")
    assert not any(c.startswith("spark.log.level=") for c in spark_conf(spark_log_level=None))
    assert "spark.log.level=ERROR" in spark_conf(conf={"spark.log.level": "ERROR"})
    with pytest.raises(ValueError, match="spark_log_level must be one of"):
        JetStreamToDeltaOperator(task_id="t", config_path=config, spark_log_level="LOUD")


def test_lineage_costs_nothing_until_asked_for(tmp_path, names):
    """Importing the provider's modules and building an operator loads neither js-etl's lineage
    module nor the OpenLineage client (the OpenLineage provider's listener asks for them)."""
    import os
    import subprocess

    config = write_config(tmp_path, names, tmp_path / "table")
    code = (
        "import sys, json\n"
        "from js_etl.airflow import JetStreamToDeltaOperator\n"
        "import js_etl.airflow.queues, js_etl.airflow.sensors\n"
        f"JetStreamToDeltaOperator(task_id='t', config_path={str(config)!r})\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'js_etl.airflow.lineage'\n"
        "                        or m.split('.')[0] == 'openlineage')))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=False, env=os.environ.copy())
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_lineage_is_that_of_the_config_execute_loaded_and_costs_no_read(tmp_path, names,
                                                                         monkeypatch):
    """Without an execute that loaded the config (a task that failed before it), no datasets:
    not a second read, which could describe a config the run never used."""
    from airflow.sdk.exceptions import AirflowFailException

    from js_etl.airflow import JetStreamToDeltaOperator

    reads = tmp_path / "config-reads.txt"
    count_config_reads(monkeypatch, reads)
    op = JetStreamToDeltaOperator(task_id="t", config_path=write_config(tmp_path, names, tmp_path),
                                  nats_conn_id="nats_never_defined")
    with pytest.raises(AirflowFailException, match="nats_never_defined"):
        op.execute({})
    lineage = op.get_openlineage_facets_on_complete(None)
    assert (lineage.inputs, lineage.outputs) == ([], [])
    assert not hasattr(op, "get_openlineage_facets_on_start")  # it would run before execute
    assert not reads.exists()


def test_transport_injection_passes_an_http_transport_and_masks_its_key(tmp_path, names,
                                                                        monkeypatch):
    """The OpenLineage provider injects only HTTP transports (the suite's is a file one): here
    the listener's client holds a real HttpTransport; its key goes to --conf, masked in logs."""
    from types import SimpleNamespace

    import airflow.providers.openlineage.utils.spark as ol_spark
    from openlineage.client.transport.http import (
        ApiKeyTokenProvider,
        HttpConfig,
        HttpTransport,
    )

    from js_etl.airflow import JetStreamToDeltaOperator

    key = "ol-key-5d1c-not-in-any-log"
    transport = HttpTransport(HttpConfig(url="http://lineage.internal:5000",
                                         auth=ApiKeyTokenProvider({"apiKey": key})))
    client = SimpleNamespace(transport=transport)
    listener = SimpleNamespace(adapter=SimpleNamespace(
        get_or_create_openlineage_client=lambda: client))
    monkeypatch.setattr(ol_spark, "get_openlineage_listener", lambda: listener)

    config = write_config(tmp_path, names, tmp_path / "table")
    op = JetStreamToDeltaOperator(task_id="t", config_path=config,
                                  openlineage_inject_transport_info=True)
    conf = op._spark_conf({})
    assert conf["spark.openlineage.transport.type"] == "http"
    assert conf["spark.openlineage.transport.url"] == "http://lineage.internal:5000"
    assert conf["spark.openlineage.transport.auth.apiKey"] == f"Bearer {key}"
    assert conf["spark.log.level"] == "WARN"

    from airflow.sdk._shared.secrets_masker.secrets_masker import redact

    assert key not in str(redact(f"--conf spark.openlineage.transport.auth.apiKey=Bearer {key}"))
    off = JetStreamToDeltaOperator(task_id="t", config_path=config,
                                   openlineage_inject_transport_info=False)
    assert not any(k.startswith("spark.openlineage.") for k in off._spark_conf({}))


def test_cluster_deploy_mode_hands_the_connection_over_in_files_never_on_the_command_line(
        token_server, tmp_path, names, monkeypatch):
    """The driver runs on the cluster, which gets no environment from the worker: the config
    and the token go as --files (the token's file readable by its owner only), every nats key
    as --set, the report comes back through report_dir; spark-submit's own environment holds
    nothing of the connection. Without report_dir the task fails before spark-submit.
    (tests/airflow/test_airflow_yarn.py runs this on a real YARN.)"""
    import stat

    from airflow.sdk.exceptions import AirflowFailException

    from js_etl.airflow import JetStreamToDeltaOperator
    from js_etl.airflow.operators import _JobSubmitHook

    config = write_config(tmp_path, names, tmp_path / "table")
    seen = {}

    def submit(hook, application):
        seen["command"] = hook._build_spark_submit_command(application)
        seen["env"] = dict(hook._process_env)
        seen["files"] = {name: Path(local).read_text() for local, name in (
            item.split("#") for item in hook._files.split(","))}
        seen["token_mode"] = stat.S_IMODE(Path(hook._files.split(",")[0].split("#")[0]
                                               ).stat().st_mode)
        report = hook._application_args[hook._application_args.index("--report-file") + 1]
        Path(report.removeprefix("file://")).write_text('{"messages_written": 3}')

    monkeypatch.setattr(_JobSubmitHook, "submit", submit)
    cluster = {"deploy_mode": "cluster"}
    op = JetStreamToDeltaOperator(task_id="t", config_path=config, nats_conn_id="nats_test",
                                  master="yarn", spark_submit_kwargs=cluster,
                                  report_dir=f"file://{tmp_path}", jars="")
    hook = op._submit_hook({"JS_ETL_NATS_TOKEN": TOKEN}, {}, name="n")
    (tmp_path / "local").mkdir()
    report = op._run(hook, "drain.py", str(config), [], tmp_path / "local")

    assert report == {"messages_written": 3}
    assert not list(tmp_path.glob("js-etl-report-*.json"))  # read, then removed
    command = seen["command"]
    assert not any(TOKEN in part for part in command)
    assert not any(k.startswith("JS_ETL") or TOKEN in v for k, v in seen["env"].items())
    assert seen["files"]["js-etl-nats-token"] == TOKEN and seen["token_mode"] == 0o600
    assert seen["files"]["js-etl-job.yaml"] == config.read_text()
    args = command[command.index("drain.py") + 1:]
    assert args[:2] == ["--config", "js-etl-job.yaml"]
    assert {"nats.token_file=js-etl-nats-token", "nats.token_env=null",
            f"nats.servers={token_server.url}"} <= {args[i + 1] for i, a in enumerate(args)
                                                   if a == "--set"}

    # A failed driver's reason comes back the same way, and fails the task with it.
    def fail(hook, application):
        report = hook._application_args[hook._application_args.index("--report-file") + 1]
        Path(report.removeprefix("file://")).write_text(
            '{"error": "js-etl: StreamNotFoundError: stream gone", "exit_code": 2}')
        raise AirflowException("spark-submit exited 1")

    from airflow.sdk.exceptions import AirflowException

    monkeypatch.setattr(_JobSubmitHook, "submit", fail)
    with pytest.raises(AirflowFailException, match="^js-etl: StreamNotFoundError: stream gone$"):
        op._run(op._submit_hook({}, {}, name="n"), "drain.py", str(config), [],
                tmp_path / "local")

    no_dir = JetStreamToDeltaOperator(task_id="t", config_path=config, master="yarn",
                                      spark_submit_kwargs=cluster)
    with pytest.raises(AirflowFailException, match="cluster deploy mode needs report_dir"):
        no_dir._run(no_dir._submit_hook({}, {}, name="n"), "drain.py", str(config), [],
                    tmp_path)
