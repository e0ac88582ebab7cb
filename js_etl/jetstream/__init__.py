"""The JetStream layer: connecting, typed admin objects, the raw pull protocol, acks.

No Spark or Airflow import lives here (or below).
"""

from js_etl.jetstream.ack import Acker
from js_etl.jetstream.admin import JetStreamAdmin, drain_consumer_problems
from js_etl.jetstream.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    PriorityGroupState,
    PriorityPolicy,
    SequenceInfo,
    StreamInfo,
    StreamState,
)
from js_etl.jetstream.client import JetStreamConnection
from js_etl.jetstream.message import (
    AckMetadata,
    JsMessage,
    Status,
    ack_subject,
    parse_ack_subject,
    parse_headers,
)
from js_etl.jetstream.options import ConnectionOptions, Secret, TlsOptions
from js_etl.jetstream.pull import Puller, PullEnd, PullRequest, PullResult
from js_etl.jetstream.sync import JetStreamSession

__all__ = [
    "AckMetadata", "AckPolicy", "Acker", "ConnectionOptions", "ConsumerConfig", "ConsumerInfo",
    "DeliverPolicy", "JetStreamAdmin", "JetStreamConnection", "JetStreamSession", "JsMessage",
    "PriorityGroupState", "PriorityPolicy", "PullEnd", "PullRequest", "PullResult", "Puller",
    "Secret", "SequenceInfo", "Status", "StreamInfo", "StreamState", "TlsOptions", "ack_subject",
    "drain_consumer_problems", "parse_ack_subject", "parse_headers",
]
