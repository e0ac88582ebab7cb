"""Messages as the server sends them: raw header blocks, status lines, delivered messages.

Ack reply subjects are taken apart and built in :mod:`js_etl.jetstream.subjects`.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, overload

from js_etl.jetstream.subjects import AckMetadata, parse_ack_subject

if TYPE_CHECKING:  # pyarrow is the fetch's, imported where used: Airflow hosts go without it
    import pyarrow as pa


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


class Deliveries(Sequence[JsMessage]):
    """The messages of one pull, kept as the parser hands them over: columns of raw bytes
    (subjects, ack replies, header blocks) and the payloads back to back in one buffer, so that
    a pull of thousands makes no object per message. Indexing and iteration make each
    :class:`JsMessage` on demand; a columnar reader (:func:`js_etl.jetstream.arrow.to_record_batch`)
    takes the columns, and the payloads as one Arrow array over that buffer
    (:meth:`payload_array`).

    Why: no object per message, and no copy of each payload as its own ``bytes`` to be joined
    again into the Arrow array's buffer: both were measurable costs of a fetch task
    (docs/design/nats-client.md).
    """

    __slots__ = ("_data", "_ends", "_shared", "headers", "replies", "subjects")

    def __init__(self) -> None:
        self.subjects: list[bytes] = []
        self.replies: list[bytes] = []
        self.headers: list[bytes | None] = []
        self._data = bytearray()  # the payloads, back to back
        self._ends = array("q")  # where each payload ends in _data
        self._shared = False  # _data is an Arrow array's buffer now (payload_array)

    @classmethod
    def of(cls, messages: Iterable[JsMessage]) -> Deliveries:
        deliveries = cls()
        for m in messages:
            deliveries.append(m.subject.encode(), m.reply.encode(), m.data, m.raw_headers)
        return deliveries

    def append(self, subject: bytes, reply: bytes, payload: bytes | memoryview,
               headers: bytes | None) -> None:
        """``payload`` is copied: it may be a view of the parser's read buffer."""
        if self._shared:  # an empty payload too: the Arrow array would not have it
            raise BufferError("these deliveries' payloads are an Arrow array's buffer now")
        self._data += payload  # first: what fails leaves the columns as they were
        self._ends.append(len(self._data))
        self.subjects.append(subject)
        self.replies.append(reply)
        self.headers.append(headers)

    @property
    def payloads(self) -> list[bytes]:
        """Each payload as its own ``bytes`` (a copy of each)."""
        with memoryview(self._data) as data:
            return [data[start:end].tobytes() for start, end in pairwise((0, *self._ends))]

    def payload_array(self) -> pa.Array:
        """The payloads as an Arrow ``binary`` array over the pull's own buffer, without a copy.
        The buffer is then shared with Arrow, so these deliveries take no more messages
        (``append`` raises BufferError). ValueError when they hold 2 GiB or more, more than a
        ``binary`` array's 32-bit offsets can address."""
        if self._ends and self._ends[-1] > 2**31 - 1:
            raise ValueError(f"{len(self)} payloads hold {self._ends[-1]:,} bytes, over the 2 GiB "
                             "a binary array holds")
        import pyarrow as pa

        offsets = array("i", [0])
        offsets.extend(self._ends.tolist())
        self._shared = True
        return pa.Array.from_buffers(pa.binary(), len(self), [None, pa.py_buffer(offsets),
                                                              pa.py_buffer(self._data)])

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, index: int) -> JsMessage: ...

    @overload
    def __getitem__(self, index: slice) -> list[JsMessage]: ...

    def __getitem__(self, index: int | slice) -> JsMessage | list[JsMessage]:
        """A subject that is not UTF-8 (the server takes any bytes but whitespace) has its bad
        bytes replaced by U+FFFD, as in the fetch's rows, rather than failing the pull."""
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = range(len(self))[index]  # a negative index too; IndexError past the end
        start = self._ends[index - 1] if index else 0
        return JsMessage(self.subjects[index].decode("utf-8", "replace"),
                         bytes(self._data[start:self._ends[index]]),
                         self.replies[index].decode("utf-8", "replace"), self.headers[index])

    def __eq__(self, other: object) -> bool:
        """Equal to a list of the same messages (``result.messages == []``)."""
        return isinstance(other, Deliveries | list) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # it grows while a pull is collected

    def __repr__(self) -> str:
        return f"Deliveries({list(self)!r})"
