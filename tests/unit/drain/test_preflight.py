"""When the Airflow operator may leave a drain unsubmitted (js_etl.drain.preflight): pure logic.
tests/airflow/test_airflow_operator.py checks it against a real server."""

from __future__ import annotations

from js_etl.drain.preflight import nothing_to_drain
from js_etl.jetstream.api import ConsumerInfo


def info(*, pending: int, ack_pending: int) -> ConsumerInfo:
    return ConsumerInfo.from_response({"stream_name": "S", "name": "c", "num_pending": pending,
                                       "num_ack_pending": ack_pending})


def test_only_a_consumer_with_nothing_pending_and_nothing_unacked_has_nothing_to_drain():
    assert nothing_to_drain(info(pending=0, ack_pending=0))
    assert not nothing_to_drain(info(pending=1, ack_pending=0))
    # An earlier run's round delivered and unacked: the next run's fence finishes it.
    assert not nothing_to_drain(info(pending=0, ack_pending=3))
    assert not nothing_to_drain(None)  # missing, and the run may create it
