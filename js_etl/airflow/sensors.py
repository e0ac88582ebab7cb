"""Wait until a durable consumer has a backlog worth draining."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from js_etl.airflow.hooks import JetStreamHook
from js_etl.airflow.job_config import load_job_config, override_list
from js_etl.airflow.triggers import ERROR, SUCCESS, JetStreamBacklogTrigger, error_payload
from js_etl.errors import JsEtlError

if TYPE_CHECKING:
    from airflow.sdk import Context


def _fail(payload: Mapping[str, Any]) -> AirflowException:
    message = f"{payload['stream']}/{payload['consumer']}: {payload['message']}"
    return AirflowException(message) if payload.get("retryable") else AirflowFailException(message)


class JetStreamBacklogSensor(BaseSensorOperator):
    """Succeeds once the consumer's ``num_pending >= min_pending``; returns that count (XCom).

    Deferrable by default: after one immediate check it hands the wait to
    :class:`~js_etl.airflow.triggers.JetStreamBacklogTrigger` in the triggerer. With
    ``deferrable=False`` it pokes every ``poll_interval`` seconds like any sensor.

    Errors are never a quiet "nothing pending": a missing stream or consumer and refused
    credentials fail the task without retries; an unreachable server fails the attempt (retried
    as configured). Note that Airflow's ``soft_fail=True`` turns *every* failure of a sensor,
    errors included, into a skip; prefer a ``timeout`` and let errors fail.

    The consumer is named by ``stream`` and ``consumer``, or by ``config_path``: the drain's job
    config, whose ``source.stream`` and ``source.consumer`` it waits on. The config is read when
    the task runs (with the ``nats`` connection's settings, as the drain reads it), never when
    the DAG is parsed; one that cannot be read or is invalid fails the task without retries.

    :param stream: stream name (templated).
    :param consumer: durable consumer name (templated).
    :param config_path: instead of ``stream`` and ``consumer``: the job's YAML config (templated).
    :param overrides: with ``config_path``: the drain's config overrides, a dict or a list of
        ``"key=value"`` as the operator takes them (templated).
    :param min_pending: backlog that ends the wait, >= 1 (default 1: any message; templated).
    :param poll_interval: seconds between checks (also the sensor's ``poke_interval``).
    :param nats_conn_id: the ``nats`` connection.

    Example::

        wait = JetStreamBacklogSensor(task_id="wait_for_orders", stream="ORDERS",
                                      consumer="orders_to_delta", min_pending=1000,
                                      poll_interval=30, timeout=6 * 3600)
        wait >> JetStreamToDeltaOperator(task_id="drain", config_path=...)

        # or: the consumer the drain reads, from its config
        JetStreamBacklogSensor(task_id="wait", config_path="/opt/etl/conf/orders.yaml")
    """

    template_fields: Sequence[str] = ("stream", "consumer", "min_pending", "config_path",
                                      "overrides")
    ui_color = "#e8f1d4"

    def __init__(self, *, stream: str | None = None, consumer: str | None = None,
                 config_path: str | os.PathLike[str] | None = None,
                 overrides: Mapping[str, Any] | Sequence[str] | None = None,
                 min_pending: int | str = 1, poll_interval: float | timedelta = 5.0,
                 nats_conn_id: str = JetStreamHook.default_conn_name, deferrable: bool = True,
                 **kwargs: Any) -> None:
        if config_path is None and (stream is None or consumer is None):
            raise ValueError("JetStreamBacklogSensor needs stream= and consumer=, or "
                             "config_path= (the job config whose source it waits on)")
        if config_path is not None and (stream is not None or consumer is not None):
            raise ValueError("JetStreamBacklogSensor takes stream= and consumer=, or "
                             "config_path=, not both")
        if overrides is not None and config_path is None:
            raise ValueError("JetStreamBacklogSensor: overrides= applies to config_path= only")
        if isinstance(poll_interval, timedelta):
            poll_interval = poll_interval.total_seconds()
        if isinstance(poll_interval, bool) or not poll_interval > 0:
            raise ValueError(f"poll_interval must be a positive number of seconds, "
                             f"got {poll_interval!r}")
        kwargs.setdefault("poke_interval", poll_interval)
        super().__init__(**kwargs)
        self.stream = stream
        self.consumer = consumer
        self.config_path = None if config_path is None else os.fspath(config_path)
        self.overrides = overrides
        self.min_pending = min_pending
        if isinstance(min_pending, int):
            self._threshold()  # refuse a bad literal at parse time; templates are checked later
        self.poll_interval = float(poll_interval)
        self.nats_conn_id = nats_conn_id
        self.deferrable = deferrable

    def _threshold(self) -> int:
        value = self.min_pending
        try:
            threshold = int(value)
        except (TypeError, ValueError):
            threshold = 0
        if isinstance(value, bool) or threshold < 1 or str(threshold) != str(value).strip():
            raise ValueError(f"min_pending must be an integer >= 1 (1 = any message pending), "
                             f"got {value!r}")
        return threshold

    def _names(self) -> tuple[str, str]:
        """(stream, consumer): as given, or the config's ``source``, read once per run of the
        task (kept in ``stream`` and ``consumer``)."""
        if self.stream is None or self.consumer is None:
            try:
                job_env = JetStreamHook(self.nats_conn_id).job_environment()
            except JsEtlError as e:  # no retry can fix the connection (missing ones included)
                raise AirflowFailException(str(e)) from None
            source = load_job_config(os.path.abspath(str(self.config_path)),
                                     override_list(self.overrides),
                                     {**os.environ, **job_env}).source
            self.stream, self.consumer = source.stream, source.consumer
        return self.stream, self.consumer

    def _pending(self) -> int:
        stream, consumer = self._names()
        try:
            return JetStreamHook(self.nats_conn_id).consumer_info(stream, consumer).num_pending
        except Exception as e:
            raise _fail(error_payload(e, stream=stream, consumer=consumer)) from e

    def poke(self, context: Context) -> PokeReturnValue:
        pending = self._pending()
        threshold = self._threshold()
        self.log.info("%s/%s: %d pending (waiting for %d)", self.stream, self.consumer, pending,
                      threshold)
        return PokeReturnValue(is_done=pending >= threshold, xcom_value=pending)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        threshold = self._threshold()
        pending = self._pending()  # one cheap check first: errors and a ready backlog need no wait
        if pending >= threshold:
            self.log.info("%s/%s: %d pending, no need to wait", self.stream, self.consumer,
                          pending)
            return pending
        self.log.info("%s/%s: %d pending, deferring until %d", self.stream, self.consumer,
                      pending, threshold)
        stream, consumer = self._names()
        self.defer(
            trigger=JetStreamBacklogTrigger(
                nats_conn_id=self.nats_conn_id, stream=stream, consumer=consumer,
                min_pending=threshold, poll_interval=self.poll_interval),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> int:
        # A new instance of the task, which has not read a config: the names are the event's.
        self.stream, self.consumer = event.get("stream"), event.get("consumer")
        if event.get("status") == SUCCESS:
            self.log.info("%s/%s: %d pending", event["stream"], event["consumer"],
                          event["num_pending"])
            return int(event["num_pending"])
        if event.get("status") == ERROR:
            raise _fail(event)
        raise AirflowException(f"unexpected event from JetStreamBacklogTrigger: {event!r}")

    # -- OpenLineage (called by the OpenLineage provider's listener when it is installed) -------
    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The stream the sensor watched, as its input; nothing where it failed before it knew
        which (a config that could not be read, a connection that is not there)."""
        if self.stream is None or self.consumer is None:
            return None
        try:
            servers = JetStreamHook(self.nats_conn_id).connection_options().servers
        except JsEtlError:
            return None
        from js_etl.airflow.lineage import sensor_lineage

        return sensor_lineage(servers, self.stream, self.consumer)
