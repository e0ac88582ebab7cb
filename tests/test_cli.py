"""The commands users run — ``js-etl drain|status`` and the spark-submit job — as real processes."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streams import publish_and_wait

from js_etl.demo import demo_config
from js_etl.errors import TerminalError
from js_etl.jetstream.errors import ConsumerNotFoundError, NatsUnavailableError

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
JS_ETL = str(BIN / "js-etl")


def run(*args: str, timeout: float = 180, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "TZ": "UTC",
           **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.fixture
def stream_with_messages(js, names):
    js.run(js.admin.add_stream(names.stream, [names.subject]))
    messages = [(f"{names.prefix}.e", json.dumps({"id": i, "kind": "k"}).encode())
                for i in range(120)]
    publish_and_wait(js, names, messages)
    return names


def drain_args(names, nats_server, table: Path) -> list[str]:
    return ["--config", str(demo_config()),
            "--set", f"nats.servers={nats_server.url}",
            "--set", f"source.stream={names.stream}", "--set", f"source.consumer={names.consumer}",
            "--set", f"target.path={table}", "--set", "fetch.pull_timeout=2"]


def test_config_errors_fail_fast_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: {stream: S, consumer: c}\ntarget: {path: /tmp/x}\nfetch: {batch: -3}\n")
    started = time.monotonic()
    result = run(JS_ETL, "drain", "--config", str(bad))
    assert result.returncode == 2
    assert "fetch.batch" in last_line(result.stderr)
    assert time.monotonic() - started < 15  # no Spark was started to find this out

    typo = run(JS_ETL, "drain", "--config", str(bad), "--set", "fetch.batchh=3",
               "--report-file", f"file://{tmp_path}/report.json")
    assert typo.returncode == 2
    assert "did you mean 'fetch.batch'" in last_line(typo.stderr)
    # Where the report would have gone, the reason goes (a driver on a cluster has no output
    # the operator sees).
    assert json.loads((tmp_path / "report.json").read_text()) == {
        "error": last_line(typo.stderr), "exit_code": 2}

    # Usage errors end with the same kind of reason line (the Airflow operator shows it).
    usage = run(JS_ETL, "backfill", "--config", str(bad), "--from-seq", "0")
    assert usage.returncode == 2
    assert last_line(usage.stderr).startswith("js-etl: UsageError: argument --from-seq")


def test_unreachable_server_is_a_transient_error_with_a_reason(tmp_path):
    from js_etl.demo.server import free_port

    result = run(JS_ETL, "status", "--config", str(demo_config()),
                 "--set", f"nats.servers=nats://127.0.0.1:{free_port()}",
                 "--set", "nats.connect_timeout=1")
    assert result.returncode == 75
    assert "cannot connect to NATS" in last_line(result.stderr)


def test_workers_whose_python_lacks_js_etls_dependencies_fail_in_one_clear_line(
        stream_with_messages, nats_server, js, tmp_path):
    """A PYSPARK_PYTHON without pyarrow or js-etl: the executors' Python daemon
    (js_etl.drain.worker_daemon) cannot start; the run says why in one line, exit 1, and
    nothing is delivered."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    names = stream_with_messages
    result = run(JS_ETL, "drain", *drain_args(names, nats_server, tmp_path / "t"),
                 env={"PYSPARK_PYTHON": str(bare / "bin" / "python")})
    assert result.returncode == 1, result.stderr[-2000:]
    reason = ("js-etl: the executors' Python could not start a worker: ModuleNotFoundError: No "
              "module named 'pyarrow' (the workers' Python, PYSPARK_PYTHON or spark-submit's "
              "spark.pyspark.python, must have js-etl and its dependencies)")
    assert reason in result.stderr.splitlines(), result.stderr[-3000:]
    info = js.consumer_info(names.stream, names.consumer)
    assert (info.num_pending, info.num_ack_pending) == (120, 0)


def test_spark_submit_without_delta_says_how_to_bring_it(stream_with_messages, nats_server,
                                                         tmp_path):
    """(The README's spark-submit with Delta runs in tests/test_readme.py.)"""
    missing = run(str(BIN / "spark-submit"), "--master", "local[2]",
                  str(REPO / "jobs" / "drain_to_delta.py"),
                  *drain_args(stream_with_messages, nats_server, tmp_path / "t"))
    assert missing.returncode == 2
    assert "spark-submit $(js-etl spark-args)" in (missing.stdout + missing.stderr)


def test_speculation_is_refused_before_anything_is_fetched(stream_with_messages, nats_server,
                                                            js, tmp_path):
    """Two attempts of one fetch task would both pull from the consumer. Spark reads the
    setting trimmed and in any case: " TRUE" turns speculation on (got past the check once)."""
    names = stream_with_messages
    result = run(str(BIN / "spark-submit"), "--master", "local[2]",
                 *shlex.split(run(JS_ETL, "spark-args").stdout),
                 "--conf", "spark.speculation= TRUE ",
                 str(REPO / "jobs" / "drain_to_delta.py"),
                 *drain_args(names, nats_server, tmp_path / "t"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert ("js-etl: ConfigError: spark.speculation=true runs a fetch task twice and both "
            "attempts pull from the consumer: run the drain with --conf spark.speculation=false"
            ) in (result.stdout + result.stderr).splitlines(), result.stderr[-3000:]
    with pytest.raises(ConsumerNotFoundError):  # refused before the run touched the server
        js.consumer_info(names.stream, names.consumer)


def _fail_on_executor(error: Exception):
    def task(batches):
        for _ in batches:
            pass
        raise error
        yield  # a generator, as mapInArrow wants

    return task


@pytest.mark.parametrize("error, reason, code", [
    (NatsUnavailableError("cannot connect to NATS at nats://10.0.0.9:4222: refused"),
     "NatsUnavailableError: cannot connect to NATS at nats://10.0.0.9:4222: refused", 75),
    (TerminalError("ack subject 'a.b' does not start with '$JS.ACK.S.C': acks would be lost"),
     "TerminalError: ack subject 'a.b' does not start with '$JS.ACK.S.C': acks would be lost", 2),
    (RuntimeError("disk full"), "RuntimeError: disk full", 1),
])
def test_an_executor_error_keeps_its_reason_and_exit_code(spark, error, reason, code):
    from js_etl.spark.failures import failure_reason

    with pytest.raises(Exception) as raised:  # Spark wraps it: PythonException / Py4JJavaError
        spark.range(1).mapInArrow(_fail_on_executor(error), "id long").collect()

    assert not isinstance(raised.value, type(error))
    got_reason, got_code = failure_reason(raised.value)
    assert (got_reason, got_code) == (reason, code)


def test_version_and_plain_help():
    from importlib.metadata import version

    version_run = subprocess.run([str(BIN / "js-etl"), "--version"], capture_output=True,
                                 text=True, timeout=60)
    assert version_run.returncode == 0
    assert version_run.stdout.strip() == f"js-etl {version('js-etl')}"
    help_run = subprocess.run([str(BIN / "js-etl"), "--help"], capture_output=True, text=True,
                              timeout=60)
    assert help_run.returncode == 0 and "``" not in help_run.stdout
    assert "73 another run holds the consumer" in " ".join(help_run.stdout.split())


@pytest.mark.parametrize("mistake, setting, exit_code, reason", [
    ("wrong port", "nats.servers=nats://127.0.0.1:{free_port}", 75,
     "js-etl: NatsUnavailableError: cannot connect to NATS at nats://127.0.0.1:"),
    ("missing stream", "source.stream=NO_SUCH_STREAM", 2,
     "js-etl: StreamNotFoundError: stream 'NO_SUCH_STREAM' not found: check source.stream"),
    ("DDL typo", "decode.schema=id BIGINTT, kind STRING", 2,
     "js-etl: ConfigError: decode.schema is not a valid Spark DDL schema: unknown type "
     "'BIGINTT' in field 'id'"),
])
def test_cheap_mistakes_fail_in_one_line_before_spark_starts(stream_with_messages, nats_server,
                                                             tmp_path, mistake, setting,
                                                             exit_code, reason):
    from js_etl.demo.server import free_port

    names = stream_with_messages
    result = run(JS_ETL, "drain", *drain_args(names, nats_server, tmp_path / "t"),
                 "--set", setting.format(free_port=free_port()))
    assert result.returncode == exit_code, result.stderr[-2000:]
    # One line and nothing else: no JVM was started (it prints its own warnings first).
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(reason), result.stderr[-2000:]
    assert not (tmp_path / "t").exists()


def test_a_failure_is_one_line_and_its_traceback_only_with_verbose(stream_with_messages,
                                                                   nats_server, tmp_path):
    names = stream_with_messages
    args = [*drain_args(names, nats_server, tmp_path / "t"), "--set", "source.stream=NOPE"]
    quiet = run(JS_ETL, "drain", *args)
    verbose = run(JS_ETL, "--verbose", "drain", *args)
    assert quiet.returncode == verbose.returncode == 2
    assert len(quiet.stderr.strip().splitlines()) == 1
    assert "Traceback (most recent call last)" in verbose.stderr
    assert last_line(verbose.stderr) == last_line(quiet.stderr)


def test_the_example_config_drains_as_shipped(tmp_path):
    """conf/example.yaml against a server of its own (its stream and consumer names are fixed):
    only the server's address and the table's path change, as the file says they may. The
    report goes to stdout and to ``--report-file``; ``js-etl status`` reads the same config."""
    from deltalake import DeltaTable

    from js_etl.config import load_config
    from js_etl.demo.publish import publish, wait_for_messages
    from js_etl.demo.server import LocalNatsServer
    from js_etl.durable.policy import desired_consumer
    from js_etl.jetstream import ConnectionOptions, JetStreamSession

    example = REPO / "conf" / "example.yaml"
    env = {"JS_ETL__NATS__SERVERS": "", "JS_ETL__TARGET__PATH": str(tmp_path / "orders")}
    with LocalNatsServer(tmp_path / "nats") as server:
        env["JS_ETL__NATS__SERVERS"] = server.url
        with JetStreamSession(ConnectionOptions(servers=(server.url,))) as js:
            js.run(js.admin.add_stream("ORDERS", ["orders.>"]))
            config = load_config(example, environ=env)
            js.run(js.admin.create_consumer("ORDERS", desired_consumer(config)))
            orders = [(f"orders.{i}", json.dumps({
                "order_id": f"o-{i}", "customer_id": i, "amount": i + 0.5, "currency": "EUR",
                "created_at": f"2026-11-28T10:00:{i:02d}Z"}).encode()) for i in range(20)]
            js.run(publish(js.conn, orders))
            js.run(wait_for_messages(js.conn, "ORDERS", 20))
        report_file = tmp_path / "report.json"
        result = run(JS_ETL, "drain", "--config", str(example), "--report-file",
                     str(report_file), env=env, timeout=300)
        status = run(JS_ETL, "status", "--config", str(example), env=env)

    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(last_line(result.stdout))  # the report on stdout and in the file
    assert report == json.loads(report_file.read_text())
    assert report["messages_written"] == 20
    for key in ("bytes", "dead_letters", "rounds", "delta_versions", "first_seq", "last_seq",
                "pending_after", "seconds", "phase_seconds"):
        assert key in report
    table = DeltaTable(str(tmp_path / "orders")).to_pyarrow_table(
        columns=["order_id", "customer_id", "published_at", "date"]).to_pylist()
    assert sorted(r["customer_id"] for r in table) == list(range(20))
    assert all(r["date"] == r["published_at"].date() for r in table)  # its partition_by
    assert status.returncode == 0, status.stderr
    assert "ack pending" in status.stdout and "ack floor" in status.stdout
    assert "stream seq 20" in status.stdout
