"""Spark's reading of JSON values into DATE, TIMESTAMP and TIMESTAMP_NTZ, for the Python decoder
(:mod:`js_etl.decode.arrow`): Spark 4.2's ``JacksonParser.makeConverter`` with the drain's
``from_json`` options (no dateFormat or timestampFormat, so Spark's default formatters and their
legacy fallback) and ``spark.sql.legacy.timeParserPolicy`` CORRECTED, in a UTC session. Values
are what Spark holds: days and microseconds since the epoch, so that years Python's ``datetime``
cannot hold (Spark reads "12345" and "-2026-11-28") are written as Spark writes them.

Each function names the Spark or Java method it follows; docs/design/json-decoding.md has the
rules and how they were found.
"""

from __future__ import annotations

import bisect
import os
import re
import shutil
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from functools import cache

_INT32 = range(-(2**31), 2**31)
_INT64 = range(-(2**63), 2**63)
_MICROS = 1_000_000
_DAY = 86_400
# What java.lang.Integer.parseInt reads: Unicode decimal digits, one UTF-16 unit each (so only
# those of the Basic Multilingual Plane).
_JAVA_INT = re.compile(r"[+-]?(?:(?![\U00010000-\U0010FFFF])\d)+")
# UTF8String.isWhitespaceOrISOControl of one byte: Spark trims these off both ends of the text.
_TRIMMED = frozenset(range(0x21)) | {0x7F}
# SparkDateTimeUtils.getZoneId rewrites (+|-)h: and a final (+|-)hh:m before ZoneId.of.
_SINGLE_HOUR = re.compile(r"([+-])([0-9]):")
_SINGLE_MINUTE = re.compile(r"([+-])([0-9][0-9]):([0-9])\Z")
# java.time.ZoneId.SHORT_IDS, which Spark passes to ZoneId.of.
_SHORT_IDS = {
    "ACT": "Australia/Darwin", "AET": "Australia/Sydney",
    "AGT": "America/Argentina/Buenos_Aires", "ART": "Africa/Cairo", "AST": "America/Anchorage",
    "BET": "America/Sao_Paulo", "BST": "Asia/Dhaka", "CAT": "Africa/Harare",
    "CNT": "America/St_Johns", "CST": "America/Chicago", "CTT": "Asia/Shanghai",
    "EAT": "Africa/Addis_Ababa", "ECT": "Europe/Paris", "EST": "-05:00", "HST": "-10:00",
    "IET": "America/Indiana/Indianapolis", "IST": "Asia/Kolkata", "JST": "Asia/Tokyo",
    "MIT": "Pacific/Apia", "MST": "-07:00", "NET": "Asia/Yerevan", "NST": "Pacific/Auckland",
    "PLT": "Asia/Karachi", "PNT": "America/Phoenix", "PRT": "America/Puerto_Rico",
    "PST": "America/Los_Angeles", "SST": "Pacific/Guadalcanal", "VST": "Asia/Ho_Chi_Minh"}
# RebaseDateTime.julianGregDiffSwitchDay and julianGregDiffs: from 0001-01-01 (Julian) on.
_JULIAN_SWITCH_DAYS = (-719164, -682945, -646420, -609895, -536845, -500320, -463795, -390745,
                       -354220, -317695, -244645, -208120, -171595, -141427)
_JULIAN_DIFFS = (2, 1, 0, -1, -2, -3, -4, -5, -6, -7, -8, -9, -10, 0)

# What ends each field of a timestamp, by its index (parseTimestampString).
_SEPARATORS = {0: b"-", 1: b"-", 2: b" T", 3: b":", 4: b":", 5: b"."}

Zone = int | str  # an offset in seconds, or a region's name


def json_date(text: str) -> int | None:
    """A JSON string read into a DATE (``makeConverter(DateType)``): its day since the epoch,
    or None where Spark refuses it. ``DefaultDateFormatter.parse`` (``stringToDate``), then the
    legacy fallback: the same with every "GMT" removed (``cleanLegacyTimestampStr``), then the
    whole text as ``Integer.parseInt`` reads it, a day count of Spark 1.5 in the Julian
    calendar (``RebaseDateTime.rebaseJulianToGregorianDays``)."""
    raw = _utf8(text)
    days = _string_to_date(raw)
    if days is None and b"GMT" in raw:
        days = _string_to_date(raw.replace(b"GMT", b""))
    if days is None:
        number = _java_int(text)
        days = None if number is None else _julian_to_gregorian_days(number)
    return days


def _java_int(text: str) -> int | None:
    """Integer.parseInt: a sign and decimal digits, leading zeros as many as there are."""
    if not _JAVA_INT.fullmatch(text):
        return None
    digits = "".join(str(unicodedata.decimal(c)) for c in text.lstrip("+-")).lstrip("0")
    number = int(digits or "0") if len(digits) <= 10 else None
    if number is None or (-number if text[0] == "-" else number) not in _INT32:
        return None
    return -number if text[0] == "-" else number


def json_timestamp(text: str) -> int | None:
    """A JSON string read into a TIMESTAMP in a UTC session (``makeConverter(TimestampType)``):
    its microsecond since the epoch, or None. ``DefaultTimestampFormatter.parse``
    (``stringToTimestamp``), then the same with every "GMT" removed (the legacy fallback)."""
    raw = _utf8(text)
    micros = _string_to_timestamp(raw)
    if micros is None and b"GMT" in raw:
        micros = _string_to_timestamp(raw.replace(b"GMT", b""))
    return micros


def json_timestamp_ntz(text: str) -> int | None:
    """A JSON string read into a TIMESTAMP_NTZ (``DefaultTimestampFormatter.
    parseWithoutTimeZone``, ``stringToTimestampWithoutTimeZone``): a date and time without any
    zone, as microseconds since 1970-01-01 00:00; no fallback."""
    parsed = _parse_timestamp(_utf8(text))
    if parsed is None or parsed[1] is not None or parsed[2]:
        return None
    fields = parsed[0]
    return _micros(fields, 0)


def json_seconds(number: int) -> int | None:
    """A JSON integer read into a TIMESTAMP: seconds since the epoch, ``getLongValue *
    1000000L``, which wraps around past the longs as Java's multiplication does."""
    if number not in _INT64:
        return None  # Jackson's getLongValue refuses it
    return (number * _MICROS + 2**63) % 2**64 - 2**63


def _utf8(text: str) -> bytes:
    """The text as Spark's UTF8String holds it: a lone surrogate becomes "?"."""
    return text.encode("utf-8", "replace")


def _trimmed(s: bytes) -> tuple[int, int]:
    """SparkDateTimeUtils.getTrimmedStart and getTrimmedEnd."""
    start, end = 0, len(s)
    while start < end and s[start] in _TRIMMED:
        start += 1
    while end > start + 1 and s[end - 1] in _TRIMMED:
        end -= 1
    return start, end


def _string_to_date(s: bytes) -> int | None:
    """SparkDateTimeUtils.stringToDate: ``[+-]yyyy*``, ``[+-]yyyy*-[m]m`` and
    ``[+-]yyyy*-[m]m-[d]d`` with anything after a space or "T"; 4 to 7 digits of year."""
    j, end = _trimmed(s)
    if j == end:
        return None
    sign = 1
    if s[j] in b"+-":
        sign = -1 if s[j] == ord("-") else 1
        j += 1
    segments = [1, 1, 1]
    i = value = digits = 0
    while j < end and s[j] not in b" T":
        if i < 2 and s[j] == ord("-"):
            if not _date_digits(i, digits):
                return None
            segments[i], value, digits, i = value, 0, 0, i + 1
        elif 0x30 <= s[j] <= 0x39:
            value, digits = value * 10 + s[j] - 0x30, digits + 1
        else:
            return None
        j += 1
    if not _date_digits(i, digits) or (i < 2 and j < end):
        return None
    segments[i] = value
    days = _epoch_day(sign * segments[0], segments[1], segments[2])
    return days if days is not None and days in _INT32 else None


def _date_digits(segment: int, digits: int) -> bool:
    return 4 <= digits <= 7 if segment == 0 else 0 < digits <= 2


def _parse_timestamp(s: bytes) -> tuple[list[int], str | None, bool] | None:
    """SparkDateTimeUtils.parseTimestampString: the fields (year, month, day, hour, minute,
    second, microsecond), the zone's text if any, and whether the text is a time only (then
    the date is today's). ``[+-]yyyy*[-[m]m[-[d]d[( |T)[h]h[:[m]m[:[s]s[.fraction]]]]]]``
    with 4 to 6 digits of year, or a time alone (``[h]h:[m]m...``, ``T[h]h...``); a zone
    only after the seconds or the fraction; fraction digits past the sixth are dropped."""
    j, end = _trimmed(s)
    if j == end:
        return None
    segments = [1, 1, 1, 0, 0, 0, 0, 0, 0]
    i = value = digits = fraction_digits = 0
    just_time = False
    zone = None
    year_sign = None
    if s[j] in b"+-":
        year_sign = -1 if s[j] == ord("-") else 1
        j += 1
    while j < end:
        b = s[j]
        if 0x30 <= b <= 0x39:
            if i == 6:
                fraction_digits += 1
            if i != 6 or digits < 6:
                value = value * 10 + b - 0x30
            digits += 1
            j += 1
            continue
        if j == 0 and b == ord("T"):  # the raw text's first byte: no space, no sign before it
            just_time = True
            i += 3
        elif b in _SEPARATORS.get(i, b""):  # the end of a field
            if not _timestamp_digits(i, digits):
                return None
            segments[i], value, digits, i = value, 0, 0, i + 1
        elif i == 0 and b == ord(":") and year_sign is None:
            just_time = True
            if not _timestamp_digits(3, digits):
                return None
            segments[3], value, digits, i = value, 0, 0, 4
        elif i in (5, 6):  # the zone: the rest of the text
            if not _timestamp_digits(i, digits):
                return None
            segments[i], value, digits, i = value, 0, 0, i + 1
            zone = s[j:end].decode("utf-8", "replace")
            j = end - 1
            if i == 6:
                i += 1
        else:
            return None
        j += 1
    if not _timestamp_digits(i, digits):
        return None
    segments[i] = value
    segments[6] *= 10 ** max(0, 6 - fraction_digits)
    segments[0] *= year_sign or 1
    return segments[:7], zone, just_time


def _timestamp_digits(segment: int, digits: int) -> bool:
    if segment == 0:
        return 4 <= digits <= 6
    if segment == 6:
        return True
    return digits <= 2 if segment == 7 else 0 < digits <= 2


def _string_to_timestamp(s: bytes) -> int | None:
    """SparkDateTimeUtils.stringToTimestamp in a UTC session: the fields in the text's own zone,
    else UTC; a time alone is today's, in that zone."""
    parsed = _parse_timestamp(s)
    if parsed is None:
        return None
    fields, zone_text, just_time = parsed
    zone = 0 if zone_text is None else _zone(zone_text)
    if zone is None:
        return None
    if just_time:
        today = datetime.now(_tzinfo(zone)).date()
        fields = [today.year, today.month, today.day, *fields[3:]]
    return _micros(fields, zone)


def _micros(fields: list[int], zone: Zone) -> int | None:
    """``LocalDate.of``, ``LocalTime.of`` and the instant at ``zone`` (``ZonedDateTime.of``:
    the earlier offset where the local time is ambiguous, the offset before a gap for a time
    in one), in microseconds (``instantToMicros``: overflow refused); None where Java refuses
    a field."""
    year, month, day, hour, minute, second, micros = fields
    days = _epoch_day(year, month, day)
    if days is None or hour > 23 or minute > 59 or second > 59:
        return None
    local = days * _DAY + hour * 3600 + minute * 60 + second
    offset = zone if isinstance(zone, int) else _region_offset(zone, local, micros)
    total = (local - offset) * _MICROS + micros
    return total if total in _INT64 else None


def _epoch_day(year: int, month: int, day: int) -> int | None:
    """``LocalDate.of(year, month, day).toEpochDay`` (the proleptic Gregorian calendar), or
    None for a month or day that does not exist."""
    if not 1 <= month <= 12 or not 1 <= day <= _month_length(year, month):
        return None
    return _days_from_civil(year, month, day)


def _month_length(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 to a proleptic Gregorian date (year 0 is 1 BC)."""
    year -= month <= 2
    era, year_of_era = divmod(year, 400)
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def _julian_to_gregorian_days(days: int) -> int:
    """RebaseDateTime.rebaseJulianToGregorianDays: the date ``days`` after 1970-01-01 names in
    the Julian calendar, as a day of the proleptic Gregorian one. From 0001-01-01 by Spark's
    table of differences; before it field by field (``localRebaseJulianToGregorianDays``: the
    hybrid calendar's year, month and day; a day past the month's end carries over)."""
    if days >= _JULIAN_SWITCH_DAYS[0]:
        i = len(_JULIAN_SWITCH_DAYS) - 1
        while i > 0 and days < _JULIAN_SWITCH_DAYS[i]:
            i -= 1
        return days + _JULIAN_DIFFS[i]
    c = days + 2440588 + 32082  # the Julian day number, then the Julian calendar's date
    d = (4 * c + 3) // 1461
    e = c - 1461 * d // 4
    m = (5 * e + 2) // 153
    day = e - (153 * m + 2) // 5 + 1
    month = m + 3 - 12 * (m // 10)
    year = d - 4800 + m // 10
    return _days_from_civil(year, month, 1) + day - 1


def _zone(text: str) -> Zone | None:
    """SparkDateTimeUtils.getZoneId of the trimmed text, then ``ZoneId.of(id, SHORT_IDS)``:
    "Z", an offset (``ZoneOffset.of``), "UTC", "GMT" or "UT" alone or followed by an offset,
    or a region's name (case-sensitive); None where Java refuses it."""
    text = _SINGLE_HOUR.sub(r"\g<1>0\2:", _java_trim(text), count=1)
    text = _SINGLE_MINUTE.sub(r"\1\2:0\3", text, count=1)
    text = _SHORT_IDS.get(text, text)
    if len(text) <= 1 or text[0] in "+-":
        return _offset(text)
    prefix = 3 if text.startswith(("UTC", "GMT")) else 2 if text.startswith("UT") else 0
    if prefix:
        if len(text) == prefix:
            return 0
        if text[prefix] in "+-":
            return _offset(text[prefix:])
    return text if text in _regions() else None


def _java_trim(text: str) -> str:
    """String.trim: every character up to U+0020 off both ends."""
    start, end = 0, len(text)
    while start < end and text[start] <= " ":
        start += 1
    while end > start and text[end - 1] <= " ":
        end -= 1
    return text[start:end]


def _offset(text: str) -> int | None:
    """ZoneOffset.of: Z, +h, +hh, +hhmm, +hh:mm, +hhmmss or +hh:mm:ss, at most 18 hours."""
    if text == "Z":
        return 0
    if len(text) == 2:
        text = f"{text[0]}0{text[1]}"
    # Where each number starts, for each length; a colon must come before each one past 3.
    starts = {3: (1,), 5: (1, 3), 6: (1, 4), 7: (1, 3, 5), 9: (1, 4, 7)}.get(len(text))
    if starts is None or text[0] not in "+-":
        return None
    numbers = []
    for at in starts:
        pair = text[at:at + 2]
        if not (len(pair) == 2 and all("0" <= c <= "9" for c in pair)) or (
                len(text) in (6, 9) and at > 1 and text[at - 1] != ":"):
            return None
        numbers.append(int(pair))
    hours, minutes, seconds = (*numbers, 0, 0)[:3]
    if hours > 18 or minutes > 59 or seconds > 59 or (hours == 18 and minutes + seconds):
        return None
    total = hours * 3600 + minutes * 60 + seconds
    return -total if text[0] == "-" else total


def _tzinfo(zone: Zone) -> timezone:
    """A fixed offset, or a region's offset now (``LocalDate.now(zone)``, for a time alone)."""
    if isinstance(zone, str):
        now = datetime.now(UTC).replace(tzinfo=None)
        local = (now - datetime(1970, 1, 1)) // timedelta(seconds=1)
        zone = _region_offset(zone, local - _region_offset(zone, local))
    return timezone(timedelta(seconds=zone))


def _region_offset(zone: str, local: int, micros: int = 0) -> int:
    """The offset, in seconds, ``ZonedDateTime.of`` gives the local time ``local`` (seconds since
    1970-01-01 00:00, and ``micros``) in the region ``zone``, by the JVM's own rules: in a gap or
    an overlap the offset before the transition (``ZoneRules.getOffsetInfo``)."""
    rules = _rules(zone)
    if not rules.local_transitions:
        return rules.wall_offsets[0]
    last = rules.local_transitions[-1]
    if rules.last_rules and (local > last or (local == last and micros)):
        year = _civil_from_days(local // _DAY)[0]
        info: int | tuple[int, int, int] = 0
        for transition in (rule.transition(year) for rule in rules.last_rules):
            info = _offset_info(local, transition)
            if isinstance(info, tuple) or info == transition[1]:
                break
        return info[1] if isinstance(info, tuple) else info
    index = bisect.bisect_right(rules.local_transitions, local) - 1
    if index == -1:
        return rules.wall_offsets[0]
    if index % 2 == 0:
        return rules.wall_offsets[index // 2]  # in the gap or overlap: the offset before it
    return rules.wall_offsets[index // 2 + 1]


def _offset_info(local: int, transition: tuple[int, int, int]) -> int | tuple[int, int, int]:
    """ZoneRules.findOffsetInfo: the offset of ``local`` near ``transition`` (its local time
    before, offset before, offset after), or the transition itself when ``local`` falls in
    its gap or overlap."""
    at, before, after = transition
    end = at + after - before
    if after > before:  # a gap
        return before if local < at else transition if local < end else after
    return after if local >= at else before if local < end else transition


@dataclass(frozen=True)
class _Rule:
    """java.time.zone.ZoneOffsetTransitionRule: a yearly transition."""

    month: int
    day: int  # negative: from the month's end
    weekday: int  # 1 (Monday) to 7; 0: the day itself
    seconds: int  # the time of day
    end_of_day: bool
    definition: int  # TimeDefinition: 0 UTC, 1 WALL, 2 STANDARD
    standard: int
    before: int
    after: int

    def transition(self, year: int) -> tuple[int, int, int]:
        """createTransition: the local time (before it), the offsets before and after."""
        if self.day < 0:
            days = _days_from_civil(year, self.month, 1) + _month_length(year, self.month) \
                + self.day
            if self.weekday:
                days -= (_weekday(days) - self.weekday) % 7
        else:
            days = _days_from_civil(year, self.month, self.day)
            if self.weekday:
                days += (self.weekday - _weekday(days)) % 7
        local = (days + self.end_of_day) * _DAY + self.seconds
        local += (self.before, 0, self.before - self.standard)[self.definition]
        return local, self.before, self.after


@dataclass(frozen=True)
class _Rules:
    """java.time.zone.ZoneRules, as far as local times need it."""

    local_transitions: list[int]  # savingsLocalTransitions, as local seconds
    wall_offsets: list[int]
    last_rules: list[_Rule]


def _weekday(days: int) -> int:
    return (days + 3) % 7 + 1  # 1970-01-01 was a Thursday


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """The proleptic Gregorian date ``days`` after 1970-01-01."""
    era, day_of_era = divmod(days + 719468, 146097)
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524
                   - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    mp = (5 * day_of_year + 2) // 153
    month = mp + 3 if mp < 10 else mp - 9
    return year_of_era + era * 400 + (month <= 2), month, day_of_year - (153 * mp + 2) // 5 + 1


def java_tzdb() -> str | None:
    """The time zone database of the JVM Spark starts here (bin/spark-class: ``$JAVA_HOME``,
    else ``java`` on the PATH): ``lib/tzdb.dat`` of its Java home, or None."""
    home = os.environ.get("JAVA_HOME")
    if not home:
        java = shutil.which("java")
        if java is None:
            return None
        home = os.path.dirname(os.path.dirname(os.path.realpath(java)))
    path = os.path.join(home, "lib", "tzdb.dat")
    return path if os.path.isfile(path) else None


@cache
def _regions() -> dict[str, bytes]:
    """The JVM's regions and their rules, serialized (TzdbZoneRulesProvider.load); none where no
    JVM is found (then no region's name reads, and config_problem has sent such a job to
    Spark's writer)."""
    path = java_tzdb()
    if path is None:
        return {}
    with open(path, "rb") as file:
        data = file.read()
    reader = _Reader(data)
    if reader.i8() != 1 or reader.utf() != "TZDB":
        raise ValueError(f"{path} is not a time zone database Java reads")
    versions = [reader.utf() for _ in range(reader.i16())]
    names = [reader.utf() for _ in range(reader.i16())]
    rules = [reader.take(reader.i16()) for _ in range(reader.i16())]
    regions: dict[str, bytes] = {}
    for _ in versions:
        regions = {}  # the last version's
        for _ in range(reader.i16()):
            name = names[reader.i16()]
            regions[name] = rules[reader.i16() & 0xFFFF]
    return regions


@cache
def _rules(zone: str) -> _Rules:
    """ZoneRules.readExternal (after Ser's type byte) of the region's serialized rules."""
    reader = _Reader(_regions()[zone])
    assert reader.i8() == 1  # Ser.ZRULES
    standard = reader.i32()  # the standard offsets' transitions: not needed for local times
    for _ in range(standard):
        reader.epoch_second()
    for _ in range(standard + 1):
        reader.offset()
    count = reader.i32()
    instants = [reader.epoch_second() for _ in range(count)]
    offsets = [reader.offset() for _ in range(count + 1)]
    last = [reader.rule() for _ in range(reader.i8())]
    local: list[int] = []
    for instant, before, after in zip(instants, offsets, offsets[1:], strict=False):
        pair = [instant + before, instant + after]
        local += pair if after > before else pair[::-1]
    return _Rules(local, offsets, last)


class _Reader:
    """java.io.DataInputStream over bytes, and java.time.zone.Ser's packed forms."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        self.at += n
        return self.data[self.at - n:self.at]

    def i8(self) -> int:
        return int.from_bytes(self.take(1), "big", signed=True)

    def i16(self) -> int:
        return int.from_bytes(self.take(2), "big", signed=True)

    def i32(self) -> int:
        return int.from_bytes(self.take(4), "big", signed=True)

    def utf(self) -> str:
        return self.take(self.i16() & 0xFFFF).decode("utf-8")

    def epoch_second(self) -> int:
        """Ser.readEpochSec."""
        high = self.i8() & 255
        if high == 255:
            return int.from_bytes(self.take(8), "big", signed=True)
        rest = int.from_bytes(self.take(2), "big")
        return ((high << 16) + rest) * 900 - 4575744000

    def offset(self) -> int:
        """Ser.readOffset."""
        quarters = self.i8()
        return self.i32() if quarters == 127 else quarters * 900

    def rule(self) -> _Rule:
        """ZoneOffsetTransitionRule.readExternal."""
        data = self.i32() & 0xFFFFFFFF
        time = (data >> 14) & 31
        standard = (data >> 4) & 255
        before, after = (data >> 2) & 3, data & 3
        seconds = self.i32() if time == 31 else time % 24 * 3600
        standard = self.i32() if standard == 255 else (standard - 128) * 900
        before = self.i32() if before == 3 else standard + before * 1800
        after = self.i32() if after == 3 else standard + after * 1800
        return _Rule(data >> 28, ((data >> 22) & 63) - 32, (data >> 19) & 7, seconds,
                     time == 24, (data >> 12) & 3, standard, before, after)
