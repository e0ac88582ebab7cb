"""Scheduled drain: every hour, land what the durable consumer holds in its Delta table.

Uses `conf/example.yaml` (stream `ORDERS`, consumer `orders_to_delta`) unless
`JS_ETL_DAG_CONFIG` names another config. NATS comes from the `nats_default` connection, Spark
from `spark_default`. A run is bounded (`run.max_seconds`), one run at a time: overlapping runs on
one consumer would be refused anyway (exit 73), and a retry simply resumes from the consumer.
The Delta table is this task's Asset, so downstream DAGs can use `schedule=[delta_asset(...)]`.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from js_etl.airflow import JetStreamToDeltaOperator

CONFIG = os.environ.get(
    "JS_ETL_DAG_CONFIG", str(Path(__file__).resolve().parents[1] / "conf" / "example.yaml")
)

# [START howto_operator_jetstream_to_delta]
with DAG(
    dag_id="js_etl_drain_to_delta",
    description="Drain the JetStream consumer into Delta every hour",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args={
        "retries": 3,
        "retry_delay": timedelta(minutes=2),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=20),
    },
    tags=["js-etl", "jetstream", "delta"],
    doc_md=__doc__,
):
    JetStreamToDeltaOperator(
        task_id="drain",
        config_path=CONFIG,
        overrides={"run.max_seconds": "45m"},  # leave room before the next hourly run
        nats_conn_id="nats_default",
        spark_conn_id="spark_default",
        execution_timeout=timedelta(minutes=55),
    )
# [END howto_operator_jetstream_to_delta]
