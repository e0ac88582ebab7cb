"""A durable consumer that follows a Structured Streaming query (the source's ``commit_consumer``).

The query reads the stream by position and moves this consumer, by consumer resets, to what its
sink committed: the consumer's ``num_pending`` is what the query has not written. Nothing may
read from it: a drain of it would miss every message the query moves it past, and a query
moving a consumer a drain reads would make the drain skip messages. The two are kept apart by a
mark in the consumer's metadata (:data:`MARK`). What that relies on:

* a query marks a consumer only while nothing was ever delivered from it (its delivered
  consumer sequence is 0: resets leave it there); a consumer another reader took messages
  from is refused;
* a drain refuses a marked consumer (:func:`js_etl.durable.policy.drain_consumer_problems`),
  before it pulls;
* a drain already past that check holds the consumer's lease (:mod:`js_etl.durable.lease`),
  which it takes before it reads the consumer's config. The query writes the mark first, then
  reads the lease, and takes the mark back and stops if a live run holds it: whichever of the
  two reads second sees the other's write (both are answered by their stream's or consumer's
  leader).
"""

from __future__ import annotations

from js_etl.durable.lease import refuse_if_held
from js_etl.errors import ConfigError, RunRefusedError
from js_etl.jetstream.api import ConsumerInfo
from js_etl.jetstream.errors import ConsumerNotFoundError
from js_etl.jetstream.sync import JetStreamSession

MARK = "js-etl.follows-query"  # metadata key; its value says what set it


def marked(metadata: dict[str, str]) -> bool:
    return MARK in metadata


def check_cursor(js: JetStreamSession, stream: str, consumer: str, lease_bucket: str
                 ) -> ConsumerInfo:
    """Refuse a consumer the query may not move (module docstring), without marking it."""
    try:
        info = js.consumer_info(stream, consumer)
    except ConsumerNotFoundError:
        raise ConfigError(f"commit_consumer: consumer {consumer!r} not found on stream "
                          f"{stream}: create it (`nats consumer add {stream} {consumer} --pull "
                          "--ack explicit --defaults`)") from None
    if not marked(info.config.metadata) and (info.delivered.consumer_seq
                                             or info.num_ack_pending):
        raise ConfigError(
            f"commit_consumer: consumer {stream}/{consumer} has delivered messages to a reader "
            f"(a drain?) — {info.delivered.consumer_seq} deliveries; a consumer that follows a "
            "query must be one nothing reads from, or that reader would miss what the query "
            f"moves it past: create one for the query (`nats consumer add {stream} "
            f"{consumer}_query --pull --ack explicit --defaults`) and name it instead")
    refuse_if_held(js, lease_bucket, stream, consumer)
    return info


def claim_cursor(js: JetStreamSession, stream: str, consumer: str, lease_bucket: str) -> None:
    """Mark ``consumer`` as the query's (module docstring), or refuse it."""
    info = check_cursor(js, stream, consumer, lease_bucket)
    if marked(info.config.metadata):
        return
    _set_mark(js, stream, consumer, True)
    try:
        refuse_if_held(js, lease_bucket, stream, consumer)  # a drain that started meanwhile
    except RunRefusedError:
        _set_mark(js, stream, consumer, False)
        raise


def _set_mark(js: JetStreamSession, stream: str, consumer: str, on: bool) -> None:
    js.run(js.admin.update_consumer_metadata(
        stream, consumer, {MARK: "set by js-etl: commit_consumer" if on else None}))
