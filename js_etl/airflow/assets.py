"""The Delta table as an Airflow ``Asset``, so downstream DAGs can schedule on a drain.

The same helper names the asset on both sides: the table the operator attaches to its alias
outlet at run time and a consumer DAG's ``schedule=[delta_asset(...)]`` are identical ``Asset``
objects built from the same location.

* a path (``/lake/orders``, ``lake/orders``, ``file:///lake/orders``) → ``file:///abs/path``
* a storage URI (``s3a://``, ``s3://``, ``abfss://``, ``gs://``, ``hdfs://`` …) → kept as is
* a catalog table (``table="bronze.orders"``) → ``delta-table://bronze.orders/`` (Airflow adds
  the trailing slash)

(Airflow would rewrite ``delta:///abs/path`` to ``delta:/abs/path``, which is why local tables
are ``file://`` URIs.)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from airflow.sdk import Asset, AssetAlias

from js_etl.errors import ConfigError

if TYPE_CHECKING:
    from js_etl.config import TargetConfig

TABLE_SCHEME = "delta-table"


def delta_asset(path: str | os.PathLike[str] | None = None, *, table: str | None = None) -> Asset:
    """The ``Asset`` of a Delta table, given its ``path`` (or URI) or its catalog ``table`` name.

    Relative paths are made absolute against the current directory; give absolute paths in
    DAGs, since the scheduler and the worker need not share a working directory.

    >>> delta_asset("/data/lake/orders")
    Asset(name='file:///data/lake/orders', uri='file:///data/lake/orders', ...)
    >>> delta_asset("s3a://lake/bronze/orders").uri
    's3a://lake/bronze/orders'
    >>> delta_asset(table="bronze.orders").uri
    'delta-table://bronze.orders/'
    """
    if (path is None) == (table is None):
        raise ValueError("delta_asset() takes exactly one of path or table")
    if table is not None:
        if not table.strip() or "/" in table:
            raise ValueError(f"delta_asset(table=...) expects a catalog table name like "
                             f"'bronze.orders', got {table!r}")
        uri = f"{TABLE_SCHEME}://{table.strip()}"
        return Asset(uri=uri, name=uri)
    text = os.fspath(path).strip()  # type: ignore[arg-type]
    parts = urlsplit(text)
    if parts.scheme and parts.scheme != "file" and len(parts.scheme) > 1:  # "C:" is a drive
        return Asset(uri=text.rstrip("/"))
    local = parts.path if parts.scheme == "file" else text
    absolute = os.path.abspath(os.path.expanduser(local))
    return Asset(uri=f"file://{absolute}")


ALIAS_PREFIX = "js_etl:"


def task_alias(dag_id: str, task_id: str) -> AssetAlias:
    """The operator's default outlet: an ``AssetAlias`` named after the task.

    Through an alias the task decides at run time whether the table gets an asset event (a
    drain that wrote nothing emits none), and which table it is: the config naming it is read
    when the task runs, not when the DAG is parsed. Downstream DAGs still schedule on the table
    itself, ``schedule=[delta_asset(...)]``.

    >>> task_alias("orders_hourly", "drain").name
    'js_etl:orders_hourly.drain'
    """
    return AssetAlias(name=f"{ALIAS_PREFIX}{dag_id}.{task_id}")


def target_asset(target: TargetConfig) -> Asset:
    """The asset of a job config's ``target`` section (``path`` or ``table``)."""
    if target.table is not None:
        return delta_asset(table=target.table)
    if target.path is None:  # TargetConfig refuses this; kept for type checkers
        raise ConfigError("target.path or target.table is required")
    return delta_asset(target.path)
