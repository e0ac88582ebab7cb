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
* a mark in the consumer's metadata (:data:`MARK`) written while nothing reads from it, naming
  at its first move the query (a token its offsets carry from its first one on, so every run
  from its checkpoint has it): a query whose offsets name another is refused before it plans a
  batch and before every move, so two queries never move one consumer past what the other has
  not written. An unnamed mark (from before marks named their query, or a reader made before
  its first move) goes to the first query that moves the consumer; a drain
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

MARK = "js-etl.follows-query"  # metadata key; its value says what set it, and for which query
_FOR_QUERY = "set by js-etl for query "
_UNNAMED = "set by js-etl: commit_consumer"  # the value before marks named their query


def marked(metadata: dict[str, str]) -> bool:
    return MARK in metadata


def _query_of(mark: str) -> str | None:
    return mark.removeprefix(_FOR_QUERY) if mark.startswith(_FOR_QUERY) else None


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


def claim_cursor(js: JetStreamSession, stream: str, consumer: str, lease_bucket: str,
                 query: str | None = None) -> ConsumerInfo:
    """Mark ``consumer`` as the query's (module docstring), or refuse it; its info. ``query``:
    the token the query's offsets carry, None where they carry none yet (its reader just made)
    or ever (offsets from before they did)."""
    info = check_cursor(js, stream, consumer, lease_bucket)
    mark = info.config.metadata.get(MARK)
    if mark is not None:
        _refuse_other_query(stream, consumer, mark, query)
        if query is not None and _query_of(mark) is None:
            _set_mark(js, stream, consumer, query)  # unnamed: this query's from now on
        return info
    _set_mark(js, stream, consumer, query)
    try:
        refuse_if_held(js, lease_bucket, stream, consumer)  # a drain that started meanwhile
    except RunRefusedError:
        try:
            _set_mark(js, stream, consumer, None, take_back=True)
        except JsEtlError as e:  # the refusal is what matters; the mark only keeps drains off
            log.warning("could not take back the mark of %s/%s: %s", stream, consumer, e)
        raise
    return info


def check_query(js: JetStreamSession, stream: str, consumer: str, query: str) -> None:
    """Before a query plans a batch: refuse a consumer another query moves. Read only: a query
    names itself in the mark at its first move, once its offsets (and so its token) are in its
    checkpoint."""
    mark = js.consumer_info(stream, consumer).config.metadata.get(MARK)
    if mark is not None:
        _refuse_other_query(stream, consumer, mark, query)


def _refuse_other_query(stream: str, consumer: str, mark: str, query: str | None) -> None:
    owner = _query_of(mark)
    if query is not None and owner is not None and owner != query:
        raise ConfigError(
            f"commit_consumer: consumer {stream}/{consumer} follows another query (token "
            f"{owner} in its checkpoint's offsets; this query's {query}); two queries moving one "
            "consumer would each move it past what the other has not written: give each query a "
            "consumer of its own (if that query is gone for good, delete the consumer and create "
            "it again)")


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


def _set_mark(js: JetStreamSession, stream: str, consumer: str, query: str | None, *,
              take_back: bool = False) -> None:
    value = None if take_back else _FOR_QUERY + query if query else _UNNAMED
    js.run(js.admin.update_consumer_metadata(stream, consumer, {MARK: value}))
