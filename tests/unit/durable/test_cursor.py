"""A drain between rounds stops once a query has claimed its consumer (pure logic)."""

from __future__ import annotations

import pytest

from js_etl.durable.cursor import MARK, refuse_marked
from js_etl.jetstream.api import ConsumerInfo
from js_etl.jetstream.errors import ConsumerConfigError


def info(metadata: dict[str, str]) -> ConsumerInfo:
    return ConsumerInfo.from_response({
        "stream_name": "ORDERS", "name": "drain",
        "config": {"durable_name": "drain", "ack_policy": "explicit", "metadata": metadata}})


def test_a_claimed_consumer_stops_the_drain_before_its_next_round():
    refuse_marked(info({"_nats.ver": "2.15.1"}))  # not claimed: the round goes on
    with pytest.raises(ConsumerConfigError, match="ORDERS/drain was claimed by a Structured "
                                                  "Streaming query .* during this run"):
        refuse_marked(info({MARK: "set by js-etl: commit_consumer"}))
