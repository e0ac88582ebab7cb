"""Drain when there is a backlog: a deferrable sensor waits (in the triggerer, holding no worker
slot) until the consumer has at least `min_pending` messages, then the drain runs.

`@continuous` with one active run: as soon as a drain ends, the next run starts waiting again.
Errors are not "no backlog": a missing stream/consumer or refused credentials fail the sensor at
once (no retries); an unreachable server fails the attempt and is retried.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from js_etl.airflow import JetStreamBacklogSensor, JetStreamToDeltaOperator

CONFIG = os.environ.get(
    "JS_ETL_DAG_CONFIG", str(Path(__file__).resolve().parents[1] / "conf" / "example.yaml")
)

# [START howto_sensor_jetstream_backlog]
with DAG(
    dag_id="js_etl_backlog_drain",
    description="Wait for a JetStream backlog, then drain it into Delta",
    schedule="@continuous",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
    tags=["js-etl", "jetstream", "delta"],
    doc_md=__doc__,
):
    wait = JetStreamBacklogSensor(
        task_id="wait_for_backlog",
        config_path=CONFIG,  # the very consumer the drain reads: read when the task runs
        min_pending=500,
        poll_interval=60,
        timeout=timedelta(hours=24),
        nats_conn_id="nats_default",
    )
    drain = JetStreamToDeltaOperator(
        task_id="drain",
        config_path=CONFIG,
        overrides={"run.max_seconds": "30m"},
        nats_conn_id="nats_default",
        execution_timeout=timedelta(minutes=45),
    )
    wait >> drain
# [END howto_sensor_jetstream_backlog]
