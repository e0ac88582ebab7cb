"""Drains as the fault and exactly-once tests run them: a stream of good and poison events, the
job's config, a drain in its own process, and the exactly-once check read back from Delta and
the consumer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from streams import publish_and_wait

from js_etl.config import load_config
from js_etl.jetstream import (
    ConsumerConfig,
    JetStreamSession,
)

pytestmark = pytest.mark.slow


REPO = Path(__file__).resolve().parents[2]


BIN = Path(sys.executable).parent


SCHEMA = "id BIGINT"


def events(names: Any, n: int, *, poison_every: int = 0) -> tuple[list[Any], list[int], list[int]]:
    """n messages (seq i+1 carries id i); every ``poison_every``-th is undecodable."""
    messages, good, bad = [], [], []
    for i in range(n):
        if poison_every and i % poison_every == poison_every - 1:
            messages.append((f"{names.prefix}.e", b"{not json"))
            bad.append(i + 1)
        else:
            messages.append((f"{names.prefix}.e", json.dumps({"id": i}).encode()))
            good.append(i + 1)
    return messages, good, bad


def setup_stream(js: JetStreamSession, names: Any, messages: list[Any], **consumer: Any) -> None:
    js.run(js.admin.add_stream(names.stream, [names.subject]))
    js.run(js.admin.create_consumer(names.stream, ConsumerConfig(
        durable_name=names.consumer, ack_wait=consumer.pop("ack_wait", 300),
        max_ack_pending=consumer.pop("max_ack_pending", 100_000), **consumer)))
    publish_and_wait(js, names, messages)


def overrides(names: Any, url: str, table: Path | str, *extra: str) -> list[str]:
    return [f"nats.servers={url}", f"source.stream={names.stream}",
            f"source.consumer={names.consumer}", f"target.path={table}",
            "decode.format=json", f"decode.schema={SCHEMA}", "fetch.partitions=2",
            "fetch.batch=100", "fetch.pull_timeout=1", *extra]


def config_for(names: Any, url: str, table: Path | str, *extra: str) -> Any:
    return load_config(None, overrides(names, url, table, *extra), environ={})


def assert_exactly_once(spark: Any, js: JetStreamSession, names: Any, table: Path | str,
                        good: list[int], bad: list[int]) -> None:
    """``table`` (a local path, or an s3:// URL read by deltalake with the process's AWS_*
    variables) holds every good message once, its dead-letter table every poison one, and the
    consumer has nothing pending or unacked."""
    assert table_seqs(spark, names, str(table)) == sorted(good), \
        "table must hold every good message exactly once"
    dead = table_seqs(spark, names, f"{table}_dead_letters")
    assert dead == bad, "dead letters must be exactly the poison messages"
    # Read once, no settling: a run returns only after the server confirmed applying its acks.
    info = js.consumer_info(names.stream, names.consumer)
    assert (info.num_pending, info.num_ack_pending) == (0, 0)


def table_seqs(spark: Any, names: Any, table: str) -> list[int]:
    """The sorted seqs of ``names.stream`` a table holds ([] where there is no table): read by
    the session's Spark, or by deltalake where the table is in S3 or the session is a Spark
    Connect client (a reader independent of the server under test)."""
    from js_etl.spark.session import is_connect

    if table.startswith("s3://") or is_connect(spark):
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            rows = DeltaTable(table).to_pyarrow_table(columns=["stream", "seq"])
        except TableNotFoundError:
            return []
        return sorted(s for st, s in zip(rows.column("stream").to_pylist(),
                                         rows.column("seq").to_pylist(), strict=True)
                      if st == names.stream)
    if not (Path(table) / "_delta_log").exists():
        return []
    rows = spark.read.format("delta").load(table).where(f"stream = '{names.stream}'")
    return sorted(r.seq for r in rows.select("seq").collect())


def drain_process(names: Any, url: str, table: Path | str, fault: str | None, marker: str,
                  *extra: str, gate: Path | None = None, command: str = "drain",
                  env_extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``js-etl <command>`` (a drain by default) in its own process, its fault point armed."""
    env = {**os.environ, "TZ": "UTC", "JS_ETL_TEST_MARKER": marker,
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("JS_ETL_FAULT", None)
    if fault:
        env["JS_ETL_FAULT"] = fault
    if gate is not None:
        env["JS_ETL_FAULT_GATE"] = str(gate)
    env.update(env_extra or {})
    args = [str(BIN / "js-etl"), command]
    for item in overrides(names, url, table, *extra):
        args += ["--set", item]
    return subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def assert_no_process_left(marker: str) -> None:
    """The killed driver's JVM must exit too (it watches the driver's pipe)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        left = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.environ().get("JS_ETL_TEST_MARKER") == marker:
                    left.append(proc.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if not left:
            return
        time.sleep(0.2)
    for pid in left:
        psutil.Process(pid).kill()
    pytest.fail(f"processes of the killed run still alive: {left}")
