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

The input carries a ``natsJetStreamConsumer`` facet (consumer and subject filters); the table
output carries ``outputStatistics`` (rows = messages written) once the run has ended.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import urlsplit

import attr
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import DatasetFacet, output_statistics_output_dataset
from openlineage.client.naming import dataset as naming

from js_etl.config import JobConfig

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


def operator_lineage(config: JobConfig, servers: Sequence[str],
                     report: Mapping[str, Any] | None = None) -> OperatorLineage:
    """Inputs and outputs of one run of the job (``report``: its run report, once it ended)."""
    source = config.source
    stream = InputDataset(
        namespace=stream_namespace(servers), name=source.stream,
        facets={CONSUMER_FACET: NatsJetStreamConsumerDatasetFacet(
            consumer=source.consumer, filterSubjects=list(source.filter_subjects))})
    namespace, name = table_naming(config.target.path, config.target.table)
    output_facets: dict[str, Any] = {}
    if report is not None and "messages_written" in report:
        output_facets["outputStatistics"] = (
            output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=int(report["messages_written"])))
    table = OutputDataset(namespace=namespace, name=name, outputFacets=output_facets)
    return OperatorLineage(inputs=[stream], outputs=[table])
