"""The job configuration: one typed, frozen tree built from defaults, YAML, environment and flags.

Everything is validated here, before Spark or NATS is touched, so a typo costs a second instead of
a cluster start. Three rooms: :mod:`~js_etl.config.values` (how one raw value is checked),
:mod:`~js_etl.config.model` (the sections, with their cross-field rules) and
:mod:`~js_etl.config.load` (merging the layers and naming where a bad value came from).
"""

from js_etl.config.load import ENV_PREFIX, load_config
from js_etl.config.model import (
    DecodeConfig,
    FetchConfig,
    JobConfig,
    NatsConfig,
    RunConfig,
    SourceConfig,
    SparkConfig,
    TargetConfig,
    TlsConfig,
)
from js_etl.config.values import local_path_problem, partition_column_name

__all__ = [
    "ENV_PREFIX",
    "DecodeConfig",
    "FetchConfig",
    "JobConfig",
    "NatsConfig",
    "RunConfig",
    "SourceConfig",
    "SparkConfig",
    "TargetConfig",
    "TlsConfig",
    "load_config",
    "local_path_problem",
    "partition_column_name",
]
