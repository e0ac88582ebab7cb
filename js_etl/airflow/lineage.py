"""OpenLineage for the operator: the NATS stream in, the Delta table out, the run's counts.

Imported only by the operator's ``get_openlineage_facets_on_*`` methods, which Airflow's
OpenLineage provider calls when it is installed and enabled; without it nothing here is loaded.

Naming (the OpenLineage dataset naming rules, built with ``openlineage.client.naming``):

=========================  ======================================  ==========================
dataset                    namespace                               name
=========================  ======================================  ==========================
NATS stream (input)        ``nats://<first server host:port>``     the stream
``/abs/path``, ``file://`` ``file``                                the absolute path
``s3://``, ``s3a://``      ``s3://<bucket>``                       the key (no leading ``/``)
``abfss://``               ``abfss://<container>@<account>…``      the path
``gs://``                  ``gs://<bucket>``                       the object path
``hdfs://``                ``hdfs://<namenode>:<port>``            the path
catalog table              ``spark_catalog``                       ``<db>.<table>``
=========================  ======================================  ==========================

The input carries a ``natsJetStreamConsumer`` facet (consumer and subject filters). The outputs
are the table and the dead-letter table, each with a ``schema`` facet (its columns: the
origin's, the payload's fields as ``decode.schema`` gives them, ``data`` where a row keeps the
payload, then computed partition columns) and, once the run has ended, ``outputStatistics``
(rows = messages written / dead letters). The backlog sensor's lineage is the stream as input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import urlsplit

import attr
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import (
    DatasetFacet,
    output_statistics_output_dataset,
    schema_dataset,
)
from openlineage.client.naming import dataset as naming

from js_etl.config import JobConfig, partition_column_name
from js_etl.config.ddl import field_types
from js_etl.schema import DEAD_LETTER, ORIGIN

CATALOG_NAMESPACE = "spark_catalog"
CONSUMER_FACET = "natsJetStreamConsumer"


@attr.define
class NatsJetStreamConsumerDatasetFacet(DatasetFacet):
    """Which durable consumer of the stream the job reads, and its subject filters."""

    consumer: str
    filterSubjects: list[str] = attr.field(factory=list)
    _additional_skip_redact: ClassVar[list[str]] = ["consumer", "filterSubjects"]

    @staticmethod
    def _get_schema() -> str:
        # A URN, not a URL: its JSON schema ships in docs/airflow/ of js-etl.
        return "urn:js-etl:openlineage:NatsJetStreamConsumerDatasetFacet:1-0-0"


def stream_namespace(servers: Sequence[str]) -> str:
    """``nats://host:port`` of the first server (scheme and credentials dropped)."""
    first = urlsplit(servers[0] if "://" in servers[0] else f"nats://{servers[0]}")
    host = first.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"nats://{host}:{first.port or 4222}"


def table_naming(path: str | None, table: str | None) -> tuple[str, str]:
    """(namespace, name) of a Delta table, from the config's ``target.path`` or ``.table``."""
    if table is not None:
        return CATALOG_NAMESPACE, table
    if path is None:
        raise ValueError("a target needs a path or a table")
    parts = urlsplit(path)
    scheme = parts.scheme.lower()
    key = parts.path.lstrip("/")
    named: naming.DatasetNaming
    if scheme in ("s3", "s3a", "s3n"):
        named = naming.S3(bucket_name=parts.netloc, object_key=key)
    elif scheme == "abfss":
        container, _, account = parts.netloc.partition("@")
        named = naming.ABFSS(container=container,
                             service=account.removesuffix(".dfs.core.windows.net"), path=key)
    elif scheme == "gs":
        named = naming.GCS(bucket_name=parts.netloc, object_key=key)
    elif scheme == "hdfs":
        named = naming.HDFS(namenode_host=parts.hostname or "",
                            namenode_port=str(parts.port or 8020), path=parts.path)
    elif scheme in ("", "file") or len(scheme) == 1:  # "C:" is a drive
        named = naming.LocalFileSystem(path=parts.path if scheme == "file" else path)
    else:
        return f"{scheme}://{parts.netloc}", parts.path
    return named.get_namespace(), named.get_name()


def stream_dataset(servers: Sequence[str], stream: str, consumer: str,
                   filter_subjects: Sequence[str] = ()) -> InputDataset:
    """The stream a job or a sensor reads, with the consumer it reads through."""
    return InputDataset(
        namespace=stream_namespace(servers), name=stream,
        facets={CONSUMER_FACET: NatsJetStreamConsumerDatasetFacet(
            consumer=consumer, filterSubjects=list(filter_subjects))})


def table_columns(config: JobConfig) -> list[tuple[str, str | None]]:
    """The columns of the job's table, as (name, Spark type in lower case; None where Spark
    decides it: a computed partition column other than ``to_date``). Nested types are given
    without their field names, as :func:`js_etl.config.ddl.field_types` reads them."""
    decode = config.decode
    payload: list[tuple[str, str | None]] = (
        [("text", "string")] if decode.format == "text"
        else list((field_types(decode.schema or "") or {}).items()) if decode.format == "json"
        else [])
    columns = [(name, kind.lower()) for name, kind in ORIGIN] + payload
    columns += [("data", "binary")] * decode.keeps_payload
    for expression in config.target.partition_by:
        name, plain = partition_column_name(expression)
        if name and not plain:
            is_date = expression.strip().lower().startswith("to_date(")
            columns.append((name, "date" if is_date else None))
    return columns


def _output(location: tuple[str | None, str | None], columns: Sequence[tuple[str, str | None]],
            rows: int | None) -> OutputDataset:
    namespace, name = table_naming(*location)
    schema = schema_dataset.SchemaDatasetFacet(fields=[
        schema_dataset.SchemaDatasetFacetFields(name=column, type=kind)
        for column, kind in columns])
    output_facets: dict[str, Any] = {}
    if rows is not None:
        output_facets["outputStatistics"] = (
            output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(rowCount=rows))
    return OutputDataset(namespace=namespace, name=name, facets={"schema": schema},
                         outputFacets=output_facets)


def operator_lineage(config: JobConfig, servers: Sequence[str],
                     report: Mapping[str, Any] | None = None) -> OperatorLineage:
    """Inputs and outputs of one run of the job (``report``: its run report, once it ended)."""
    source, target = config.source, config.target
    stream = stream_dataset(servers, source.stream, source.consumer, source.filter_subjects)
    ended = report is not None and "messages_written" in report

    def rows(key: str) -> int | None:
        return int(report[key]) if ended and report is not None else None

    table = _output((target.path, target.table), table_columns(config), rows("messages_written"))
    dead_letters = _output((target.resolved_dead_letter_path, target.resolved_dead_letter_table),
                           [(name, kind.lower()) for name, kind in DEAD_LETTER],
                           rows("dead_letters"))
    return OperatorLineage(inputs=[stream], outputs=[table, dead_letters])


def sensor_lineage(servers: Sequence[str], stream: str, consumer: str) -> OperatorLineage:
    """The backlog sensor reads the stream's consumer state: the stream is its input."""
    return OperatorLineage(inputs=[stream_dataset(servers, stream, consumer)])
