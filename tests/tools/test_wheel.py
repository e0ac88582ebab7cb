"""js-etl runs from its wheel, outside the source checkout: the packaged job scripts and demo
config are in the wheel, ``js-etl demo`` works from it, and the Airflow operator submits the
installed job script by default.

The wheel is installed with ``pip install --no-deps --target`` and put first on ``PYTHONPATH`` of
this venv's Python (whose dependencies it reuses), from a working directory outside the
repository. Delta's jars come from the checkout's ``.jars/delta`` through ``JS_ETL_JARS_DIR``,
so nothing is downloaded but the build backend (pip's build isolation: the venv's own setuptools
is older than the one pyproject.toml requires).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.shipping import build_wheel

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable

pytestmark = pytest.mark.wheel

# Run by this venv's Python with the wheel's files first on PYTHONPATH: where each piece resolves.
_WHERE = r"""
import json
import js_etl, js_etl.jobs.drain, js_etl.jobs.backfill
from js_etl.demo import demo_config
from js_etl.spark.jars import LOG_STORE_JAR, delta_artifacts, source_checkout
print(json.dumps({"package": js_etl.__file__, "drain": js_etl.jobs.drain.__file__,
                  "backfill": js_etl.jobs.backfill.__file__, "demo_config": str(demo_config()),
                  "demo_config_exists": demo_config().is_file(),
                  "checkout": source_checkout() and str(source_checkout()),
                  "delta": delta_artifacts().submit_args(),
                  "log_store": LOG_STORE_JAR.is_file()}))
"""

# The operator's default application, from the installed js_etl (Airflow only in this process).
_OPERATOR = r"""
import json
from js_etl.airflow import JetStreamToDeltaOperator
from js_etl.demo import demo_config
apps = {job: JetStreamToDeltaOperator(task_id=job, config_path=str(demo_config()), job=job,
                                      outlets=[])._application()
        for job in ("drain", "backfill")}
print(json.dumps(apps))
"""


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout, installed alone into a folder of its own."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp / "dist")
    installed = subprocess.run([PYTHON, "-m", "pip", "install", "--no-deps", "-q", "--target",
                                str(tmp / "site"), str(wheel)],
                               capture_output=True, text=True, timeout=300, check=False)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return tmp / "site"


def run_installed(site: Path, cwd: Path, *args: str, timeout: float = 300,
                  **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(site), "TZ": "UTC",
               "PATH": f"{Path(PYTHON).parent}{os.pathsep}{os.environ.get('PATH', '')}", **env}
    return subprocess.run([PYTHON, *args], capture_output=True, text=True, timeout=timeout,
                          check=False, env=environ, cwd=cwd)


def test_the_wheel_holds_the_jobs_and_the_demo_config(site, tmp_path):
    result = run_installed(site, tmp_path, "-c", _WHERE, JS_ETL_JARS_DIR="")
    assert result.returncode == 0, result.stderr[-3000:]
    where = json.loads(last_line(result.stdout))
    for key in ("package", "drain", "backfill", "demo_config"):
        assert Path(where[key]).is_relative_to(site), (key, where[key])
    assert where["demo_config_exists"] is True
    assert (site / "js_etl" / "py.typed").is_file()
    # The product only: the benchmark and cluster tooling stay in the checkout (tools/).
    assert not (site / "tools").exists() and not (site / "js_etl" / "dev").exists()
    # Not a source checkout; Delta comes by --packages, with the log store jar of the wheel.
    assert where["checkout"] is None
    log_store = str((site / "js_etl" / "spark" / "java" / "js-etl-log-store.jar").resolve())
    assert where["log_store"] is True
    assert where["delta"][:4] == ["--jars", log_store, "--packages",
                                  "io.delta:delta-spark_4.2_2.13:4.4.0"]


def test_the_demo_runs_from_the_wheel(site, tmp_path):
    result = run_installed(site, tmp_path, "-m", "js_etl.cli", "demo", "--messages", "300",
                           JS_ETL_JARS_DIR=str(REPO / ".jars" / "delta"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(last_line(result.stdout))
    assert report["messages_written"] == 300 and report["stopped_because"] == "drained"
    assert (tmp_path / ".demo" / "events" / "_delta_log").is_dir()  # in the working directory


def test_the_operator_submits_the_installed_job_scripts(site, tmp_path):
    if importlib.util.find_spec("airflow") is None:  # found, not imported: Airflow stays out
        pytest.skip("the operator needs the airflow extra")
    result = run_installed(site, tmp_path, "-c", _OPERATOR, timeout=180,
                           AIRFLOW_HOME=str(tmp_path / "airflow"),
                           AIRFLOW__CORE__LOAD_EXAMPLES="False")
    assert result.returncode == 0, result.stderr[-3000:]
    applications = json.loads(last_line(result.stdout))
    assert applications == {"drain": str((site / "js_etl" / "jobs" / "drain.py").resolve()),
                            "backfill": str((site / "js_etl" / "jobs" / "backfill.py").resolve())}
