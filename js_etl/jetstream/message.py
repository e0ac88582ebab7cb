"""Messages as the server sends them: raw header blocks, status lines, delivered messages.

Ack reply subjects are taken apart and built in :mod:`js_etl.jetstream.subjects`.
"""

from __future__ import annotations

from dataclasses import dataclass

from js_etl.jetstream.subjects import AckMetadata, parse_ack_subject


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
