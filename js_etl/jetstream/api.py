"""Typed, frozen JetStream admin objects: what we read from and send to ``$JS.API``.

One dataclass per wire object, with ``from_response`` (unknown keys ignored, so newer servers
do not break us) and ``as_dict`` (``None`` dropped). Units are converted here and only here:
durations are ``float`` seconds in Python and nanoseconds on the wire; times are aware UTC
``datetime`` in Python and RFC 3339 on the wire (the codec: :mod:`js_etl.instant`). nats-py's
own ``ConsumerConfig`` cannot carry priority groups (it raises ``TypeError``), which is why these
exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, Self

from js_etl.instant import format_time, parse_time

_NS = 1_000_000_000


def _seconds(ns: int | None) -> float | None:
    return None if ns is None else ns / _NS


def _nanos(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * _NS)


class AckPolicy(StrEnum):
    NONE = "none"
    ALL = "all"
    EXPLICIT = "explicit"


class DeliverPolicy(StrEnum):
    ALL = "all"
    LAST = "last"
    NEW = "new"
    BY_START_SEQUENCE = "by_start_sequence"
    BY_START_TIME = "by_start_time"
    LAST_PER_SUBJECT = "last_per_subject"


class PriorityPolicy(StrEnum):
    NONE = "none"
    OVERFLOW = "overflow"
    PINNED_CLIENT = "pinned_client"
    PRIORITIZED = "prioritized"


@dataclass(frozen=True, slots=True)
class StreamState:
    messages: int = 0
    bytes: int = 0
    first_seq: int = 0
    first_ts: datetime | None = None
    last_seq: int = 0
    last_ts: datetime | None = None
    num_subjects: int = 0
    consumer_count: int = 0

    @classmethod
    def from_response(cls, d: dict[str, Any]) -> Self:
        return cls(
            messages=d.get("messages", 0), bytes=d.get("bytes", 0),
            first_seq=d.get("first_seq", 0), first_ts=parse_time(d.get("first_ts")),
            last_seq=d.get("last_seq", 0), last_ts=parse_time(d.get("last_ts")),
            num_subjects=d.get("num_subjects", 0), consumer_count=d.get("consumer_count", 0),
        )


@dataclass(frozen=True, slots=True)
class StreamInfo:
    name: str
    subjects: tuple[str, ...]
    state: StreamState
    created: datetime | None = None
    storage: str | None = None
    num_replicas: int = 1
    max_age: float = 0.0  # seconds; 0: messages never age out
    retention: str = "limits"  # or "interest", "workqueue"
    # A mirror, sources or a subject transform: it stores messages on subjects ``subjects``
    # does not list (the origin's, or transformed ones).
    unlisted_subjects: bool = False

    @classmethod
    def from_response(cls, d: dict[str, Any]) -> Self:
        cfg = d.get("config", {})
        return cls(name=cfg.get("name", ""), subjects=tuple(cfg.get("subjects") or ()),
                   state=StreamState.from_response(d.get("state", {})),
                   created=parse_time(d.get("created")), storage=cfg.get("storage"),
                   num_replicas=cfg.get("num_replicas") or 1,
                   max_age=(cfg.get("max_age") or 0) / 1e9,
                   retention=cfg.get("retention") or "limits",
                   unlisted_subjects=bool(cfg.get("mirror") or cfg.get("sources")
                                          or cfg.get("subject_transform")))


@dataclass(frozen=True, slots=True)
class SequenceInfo:
    consumer_seq: int = 0
    stream_seq: int = 0
    last_active: datetime | None = None

    @classmethod
    def from_response(cls, d: dict[str, Any] | None) -> Self:
        d = d or {}
        return cls(d.get("consumer_seq", 0), d.get("stream_seq", 0),
                   parse_time(d.get("last_active")))


@dataclass(frozen=True, slots=True)
class PriorityGroupState:
    group: str
    pinned_client_id: str | None = None
    pinned_ts: datetime | None = None

    @classmethod
    def from_response(cls, d: dict[str, Any]) -> Self:
        return cls(d.get("group", ""), d.get("pinned_client_id") or None,
                   parse_time(d.get("pinned_ts")))


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """The consumer settings a drain or a backfill uses. Durations in seconds.

    >>> ConsumerConfig(durable_name="orders_to_delta", ack_wait=300, max_ack_pending=20_000,
    ...                filter_subjects=("orders.>",)).as_dict()["ack_wait"]
    300000000000
    """

    durable_name: str | None = None
    name: str | None = None
    description: str | None = None
    deliver_policy: DeliverPolicy = DeliverPolicy.ALL
    opt_start_seq: int | None = None
    opt_start_time: datetime | None = None
    ack_policy: AckPolicy = AckPolicy.EXPLICIT
    ack_wait: float | None = None
    max_deliver: int | None = None
    max_ack_pending: int | None = None
    max_waiting: int | None = None
    max_batch: int | None = None
    max_bytes: int | None = None
    max_expires: float | None = None
    inactive_threshold: float | None = None
    filter_subjects: tuple[str, ...] = ()
    priority_groups: tuple[str, ...] = ()
    priority_policy: PriorityPolicy | None = None
    priority_timeout: float | None = None
    deliver_subject: str | None = None  # set only on push consumers; a drain refuses them
    headers_only: bool | None = None  # deliver headers without payloads
    mem_storage: bool | None = None
    num_replicas: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    _DURATIONS = ("ack_wait", "max_expires", "inactive_threshold", "priority_timeout")

    @classmethod
    def from_response(cls, d: dict[str, Any]) -> Self:
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {k: v for k, v in d.items() if k in known}
        for k in cls._DURATIONS:
            if k in kw:
                kw[k] = _seconds(kw[k])
        subjects = list(d.get("filter_subjects") or ())
        if d.get("filter_subject"):
            subjects.insert(0, d["filter_subject"])
        kw["filter_subjects"] = tuple(subjects)
        kw["priority_groups"] = tuple(d.get("priority_groups") or ())
        kw["opt_start_time"] = parse_time(d.get("opt_start_time"))
        for k, enum in (("deliver_policy", DeliverPolicy), ("ack_policy", AckPolicy),
                        ("priority_policy", PriorityPolicy)):
            if kw.get(k) is not None:
                kw[k] = enum(kw[k])
        kw["metadata"] = dict(d.get("metadata") or {})
        return cls(**kw)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or v == () or v == {}:
                continue
            if f.name in self._DURATIONS:
                v = _nanos(v)
            elif isinstance(v, datetime):
                v = format_time(v)
            elif isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, StrEnum):
                v = v.value
            out[f.name] = v
        return out


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    stream_name: str
    name: str
    config: ConsumerConfig
    delivered: SequenceInfo
    ack_floor: SequenceInfo
    num_ack_pending: int = 0
    num_redelivered: int = 0
    num_waiting: int = 0
    num_pending: int = 0
    priority_groups: tuple[PriorityGroupState, ...] = ()
    created: datetime | None = None
    ts: datetime | None = None

    @classmethod
    def from_response(cls, d: dict[str, Any]) -> Self:
        return cls(
            stream_name=d.get("stream_name", ""), name=d.get("name", ""),
            config=ConsumerConfig.from_response(d.get("config", {})),
            delivered=SequenceInfo.from_response(d.get("delivered")),
            ack_floor=SequenceInfo.from_response(d.get("ack_floor")),
            num_ack_pending=d.get("num_ack_pending", 0),
            num_redelivered=d.get("num_redelivered", 0),
            num_waiting=d.get("num_waiting", 0), num_pending=d.get("num_pending", 0),
            priority_groups=tuple(PriorityGroupState.from_response(g)
                                  for g in d.get("priority_groups") or ()),
            created=parse_time(d.get("created")), ts=parse_time(d.get("ts")),
        )

    def pinned_id(self, group: str) -> str | None:
        for g in self.priority_groups:
            if g.group == group:
                return g.pinned_client_id
        return None
