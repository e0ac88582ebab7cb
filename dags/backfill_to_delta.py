"""Manual backfill: re-read a range of the stream into a Delta table.

Trigger it with parameters (UI "Trigger DAG w/ config", or
`airflow dags trigger js_etl_backfill_to_delta -c '{"from_seq": 1000, "to_seq": 5000}'`):

* where the range starts: `from_seq` (a stream sequence) or `from_time` (RFC 3339, e.g.
  `2026-11-01T00:00:00Z`); where it ends (optional, default: the stream's last message at
  start): `to_seq` or `to_time`. Both ends are inclusive.
* `target_path`: the Delta table to write (empty: the config's `target`, in which case the job
  clamps the range to what the drain's consumer has already acked, so nothing is written twice).

The job is `js_etl/jobs/backfill.py`: ephemeral consumers, the durable consumer is never
touched. The table actually written is attached to the `js_etl_backfill` AssetAlias at run time,
since it is only known then.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, AssetAlias, Param, task

from js_etl.airflow import JetStreamToDeltaOperator

CONFIG = os.environ.get(
    "JS_ETL_DAG_CONFIG", str(Path(__file__).resolve().parents[1] / "conf" / "example.yaml")
)
RANGE_FLAGS = {"from_seq": "--from-seq", "to_seq": "--to-seq",
               "from_time": "--from-time", "to_time": "--to-time"}

# [START howto_operator_jetstream_backfill]
with DAG(
    dag_id="js_etl_backfill_to_delta",
    description="Backfill a range of a JetStream stream into Delta (manual, parameterised)",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    params={
        "from_seq": Param(None, type=["null", "integer"], minimum=1,
                          description="First stream sequence to read (or give from_time)"),
        "to_seq": Param(None, type=["null", "integer"], minimum=1,
                        description="Last stream sequence to read (optional)"),
        "from_time": Param(None, type=["null", "string"],
                           description="Read messages stored at or after (RFC 3339)"),
        "to_time": Param(None, type=["null", "string"],
                         description="Read messages stored at or before (RFC 3339; optional)"),
        "target_path": Param("", type="string",
                             description="Delta table to write; empty = the config's target"),
    },
    tags=["js-etl", "jetstream", "delta", "backfill"],
    doc_md=__doc__,
):

    @task(multiple_outputs=True)
    def backfill_plan(**context: Any) -> dict[str, Any]:
        """The job's range flags and config overrides, from the run's params."""
        params = context["params"]
        given = {name: params.get(name) for name in RANGE_FLAGS
                 if params.get(name) not in (None, "")}
        for first, second in (("from_seq", "from_time"), ("to_seq", "to_time")):
            if first in given and second in given:
                raise ValueError(f"give {first} or {second}, not both")
        if "from_seq" not in given and "from_time" not in given:
            raise ValueError("give where the range starts: from_seq or from_time")
        job_args = [part for name, value in given.items()
                    for part in (RANGE_FLAGS[name], str(value))]
        target = (params.get("target_path") or "").strip()
        return {"job_args": job_args, "overrides": {"target.path": target} if target else {}}

    plan = backfill_plan()
    JetStreamToDeltaOperator(
        task_id="backfill",
        job="backfill",
        config_path=CONFIG,
        overrides=plan["overrides"],
        job_args=plan["job_args"],
        nats_conn_id="nats_default",
        outlets=[AssetAlias("js_etl_backfill")],
    )
# [END howto_operator_jetstream_backfill]
