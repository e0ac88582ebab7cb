"""JetStreamBacklogSensor in real DAG runs (dag.test() on SQLite, real nats-server with a token)."""

from __future__ import annotations

import threading
import time

import pytest
from airflow_support import (
    TOKEN,
    failures,
    lineage_events,
    load_dag,
    task_states,
    write_dag,
    xcom,
)

from js_etl.demo.publish import publish, wait_for_messages
from js_etl.jetstream import AckPolicy, ConsumerConfig

# dag.test() runs tasks through Airflow's in-process execution API, whose FastAPI TestClient
# import warns about starlette/httpx: Airflow's own dependency, nothing these tests can change.
pytestmark = pytest.mark.filterwarnings("ignore::starlette.exceptions.StarletteDeprecationWarning")


def _triggers() -> list[tuple[int, str, dict]]:
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session

    with create_session() as session:
        return [(t.id, t.classpath, dict(t.kwargs)) for t in session.query(Trigger).all()]


def _stream_with_consumer(tjs, names) -> None:
    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))
    tjs.run(tjs.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_policy=AckPolicy.EXPLICIT)))


def _job_config(tmp_path, names) -> str:
    config = tmp_path / "job.yaml"
    config.write_text(f"source: {{stream: {names.stream}, consumer: {names.consumer}}}\n"
                      f"target: {{path: '{tmp_path / 'table'}'}}\n")
    return str(config)


@pytest.mark.parametrize("named_by", ["names", "config"])
def test_sensor_defers_and_completes_when_messages_arrive(tjs, names, tmp_path, named_by):
    _stream_with_consumer(tjs, names)
    if named_by == "names":
        consumer = f"stream={names.stream!r}, consumer={names.consumer!r}"
    else:  # the drain's config, read when the sensor runs; the resumed task does not read it
        consumer = f"config_path={_job_config(tmp_path, names)!r}"
    dag_id = f"sensor_waits_{named_by}_{names.stream}"
    dag = load_dag(write_dag(dag_id, f"""
        with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                 catchup=False) as dag:
            JetStreamBacklogSensor(task_id="wait", {consumer}, min_pending=3,
                                   poll_interval=0.2, nats_conn_id="nats_test",
                                   on_failure_callback=record_failure)
        """))
    known = {t[0] for t in _triggers()}
    published = threading.Event()
    problems: list[BaseException] = []

    def publish_once_deferred() -> None:
        # Publish only once the sensor's trigger exists: the first check saw nothing pending,
        # so what ends the wait is the trigger seeing the messages arrive.
        from js_etl.jetstream import ConnectionOptions, JetStreamSession, Secret

        try:
            deadline = time.monotonic() + 60
            while not any(t[0] not in known for t in _triggers()):
                if time.monotonic() > deadline:
                    raise TimeoutError("the sensor never deferred")
                time.sleep(0.1)
            time.sleep(1.0)  # let the trigger poll an empty consumer a few times
            options = ConnectionOptions(servers=tjs.conn.options.servers, token=Secret(TOKEN))
            with JetStreamSession(options) as js:
                js.run(publish(js.conn, [(f"{names.prefix}.e", b"m")] * 3))
                js.run(wait_for_messages(js.conn, names.stream, 3))
            published.set()
        except BaseException as e:  # surfaced by the assertions below
            problems.append(e)

    publisher = threading.Thread(target=publish_once_deferred, daemon=True)
    publisher.start()
    dag_run = dag.test()
    publisher.join(30)

    assert not problems, problems
    assert published.is_set()
    assert task_states(dag_run) == {"wait": "success"}, failures(dag_id)
    assert xcom(dag_run, "wait") == 3
    new = [t for t in _triggers() if t[0] not in known]
    assert [t[1] for t in new] == ["js_etl.airflow.triggers.JetStreamBacklogTrigger"]
    assert new[0][2] == {"nats_conn_id": "nats_test", "stream": names.stream,
                         "consumer": names.consumer, "min_pending": 3, "poll_interval": 0.2}
    assert TOKEN not in repr(new[0][2])  # what the metadata DB holds for the triggerer
    # Its lineage: the stream it watched (named by the trigger's event after the deferral).
    (complete,) = lineage_events(f"{dag_id}.wait", "COMPLETE")
    (watched,) = complete["inputs"]
    assert watched["name"] == names.stream
    assert watched["facets"]["natsJetStreamConsumer"]["consumer"] == names.consumer


def test_sensor_fails_with_the_reason_when_the_stream_or_consumer_is_missing(tjs, names,
                                                                            tmp_path):
    tjs.run(tjs.admin.add_stream(names.stream, [names.subject]))  # but no consumer
    config = _job_config(tmp_path, names)
    missing = str(tmp_path / "missing.yaml")
    dag_id = f"sensor_missing_{names.stream}"
    dag = load_dag(write_dag(dag_id, f"""
        with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
                 catchup=False, default_args={{"on_failure_callback": record_failure}}) as dag:
            JetStreamBacklogSensor(task_id="no_stream", stream="NO_SUCH_STREAM",
                                   consumer="c", poll_interval=0.2, nats_conn_id="nats_test")
            JetStreamBacklogSensor(task_id="no_consumer_poking", stream={names.stream!r},
                                   consumer="no_such_consumer", poll_interval=0.2,
                                   deferrable=False, nats_conn_id="nats_test")
            JetStreamBacklogSensor(task_id="refused", stream={names.stream!r},
                                   consumer="c", poll_interval=0.2,
                                   nats_conn_id="nats_bad_token")
            JetStreamBacklogSensor(task_id="no_connection", stream={names.stream!r},
                                   consumer="c", poll_interval=0.2,
                                   nats_conn_id="no_such_connection")
            JetStreamBacklogSensor(task_id="no_config", config_path={missing!r},
                                   poll_interval=0.2, nats_conn_id="nats_test")
            JetStreamBacklogSensor(task_id="overridden", config_path={config!r},
                                   overrides={{"source.consumer": "overridden_consumer"}},
                                   poll_interval=0.2, nats_conn_id="nats_test")
        """))
    dag_run = dag.test()

    assert task_states(dag_run) == {"no_stream": "failed", "no_consumer_poking": "failed",
                                    "refused": "failed", "no_connection": "failed",
                                    "no_config": "failed", "overridden": "failed"}
    failed = failures(dag_id)
    assert failed["no_stream"]["type"] == "AirflowFailException"  # needs a fix: no retries
    assert failed["no_stream"]["message"].startswith(
        "NO_SUCH_STREAM/c: StreamNotFoundError: stream not found")
    assert failed["no_consumer_poking"]["type"] == "AirflowFailException"
    assert "ConsumerNotFoundError: consumer not found" in failed["no_consumer_poking"]["message"]
    assert "AuthorizationError: NATS refused the credentials" in failed["refused"]["message"]
    assert failed["no_connection"]["type"] == "AirflowFailException"  # as the operator's
    assert "no_such_connection" in failed["no_connection"]["message"]
    # A config that cannot be read needs a fix: no retries. Overrides apply as the drain's do.
    assert failed["no_config"]["type"] == "AirflowFailException"
    assert failed["no_config"]["message"] == (
        f"js-etl: ConfigError: cannot read config file {missing}: No such file or directory")
    assert failed["overridden"]["message"].startswith(
        f"{names.stream}/overridden_consumer: ConsumerNotFoundError")
    assert xcom(dag_run, "no_stream") is None


def test_sensor_refuses_bad_settings_at_construction():
    from js_etl.airflow import JetStreamBacklogSensor

    with pytest.raises(ValueError, match="needs stream= and consumer=, or config_path="):
        JetStreamBacklogSensor(task_id="s")
    with pytest.raises(ValueError, match="needs stream= and consumer=, or config_path="):
        JetStreamBacklogSensor(task_id="s", stream="S")
    with pytest.raises(ValueError, match="takes stream= and consumer=, or config_path=, not both"):
        JetStreamBacklogSensor(task_id="s", stream="S", consumer="c", config_path="/j.yaml")
    with pytest.raises(ValueError, match="overrides= applies to config_path= only"):
        JetStreamBacklogSensor(task_id="s", stream="S", consumer="c", overrides={"a.b": 1})
    with pytest.raises(ValueError, match="min_pending must be an integer >= 1"):
        JetStreamBacklogSensor(task_id="s", stream="S", consumer="c", min_pending=0)
    with pytest.raises(ValueError, match="poll_interval must be a positive"):
        JetStreamBacklogSensor(task_id="s", stream="S", consumer="c", poll_interval=0)
    # A template is checked once rendered; a config is read only when the task runs.
    JetStreamBacklogSensor(task_id="s", stream="S", consumer="c",
                           min_pending="{{ params.n }}")
    JetStreamBacklogSensor(task_id="s", config_path="/not/there.yaml")
