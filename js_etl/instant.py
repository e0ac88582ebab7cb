"""RFC 3339 instants, the one codec: the server's wire times and the times users give.

* :func:`parse_time` / :func:`format_time`: ``$JS.API`` answers and requests, as aware UTC
  ``datetime`` (microseconds; the server's zero time is ``None``). Strict RFC 3339, as the server
  writes it.
* :func:`parse_instant` / :func:`format_instant`: what a user types (``--from-time``), as exact
  integer nanoseconds since the epoch; RFC 3339 / ISO 8601, lenient about the form. What it
  formats, the server parses (``STREAM.MSG.GET`` with ``start_time``). The server compares
  times as 64-bit nanoseconds since the epoch and wraps outside them, so an instant outside
  :data:`NS_MIN`..:data:`NS_MAX` is refused, and a Spark filter's is clamped to them
  (:func:`clamp_ns`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

from js_etl.errors import ConfigError

_NS = 1_000_000_000
NS_MIN, NS_MAX = -(2**63), 2**63 - 1  # the times NATS compares: 1677-09-21 to 2262-04-11
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ZERO_TIME = "0001-01-01T00:00:00Z"
_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")
_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)(?:[Tt ](\d\d):(\d\d)(?::(\d\d)(?:[.,](\d{1,9}))?)?)?"
                   r"\s*(Z|z|UTC|[+-]\d\d(?::?\d\d)?)?")


# --- wire times ---------------------------------------------------------------------------------
def parse_time(value: str | None) -> datetime | None:
    """RFC 3339 with up to nanoseconds -> aware UTC datetime (microseconds); zero time -> None."""
    if not value or value == _ZERO_TIME:
        return None
    m = _RFC3339.match(value)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {value!r}")
    base, frac, tz = m.groups()
    micros = (frac or "0")[:6].ljust(6, "0")
    parsed = datetime.fromisoformat(f"{base}.{micros}{'+00:00' if tz == 'Z' else tz}")
    return parsed.astimezone(UTC)


def format_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- user times, in nanoseconds -----------------------------------------------------------------
def parse_instant(text: str, what: str = "time") -> int:
    """RFC 3339 / ISO 8601 (date only, minutes, seconds, up to 9 fractional digits; ``Z``, an
    offset, or no zone = UTC) -> nanoseconds since the epoch, exactly."""
    m = _TIME.fullmatch(text.strip())
    if not m:
        raise ConfigError(f"{what} {text!r} is not an RFC 3339 / ISO 8601 time, e.g. "
                          "2026-11-01T00:00:00Z (no zone means UTC)")
    year, month, day, hour, minute, second, frac, zone = m.groups()
    tz: timezone = UTC
    if zone and zone not in ("Z", "z", "UTC"):
        digits = zone[1:].replace(":", "")
        offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
        tz = timezone(-offset if zone[0] == "-" else offset)
    try:
        moment = datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0),
                          int(second or 0), tzinfo=tz)
    except ValueError as e:
        raise ConfigError(f"{what} {text!r} is not a valid time: {e}") from None
    seconds = (moment - _EPOCH) // timedelta(seconds=1)
    ns = seconds * _NS + int((frac or "0").ljust(9, "0"))
    if not NS_MIN <= ns <= NS_MAX:
        raise ConfigError(f"{what} {text!r} is outside the times NATS compares, "
                          f"{format_instant(NS_MIN)} to {format_instant(NS_MAX)}")
    return ns


def clamp_ns(moment: datetime) -> int:
    """An aware ``datetime`` (microseconds) as nanoseconds since the epoch, within
    :data:`NS_MIN`..:data:`NS_MAX`: every stored message lies between, so a time past either
    end compares with them as that end does."""
    micros = (moment - _EPOCH) // timedelta(microseconds=1)
    return max(NS_MIN, min(NS_MAX, micros * 1000))


def format_instant(ns: int) -> str:
    """Nanoseconds since the epoch -> RFC 3339 UTC with nanoseconds (what the server parses)."""
    seconds, rest = divmod(ns, _NS)
    return f"{(_EPOCH + timedelta(seconds=seconds)):%Y-%m-%dT%H:%M:%S}.{rest:09d}Z"
