"""The ``nats`` scheme of Airflow's common.messaging provider (event-driven scheduling).

``MessageQueueTrigger(scheme="nats", stream=..., consumer=..., min_pending=N, ...)`` inside an
``AssetWatcher`` starts the DAG scheduled on that asset each time the consumer's backlog
crosses N; the trigger doing the work is
:class:`~js_etl.airflow.triggers.JetStreamBacklogEventTrigger`. Airflow finds this class through
the ``queues`` key of :func:`js_etl.airflow.get_provider_info`.

The deprecated ``MessageQueueTrigger(queue="nats://STREAM/CONSUMER", ...)`` form is understood
too (the other arguments, e.g. ``min_pending``, as keywords).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider

from js_etl.airflow.triggers import JetStreamBacklogEventTrigger

SCHEME = "nats"


def _parts(queue: str) -> tuple[str, str] | None:
    split = urlsplit(queue)
    names = split.path.strip("/").split("/")
    if split.scheme != SCHEME or not split.netloc or len(names) != 1 or not names[0]:
        return None
    return split.netloc, names[0]


class NatsMessageQueueProvider(BaseMessageQueueProvider):
    """``scheme="nats"``: a durable consumer's backlog, polled with ``consumer_info``."""

    scheme = SCHEME

    def queue_matches(self, queue: str) -> bool:
        """``nats://STREAM/CONSUMER`` (the deprecated ``queue=`` form of MessageQueueTrigger)."""
        return _parts(queue) is not None

    def trigger_class(self) -> type[JetStreamBacklogEventTrigger]:
        return JetStreamBacklogEventTrigger

    def trigger_kwargs(self, queue: str, **kwargs: Any) -> dict[str, Any]:
        parts = _parts(queue)
        if parts is None:
            raise ValueError(f"not a NATS queue URI: {queue!r} (expected nats://STREAM/CONSUMER)")
        return {"stream": parts[0], "consumer": parts[1]}
