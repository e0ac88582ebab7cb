"""The Delta table as an Airflow ``Asset``, so downstream DAGs can schedule on a drain.

The same helper names the asset on both sides: the operator's outlet and a consumer DAG's
``schedule=[delta_asset(...)]`` build identical ``Asset`` objects from the same location.

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


def table_alias(asset: Asset) -> AssetAlias:
    """The operator's default outlet for a table: an ``AssetAlias`` named after it.

    Through an alias the task decides at run time whether the table gets an asset event (a
    drain that wrote nothing emits none); a static ``Asset`` outlet gets one on every success.
    Downstream DAGs still schedule on the table itself, ``schedule=[delta_asset(...)]``.

    >>> table_alias(delta_asset("/data/lake/orders")).name
    'js_etl:file:///data/lake/orders'
    """
    return AssetAlias(name=f"{ALIAS_PREFIX}{asset.uri}")


def target_asset(target: TargetConfig) -> Asset:
    """The asset of a job config's ``target`` section (``path`` or ``table``)."""
    if target.table is not None:
        return delta_asset(table=target.table)
    if target.path is None:  # TargetConfig refuses this; kept for type checkers
        raise ConfigError("target.path or target.table is required")
    return delta_asset(target.path)
