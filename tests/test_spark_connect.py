"""js-etl over Spark Connect: a real Spark Connect server (tools/spark_connect.py), the data
source's and the backfill's tests run again as its client, and the drain's refusal.

The tests of tests/source/test_source.py and tests/backfill/test_backfill.py that use the
session run a second time in a pytest of their own with ``JS_ETL_TEST_SPARK=connect`` and
``SPARK_REMOTE`` naming the server (tests/conftest.py), with the same assertions; those marked
``classic_spark`` (the classic session's JVM API) or ``nats_side`` (their subject is not the
session) are not run there. A Connect session
switches pyspark into Connect mode for its whole process, hence the second pytest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BOTH_MODES = ("tests/source/test_source.py", "tests/backfill/test_backfill.py")


@pytest.mark.slow
def test_the_source_and_backfill_tests_pass_over_spark_connect(spark_connect_server):
    env = {**os.environ, "JS_ETL_TEST_SPARK": "connect", "SPARK_REMOTE": spark_connect_server.url}
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *BOTH_MODES], capture_output=True, text=True, timeout=1200,
                         check=False, env=env, cwd=REPO)
    summary = ran.stdout.strip().splitlines()[-1]
    assert ran.returncode == 0, ran.stdout[-6000:] + ran.stderr[-2000:]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (\w+)", summary)}
    # None failed, erred or was skipped:
    assert set(counts) <= {"passed", "deselected", "warning", "warnings"}, summary
    assert counts["passed"] >= 15, summary  # the data source's and the backfill's own tests


def test_the_drain_refuses_a_spark_connect_session_in_one_line(spark_connect_server, names,
                                                               js, nats_server, tmp_path):
    js.run(js.admin.add_stream(names.stream, [names.subject]))
    config = tmp_path / "job.yaml"
    config.write_text(
        f"nats: {{servers: ['{nats_server.url}']}}\n"
        f"source: {{stream: {names.stream}, consumer: {names.consumer}, "
        "create_consumer: true}\n"
        f"target: {{path: '{tmp_path / 'table'}'}}\n")
    ran = subprocess.run([str(Path(sys.executable).with_name("js-etl")), "drain", "--config",
                          str(config)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "SPARK_REMOTE": spark_connect_server.url},
                         cwd=tmp_path)
    assert ran.returncode == 2, ran.stdout[-2000:] + ran.stderr[-2000:]
    lines = ran.stderr.strip().splitlines()
    assert lines[-1].startswith("js-etl: ConfigError: the drain needs a classic Spark session")
    assert not (tmp_path / "table").exists()
