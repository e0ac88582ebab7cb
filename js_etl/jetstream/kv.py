"""A JetStream key-value bucket, as the ``nats kv`` CLI and the NATS clients lay it out (ADR-8):
stream ``KV_<bucket>``, one subject ``$KV.<bucket>.<key>`` a key, its last message the value.

Only what a lease needs: create-only and revision-checked writes (the server's
``Nats-Expected-Last-Subject-Sequence``), a read of the latest revision, and a conditional delete
marker. The bucket's ``max_age`` is every entry's expiry, enforced by the server's clock.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

from js_etl.jetstream.api import StreamInfo
from js_etl.jetstream.client import JetStreamConnection
from js_etl.jetstream.errors import (
    JetStreamError,
    StreamNotFoundError,
    WrongLastSequenceError,
)
from js_etl.jetstream.message import parse_headers

_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
_OPERATION = "KV-Operation"
_MARKER = "Nats-Marker-Reason"  # a bucket with limit markers leaves one where an entry expired
_NO_MESSAGE = 10037  # err_code of a message get that found nothing
_STREAM_IN_USE = 10058  # err_code: a stream of that name exists with another configuration
_KEY_CHARS = re.compile(r"[^-_A-Za-z0-9]")


def key_token(name: str) -> str:
    """``name`` as one token of a KV key: ``-``, ``_``, letters and digits as they are, every
    other byte as ``=XX`` (so names that differ give keys that differ)."""
    return _KEY_CHARS.sub(lambda m: "".join(f"={b:02X}" for b in m.group().encode()), name)


@dataclass(frozen=True, slots=True)
class KvEntry:
    key: str
    value: bytes
    revision: int  # the stream sequence of this value: what a revision-checked write names
    deleted: bool = False  # a delete or purge marker, not a value


class KeyValue:
    """``await KeyValue(conn, "js-etl-leases").create("ORDERS.drain", b"...")``"""

    def __init__(self, conn: JetStreamConnection, bucket: str, *, timeout: float = 5.0) -> None:
        self.conn = conn
        self.bucket = bucket
        self.stream = f"KV_{bucket}"
        self.timeout = timeout

    def _subject(self, key: str) -> str:
        return f"$KV.{self.bucket}.{key}"

    async def info(self) -> StreamInfo:
        return StreamInfo.from_response(
            await self.conn.request(f"STREAM.INFO.{self.stream}", None, self.timeout))

    async def ensure(self, *, ttl: float, replicas: int) -> StreamInfo:
        """The bucket, created (history 1, entries expiring ``ttl`` seconds after their last
        write) when it does not exist; an existing bucket is used as it is."""
        try:
            return await self.info()
        except StreamNotFoundError:
            pass
        ttl_ns = int(ttl * 1e9)
        config = {
            "name": self.stream, "subjects": [f"$KV.{self.bucket}.>"], "storage": "file",
            "num_replicas": replicas, "max_msgs_per_subject": 1, "max_age": ttl_ns,
            "duplicate_window": min(ttl_ns, 120 * 10**9), "discard": "new",
            "allow_rollup_hdrs": True, "deny_delete": True, "allow_direct": True,
            "max_msg_size": -1, "max_bytes": -1, "max_msgs": -1,
        }
        try:
            return StreamInfo.from_response(
                await self.conn.request(f"STREAM.CREATE.{self.stream}", config, self.timeout))
        except JetStreamError as e:
            if e.err_code != _STREAM_IN_USE:
                raise
            return await self.info()  # another client created it first, its way

    async def get(self, key: str) -> KvEntry | None:
        """The latest revision of ``key`` (a delete marker too), or None."""
        try:
            answer = await self.conn.request(f"STREAM.MSG.GET.{self.stream}",
                                             {"last_by_subj": self._subject(key)}, self.timeout)
        except JetStreamError as e:
            if e.err_code == _NO_MESSAGE:
                return None
            raise
        message: dict[str, Any] = answer["message"]
        headers = parse_headers(base64.b64decode(message["hdrs"])) if message.get("hdrs") else {}
        return KvEntry(key, base64.b64decode(message.get("data") or ""), int(message["seq"]),
                       deleted=bool(headers.get(_OPERATION) or headers.get(_MARKER)))

    async def update(self, key: str, value: bytes, revision: int) -> int:
        """Write ``value`` if ``revision`` is still the key's latest (0: the key has none);
        :class:`WrongLastSequenceError` otherwise. Returns the new revision."""
        ack = await self.conn.publish(self._subject(key), value, {_EXPECTED_LAST: str(revision)},
                                      self.timeout)
        return int(ack["seq"])

    async def create(self, key: str, value: bytes) -> int:
        """Write ``value`` only if the key has no value (none ever, expired, or deleted)."""
        try:
            return await self.update(key, value, 0)
        except WrongLastSequenceError:
            entry = await self.get(key)
            if entry is None or not entry.deleted:
                raise
            return await self.update(key, value, entry.revision)

    async def delete(self, key: str, revision: int) -> None:
        """Leave a delete marker if ``revision`` is still the key's latest."""
        await self.conn.publish(self._subject(key), b"",
                                {_EXPECTED_LAST: str(revision), _OPERATION: "DEL"}, self.timeout)
