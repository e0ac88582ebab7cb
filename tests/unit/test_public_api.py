"""The package's public API (js_etl.__all__): every name resolves, and importing js_etl loads
neither pyspark nor Airflow, so an Airflow host or a plain script pays for neither until a name
that needs one is used."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import js_etl

PROBE = """
import json, sys
import js_etl
loaded = {name for name in ("pyspark", "airflow", "deltalake", "delta") if name in sys.modules}
js_etl.load_config, js_etl.JobConfig, js_etl.RunReport
print(json.dumps(sorted(loaded)))
"""


def test_every_public_name_resolves():
    for name in js_etl.__all__:
        assert getattr(js_etl, name).__name__ == name


def test_importing_js_etl_loads_no_spark_and_no_airflow():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == []


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="run_dran"):
        js_etl.run_dran  # noqa: B018 - the typo is the test
