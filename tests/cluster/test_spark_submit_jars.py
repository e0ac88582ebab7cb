"""``spark-submit --jars`` must reach the job's SparkContext, which serves them to executors.

``job_session`` used to call ``configure_delta(builder, jars=[])``, which set ``spark.jars`` to
``""`` and wiped spark-submit's ``--jars``: local mode (one JVM, the jars on the driver's class
path) hid it; on a standalone cluster executors failed with ``ClassCastException ...
SerializedLambda`` (issue 18).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from js_etl.spark.jars import delta_artifacts

BIN = Path(sys.executable).parent

PROBE = '''
import json
from js_etl.config.model import SparkConfig
from js_etl.spark.session import job_session

spark = job_session(SparkConfig(), spark_submit=True)
sc = spark.sparkContext
print(json.dumps({"spark.jars": sc.getConf().get("spark.jars", None),
                  "served": sc._jsc.sc().listJars().mkString(",").split(",")}))
spark.stop()
'''


def test_spark_submit_jars_survive_job_session(tmp_path: Path) -> None:
    jars = delta_artifacts().jars
    assert len(jars) > 1  # Delta's jars, resolved by `make setup`, and the log store
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "TZ": "UTC",
           "PYSPARK_PYTHON": sys.executable}
    result = subprocess.run(
        [str(BIN / "spark-submit"), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
         "--jars", ",".join(jars), str(probe)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    assert seen["spark.jars"] is not None
    assert sorted(Path(j).name for j in seen["spark.jars"].split(",")) == \
        sorted(Path(j).name for j in jars)
    # What executors fetch: one served jar per --jars entry.
    assert sorted(s.rsplit("/", 1)[-1] for s in seen["served"] if s) == \
        sorted(Path(j).name for j in jars)
