"""Event-driven drain: an asset watcher in the triggerer starts this DAG when the consumer's
backlog crosses `min_pending` (Airflow's common.messaging `MessageQueueTrigger`, scheme `nats`).

Unlike js_etl_backlog_drain (a `@continuous` DAG whose sensor holds a run open while it waits),
no DAG run exists until there is work. The watcher fires once per crossing: after a drain has
brought the backlog below `min_pending`, the next crossing starts the next run.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher

from js_etl.airflow import JetStreamToDeltaOperator
from js_etl.config import load_config

CONFIG = os.environ.get(
    "JS_ETL_DAG_CONFIG", str(Path(__file__).resolve().parents[1] / "conf" / "example.yaml")
)
SOURCE = load_config(CONFIG).source  # watch the very consumer the drain reads

# [START howto_asset_watcher_nats]
backlog = Asset(
    name=f"nats_backlog_{SOURCE.stream}_{SOURCE.consumer}",
    watchers=[
        AssetWatcher(
            name="backlog_reached",
            trigger=MessageQueueTrigger(
                scheme="nats",
                nats_conn_id="nats_default",
                stream=SOURCE.stream,
                consumer=SOURCE.consumer,
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
