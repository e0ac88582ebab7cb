"""js-etl over Spark Connect: a real Spark Connect server (tools/spark_connect.py), and tests of
the classic suite run again as its client, with the same assertions.

They run in one pytest of their own, with ``JS_ETL_TEST_SPARK=connect`` and ``SPARK_REMOTE`` naming
the server (tests/conftest.py): a Connect session switches pyspark into Connect mode for its
whole process. There the ``spark`` fixture is a Connect client, every ``js-etl drain`` a test
starts goes to the server, and a table is read back by deltalake, not by the server under test.
Tests marked ``classic_spark`` (the classic session's JVM API) or ``nats_side`` (their subject
is not the session) are not run again."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from streams import add_stream, pub

REPO = Path(__file__).resolve().parents[1]

# The data source's and the backfill's tests that use the session: all of them.
SOURCE_AND_BACKFILL = ("tests/source/test_source.py", "tests/backfill/test_backfill.py")
# Backfill cases whose Connect-specific part is a drain, a range split or a MERGE into a new
# table the other cases already run over Connect (the drain leg below; the range reader; the
# dead-letter case): tested once, on the classic session.
BACKFILL_ONCE = (
    "test_backfill_over_drained_rows_fills_gaps_and_leaves_the_rest_to_the_drain",
    "test_rewind_then_drain_rereads_from_the_new_position",
    "test_parallel_sub_ranges_add_up_to_exactly_the_range",
    "test_middle_range_into_an_empty_table_and_a_rerun_inserts_nothing",
)

# The drain's exactly-once cases, one of each kind (their files, run whole over Connect, passed
# but for the tests now marked classic_spark: docs/design/spark-connect.md):
# both writers, dead letters, a failed fetch task attempt, the client SIGKILLed at a fault point
# and while a fetch task it started holds deliveries in the server, and a randomized schedule.
DRAIN = (
    "tests/drain/test_drain.py::test_drains_every_message_exactly_once_with_origin_columns",
    "tests/drain/test_drain.py::test_json_decoded_on_schema_and_bad_payloads_dead_lettered",
    "tests/drain/test_drain.py::test_a_first_write_that_never_committed_does_not_block_the_next_run",
    "tests/drain/test_faults.py::test_driver_sigkilled_then_recovery_run[kill_mid_ack]",
    "tests/drain/test_faults.py::test_a_driver_killed_while_a_fetch_task_holds_deliveries_then_recovery_run",
    "tests/drain/test_faults.py::test_failed_task_attempt_is_retried_and_never_acked[fail_fetch_task]",
    "tests/drain/test_fault_schedules.py::test_fault_schedule_keeps_every_message_exactly_once",
)
# The streaming source's queries, once: AvailableNow queries in limited batches, the second
# resumed from the checkpoint, and the durable consumer that follows the commits, moved by the
# reader on the server. The rest of its file tests the source whatever the session (all of it
# passed over Connect when first tried).
STREAM = ("tests/source/test_stream.py::test_commit_consumer_follows_what_the_sink_committed",)
# 209 messages (4 poison), ack_wait 3 s, 10 partitions of 20-message pulls: the first drain is
# SIGKILLed 3.3 s after it took its lock, then clean drains until one reports drained.
CONNECT_SCHEDULE_SEED = "8375"


def _connect_leg(server_url: str, tests: tuple[str, ...], **env: str) -> dict[str, int]:
    """Run ``tests`` as a Spark Connect client of the server; fail on any failure, error or
    skip; return pytest's counts."""
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        capture_output=True, text=True, timeout=1200, check=False, cwd=REPO,
        env={**os.environ, "JS_ETL_TEST_SPARK": "connect", "SPARK_REMOTE": server_url, **env})
    summary = ran.stdout.strip().splitlines()[-1]
    assert ran.returncode == 0, ran.stdout[-6000:] + ran.stderr[-2000:]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (\w+)", summary)}
    assert set(counts) <= {"passed", "deselected", "warning", "warnings"}, summary
    return counts


@pytest.mark.slow
def test_the_source_stream_backfill_and_drain_tests_pass_over_spark_connect(spark_connect_server):
    """One leg, one client process: the data source's and the backfill's tests that use the
    session, the streaming source's queries, and the drain's exactly-once cases."""
    deselect = [a for name in BACKFILL_ONCE
                for a in ("--deselect", f"tests/backfill/test_backfill.py::{name}")]
    counts = _connect_leg(spark_connect_server.url,
                          (*SOURCE_AND_BACKFILL, *deselect, *STREAM, *DRAIN),
                          JS_ETL_SCHEDULE_SEED=CONNECT_SCHEDULE_SEED)
    # 16 of the two files that use the session; 1 streaming one; 8 drain cases (the
    # first-write one runs on both writers)
    assert counts["passed"] == 16 + 1 + 8, counts


def test_a_drain_over_spark_connect_refuses_a_table_the_client_cannot_reach_in_one_line(
        spark_connect_server, names, js, nats_server, tmp_path):
    """The lock and the table reads are the client's: a Hadoop-only location fails before any
    fetch, with the exit code of a configuration error, and the consumer is left as it was. The
    server is named by the config's ``spark.remote``."""
    add_stream(js, names)
    pub(js, f"{names.prefix}.a", 1)
    config = tmp_path / "job.yaml"
    config.write_text(
        f"nats: {{servers: ['{nats_server.url}']}}\n"
        f"source: {{stream: {names.stream}, consumer: {names.consumer}, "
        "create_consumer: true}\n"
        "target: {path: 'hdfs://127.0.0.1:9/js-etl/table'}\n"
        f"spark: {{remote: '{spark_connect_server.url}'}}\n")
    ran = subprocess.run([str(Path(sys.executable).with_name("js-etl")), "drain", "--config",
                          str(config)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert ran.returncode == 2, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert ran.stderr.strip().splitlines()[-1].startswith(
        "js-etl: ConfigError: over Spark Connect the drain keeps its lock and reads its tables "
        "from the client, which has no Hadoop for hdfs://127.0.0.1:9/js-etl/table")
    info = js.consumer_info(names.stream, names.consumer)
    assert (info.num_pending, info.num_ack_pending, info.delivered.consumer_seq) == (1, 0, 0)


@pytest.mark.parametrize(("remote", "code", "says"), [
    ("sc://127.0.0.1:{free}", 75, "TransientError: no Spark Connect server answers at "
                                  "127.0.0.1:{free} (Connection refused)"),
    ("http://127.0.0.1:{free}/;token=s3cret", 2, "ConfigError: spark.remote: not a Spark "
                                                 "Connect URL: it must be sc://host[:port]"),
    ("sc://127.0.0.1:port/;token=s3cret", 2, "ConfigError: spark.remote: not a Spark Connect "
                                             "URL: its host or port does not parse"),
])
def test_a_spark_remote_no_server_answers_at_fails_in_one_line_at_once(remote, code, says, names,
                                                                        js, nats_server,
                                                                        tmp_path):
    """pyspark's client would retry a refused connection for minutes; js-etl says so at once,
    with the transient exit code for a server that does not answer, and never shows the URL's
    parameters (they may hold a token)."""
    from js_etl.demo.server import free_port

    free = free_port()
    add_stream(js, names)
    ran = subprocess.run(
        [str(Path(sys.executable).with_name("js-etl")), "drain",
         "--set", f"nats.servers={nats_server.url}", "--set", f"source.stream={names.stream}",
         "--set", f"source.consumer={names.consumer}", "--set", "source.create_consumer=true",
         "--set", f"target.path={tmp_path / 'table'}",
         "--set", f"spark.remote={remote.format(free=free)}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert ran.returncode == code, ran.stderr[-2000:]
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("js-etl: " + says.format(free=free)), last
    assert "s3cret" not in ran.stderr + ran.stdout
