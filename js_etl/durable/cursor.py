"""A durable consumer that follows a Structured Streaming query (the source's ``commit_consumer``).

The query reads the stream by position and moves this consumer, by consumer resets, to what its
sink committed: the consumer's ``num_pending`` is what the query has not written. Nothing may
read from it: a drain of it would miss every message the query moves it past, and a query
moving a consumer a drain reads would make the drain skip messages. The query claims it
(:func:`claim_cursor`) when its reader is made and again before every move. What that relies
on:

* the query's own resets leave the consumer's delivered consumer sequence at 0 and nothing
  pending an ack (a reset zeroes both): a consumer with deliveries, a pull waiting or a push
  subscriber has another reader, and is refused — before it is marked, and before every move;
* a mark in the consumer's metadata (:data:`MARK`) written while nothing reads from it; a drain
  refuses a marked consumer before its first round and before every round
  (:func:`js_etl.durable.policy.drain_consumer_problems`, :func:`refuse_marked`), and ``js-etl
  rewind`` refuses it;
* a drain already past those checks holds the consumer's lease (:mod:`js_etl.durable.lease`),
  taken before it reads the consumer's config. The query writes the mark, then reads the lease
  (in the bucket its ``lease_bucket`` option names: the drains' ``source.lease_bucket``), and
  takes the mark back and stops if a live run holds it: whichever of the two reads second sees
  the other's write (both are answered by their stream's or consumer's leader).

A mark stays with the consumer: a consumer that followed a query is not drained later (delete it
and create another for the drain).
"""

from __future__ import annotations

import logging

from js_etl.durable.lease import refuse_if_held
from js_etl.errors import ConfigError, JsEtlError, RunRefusedError
from js_etl.jetstream.api import ConsumerInfo
from js_etl.jetstream.errors import ConsumerConfigError, ConsumerNotFoundError
from js_etl.jetstream.sync import JetStreamSession

log = logging.getLogger(__name__)

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
    reader = _reader(info)
    if reader:
        raise ConfigError(
            f"commit_consumer: consumer {stream}/{consumer} {reader}; a consumer that follows a "
            "query must be one nothing reads from, or that reader would miss what the query "
            f"moves it past: create one for the query (`nats consumer add {stream} "
            f"{consumer}_query --pull --ack explicit --defaults`) and name it instead")
    refuse_if_held(js, lease_bucket, stream, consumer)
    return info


def claim_cursor(js: JetStreamSession, stream: str, consumer: str, lease_bucket: str
                 ) -> ConsumerInfo:
    """Mark ``consumer`` as the query's (module docstring), or refuse it; its info."""
    info = check_cursor(js, stream, consumer, lease_bucket)
    if marked(info.config.metadata):
        return info
    _set_mark(js, stream, consumer, True)
    try:
        refuse_if_held(js, lease_bucket, stream, consumer)  # a drain that started meanwhile
    except RunRefusedError:
        try:
            _set_mark(js, stream, consumer, False)
        except JsEtlError as e:  # the refusal is what matters; the mark only keeps drains off
            log.warning("could not take back the mark of %s/%s: %s", stream, consumer, e)
        raise
    return info


def refuse_marked(info: ConsumerInfo) -> None:
    """For a drain between rounds: stop once a query has claimed its consumer."""
    if marked(info.config.metadata):
        raise ConsumerConfigError(
            f"consumer {info.stream_name}/{info.name} was claimed by a Structured Streaming query "
            "(commit_consumer) during this run, which moves it past what a drain has not read: "
            "the run stops before its next round; give the drain a consumer of its own")


def _reader(info: ConsumerInfo) -> str | None:
    """What shows the consumer has a reader other than the query's resets, or None."""
    if info.config.deliver_subject:
        return "is a push consumer (it delivers to subscribers)"
    if info.delivered.consumer_seq or info.num_ack_pending:
        return (f"has delivered messages to a reader (a drain?): "
                f"{info.delivered.consumer_seq} deliveries, {info.num_ack_pending} unacked")
    if info.num_waiting:
        return f"has {info.num_waiting} pull requests waiting (a reader)"
    return None


def _set_mark(js: JetStreamSession, stream: str, consumer: str, on: bool) -> None:
    js.run(js.admin.update_consumer_metadata(
        stream, consumer, {MARK: "set by js-etl: commit_consumer" if on else None}))
