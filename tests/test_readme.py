"""The README's "Drain your own stream", "Backfills", "On a cluster and on S3" (its spark-submit)
and "From PySpark" examples, and the first example of docs/pyspark.md, run as written
against a real nats-server of this module's own (the README's names, ORDERS …, are fixed): the
`nats consumer add` line with the real NATS CLI, the config file as shown, `js-etl drain` and
`js-etl backfill` as commands, the PySpark snippet in a session. Only what the README itself says
may be changed is: the server's address (`JS_ETL__NATS__SERVERS`) and the table paths
(`JS_ETL__TARGET__PATH`, `--set target.path=`), which point into the test's directory."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from js_etl.demo.publish import publish
from js_etl.demo.server import LocalNatsServer
from js_etl.jetstream import ConnectionOptions, JetStreamSession

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
MESSAGES = 120
KINDS = (b"book", b"food", b"toys")


def section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)


@pytest.fixture(scope="module")
def orders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNatsServer]:
    """A server with the stream ORDERS holding MESSAGES orders, one of them not JSON."""
    server = LocalNatsServer(tmp_path_factory.mktemp("readme-nats"))
    server.start()
    try:
        with JetStreamSession(ConnectionOptions(servers=(server.url,))) as js:
            js.run(js.admin.add_stream("ORDERS", ["orders.>"]))
            js.run(publish(js.conn, [
                *((f"orders.{i % 3}", b'{"id":%d,"kind":"%s","amount":%d.5}' % (
                    i, KINDS[i % 3], i)) for i in range(1, MESSAGES)),
                ("orders.x", b"not json")]))
            assert js.stream_info("ORDERS").state.messages == MESSAGES
        yield server
    finally:
        server.stop()


def run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    words = shlex.split(command.replace("\\\n", " "))
    assert words[0] == "js-etl", command
    return subprocess.run([str(Path(sys.executable).with_name("js-etl")), *words[1:]], cwd=cwd,
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=600, check=False)


def run_nats_cli(script: str, url: str, nats_cli: str, cwd: Path) -> None:
    """A shell block of ``nats`` commands, with the real NATS CLI, against ``url``."""
    made = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd,
                          env={**os.environ, "NATS_URL": url, "HOME": str(cwd),
                               "PATH": f"{Path(nats_cli).parent}{os.pathsep}{os.environ['PATH']}"},
                          capture_output=True, text=True, timeout=120, check=False)
    assert made.returncode == 0, made.stderr


def test_drain_your_own_stream_as_the_readme_shows(orders, nats_cli, tmp_path):
    from deltalake import DeltaTable

    own = section("Drain your own stream")
    (add,) = blocks(own, "sh")
    (yaml,) = blocks(own, "yaml")
    (drain,) = blocks(own, "bash")
    run_nats_cli(add, orders.url, nats_cli, tmp_path)
    (tmp_path / "orders.yaml").write_text(yaml)
    table = tmp_path / "lake" / "orders"
    env = {"JS_ETL__NATS__SERVERS": orders.url, "JS_ETL__TARGET__PATH": str(table)}

    result = run(drain.strip(), tmp_path, env)

    assert result.returncode == 0, result.stderr[-3000:]
    report = result.stdout.strip().splitlines()[-1]
    assert '"messages_written":119' in report and '"dead_letters":1' in report, report
    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    assert sorted(r["id"] for r in rows) == list(range(1, MESSAGES))
    assert {"subject", "stream", "seq", "published_at", "headers", "kind", "amount",
            "date"} <= set(rows[0])
    (dead,) = DeltaTable(f"{table}_dead_letters").to_pyarrow_table().to_pylist()
    assert dead["data"] == b"not json" and dead["error"]

    # Backfills: the command as shown, its table in the test's directory.
    (backfill,) = blocks(section("Backfills"), "bash")
    backfill = backfill.strip().replace("/data/lake/", f"{tmp_path}/lake/")
    result = run(backfill, tmp_path, {"JS_ETL__NATS__SERVERS": orders.url,
                                      "JS_ETL__TARGET__PATH": str(table)})
    assert result.returncode == 0, result.stderr[-3000:]
    again = DeltaTable(str(tmp_path / "lake" / "orders_backfill")).to_pyarrow_table()
    assert sorted(again.column("seq").to_pylist()) == list(range(1, 101))

    # Under spark-submit: the command as shown (Delta from `js-etl spark-args`), the job script
    # of the checkout, its report file in the test's directory. The stream is the module's (the
    # PySpark examples count it), so the run finds the consumer drained: Delta loaded, the table
    # read, nothing written twice.
    (submit,) = blocks(section("On a cluster and on S3"), "bash")
    report = tmp_path / "report.json"
    (tmp_path / "jobs").symlink_to(REPO / "jobs")
    submitted = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", submit.replace("/tmp/report.json", str(report))],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, **env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                                          f"{os.environ['PATH']}"})
    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
    assert '"messages_written":0' in report.read_text()
    assert '"stopped_because":"drained"' in report.read_text()
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == MESSAGES - 1


def test_the_pyspark_example_runs_in_a_session(orders, spark, capsys):
    (snippet,) = blocks(section("From PySpark"), "python")
    exec(snippet.replace("nats://127.0.0.1:4222", orders.url), {"spark": spark})
    shown = capsys.readouterr().out
    assert re.search(r"\|\s*book\|\s*39\|", shown), shown
    assert re.search(r"\|\s*food\|\s*40\|", shown), shown


def test_the_pyspark_pages_example_runs_in_a_session_with_delta(orders, spark, capsys, tmp_path):
    """docs/pyspark.md's first example: the last hour's orders joined with labels, written to
    Delta, and the dead letters shown; `spark` is the suite's session, which has Delta."""
    page = (REPO / "docs" / "pyspark.md").read_text()
    snippet = blocks(page, "python")[0]
    exec(snippet.replace("nats://127.0.0.1:4222", orders.url)
         .replace("/tmp/orders_by_kind", str(tmp_path / "orders_by_kind")), {"spark": spark})
    written = {r.label: r.orders for r in spark.read.format("delta").load(
        str(tmp_path / "orders_by_kind")).collect()}
    assert written == {"Books": 39, "Groceries": 40}
    assert "payload is not JSON" in capsys.readouterr().out


def test_the_pyspark_pages_connect_example_runs_as_a_client(orders, spark_connect_server,
                                                            tmp_path):
    """docs/pyspark.md's Spark Connect example, as a script of its own (Connect mode is
    process-wide) against the suite's Spark Connect server."""
    page = (REPO / "docs" / "pyspark.md").read_text()
    snippet = blocks(page.split("\n## Over Spark Connect\n", 1)[1], "python")[0]
    script = tmp_path / "connect_example.py"
    script.write_text(snippet.replace("nats://127.0.0.1:4222", orders.url)
                      .replace("sc://127.0.0.1:15002", spark_connect_server.url))
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, check=False, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.split() == [str(MESSAGES), str(MESSAGES - 1)]  # one order is not JSON


def test_the_streaming_examples_run_as_written(orders, spark, nats_cli, capsys, tmp_path,
                                               monkeypatch):
    """The README's Structured Streaming example and docs/streaming.md's — the notebook query,
    then the packaged job: its `nats consumer add`, its config and its command (the CLI's own
    entry point, in this process: its session is the suite's) — with the tables and checkpoints
    in the test's directory; each reads the whole stream once."""
    from deltalake import DeltaTable

    from js_etl.cli import main

    def here(text: str) -> str:
        return (text.replace("nats://127.0.0.1:4222", orders.url)
                .replace("/tmp/", f"{tmp_path}/tmp/").replace("/data/", f"{tmp_path}/data/"))

    snippet = blocks(section("Structured Streaming"), "python")[0]  # then the Airflow DAG
    exec(here(snippet), {"spark": spark})
    raw = DeltaTable(str(tmp_path / "tmp" / "lake" / "orders_raw")).to_pyarrow_table()
    assert raw.num_rows == MESSAGES

    page = (REPO / "docs" / "streaming.md").read_text()
    exec(here(blocks(page, "python")[0]), {"spark": spark})
    assert capsys.readouterr().out.split() == [str(MESSAGES)]

    (add,) = blocks(page, "sh")
    (yaml,) = blocks(page, "yaml")
    (stream,) = blocks(page, "bash")
    run_nats_cli(add, orders.url, nats_cli, tmp_path)
    (tmp_path / "orders_stream.yaml").write_text(here(yaml))
    monkeypatch.chdir(tmp_path)
    words = shlex.split(stream.strip())
    assert words[:2] == ["js-etl", "stream"]
    assert main(words[1:]) == 0, capsys.readouterr().err[-3000:]
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (report["messages_written"], report["dead_letters"]) == (MESSAGES - 1, 1)
    assert [b["last_seq"] for b in report["batches"]] == [50, 100, MESSAGES]
    table = tmp_path / "data" / "lake" / "orders_stream"
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == MESSAGES - 1
    (dead,) = DeltaTable(f"{table}_dead_letters").to_pyarrow_table().to_pylist()
    assert dead["data"] == b"not json"
    with JetStreamSession(ConnectionOptions(servers=(orders.url,))) as js:
        assert js.consumer_info("ORDERS", "orders_stream").num_pending == 0
