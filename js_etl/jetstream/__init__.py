"""The JetStream layer: connecting, typed admin objects, the raw pull protocol, ack subjects,
acks. It speaks protocol only: what a drain needs from a consumer lives in :mod:`js_etl.durable`.

No Spark or Airflow import lives here (or below).
"""

from js_etl.jetstream.ack import Acker
from js_etl.jetstream.admin import JetStreamAdmin
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
from js_etl.jetstream.message import Deliveries, JsMessage, Status, parse_headers
from js_etl.jetstream.options import ConnectionOptions, Secret, TlsOptions
from js_etl.jetstream.pull import PriorityGroupRequest, PullEnd, Puller, PullRequest, PullResult
from js_etl.jetstream.subjects import AckMetadata, ack_prefix, ack_subject, parse_ack_subject
from js_etl.jetstream.sync import JetStreamSession

__all__ = [
    "AckMetadata", "AckPolicy", "Acker", "ConnectionOptions", "ConsumerConfig", "ConsumerInfo",
    "DeliverPolicy", "Deliveries", "JetStreamAdmin", "JetStreamConnection", "JetStreamSession",
    "JsMessage", "PriorityGroupRequest", "PriorityGroupState", "PriorityPolicy", "PullEnd",
    "PullRequest", "PullResult", "Puller", "Secret", "SequenceInfo", "Status", "StreamInfo",
    "StreamState", "TlsOptions", "ack_prefix", "ack_subject", "parse_ack_subject",
    "parse_headers",
]
