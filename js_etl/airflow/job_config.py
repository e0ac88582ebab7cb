"""The job's config as the provider's tasks read it: when the task runs, never when its DAG is
parsed (the DAG processor parses every DAG file again and again, and need not see the file).

The operator reads it once per run, in ``execute``, and keeps it for its lineage; the sensor
reads it once per run to find the consumer it waits on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from js_etl.config import JobConfig, load_config
from js_etl.errors import JsEtlError


def _yaml_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_yaml_text(v) for v in value) + "]"
    return str(value)


def override_list(overrides: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """``{"fetch.batch": 500}`` or ``["fetch.batch=500"]`` → ``["fetch.batch=500"]``."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{key}={_yaml_text(value)}" for key, value in overrides.items()]
    if isinstance(overrides, str):
        return [overrides]
    return [str(item) for item in overrides]


def load_job_config(path: str, overrides: Sequence[str], environ: Mapping[str, str]) -> JobConfig:
    """The config as the job will see it; a file that cannot be read or an invalid config fails
    the task without retries (no retry can fix it)."""
    try:
        return load_config(path, overrides, environ=environ)
    except JsEtlError as e:
        raise AirflowFailException(f"js-etl: {type(e).__name__}: {e}") from None
