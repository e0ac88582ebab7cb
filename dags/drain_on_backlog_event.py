"""Event-driven drain: an asset watcher in the triggerer starts this DAG when the consumer's
backlog crosses `min_pending` (Airflow's common.messaging `MessageQueueTrigger`, scheme `nats`).

Unlike js_etl_backlog_drain (a `@continuous` DAG whose sensor holds a run open while it waits),
no DAG run exists until there is work. The watcher fires once per crossing: after a drain has
brought the backlog below `min_pending`, the next crossing starts the next run.

The watcher is built when the DAG is parsed, which reads no config: it names the consumer itself,
`JS_ETL_DAG_STREAM` and `JS_ETL_DAG_CONSUMER` (default: those of `conf/example.yaml`). Set them
to the `source.stream` and `source.consumer` of the drain's config.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher

from js_etl.airflow import JetStreamToDeltaOperator

CONFIG = os.environ.get(
    "JS_ETL_DAG_CONFIG", str(Path(__file__).resolve().parents[1] / "conf" / "example.yaml")
)
STREAM = os.environ.get("JS_ETL_DAG_STREAM", "ORDERS")
CONSUMER = os.environ.get("JS_ETL_DAG_CONSUMER", "orders_to_delta")

# [START howto_asset_watcher_nats]
backlog = Asset(
    name=f"nats_backlog_{STREAM}_{CONSUMER}",
    watchers=[
        AssetWatcher(
            name="backlog_reached",
            trigger=MessageQueueTrigger(
                scheme="nats",
                nats_conn_id="nats_default",
                stream=STREAM,
                consumer=CONSUMER,
                min_pending=500,
                poll_interval=30,
            ),
        )
    ],
)

with DAG(
    dag_id="js_etl_drain_on_backlog_event",
    description="Drain a JetStream consumer into Delta when its backlog crosses a threshold",
    schedule=[backlog],
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
    tags=["js-etl", "jetstream", "delta"],
    doc_md=__doc__,
):
    JetStreamToDeltaOperator(
        task_id="drain",
        config_path=CONFIG,
        overrides={"run.max_seconds": "30m"},
        nats_conn_id="nats_default",
        execution_timeout=timedelta(minutes=45),
    )
# [END howto_asset_watcher_nats]
