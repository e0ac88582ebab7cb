"""What can be told about a drain before Spark starts, in a second rather than after the JVM:
the target paths are writable, the server answers with these credentials, the stream exists,
the consumer exists as a drain needs it (or is missing where the run may create it), no other
run holds it — and whether it has anything to drain at all. Read-only: a run checks all of it
again itself, and creates what it may. ``js-etl drain`` runs it before its session starts, the
Airflow operator before spark-submit."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

from js_etl.config import JobConfig
from js_etl.delta.rules import check_target_paths
from js_etl.jetstream.api import ConsumerInfo
from js_etl.jetstream.options import ConnectionOptions
from js_etl.report import RunReport, StopReason


def check_drain(config: JobConfig, environ: Mapping[str, str] | None = None
                ) -> tuple[ConnectionOptions, ConsumerInfo | None]:
    """Every check of the module docstring, with the secrets of ``environ`` (default: this
    process's): the connection's options, resolved before Spark starts, and the consumer's info
    (:func:`check_drainable`)."""
    check_target_paths(config)
    options = config.nats.connection_options(environ)
    options.check()  # files readable, websocket usable: exit 2 now, not after Spark
    return options, check_drainable(config, options)


def check_drainable(config: JobConfig, options: ConnectionOptions) -> ConsumerInfo | None:
    """The consumer's info as the checks saw it (module docstring); None where it is missing
    and the run may create it (``source.create_consumer``)."""
    from js_etl.durable.lease import refuse_if_held
    from js_etl.durable.policy import (
        desired_consumer,
        ensure_drain_consumer,
        min_ack_wait,
        source_stream_info,
    )
    from js_etl.jetstream import JetStreamSession
    from js_etl.jetstream.errors import ConsumerNotFoundError

    source = config.source
    info: ConsumerInfo | None = None
    with JetStreamSession(options) as js:
        source_stream_info(js, source.stream)
        try:
            info = js.run(ensure_drain_consumer(js.admin, source.stream, desired_consumer(config),
                                                create=False, min_ack_wait=min_ack_wait(config)))
        except ConsumerNotFoundError:
            if not source.create_consumer:
                raise
        refuse_if_held(js, source.lease_bucket, source.stream, source.consumer)
    return info


def nothing_to_drain(info: ConsumerInfo | None) -> bool:
    """Whether a run would find nothing: no message pending and none delivered but unacked (an
    earlier run's round left unacked is the next run's to finish, so that one is not nothing)."""
    return info is not None and info.num_pending == 0 and info.num_ack_pending == 0


def skipped_report(config: JobConfig) -> RunReport:
    """The report of a drain not started because :func:`nothing_to_drain` said so."""
    from js_etl.delta.table import job_tables

    target, dead_letters = job_tables(config)
    return RunReport(job=config.job_id, run_id=uuid.uuid4().hex[:12],
                     stream=config.source.stream, consumer=config.source.consumer,
                     target=str(target), dead_letter_target=str(dead_letters),
                     started_at=datetime.now(UTC).isoformat(timespec="seconds"),
                     pending_after=0, ack_pending_after=0,
                     stopped_because=StopReason.NOTHING_PENDING)
