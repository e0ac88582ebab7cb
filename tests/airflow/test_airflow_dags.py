"""The example DAGs in dags/: they parse on Airflow 3.3 with no import error and no deprecation
warning, without reading a job config, and they are shaped as documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from airflow_support import REPO

from js_etl.config import load_config

DAGS = REPO / "dags"

# In a fresh interpreter, so js_etl.airflow and the DAG files are imported for the first time
# while warnings are being recorded (in this process they were imported long ago).
_PARSE = textwrap.dedent("""
    import json, sys, warnings
    import airflow.sdk  # Airflow's own start-up is not what we are checking
    from airflow.dag_processing.dagbag import DagBag

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bag = DagBag(dag_folder=sys.argv[1])
    print(json.dumps({
        "dag_ids": sorted(bag.dag_ids),
        "import_errors": bag.import_errors,
        "captured_warnings": {k: list(v) for k, v in bag.captured_warnings.items()},
        "warnings": [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})"
                     for w in caught
                     if issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning,
                                                FutureWarning))],
    }))
""")


# The same parse with every way to read a job config refusing: a DAG file that read one would
# show as an import error.
_PARSE_WITHOUT_CONFIG_READS = textwrap.dedent("""
    import js_etl.config, js_etl.config.load

    def refuse(*args, **kwargs):
        raise RuntimeError(f"load_config{args!r} while parsing DAG files")

    js_etl.config.load_config = js_etl.config.load.load_config = refuse
""") + _PARSE


def _parse_in_a_fresh_interpreter(script: str, **environ: str) -> dict:
    result = subprocess.run([sys.executable, "-c", script, str(DAGS)], check=False,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, **environ})
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def test_example_dags_import_cleanly_without_deprecation_warnings():
    parsed = _parse_in_a_fresh_interpreter(_PARSE)
    assert parsed["import_errors"] == {}
    assert parsed["captured_warnings"] == {}
    assert parsed["warnings"] == []  # DeprecatedImportWarning is a FutureWarning
    assert parsed["dag_ids"] == ["js_etl_backfill_to_delta", "js_etl_backlog_drain",
                                 "js_etl_drain_on_backlog_event", "js_etl_drain_to_delta"]


def test_example_dags_parse_without_reading_a_job_config(tmp_path):
    """Parsing is no place for file I/O: the DAG processor parses every file again and again,
    and need not see the configs. With the config missing and load_config refusing, all four
    DAGs still import, naming the missing file as the config their tasks read when they run."""
    missing = tmp_path / "not-there" / "job.yaml"
    parsed = _parse_in_a_fresh_interpreter(_PARSE_WITHOUT_CONFIG_READS,
                                           JS_ETL_DAG_CONFIG=str(missing))
    assert parsed["import_errors"] == {}
    assert parsed["dag_ids"] == ["js_etl_backfill_to_delta", "js_etl_backlog_drain",
                                 "js_etl_drain_on_backlog_event", "js_etl_drain_to_delta"]


def test_example_dags_are_shaped_as_documented():
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import AssetAlias

    from js_etl.airflow import JetStreamBacklogSensor, JetStreamToDeltaOperator
    from js_etl.airflow.assets import task_alias

    bag = DagBag(dag_folder=DAGS)
    example_config = str(REPO / "conf" / "example.yaml")

    scheduled = bag.dags["js_etl_drain_to_delta"]
    assert (scheduled.max_active_runs, scheduled.catchup) == (1, False)
    assert scheduled.schedule == "@hourly"
    drain = scheduled.get_task("drain")
    assert isinstance(drain, JetStreamToDeltaOperator)
    assert drain.retries == 3 and drain.retry_delay.total_seconds() == 120
    # The table is attached to the task's alias at run time, once the config is read.
    assert drain.outlets == [task_alias("js_etl_drain_to_delta", "drain")]
    assert drain.outlets == [AssetAlias("js_etl:js_etl_drain_to_delta.drain")]
    assert drain.config_path == example_config

    backlog = bag.dags["js_etl_backlog_drain"]
    wait, then = backlog.get_task("wait_for_backlog"), backlog.get_task("drain")
    assert isinstance(wait, JetStreamBacklogSensor) and wait.deferrable
    # It waits on the drain's own consumer: its config's source, read when the sensor runs.
    assert (wait.config_path, then.config_path) == (example_config, example_config)
    assert (wait.stream, wait.consumer) == (None, None)
    assert wait.downstream_task_ids == {"drain"}
    assert then.outlets == [task_alias("js_etl_backlog_drain", "drain")]

    backfill = bag.dags["js_etl_backfill_to_delta"]
    assert backfill.schedule is None
    assert set(backfill.params) == {"from_seq", "to_seq", "from_time", "to_time", "target_path"}
    job = backfill.get_task("backfill")
    assert isinstance(job, JetStreamToDeltaOperator) and job.job == "backfill"
    assert job.outlets == [AssetAlias("js_etl_backfill")]
    assert backfill.get_task("backfill_plan").downstream_task_ids == {"backfill"}


def test_the_event_driven_example_is_scheduled_by_a_nats_asset_watcher():
    """Parsed and serialised as the DAG processor does: the watcher's trigger is ours, by
    default with the consumer of the example config the drain reads, and only ids and numbers
    in its kwargs."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    from js_etl.airflow import JetStreamToDeltaOperator
    from js_etl.airflow.assets import task_alias

    example = load_config(REPO / "conf" / "example.yaml")
    bag = DagBag(dag_folder=DAGS / "drain_on_backlog_event.py")
    assert bag.import_errors == {}
    dag = bag.dags["js_etl_drain_on_backlog_event"]
    drain = dag.get_task("drain")
    assert isinstance(drain, JetStreamToDeltaOperator)
    assert drain.config_path == str(REPO / "conf" / "example.yaml")
    assert drain.outlets == [task_alias("js_etl_drain_on_backlog_event", "drain")]

    # What the DAG processor stores, and the triggerer reads back.
    timetable = DagSerialization.to_dict(dag)["dag"]["timetable"]["__var"]
    (asset,) = timetable["asset_condition"]["objects"]
    assert asset["name"] == f"nats_backlog_{example.source.stream}_{example.source.consumer}"
    (watcher,) = asset["watchers"]
    assert watcher["trigger"] == {
        "classpath": "js_etl.airflow.triggers.JetStreamBacklogEventTrigger",
        "kwargs": {"nats_conn_id": "nats_default", "stream": example.source.stream,
                   "consumer": example.source.consumer, "min_pending": 500,
                   "poll_interval": 30.0}}


def test_provider_docs_include_example_dags_that_have_their_markers():
    """docs/airflow/: every exampleinclude names a DAG file holding both markers, every toctree
    entry exists, and every example DAG is shown somewhere."""
    import re

    docs = REPO / "docs" / "airflow"
    included = set()
    for page in docs.rglob("*.rst"):
        text = page.read_text()
        for path, start, end in re.findall(
                r"exampleinclude:: /\.\./\.\./(\S+)\n(?:\s+:\w+:.*\n)*?\s+:start-after: (.+)\n"
                r"\s+:end-before: (.+)\n", text):
            source = (REPO / path).read_text()
            assert start.strip() in source and end.strip() in source, (page, path)
            assert source.index(start.strip()) < source.index(end.strip())
            included.add(path)
        for entry in re.findall(r"^    (?:.*<)?([\w/]+)>?$", text.split(".. toctree::")[-1]
                                if ".. toctree::" in text else "", flags=re.M):
            assert (docs / f"{entry}.rst").exists(), (page, entry)
    assert included == {f"dags/{p.name}" for p in DAGS.glob("*.py")}
