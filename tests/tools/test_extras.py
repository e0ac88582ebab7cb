"""What each way of installing js-etl pulls, resolved by pip from the package index as a user's
`pip install` would (``--dry-run --report``: nothing is installed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPARK_SIDE = {"pyspark", "delta-spark", "deltalake", "obstore"}


def resolved(requirement: str, tmp_path: Path) -> set[str]:
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
                           "--ignore-installed", "--disable-pip-version-check", "--report",
                           str(report), requirement], capture_output=True, text=True,
                          timeout=600, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {item["metadata"]["name"].lower()
            for item in json.loads(report.read_text())["install"]}


def test_the_core_is_the_jetstream_side_only(tmp_path):
    pulled = resolved(str(REPO), tmp_path)
    assert {"nats-py", "nkeys", "pyyaml"} <= pulled
    assert not pulled & (SPARK_SIDE | {"pyarrow", "pandas", "numpy"}), pulled


def test_the_airflow_extra_brings_no_spark_and_no_delta(tmp_path):
    pulled = resolved(f"{REPO}[airflow]", tmp_path)
    assert {"apache-airflow", "apache-airflow-providers-apache-spark"} <= pulled
    assert not pulled & SPARK_SIDE, pulled & SPARK_SIDE
