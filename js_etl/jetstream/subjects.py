"""The ack reply subject of a JetStream delivery: the one place that takes it apart and builds it.

Two forms exist (nats-server 2.15):
``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`` (9 tokens), and with a
domain and account hash ``$JS.ACK.<domain>.<hash>.<stream>…`` (11 tokens, 12 with a trailing
random token). ``<ts>`` is the message's stored stream time in nanoseconds; ``<pending>`` is the
consumer's undelivered count after this delivery (redeliveries are not counted in it).

Parsing comes in two shapes: :func:`parse_ack_subject` for one subject (either form), and
:func:`parse_ack_columns` for a whole pull's reply subjects at once, by Arrow compute kernels
(the 9-token form under a known prefix). Building: :func:`ack_prefix` for a stream/consumer,
:func:`ack_subject` for one delivery, :func:`framed_ack_subjects` for many, by one Arrow kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pyarrow is the fetch's, imported where used: Airflow hosts go without it
    import pyarrow as pa

ACK_SUBJECTS = "$JS.ACK."  # every ack subject starts so
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ack_prefix(stream: str, consumer: str) -> str:
    """``$JS.ACK.<stream>.<consumer>``: the part of the reply subject (9-token form) shared by
    every delivery of one consumer."""
    return f"{ACK_SUBJECTS}{stream}.{consumer}"


def prefix_stream(prefix: str) -> str:
    """The stream named in an :func:`ack_prefix`."""
    return prefix.split(".")[-2]


def ack_subject(prefix: str, num_delivered: int, stream_seq: int, consumer_seq: int) -> str:
    """Rebuild an ack subject for a delivery from what a table row keeps.

    The server keys explicit acks by stream sequence and takes the delivery sequence from its own
    pending record (an ack on a stale delivery's subject acks the current delivery), so
    timestamp and pending tokens are not needed and are sent as 0.
    """
    return f"{prefix}.{num_delivered}.{stream_seq}.{consumer_seq}.0.0"


def framed_ack_subjects(prefix: str, num_delivered: pa.Array, stream_seq: pa.Array,
                        consumer_seq: pa.Array, *, before: bytes, after: bytes) -> pa.Array:
    """``before + <ack subject> + after`` for every delivery, as ``large_binary`` (64-bit
    offsets: no 2 GiB ceiling), in one Arrow kernel pass. The subjects are those of
    :func:`ack_subject`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def binary(value: bytes) -> pa.Scalar:
        return pa.scalar(value, pa.large_binary())

    tokens = [pc.cast(pc.cast(a, pa.large_string()), pa.large_binary())
              for a in (num_delivered, stream_seq, consumer_seq)]
    # "<before><prefix>.<delivered>.<sseq>.<cseq>.0.0<after>" per delivery.
    return pc.binary_join_element_wise(
        binary(before + prefix.encode()), *tokens, binary(b"0"), binary(b"0" + after),
        binary(b"."))


@dataclass(frozen=True, slots=True)
class AckMetadata:
    """What the ack reply subject says about a delivery (either form, module docstring).
    ``timestamp_ns`` is the message's stored stream time."""

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
            return ack_prefix(self.stream, self.consumer)
        domain = self.domain or "_"
        return f"{ACK_SUBJECTS}{domain}.{self.account_hash}.{self.stream}.{self.consumer}"


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


class ForeignAckSubjectError(ValueError):
    """A reply subject that does not start with the expected :func:`ack_prefix`."""

    def __init__(self, reply: str, prefix: str) -> None:
        self.reply = reply
        self.prefix = prefix
        super().__init__(f"ack subject {reply!r} does not start with {prefix!r}")


@dataclass(frozen=True, slots=True)
class AckColumns:
    """The numeric tokens of many ack subjects, as ``int64`` Arrow arrays, row for row."""

    num_delivered: pa.Array
    stream_seq: pa.Array
    consumer_seq: pa.Array
    timestamp_ns: pa.Array


def parse_ack_columns(replies: pa.Array, prefix: str) -> AckColumns:
    """Split the reply subjects of one pull (``string`` array, 9-token form under ``prefix``)
    by Arrow compute kernels: parsing each message's tokens in Python cost more than the rest of
    a fetched batch together. ForeignAckSubjectError names the first that is not under
    ``prefix``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    prefix_dot = prefix + "."
    if not pc.all(pc.starts_with(replies, prefix_dot)).as_py():
        bad = next(r for r in replies.to_pylist() if not r.startswith(prefix_dot))
        raise ForeignAckSubjectError(bad, prefix)
    # <prefix>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
    tokens = pc.split_pattern(pc.utf8_slice_codeunits(replies, len(prefix_dot)), ".")

    def token(i: int) -> pa.Array:
        return pc.list_element(tokens, i).cast(pa.int64())

    return AckColumns(token(0), token(1), token(2), token(3))
