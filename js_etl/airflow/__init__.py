"""Airflow integration of js-etl, shaped like an Airflow provider.

=============================  ================================================================
``JetStreamHook``              the ``nats`` connection type: sessions, test_connection, the
                               job's environment (:mod:`js_etl.airflow.hooks`)
``JetStreamToDeltaOperator``   runs the packaged job (``js_etl/jobs/drain.py`` /
                               ``backfill.py``) with spark-submit, returns the run report
                               (:mod:`.operators`)
``JetStreamBacklogSensor``     waits for ``num_pending >= min_pending``, deferrable
                               (:mod:`.sensors`, trigger in :mod:`.triggers`)
``delta_asset``                the Delta table as an Airflow ``Asset`` (:mod:`.assets`)
``MessageQueueTrigger(         event-driven scheduling: an ``AssetWatcher`` fires when the
scheme="nats", ...)``          backlog crosses ``min_pending`` (:mod:`.queues`, trigger
                               ``JetStreamBacklogEventTrigger`` in :mod:`.triggers`)
=============================  ================================================================

Airflow discovers the connection type through the ``apache_airflow_provider`` entry point,
which calls :func:`get_provider_info` (no Airflow import needed for that). The classes are
imported on first use, so ``import js_etl.airflow`` works without the ``airflow`` extra and
names it when a class is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from js_etl.airflow.assets import delta_asset
    from js_etl.airflow.hooks import JetStreamHook
    from js_etl.airflow.operators import JetStreamToDeltaOperator
    from js_etl.airflow.sensors import JetStreamBacklogSensor
    from js_etl.airflow.triggers import JetStreamBacklogEventTrigger, JetStreamBacklogTrigger

__all__ = [
    "JetStreamBacklogEventTrigger",
    "JetStreamBacklogSensor",
    "JetStreamBacklogTrigger",
    "JetStreamHook",
    "JetStreamToDeltaOperator",
    "delta_asset",
    "get_provider_info",
]

_EXPORTS = {
    "JetStreamHook": "js_etl.airflow.hooks",
    "JetStreamToDeltaOperator": "js_etl.airflow.operators",
    "JetStreamBacklogSensor": "js_etl.airflow.sensors",
    "JetStreamBacklogTrigger": "js_etl.airflow.triggers",
    "JetStreamBacklogEventTrigger": "js_etl.airflow.triggers",
    "delta_asset": "js_etl.airflow.assets",
}



def _field(label: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"label": label, "description": description,
            "schema": schema or {"type": ["string", "null"]}}


def get_provider_info() -> dict[str, Any]:
    """Provider metadata for Airflow's ProvidersManager (the ``nats`` connection type)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("js-etl")
    except PackageNotFoundError:  # running from a source tree that was never installed
        release = "0.0.0"
    return {
        "package-name": "js-etl",
        "name": "js-etl (NATS JetStream to Delta Lake)",
        "description": "Bounded, effectively-once batch drains of NATS JetStream durable "
                       "consumers into Delta Lake tables with Spark.",
        "versions": [release],
        "integrations": [{
            "integration-name": "NATS JetStream",
            "external-doc-url": "https://docs.nats.io/nats-concepts/jetstream",
            "tags": ["software"],
        }],
        "hooks": [{"integration-name": "NATS JetStream",
                   "python-modules": ["js_etl.airflow.hooks"]}],
        "operators": [{"integration-name": "NATS JetStream",
                       "python-modules": ["js_etl.airflow.operators"]}],
        "sensors": [{"integration-name": "NATS JetStream",
                     "python-modules": ["js_etl.airflow.sensors"]}],
        "triggers": [{"integration-name": "NATS JetStream",
                      "python-modules": ["js_etl.airflow.triggers"]}],
        # The task's "Run report" link, resolved by the API server from the serialized DAG.
        "extra-links": ["js_etl.airflow.operators.RunReportLink"],
        # The `nats` scheme of common.messaging's MessageQueueTrigger (AssetWatcher).
        "queues": ["js_etl.airflow.queues.NatsMessageQueueProvider"],
        "connection-types": [{
            "connection-type": "nats",
            "hook-class-name": "js_etl.airflow.hooks.JetStreamHook",
            "hook-name": "NATS JetStream",
            "ui-field-behaviour": {
                "hidden-fields": ["schema"],
                "relabeling": {"host": "Servers", "login": "User"},
                "placeholders": {
                    "host": "nats-1.internal:4222,nats-2.internal:4222 (or tls://host:4222)",
                    "port": "4222 (for servers given without a port)",
                    "login": "user (with password), or leave empty",
                },
            },
            "conn-fields": {
                "token": _field("Token", "Auth token (kept secret, masked in logs).",
                                {"type": ["string", "null"], "format": "password"}),
                "creds_file": _field("Credentials file",
                                     "Path of a .creds file (JWT + nkey seed) on the workers."),
                "nkey_seed_file": _field("NKey seed file", "Path of an nkey seed file."),
                "tls_ca_file": _field("TLS CA file", "CA bundle that verifies the servers."),
                "tls_cert_file": _field("TLS client certificate",
                                        "Client certificate (needs the key file)."),
                "tls_key_file": _field("TLS client key", "Key of the client certificate."),
                "domain": _field("JetStream domain", "For leaf-node setups; empty for none."),
                "connect_timeout": _field("Connect timeout (s)",
                                          "Seconds to establish the connection (default 5).",
                                          {"type": ["number", "null"]}),
                "name": _field("Client name", "Shown in server monitoring (default js-etl)."),
            },
        }],
    }


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'js_etl.airflow' has no attribute {name!r}")
    from importlib import import_module

    try:
        return getattr(import_module(module), name)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == "airflow":
            raise ModuleNotFoundError(
                f"js_etl.airflow.{name} needs Apache Airflow: install the 'airflow' extra "
                "(pip install -e '.[airflow]')", name=e.name) from e
        raise
