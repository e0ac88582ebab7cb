"""``js-etl demo``: the whole product on a laptop, with nothing to set up.

Starts a nats-server from the project's environment, creates a stream, publishes sample JSON
events (a few of them undecodable), drains them into a partitioned local Delta table, prints the
run report and a glance at the table and the dead letters, and stops the server. Its config,
``demo.yaml`` beside this module, is package data: a wheel install runs the demo too.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

from js_etl.config import load_config
from js_etl.demo.publish import publish, wait_for_messages
from js_etl.demo.server import LocalNatsServer
from js_etl.jetstream import JetStreamSession

KINDS = ("order", "refund", "payment", "shipment")


def demo_config() -> Path:
    """The demo's config file, ``js_etl/demo/demo.yaml`` of the installed package."""
    return Path(str(resources.files("js_etl.demo").joinpath("demo.yaml")))


def sample_events(n: int, *, seed: int = 7) -> list[tuple[str, bytes]]:
    """n events on demo.<kind>; every 997th is broken in one of three ways."""
    rng = random.Random(seed)
    broken = (b'{"id": 12, "kind": "order"', b"\xff\xfe not utf-8", b'{"id": "twelve"}')
    events = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        if i % 997 == 996:
            body = broken[(i // 997) % len(broken)]
        else:
            body = json.dumps({"id": i, "kind": kind, "amount": round(rng.uniform(1, 500), 2),
                               "ts": datetime.now(UTC).isoformat()}).encode()
        events.append((f"demo.{kind}", body))
    return events


def run_demo(config_path: Path, *, messages: int = 5000, keep: bool = False) -> int:
    from js_etl.drain.run import run_drain
    from js_etl.drain.writers.columnar_plan import expects_columnar
    from js_etl.spark.session import local_session

    work = Path(".demo")
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(exist_ok=True)
    with LocalNatsServer(work / "nats") as server:
        print(f"nats-server {server.url} (pid {server.pid}), store {server.store_dir}")
        config = load_config(config_path, [f"nats.servers={server.url}"])
        stream = config.source.stream
        with JetStreamSession(config.nats.connection_options()) as js:
            js.run(js.admin.add_stream(stream, ["demo.>"]))
            js.run(publish(js.conn, sample_events(messages)))
            js.run(wait_for_messages(js.conn, stream, messages))
        print(f"published {messages} events to stream {stream}")

        spark = local_session(config.spark.master, "js-etl-demo", config.spark.conf,
                              log_level="ERROR", columnar=expects_columnar(config))
        try:
            report = run_drain(spark, config)
            table = spark.read.format("delta").load(config.target.path)
            print("\nrows by date and kind:")
            table.groupBy("date", "kind").count().orderBy("date", "kind").show()
            print("a few rows:")
            table.orderBy("seq").select("seq", "subject", "published_at", "id", "kind",
                                        "amount").show(5, truncate=False)
            dead = config.target.resolved_dead_letter_path
            if dead and report.dead_letters:
                print("dead letters:")
                spark.read.format("delta").load(dead).orderBy("seq").select(
                    "seq", "subject", "error").show(truncate=False)
        finally:
            spark.stop()
    print("run report:", file=sys.stderr)
    print(report.to_json())
    return 0
