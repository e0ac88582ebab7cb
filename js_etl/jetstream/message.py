"""Messages as the server sends them: raw header blocks, status lines and ack subjects."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_ACK_PREFIX = "$JS.ACK."
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class AckMetadata:
    """What the ack reply subject says about a delivery.

    Two forms exist (measured): ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>``
    (9 tokens), and with a domain and account hash ``$JS.ACK.<domain>.<hash>.<stream>…`` (11 tokens,
    12 with a trailing random token). ``timestamp_ns`` is the message's stored stream time.
    """

    stream: str
    consumer: str
    num_delivered: int
    stream_seq: int
    consumer_seq: int
    timestamp_ns: int
    num_pending: int
    domain: str | None = None
    account_hash: str | None = None

    @property
    def timestamp(self) -> datetime:
        # Integer microseconds, truncated like parse_time() and the table's published_at: a
        # float division of a 19-digit ns value rounds (and can be off by one microsecond).
        return _EPOCH + timedelta(microseconds=self.timestamp_ns // 1000)

    @property
    def ack_prefix(self) -> str:
        """The part of the reply subject shared by every delivery of this consumer."""
        if self.account_hash is None:
            return f"{_ACK_PREFIX}{self.stream}.{self.consumer}"
        return f"{_ACK_PREFIX}{self.domain or '_'}.{self.account_hash}.{self.stream}.{self.consumer}"


def parse_ack_subject(reply: str) -> AckMetadata:
    """Parse a JetStream ack reply subject in either form; ValueError if it is not one."""
    tokens = reply.split(".")
    n = len(tokens)
    if n < 9 or tokens[0] != "$JS" or tokens[1] != "ACK" or n == 10:
        raise ValueError(f"not a JetStream ack subject: {reply!r}")
    if n == 9:
        domain = account = None
        rest = tokens[2:]
    else:
        domain = None if tokens[2] == "_" else tokens[2]
        account = tokens[3]
        rest = tokens[4:11]
    try:
        return AckMetadata(rest[0], rest[1], int(rest[2]), int(rest[3]), int(rest[4]),
                           int(rest[5]), int(rest[6]), domain, account)
    except ValueError:
        raise ValueError(f"not a JetStream ack subject: {reply!r}") from None


def ack_subject(prefix: str, num_delivered: int, stream_seq: int, consumer_seq: int) -> str:
    """Rebuild an ack subject for a delivery from what a table row keeps.

    The server keys explicit acks by stream sequence and takes the delivery sequence from its own
    pending record (measured: an ack on a stale delivery's subject acks the current delivery), so
    timestamp and pending tokens are not needed and are sent as 0.
    """
    return f"{prefix}.{num_delivered}.{stream_seq}.{consumer_seq}.0.0"


def parse_headers(raw: bytes | None) -> dict[str, list[str]]:
    """Every header value, in order, from a raw ``NATS/1.0`` block (status line skipped).

    nats-py keeps only the last value of a repeated key; a table column of
    ``map<string,array<string>>`` needs all of them.
    """
    if not raw:
        return {}
    out: dict[str, list[str]] = {}
    lines = raw.decode("utf-8", "replace").split("\r\n")
    for line in lines[1:]:
        if not line:
            continue
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key.strip(), []).append(value.strip())
    return out


@dataclass(frozen=True, slots=True)
class Status:
    """A status frame: ``NATS/1.0 409 Message Size Exceeds MaxBytes`` plus its headers."""

    code: int
    description: str
    headers: dict[str, list[str]]

    @classmethod
    def parse(cls, raw: bytes) -> Status:
        first, _, _ = raw.partition(b"\r\n")
        parts = first.decode("utf-8", "replace").split(" ", 2)  # NATS/1.0 <code> [text]
        code = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        return cls(code, parts[2] if len(parts) > 2 else "", parse_headers(raw))

    def header(self, key: str) -> str | None:
        values = self.headers.get(key)
        return values[-1] if values else None

    def __str__(self) -> str:
        return f"{self.code} {self.description}".strip()


@dataclass(frozen=True, slots=True)
class JsMessage:
    """One delivered JetStream message. Headers and metadata are parsed on demand."""

    subject: str
    data: bytes
    reply: str
    raw_headers: bytes | None = None

    @property
    def headers(self) -> dict[str, list[str]]:
        return parse_headers(self.raw_headers)

    @property
    def metadata(self) -> AckMetadata:
        return parse_ack_subject(self.reply)

    @property
    def size(self) -> int:
        """What this message costs against a pull's ``max_bytes`` (measured formula)."""
        return (len(self.subject.encode()) + len(self.reply.encode()) + len(self.raw_headers or b"")
                + len(self.data))
